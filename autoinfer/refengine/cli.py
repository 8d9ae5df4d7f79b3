"""`autoinfer engine bench`: the reference engine's op variants and whole-model speed against their floors;
`autoinfer engine generate`: text from it with a configuration a sweep chose."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.table import Table

engine_app = typer.Typer(help="The bundled PyTorch reference engine.", no_args_is_help=True)


def register(app: typer.Typer) -> None:
    app.add_typer(engine_app, name="engine")


@engine_app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True,
                                      "help_option_names": []})
def generate(ctx: typer.Context) -> None:
    """Text from the reference engine with the flags a sweep's trial ran: --model M --prompt TEXT (or stdin), --chat,
    --n-predict, --temperature; `autoinfer engine generate --help` lists every flag."""
    from autoinfer.refengine.generate import main

    raise typer.Exit(main(ctx.args))


@engine_app.command()
def bench(
    model: Optional[Path] = typer.Option(None, "--model", help="A qwen35moe GGUF (default: the synthetic tiny model)."),
    device: str = typer.Option("cpu", "--device", help="cpu | cuda"),
    dtype: str = typer.Option("fp32", "--dtype", help="fp32 | bf16 | fp16"),
    n_prompt: int = typer.Option(128, "--n-prompt", min=1, help="Prompt tokens for prefill and the ops."),
    n_gen: int = typer.Option(16, "--n-gen", min=1, help="Decode steps of the engine rows."),
    reps: int = typer.Option(3, "--reps", min=1, help="Timed repetitions (median reported)."),
    expert_slots: int = typer.Option(0, "--expert-slots", min=0, help="Device expert slots; 0 = all resident."),
    budget_mib: Optional[float] = typer.Option(None, "--budget-mib", min=1, help="Derive expert slots from this device "
                                               "memory budget instead."),
    prefetch: int = typer.Option(0, "--prefetch", min=0, help="Prefetch the predicted experts of this many layers "
                                 "ahead."),
    misses: str = typer.Option("copy", "--misses", help="copy: a missed expert is copied into a device slot; cpu: "
                               "one that a single token needs is computed on the host."),
    prefill_chunk: int = typer.Option(512, "--prefill-chunk", min=1, help="Tokens per prefill segment (and "
                                      "snapshot interval)."),
    threads: Optional[int] = typer.Option(None, "--threads", min=1, help="torch intra-op threads."),
) -> None:
    """Each op variant and the whole engine: error vs the reference, time, and the bandwidth-limited floor."""
    from autoinfer.refengine.bench import run_bench
    from autoinfer.refengine.budget import DevicePlan
    from autoinfer.refengine.options import EngineOptions

    if model is None:
        from autoinfer.model.synth import cached_model

        model = cached_model("tiny", "Q8_0")
    options = EngineOptions(device=device, dtype=dtype, torch_threads=threads, expert_slots=expert_slots,
                            prefetch=prefetch, misses=misses, prefill_chunk=prefill_chunk)
    if budget_mib is not None:
        expert_slots = DevicePlan.from_gguf(model, options).slots(budget_mib)
        options = EngineOptions(**{**options.__dict__, "expert_slots": expert_slots})
    bw, rows = run_bench(model, options, n_prompt=n_prompt, n_gen=n_gen, reps=reps)
    console = Console(width=max(Console().width, 150))
    table = Table(title=f"{model.name} on {device} {dtype}; measured bandwidth {bw / 1e9:.1f} GB/s"
                        + (f"; {expert_slots} expert slots" if expert_slots else ""))
    for col in ("op", "variant", "rel. error vs ref", "time ms", "floor ms", "floor/time", "detail"):
        table.add_column(col, justify="right" if col in ("time ms", "floor ms", "floor/time") else "left")
    for r in rows:
        table.add_row(r.what, r.variant, "reference" if r.error is None else f"{r.error:.1e}", f"{r.time_ms:.2f}",
                      f"{r.floor_ms:.3f}", f"{r.floor_share:.1%}", r.detail)
    console.print(table)

