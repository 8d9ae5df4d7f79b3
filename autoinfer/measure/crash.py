"""What a child killed by a signal tells: the signal's meaning and, when stderr or the kernel log shows it, the
faulting component (function and library).

The last stderr line of a crashed llama.cpp run is usually an unrelated debug line; what a user needs is "illegal
instruction in tinygemm_kernel_amx<block_q8_0> (libggml-cpu.so)". Sources, best first:
- a backtrace on stderr (ggml prints one on abort; glibc's `lib.so(symbol+0x1f)` and gdb's `#3 0x… in symbol`);
- the kernel log line of the fault (`traps: NAME[TID] trap invalid opcode ip:… in lib.so[OFFSET,BASE+SIZE]`, or
  `NAME[TID]: segfault at … in lib.so[BASE+SIZE]`), whose library offset addr2line turns into a function name.
Reading the kernel log needs permission (kernel.dmesg_restrict); without it the stderr source alone is used.
"""

from __future__ import annotations

import os
import re
import shutil
import signal as signals
import subprocess
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

#: What each fatal signal means for a measured program, in words a user can act on.
MEANINGS = {
    signals.SIGILL: "illegal instruction: the build uses a CPU instruction this CPU (or its VM) does not allow",
    signals.SIGSEGV: "segmentation fault: an invalid memory access in the program",
    signals.SIGBUS: "bus error: a memory-mapped file shrank or was unreadable (was the model file changed?)",
    signals.SIGFPE: "arithmetic exception (an integer division by zero)",
    signals.SIGABRT: "aborted: the program stopped itself on a failed check (its assertion is on stderr)",
    signals.SIGKILL: "killed: by the kernel's out-of-memory killer, a timeout or another process",
    signals.SIGTERM: "terminated by another process",
    signals.SIGTRAP: "trap: a debugger breakpoint or a compiler-inserted trap was hit",
}
# Frames that belong to the crash handling, not to the code that faulted.
_HANDLER_FRAMES = re.compile(r"^(ggml_print_backtrace|ggml_abort|ggml_uncaught_exception|__GI_|raise$|abort$|"
                             r"pthread_kill|__pthread_kill|__restore_rt|_sigtramp|__libc_|_start$|main$|"
                             r"std::terminate|__cxa_|__gnu_cxx::__verbose_terminate)")
_GLIBC_FRAME = re.compile(r"(?P<lib>[\w.+-]+\.so[\d.]*)\((?P<sym>[^+)]+)\+0x[0-9a-fA-F]+\)")
_GDB_FRAME = re.compile(r"^#\d+\s+(?:0x[0-9a-fA-F]+\s+in\s+)?(?P<sym>[^\s(][^(]*?)\s*\(.*?\)(?:\s+(?:at|from)\s+"
                        r"(?P<lib>\S+))?")
# Kernel lines: 6.x prints "lib.so[OFFSET,BASE+SIZE]", older kernels "lib.so[BASE+SIZE]".
#: The kernel log's clock runs slightly behind CLOCK_MONOTONIC in VMs; a fault up to this long "before" the start counts.
_CLOCK_SLACK_S = 2.0
_KERNEL_LINE = re.compile(r"^\[\s*(?P<ts>\d+\.\d+)\]\s+(?:traps:\s+)?(?P<comm>.{1,15}?)\[(?P<tid>\d+)\]:?\s+"
                          r"(?P<what>.*?)\s+ip[: ](?P<ip>[0-9a-fA-F]+).*?\bin\s+(?P<lib>[^\s\[]+)"
                          r"\[(?:(?P<off>[0-9a-fA-F]+),)?(?P<base>[0-9a-fA-F]+)\+[0-9a-fA-F]+\]")


@dataclass(frozen=True)
class Crash:
    """A child's death by a signal, explained."""

    signal: int
    name: str  # "SIGILL"
    meaning: str
    component: str | None = None  # "tinygemm_kernel_amx<block_q8_0> (libggml-cpu.so)", when a source shows it
    source: str | None = None  # "stderr" or "kernel log"
    kernel_line: str | None = None  # the kernel log line of the fault, verbatim

    def describe(self) -> str:
        """One line: `SIGILL (illegal instruction: …) in tinygemm_kernel_amx (libggml-cpu.so; from the kernel log)`."""
        where = f" in {self.component} (from the {self.source})" if self.component else ""
        return f"{self.name} ({self.meaning}){where}"

    def as_metrics(self) -> dict[str, str]:
        """The fields a trial records (its `metrics`), so a study's failures can be grouped by cause."""
        out = {"signal": self.name, "signal_meaning": self.meaning}
        if self.component:
            out.update(faulting_component=self.component, component_source=self.source or "")
        if self.kernel_line:
            out["kernel_line"] = self.kernel_line
        return out


def signal_name(sig: int) -> str:
    try:
        return signals.Signals(sig).name
    except ValueError:
        return f"signal {sig}"


def meaning(sig: int) -> str:
    return MEANINGS.get(sig, "ended by a signal the program did not handle")


def stderr_component(stderr: str) -> str | None:
    """The innermost frame of a backtrace on stderr that is not crash handling, as `symbol (library)`."""
    for line in stderr.splitlines():
        line = line.strip()
        match = _GLIBC_FRAME.search(line) or _GDB_FRAME.match(line)
        if match is None:
            continue
        symbol = _demangle(match.group("sym").strip())
        if not symbol or symbol == "??" or _HANDLER_FRAMES.match(symbol):
            continue
        lib = match.group("lib")
        return f"{symbol} ({Path(lib).name})" if lib else symbol
    return None


def _demangle(symbol: str) -> str:
    """C++ names in glibc backtraces are mangled (_Z…); c++filt, when installed, makes them readable."""
    tool = shutil.which("c++filt")
    if not symbol.startswith("_Z") or tool is None:
        return symbol
    done = subprocess.run([tool, symbol], check=False, capture_output=True, text=True, timeout=10)
    return done.stdout.strip() or symbol


def kernel_log() -> list[str]:
    """The kernel ring buffer's lines, or none when it cannot be read (dmesg_restrict, no dmesg, a container)."""
    tool = shutil.which("dmesg")
    if tool is None:
        return []
    try:
        done = subprocess.run([tool], check=False, capture_output=True, text=True, timeout=10,
                              stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired):
        return []
    return done.stdout.splitlines() if done.returncode == 0 else []


def boot_seconds() -> float:
    """Now on the kernel log's clock, to tell this run's fault from older ones: printk stamps lines with the
    scheduler clock, which like CLOCK_MONOTONIC counts from boot and stops during suspend (CLOCK_BOOTTIME does not)."""
    return time.clock_gettime(time.CLOCK_MONOTONIC)


def kernel_component(lines: Iterable[str], program: str, since_s: float,
                     lib_dirs: Iterable[Path] = ()) -> tuple[str | None, str | None]:
    """(component, kernel line) of the last fault of `program` logged after `since_s` (seconds since boot).

    The fault is logged under the faulting *thread's* id, which is not the child's pid, so the program's name (the
    kernel keeps 15 characters) and the time select the line. The library offset becomes a function name with
    addr2line when the library is found in `lib_dirs`."""
    comm = Path(program).name[:15]
    found = None
    for line in lines:
        match = _KERNEL_LINE.match(line.strip())
        if match and match.group("comm") == comm and float(match.group("ts")) >= since_s - _CLOCK_SLACK_S:
            found = match
    if found is None:
        return None, None
    lib = found.group("lib")
    offset = int(found.group("off"), 16) if found.group("off") else int(found.group("ip"), 16) - int(
        found.group("base"), 16)
    symbol = _symbol_at(lib, offset, lib_dirs)
    component = f"{symbol} ({lib})" if symbol else lib
    return component, found.string


def _symbol_at(lib: str, offset: int, lib_dirs: Iterable[Path]) -> str | None:
    """The function at a file offset of a shared library (text offsets equal addresses in the libraries ld and
    lld write), or None without addr2line, the library or its symbols."""
    tool = shutil.which("addr2line")
    path = next((Path(d) / lib for d in lib_dirs if (Path(d) / lib).is_file()), None)
    if tool is None or path is None:
        return None
    try:
        done = subprocess.run([tool, "-f", "-C", "-e", str(path), hex(offset)], check=False, capture_output=True,
                              text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return None
    name = (done.stdout.splitlines() or ["??"])[0].strip()
    return None if name in ("", "??") else name


def explain(sig: int, stderr: str, program: str, since_s: float, env: dict[str, str] | None = None) -> Crash:
    """Explain a child's death by `sig`: meaning, and the component from stderr, else from the kernel log."""
    name = signal_name(sig)
    component = stderr_component(stderr)
    if component is not None:
        return Crash(sig, name, meaning(sig), component, "stderr")
    if sig in (signals.SIGKILL, signals.SIGTERM):  # sent by someone, not a fault: the kernel logs no fault line
        return Crash(sig, name, meaning(sig))
    library_path = (env or os.environ).get("LD_LIBRARY_PATH", "")
    lib_dirs = [Path(program).parent, *(Path(p) for p in library_path.split(os.pathsep) if p)]
    component, line = kernel_component(kernel_log(), program, since_s, lib_dirs)
    return Crash(sig, name, meaning(sig), component, "kernel log" if component else None, line)
