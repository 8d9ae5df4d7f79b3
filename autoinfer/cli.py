"""The `autoinfer` command line. Each area registers its own commands; this module only wires them up."""

from __future__ import annotations

import sys

import typer

from autoinfer.errors import UserError
from autoinfer.store.redact import redact

app = typer.Typer(
    help="Find the fastest way to run a big MoE model on a GPU too small to hold it.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

# Each line adds one area's commands (its module owns them).
from autoinfer.sweep.cli import register as _campaign  # noqa: E402  sweep, status, export

_campaign(app)
from autoinfer.analysis.cli import register as _analysis  # noqa: E402  analyze, import

_analysis(app)

from autoinfer.llama.cli import register as _llama  # noqa: E402  build, doctor

_llama(app)
from autoinfer.sweep.replay_cli import register as _replay  # noqa: E402  replay

_replay(app)
from autoinfer.refengine.cli import register as _refengine  # noqa: E402  engine bench

_refengine(app)
from autoinfer.llama.quantize_cli import register as _quantize  # noqa: E402  model quantize, model quality
from autoinfer.model.cli import model_app  # noqa: E402  model synth, model info
from autoinfer.model.cli import register as _model  # noqa: E402

_quantize(model_app)  # they run llama.cpp's tools on model files: the llama package owns them
_model(app)

from autoinfer.sweep.worker_cli import register as _worker  # noqa: E402  worker

_worker(app)


def _usage_line(exc: typer.TyperException) -> str:
    """Typer's usage message on one line, with the command's --help as the fix."""
    message = " ".join(exc.format_message().split())
    ctx = getattr(exc, "ctx", None)
    command = ctx.command_path if ctx is not None else "autoinfer"
    return f"error: {message} (see `{command} --help`)"


def main() -> None:
    """Entry point: UserError and typer's usage errors become one line on stderr and exit status 2."""
    try:
        code = app(standalone_mode=False)  # a command's typer.Exit(code) comes back here, not raised
    except UserError as exc:
        print(f"error: {' '.join(redact(str(exc)).splitlines())}", file=sys.stderr)  # one line, always
        sys.exit(2)
    except typer.Abort:
        print("aborted", file=sys.stderr)
        sys.exit(130)
    except typer.Exit as exc:
        sys.exit(exc.exit_code)
    except typer.TyperException as exc:
        # A group called without a command (no_args_is_help) carries its help text instead of a message (rich
        # help is already printed when the error is made, leaving the message empty): show it, then one line.
        message = exc.format_message()
        ctx = getattr(exc, "ctx", None)
        if ctx is not None and (not message.strip() or "\n" in message.strip()):
            if message.strip():
                print(message)
            print(f"error: `{ctx.command_path}` needs a command (listed above)", file=sys.stderr)
        else:
            print(_usage_line(exc), file=sys.stderr)
        sys.exit(2)
    if isinstance(code, int) and code:
        sys.exit(code)


if __name__ == "__main__":
    main()
