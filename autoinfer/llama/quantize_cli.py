"""`autoinfer model quantize` (a quantization ladder, and its quality) and `autoinfer model quality`."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.table import Table

from autoinfer.llama.quantize import DEFAULT_TYPES

LlamaBinOpt = typer.Option(None, "--llama-bin", help="Folder with llama-quantize/llama-perplexity (default: found).")
CorpusOpt = typer.Option(None, "--corpus", help="UTF-8 text for KLD/perplexity (default: the shipped corpus).")
CtxOpt = typer.Option(256, "--ctx", min=16, help="Context per perplexity chunk (tokens).")
ChunksOpt = typer.Option(None, "--chunks", min=1, help="Chunks to score (default: all the corpus holds).")
ThreadsOpt = typer.Option(None, "--threads", min=1, help="CPU threads for llama-quantize/llama-perplexity.")
NglOpt = typer.Option(None, "--n-gpu-layers", min=0, help="Layers on the GPU while scoring (default: fitted).")


def register(model_app: typer.Typer) -> None:
    model_app.command("quantize")(quantize_command)
    model_app.command("quality")(quality_command)


def _settings(corpus: Optional[Path], ctx: int, chunks: Optional[int], threads: Optional[int],
              n_gpu_layers: Optional[int]):
    from autoinfer.llama.quality import DEFAULT_CORPUS, QualitySettings

    return QualitySettings(corpus=corpus or DEFAULT_CORPUS, ctx=ctx, chunks=chunks, threads=threads,
                           n_gpu_layers=n_gpu_layers)


def _quality_table(console: Console, files: list[Path], settings, reference: Optional[Path], tools) -> None:
    from autoinfer.llama.quality import measure_quality

    table = Table(title=f"quality on {settings.corpus.name} (ctx {settings.ctx})")
    for column in ("file", "MiB", "KLD (nats)", "PPL", "same top token", ""):
        table.add_column(column, justify="left" if column in ("file", "") else "right")

    def row(path: Path, q, cached: bool) -> None:
        top = f"{q.same_top_p:.1f} %" if q.same_top_p is not None else "—"
        table.add_row(path.name, f"{path.stat().st_size / 2**20:.1f}", f"{q.kld:.6f} ± {q.kld_err:.6f}",
                      f"{q.ppl:.4g} ± {q.ppl_err:.2g}", top,
                      "reference" if q.kld == 0 and str(path) == q.reference else ("cached" if cached else ""))

    with console.status("measuring KLD and perplexity with llama-perplexity"):
        measure_quality(files, settings, reference=reference, tools=tools, on_result=row)
    console.print(table)
    console.print("KLD is measured against the reference file's token distributions. Synthetic models have random "
                  "weights: their numbers only order the types; use real weights for real quality.")


def quantize_command(
    source: Path = typer.Argument(..., help="High-precision (F16/BF16/F32) .gguf to quantize."),
    types: str = typer.Option(",".join(DEFAULT_TYPES), "--types", help="Comma-separated llama-quantize types."),
    out_dir: Optional[Path] = typer.Option(None, "--out-dir", help="Folder for the ladder (default: the cache)."),
    imatrix: Optional[str] = typer.Option(
        None, "--imatrix", help="Importance matrix file for every type, or `auto`: made with llama-imatrix on the "
        "shipped corpus (cached) for the types that need one (IQ2/IQ1)."),
    allow_requantize: bool = typer.Option(False, "--allow-requantize", help="Accept an already quantized source."),
    quality: bool = typer.Option(True, "--quality/--no-quality", help="Measure KLD/PPL of every rung."),
    corpus: Optional[Path] = CorpusOpt,
    ctx: int = CtxOpt,
    chunks: Optional[int] = ChunksOpt,
    threads: Optional[int] = ThreadsOpt,
    n_gpu_layers: Optional[int] = NglOpt,
    llama_bin: Optional[Path] = LlamaBinOpt,
) -> None:
    """Build a quantization ladder with llama-quantize (cached), then measure each file's KLD and perplexity
    against the source; prints the `model:` list to paste into a campaign."""
    from autoinfer.llama.build import find_tools
    from autoinfer.llama.quantize import IMATRIX_AUTO, build_ladder

    console = Console()
    tools = find_tools(llama_bin)
    table = Table(title=f"ladder of {source.name}")
    for column in ("type", "file", "MiB", ""):
        table.add_column(column, justify="right" if column == "MiB" else "left")
    with console.status("quantizing with llama-quantize"):
        rungs = build_ladder(source, tuple(types.split(",")), out_dir=out_dir,
                             imatrix=imatrix if imatrix in (None, IMATRIX_AUTO) else Path(imatrix),
                             allow_requantize=allow_requantize, threads=threads, tools=tools,
                             on_rung=lambda r: table.add_row(r.qtype, str(r.path), f"{r.n_bytes / 2**20:.1f}",
                                                             "built" if r.built else "cached"))
    console.print(table, soft_wrap=True)
    with_matrix = [r for r in rungs if r.imatrix]  # one matrix per ladder: the file given, or the auto one
    if with_matrix:
        console.print(f"importance matrix for {', '.join(r.qtype for r in with_matrix)}: {with_matrix[0].imatrix}",
                      highlight=False, soft_wrap=True)
    files = [Path(source).resolve(), *(r.path for r in rungs)]
    if quality:
        _quality_table(console, files, _settings(corpus, ctx, chunks, threads, n_gpu_layers), None, tools)
    console.print("\ncampaign model list:\nmodel:", highlight=False)
    for path in files:
        console.print(f"  - {path}", highlight=False, soft_wrap=True)


def quality_command(
    files: list[Path] = typer.Argument(..., help="Quantizations of one model (.gguf)."),
    reference: Optional[Path] = typer.Option(None, "--reference", help="Default: the highest-precision file."),
    corpus: Optional[Path] = CorpusOpt,
    ctx: int = CtxOpt,
    chunks: Optional[int] = ChunksOpt,
    threads: Optional[int] = ThreadsOpt,
    n_gpu_layers: Optional[int] = NglOpt,
    llama_bin: Optional[Path] = LlamaBinOpt,
) -> None:
    """KL divergence and perplexity of each file against the reference (stored beside the file's hash)."""
    from autoinfer.llama.build import find_tools
    from autoinfer.model.resolve import resolve_model

    paths = [Path(resolve_model(str(f))) for f in files]
    _quality_table(Console(), paths, _settings(corpus, ctx, chunks, threads, n_gpu_layers), reference,
                   find_tools(llama_bin))
