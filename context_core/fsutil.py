"""Write a file so that readers see the old content or the new, never half of it.

Thresholds, plans, summaries and health histories are read by other processes (the router, a
later DAG task, the next day's run) while a job may be rewriting them. Each write goes to a
temporary file in the destination's directory (same file system, so the rename is atomic),
is flushed to disk, then renamed over the destination. The temporary name is unique per
write (``O_EXCL`` on a random suffix), so two writers of the same file never share a
temporary file: the last rename wins and both leave a complete file.

The new file gets the mode a plain ``open(path, "w")`` would give it (``0o666`` minus the
umask) unless ``mode`` says otherwise; the destination's old mode is not carried over.

JSON-lines logs (audit, access, quarantine) are appended to by many writers and rewritten by
retention and erasure. :func:`append_line` appends one line under an advisory lock
(``fcntl.flock`` on a sidecar ``.<name>.lock`` in the same directory: the lock outlives the
file's inode, which a rewrite replaces) and :func:`filter_lines` rewrites under the same lock
(temporary file in the same directory, fsync, ``os.replace``), so a line appended while the
file is being filtered waits for the rewrite and lands in the new file, never in a replaced
one.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import secrets
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import BinaryIO

__all__ = ["append_line", "atomic_write_bytes", "atomic_write_text", "filter_lines", "line_lock"]


def atomic_write_bytes(
    path: Path | str, data: bytes, *, mode: int = 0o666, durable: bool = True
) -> Path:
    """Replace ``path`` with ``data`` atomically; create missing parent directories.

    ``durable``: fsync the file before the rename and the directory after it, so a crash
    leaves the old or the new content rather than an empty file. Returns ``path``.
    """
    with _replacing(path, mode=mode, durable=durable) as f:
        f.write(data)
    return Path(path)


@contextlib.contextmanager
def _replacing(path: Path | str, *, mode: int, durable: bool) -> Iterator[BinaryIO]:
    """A new file written through the yielded handle, renamed over ``path`` when the block
    ends (flushed, fsynced when ``durable``); removed, ``path`` untouched, when it raises."""
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
            yield f
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


@contextlib.contextmanager
def line_lock(path: Path | str) -> Iterator[None]:
    """Hold the advisory lock of the JSON-lines file ``path`` (exclusive; blocks)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path.with_name(f".{path.name}.lock"), os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing the descriptor releases the lock


def append_line(path: Path | str, line: str | bytes, *, mode: int = 0o640) -> None:
    """Append ``line`` (a newline is added when missing) to ``path`` with one ``write`` on an
    ``O_APPEND`` descriptor, under :func:`line_lock`. Creates the file and its directory."""
    data = line.encode() if isinstance(line, str) else line
    if not data.endswith(b"\n"):
        data += b"\n"
    with line_lock(path):
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, mode)
        try:
            os.write(fd, data)
        finally:
            os.close(fd)


def filter_lines(path: Path | str, keep: Callable[[bytes], bool], *, durable: bool = True) -> int:
    """Rewrite ``path`` with only the lines ``keep`` accepts, under :func:`line_lock`;
    returns how many lines went (0: the file is left as it is, not rewritten).

    Crash-safe: the kept lines stream (one line in memory at a time) to a temporary file in
    the same directory, flushed and fsynced, then renamed over ``path`` (the old file or the
    new one, never half). A first read-only pass finds whether anything goes at all. Writers
    that use :func:`append_line` wait for the lock; a writer that keeps its own descriptor
    open (the trace writer) is caught up to: bytes it appended while the file was read are
    filtered and copied too before the rename, and it reopens the path when the inode
    changes. A last line without its newline (being written) is kept as it is.
    """
    path = Path(path)
    if not path.is_file():
        return 0
    with line_lock(path):
        if not any(not keep(raw) for raw in _complete_lines(path)):
            return 0  # nothing to drop: the file is not rewritten
        removed = 0
        done = 0
        with _replacing(path, mode=path.stat().st_mode & 0o777, durable=durable) as out:
            for _ in range(20):  # catch up with descriptor-holding writers; then copy as is
                with open(path, "rb") as src:
                    src.seek(done)
                    for raw in src:
                        if not raw.endswith(b"\n"):
                            break  # a line being written: taken on the next pass
                        done += len(raw)
                        if keep(raw):
                            out.write(raw)
                        else:
                            removed += 1
                if os.path.getsize(path) == done:
                    break
            with open(path, "rb") as src:
                src.seek(done)
                shutil.copyfileobj(src, out)  # a torn last line, or what a writer still adds
    return removed


def _complete_lines(path: Path) -> Iterator[bytes]:
    with open(path, "rb") as src:
        for raw in src:
            if raw.endswith(b"\n"):
                yield raw
