"""A child killed by a signal: its meaning and the faulting component, from stderr or the kernel log."""

from __future__ import annotations

import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from autoinfer.engines.base import Outcome
from autoinfer.engines.llama_common import classify_failure
from autoinfer.measure import crash
from autoinfer.measure.process import run_isolated

# What ggml's abort handler and glibc's backtrace_symbols_fd print, innermost frame first after the handlers.
BACKTRACE = """\
/opt/llama/libggml-base.so.0(ggml_print_backtrace+0x1e) [0x7f00000011ee]
/opt/llama/libggml-base.so.0(ggml_abort+0x11f) [0x7f00000012ff]
/opt/llama/libggml-cpu.so.0(ggml_backend_amx_mul_mat+0x3c2) [0x7f0000003c2a]
/opt/llama/libggml-cpu.so.0(+0x2f1a0) [0x7f000002f1a0]
"""
# A C function that executes an undefined instruction, in a shared library, like an AMX kernel on a VM without AMX.
LIBRARY_C = '__attribute__((noinline)) void tinygemm_kernel_amx_standin(void) { __asm__ volatile("ud2"); }\n'
MAIN_C = "void tinygemm_kernel_amx_standin(void);\nint main(void) { tinygemm_kernel_amx_standin(); return 0; }\n"


def test_a_signal_death_records_its_meaning_and_the_component_on_stderr():
    code = ("import os, signal, sys; sys.stderr.write(sys.argv[1]); sys.stderr.write('set_n_threads: n_threads = 2\\n');"
            "sys.stderr.flush(); os.kill(os.getpid(), signal.SIGILL)")
    res = run_isolated([sys.executable, "-c", code, BACKTRACE], timeout_s=60)
    assert res.signal == signal.SIGILL and res.crash is not None
    assert res.crash.name == "SIGILL" and "illegal instruction" in res.crash.meaning
    assert res.crash.component == "ggml_backend_amx_mul_mat (libggml-cpu.so.0)" and res.crash.source == "stderr"
    outcome, reason = classify_failure(res.returncode, res.signal, res.timed_out, res.stderr, crash=res.crash)
    assert outcome is Outcome.CRASH
    assert reason.startswith("killed by SIGILL (illegal instruction: the build uses a CPU instruction")
    assert "in ggml_backend_amx_mul_mat (libggml-cpu.so.0) (from the stderr)" in reason
    assert reason.endswith("last stderr line: set_n_threads: n_threads = 2")
    assert res.crash.as_metrics()["faulting_component"] == "ggml_backend_amx_mul_mat (libggml-cpu.so.0)"


def test_a_stop_by_the_harness_is_not_a_crash():
    res = run_isolated([sys.executable, "-c", "import time; time.sleep(30)"], timeout_s=0.5)
    assert res.timed_out and res.signal is not None and res.crash is None


@pytest.mark.skipif(shutil.which("cc") is None, reason="needs a C compiler to build a faulting program")
def test_an_illegal_instruction_is_named_from_the_kernel_log(tmp_path):
    (tmp_path / "standin.c").write_text(LIBRARY_C)
    (tmp_path / "main.c").write_text(MAIN_C)
    subprocess.run(["cc", "-O1", "-g", "-shared", "-fPIC", "-o", str(tmp_path / "libamxstandin.so"),
                    str(tmp_path / "standin.c")], check=True)
    program = tmp_path / "amx-standin"
    subprocess.run(["cc", "-o", str(program), str(tmp_path / "main.c"), f"-L{tmp_path}", "-lamxstandin",
                    f"-Wl,-rpath,{tmp_path}"], check=True)
    since = crash.boot_seconds()
    res = run_isolated([str(program)], timeout_s=60)
    assert res.signal == signal.SIGILL and res.crash is not None and "illegal instruction" in res.crash.meaning
    if crash.kernel_component(crash.kernel_log(), str(program), since)[1] is None:
        assert res.crash.component is None  # nothing logged to read: the meaning alone, no guess
        pytest.skip("the kernel did not log this fault where it can be read (dmesg_restrict, a container, "
                    "exception-trace off or its rate limit)")
    assert res.crash.component == "tinygemm_kernel_amx_standin (libamxstandin.so)", res.crash
    assert res.crash.source == "kernel log" and "invalid opcode" in res.crash.kernel_line


def test_kernel_log_lines_of_old_and_new_kernels():
    lib = Path("/nonexistent")
    new = ("[  645.335658] traps: llama-bench[11361] trap invalid opcode ip:7f2c8fe530f9 sp:7ffc83088418 error:0 "
           "in libggml-cpu.so[10f9,7f2c8fe53000+1000]")
    old = ("[  100.000001] llama-bench[4242]: segfault at 0 ip 00007f2c8fe530f9 sp 00007ffc83088418 error 4 "
           "in libggml-cpu.so[7f2c8fe53000+1000] likely on CPU 1 (core 1, socket 0)")
    other = "[  700.0] traps: python3[1] trap invalid opcode ip:1 sp:2 error:0 in libc.so[1,0+1000]"
    assert crash.kernel_component([new, other], "/opt/bin/llama-bench", 640.0, [lib]) == ("libggml-cpu.so", new)
    assert crash.kernel_component([old], "llama-bench", 90.0, [lib]) == ("libggml-cpu.so", old)
    assert crash.kernel_component([old], "llama-bench", 700.0, [lib]) == (None, None)  # before this run started
    assert crash.kernel_component([other], "llama-bench", 0.0, [lib]) == (None, None)  # another program


def test_every_fatal_signal_has_a_meaning():
    for sig in (signal.SIGILL, signal.SIGSEGV, signal.SIGBUS, signal.SIGFPE, signal.SIGABRT, signal.SIGKILL):
        assert crash.meaning(sig) != crash.meaning(0)
    assert crash.stderr_component("#0  0x00007f in __GI_raise (sig=4)\n#1  0x00007f in "
                                  "ggml_compute_forward_mul_mat (params=0x1) at ggml-cpu.c:1\n") == \
        "ggml_compute_forward_mul_mat (ggml-cpu.c:1)"
