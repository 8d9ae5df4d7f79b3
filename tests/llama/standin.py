"""A stand-in llama-bench that reproduces the AMX crash of a VM on any machine.

On an Intel VM whose CPU advertises AMX, a -march=native llama.cpp build dies with SIGILL in its AMX kernels for
repacked quantized weights; F16 weights and `--repack 0` run. The stand-in does the same: it is a script placed
first in a folder that otherwise links to the real build, and it dies with SIGILL (by an undefined instruction in a
function of a small shared library compiled on the spot, where a C compiler is found, else by signal 4) when the model
is quantized and the run repacks it (mode "repack"), for every quantized run (mode "always"), or for every quantized
run that is not a one-repetition smoke run (mode "trials"); mode "refuse" fails to load quantized models without a
crash, like a build too old for the model. Every other call execs the real llama-bench, so
--help, --version and the runs that survive are the real binary's.
"""

from __future__ import annotations

import platform
import shutil
import subprocess
import sys
from pathlib import Path

SCRIPT = '''#!{python}
import os, re, signal, sys

REAL, MODE, FAULT = {real!r}, {mode!r}, {fault!r}
args = sys.argv[1:]


def value(flag, default):
    return args[args.index(flag) + 1] if flag in args and args.index(flag) + 1 < len(args) else default


found = re.search(r"-([A-Z0-9_]+)-(?:none|qwen35)-s\\d+\\.gguf$", value("-m", ""))
quantized = found is not None and found.group(1) not in ("F16", "F32", "BF16")
repack = value("--repack", "1") != "0"
crash = quantized and (MODE == "always" or (MODE == "repack" and repack) or (MODE == "trials" and value("-r", "5") != "1"))
if quantized and MODE == "refuse":  # a build that cannot load the model: an error, no crash
    sys.stderr.write("llama_model_load: error loading model: unknown model architecture\\n")
    sys.exit(1)
if crash:
    sys.stderr.write("load_tensors:          AMX model buffer size =     0.30 MiB\\n")
    sys.stderr.flush()
    if FAULT:  # a real fault: an undefined instruction in a library function, logged by the kernel under this pid
        with open(os.path.join(os.path.dirname(FAULT), "pids"), "a") as pids:
            pids.write(f"{{os.getpid()}}\\n")
        os.execv(FAULT, [FAULT])
    os.kill(os.getpid(), signal.SIGILL)
os.execv(REAL, [REAL, *args])
'''
# Executes an undefined instruction (ud2) in a function of a shared library, as an AMX kernel does where AMX is not
# allowed; the program is also called llama-bench, so the kernel logs the fault under that name.
LIBRARY_C = '__attribute__((noinline)) void tinygemm_kernel_amx_standin(void) { __asm__ volatile("ud2"); }\n'
MAIN_C = "void tinygemm_kernel_amx_standin(void);\nint main(void) { tinygemm_kernel_amx_standin(); return 0; }\n"
COMPONENT = "tinygemm_kernel_amx_standin (libamxstandin.so)"


def faulted_pids(folder: Path) -> set[int]:
    """The pids of the stand-in's real faults in `folder` (the kernel's fault lines name them)."""
    pids = folder / "fault" / "pids"
    return {int(line) for line in pids.read_text().split()} if pids.exists() else set()


def _faulting_program(folder: Path) -> Path | None:
    """folder/fault/llama-bench and folder/libamxstandin.so (beside the tools, where the crash explainer looks for
    libraries), or None without an x86 C compiler."""
    cc = shutil.which("cc")
    if cc is None or platform.machine() not in ("x86_64", "AMD64"):
        return None
    (folder / "fault").mkdir()
    (folder / "fault" / "standin.c").write_text(LIBRARY_C)
    (folder / "fault" / "main.c").write_text(MAIN_C)
    subprocess.run([cc, "-O1", "-g", "-shared", "-fPIC", "-o", str(folder / "libamxstandin.so"),
                    str(folder / "fault" / "standin.c")], check=True)
    program = folder / "fault" / "llama-bench"
    subprocess.run([cc, "-o", str(program), str(folder / "fault" / "main.c"), f"-L{folder}", "-lamxstandin",
                    f"-Wl,-rpath,{folder}"], check=True)
    return program


def make_standin(folder: Path, tools, mode: str) -> Path:
    """`folder` with links to every file of the real build's bin/ and the stand-in as llama-bench."""
    folder.mkdir(parents=True, exist_ok=True)
    for path in tools.bin_dir.iterdir():
        if path.name != "llama-bench":
            (folder / path.name).symlink_to(path)
    script = folder / "llama-bench"
    fault = _faulting_program(folder)
    script.write_text(SCRIPT.format(python=sys.executable, real=str(tools.tool("llama-bench")), mode=mode,
                                    fault=str(fault) if fault else ""))
    script.chmod(0o755)
    return folder
