"""`autoinfer model synth` (random-weight qwen35moe GGUFs) and `autoinfer model info` (bytes per tensor group)."""

from __future__ import annotations

import json
from pathlib import Path

import typer
from rich.console import Console
from rich.progress import BarColumn, DownloadColumn, Progress, TimeRemainingColumn, TransferSpeedColumn
from rich.table import Table

from autoinfer.errors import UserError

model_app = typer.Typer(help="Synthetic qwen35moe models and their byte accounting.", no_args_is_help=True)


def register(app: typer.Typer) -> None:
    app.add_typer(model_app, name="model")


def _size(n: int) -> str:
    return f"{n / 2**30:.2f} GiB" if n >= 2**30 else f"{n / 2**20:.2f} MiB"


@model_app.command("synth")
def synth_command(
    out: Path = typer.Argument(..., help="Output .gguf file."),
    preset: str = typer.Option("tiny", "--preset", help="tiny | small | 35b-a3b"),
    qtype: str = typer.Option("Q8_0", "--qtype", help="F32 F16 BF16 Q4_0 Q4_1 Q5_0 Q5_1 Q8_0, K- and IQ-quants."),
    seed: int = typer.Option(0, "--seed", min=0, help="Random seed of the weights."),
    tokenizer: str = typer.Option("qwen35", "--tokenizer", help="qwen35 (real tokens, fitted to the preset's "
                                   "vocabulary) | none (llama-bench only; llama-server cannot serve it)."),
    force: bool = typer.Option(False, "--force", help="Overwrite OUT if it exists."),
) -> None:
    """Write a random-weight qwen35moe GGUF that llama.cpp loads and runs like the real model of that shape."""
    from autoinfer.model.synth import plan, synth

    if out.exists() and not force:
        raise UserError(f"{out} exists; pass --force to overwrite it")
    sp = plan(preset, qtype, tokenizer)
    console = Console(stderr=True)
    console.print(f"{preset} {qtype}: {len(sp.tensors)} tensors, {sp.n_params / 1e9:.3f} B params, "
                  f"{_size(sp.tensor_bytes)}")
    columns = ("[progress.description]{task.description}", BarColumn(), DownloadColumn(), TransferSpeedColumn(),
               TimeRemainingColumn())
    with Progress(*columns, console=console, transient=True) as bar:
        task = bar.add_task("writing", total=sp.tensor_bytes)
        synth(out, preset, qtype, seed=seed, tokenizer=tokenizer,
              progress=lambda done, _total: bar.update(task, completed=done))
    Console().print(str(out), soft_wrap=True)


@model_app.command("info")
def info_command(
    path: Path = typer.Argument(..., help="A qwen35moe (or qwen3next) .gguf file."),
    as_json: bool = typer.Option(False, "--json", help="Machine-readable output with every tensor."),
) -> None:
    """Architecture, layers, experts, bytes per tensor group, routed-expert bytes per layer and totals."""
    from autoinfer.model.gguf_info import read_info

    info = read_info(path)
    if as_json:
        typer.echo(json.dumps(info.to_dict(), indent=1, default=str))
        return
    console = Console()
    head = Table(title=str(info.path), show_header=False)
    for key, value in (
        ("architecture", info.arch),
        ("layers", f"{info.n_layers} (attention: {', '.join(map(str, info.attention_layers))})"),
        ("experts", f"{info.n_experts}, {info.n_experts_used} used per token"),
        ("hidden", str(info.hidden)),
        ("vocabulary", str(info.vocab_size)),
        ("context length", str(info.context_length)),
        ("parameters", f"{info.n_params / 1e9:.3f} B"),
        ("tensor bytes", f"{info.tensor_bytes:,} ({_size(info.tensor_bytes)})"),
        ("file bytes", f"{info.file_bytes:,}"),
        ("one expert", f"{info.expert_bytes():,} bytes (layer 0)"),
        ("read per token", f"{_size(info.active_bytes_per_token())} (dense + top-{info.n_experts_used} experts)"),
    ):
        head.add_row(key, value)
    console.print(head)

    groups = Table(title="bytes per tensor group")
    groups.add_column("group")
    groups.add_column("bytes", justify="right")
    groups.add_column("size", justify="right")
    groups.add_column("share", justify="right")
    for group, n in info.bytes_by_group().items():
        if n:
            groups.add_row(group, f"{n:,}", _size(n), f"{100 * n / info.tensor_bytes:.1f}%")
    groups.add_row("total", f"{info.tensor_bytes:,}", _size(info.tensor_bytes), "100.0%", style="bold")
    console.print(groups)

    layers = Table(title="bytes per layer")
    layers.add_column("layer", justify="right")
    layers.add_column("mixer")
    layers.add_column("routed experts", justify="right")
    layers.add_column("rest of layer", justify="right")
    for i, by_group in enumerate(info.layer_bytes()):
        experts = by_group.get("routed_experts", 0)
        layers.add_row(str(i), "attention" if i in info.attention_layers else "gdn", _size(experts),
                       _size(sum(by_group.values()) - experts))
    console.print(layers)
