"""Write a file so that readers see the old content or the new, never half of it.

Thresholds, plans, summaries and health histories are read by other processes (the router, a
later DAG task, the next day's run) while a job may be rewriting them. Each write goes to a
temporary file in the destination's directory (same file system, so the rename is atomic),
is flushed to disk, then renamed over the destination. The temporary name is unique per
write (``O_EXCL`` on a random suffix), so two writers of the same file never share a
temporary file: the last rename wins and both leave a complete file.

The new file gets the mode a plain ``open(path, "w")`` would give it (``0o666`` minus the
umask) unless ``mode`` says otherwise; the destination's old mode is not carried over.
"""

from __future__ import annotations

import contextlib
import os
import secrets
from pathlib import Path

__all__ = ["atomic_write_bytes", "atomic_write_text"]


def atomic_write_bytes(
    path: Path | str, data: bytes, *, mode: int = 0o666, durable: bool = True
) -> Path:
    """Replace ``path`` with ``data`` atomically; create missing parent directories.

    ``durable``: fsync the file before the rename and the directory after it, so a crash
    leaves the old or the new content rather than an empty file. Returns ``path``.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0)
    while True:
        tmp = path.with_name(f".{path.name}.{secrets.token_hex(6)}.tmp")
        try:
            fd = os.open(tmp, flags, mode)
            break
        except FileExistsError:  # pragma: no cover - 48 random bits collided
            continue
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            if durable:
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise
    if durable:
        _fsync_dir(path.parent)
    return path


def atomic_write_text(
    path: Path | str,
    text: str,
    *,
    encoding: str = "utf-8",
    mode: int = 0o666,
    durable: bool = True,
) -> Path:
    """:func:`atomic_write_bytes` of ``text`` encoded as is (``\\n`` stays ``\\n``)."""
    return atomic_write_bytes(path, text.encode(encoding), mode=mode, durable=durable)


def _fsync_dir(directory: Path) -> None:
    """Make the rename itself durable (POSIX); a no-op where directories cannot be opened."""
    try:
        fd = os.open(directory, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError:
        return
    try:
        with contextlib.suppress(OSError):
            os.fsync(fd)
    finally:
        os.close(fd)
