"""The source download reports its progress on stderr while the downloader runs (pip prints nothing captured)."""

from __future__ import annotations

import re
import sys

from autoinfer.llama.build import watched_download

# A stand-in downloader: writes a file of that name in its TMPDIR, chunk by chunk, as pip does in its unpack folder.
WRITER = """
import os, sys, tempfile, time
folder = tempfile.mkdtemp(prefix="pip-unpack-")
with open(os.path.join(folder, "pkg-1.0.tar.gz"), "wb") as f:
    for _ in range(8):
        f.write(b"x" * 250_000)
        f.flush()
        time.sleep(0.25)
print("done writing", file=sys.stderr)
sys.exit(int(sys.argv[1]))
"""


def test_progress_lines_grow_until_the_download_ends(tmp_path, capsys):
    code, stderr = watched_download([sys.executable, "-c", WRITER, "0"], tmp_path, "pkg-1.0.tar.gz", 2_000_000,
                                    "the package", every_s=0.5)
    assert code == 0 and "done writing" in stderr
    lines = capsys.readouterr().err.splitlines()
    got = [float(m.group(1)) for line in lines if (m := re.match(r"downloading the package: ([\d.]+) of 2\.0 MB, "
                                                                 r"\d+ s$", line))]
    assert len(got) == len(lines) >= 2, lines
    assert got == sorted(got) and got[-1] > got[0]


def test_the_downloaders_failure_and_stderr_come_back(tmp_path):
    code, stderr = watched_download([sys.executable, "-c", WRITER, "3"], tmp_path, "pkg-1.0.tar.gz", 2_000_000,
                                    "the package", every_s=5)
    assert code == 3 and stderr.strip().endswith("done writing")
