"""Files are replaced whole, never rewritten in place.

Each write goes to a temporary file in the target's folder, is flushed to disk, then renamed over the target
(os.replace is atomic on one file system), so a crash or a kill during a write leaves the previous file or the new
one, never a torn mix.
"""

from __future__ import annotations

import os
import tempfile
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Iterator


@contextmanager
def replacing(path: Path | str) -> Iterator[Path]:
    """A temporary path beside `path` for the caller to write (by any library); on success it replaces `path`.

    On an exception the temporary file is removed and `path` is left as it was.
    """
    path = Path(path)
    fd, name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    tmp = Path(name)
    try:
        yield tmp
        with open(tmp, "rb+") as fh:  # the writer may have closed it without syncing
            os.fsync(fh.fileno())
        os.chmod(tmp, 0o666 & ~_UMASK)  # mkstemp makes 0600; a result file is as readable as any other
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    _sync_dir(path.parent)


def write_bytes(path: Path | str, data: bytes) -> Path:
    with replacing(path) as tmp:
        tmp.write_bytes(data)
    return Path(path)


def write_text(path: Path | str, text: str, encoding: str = "utf-8", errors: str = "strict") -> Path:
    return write_bytes(path, text.encode(encoding, errors))


def _read_umask() -> int:
    """The process umask (read once at import, while no other thread creates files: os.umask can only swap it)."""
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


_UMASK = _read_umask()


def _sync_dir(folder: Path) -> None:
    """Make the rename itself durable (best effort: some file systems refuse to open a folder)."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    with suppress(OSError):
        os.fsync(fd)
    os.close(fd)
