"""A file looked at no more often than a bound: what the router's policy files share.

The thresholds file, the relevance model and the shadow marker can each be replaced while
the service runs (a promote, a rollback, a shadow start). A route reads the one in force; it
must not ``stat`` three files on every call, nor miss a change for long. :class:`FileWatch`
answers "has it changed?" with at most one ``os.stat`` per ``recheck_s`` seconds (0: on
every call) and says :data:`NOT_DUE` in between, so its callers keep what they loaded.
A file is identified by modification time, size and inode: a rename over it (how the
calibration tools write) changes the inode even within one timestamp tick.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Final, Literal

__all__ = ["NOT_DUE", "FileKey", "FileWatch", "file_key"]

FileKey = tuple[int, int, int]
"""``(st_mtime_ns, st_size, st_ino)`` of a file."""

NOT_DUE: Final = "not due"
""":meth:`FileWatch.look` within the bound: the file was not looked at."""


def file_key(path: Path | str) -> FileKey | None:
    """The file's identity now; None when there is no file (or it cannot be stat-ed)."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_mtime_ns, st.st_size, st.st_ino)


class FileWatch:
    """One file, stat-ed at most once per ``recheck_s`` seconds of ``clock`` (monotonic,
    injectable for tests). Not locked: two threads may both look at the same moment, which
    costs one extra ``stat`` and changes nothing (callers compare keys under their own lock
    before they reload)."""

    __slots__ = ("_clock", "_last", "path", "recheck_s")

    def __init__(
        self,
        path: Path | str,
        recheck_s: float,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.path = Path(path)
        self.recheck_s = float(recheck_s)
        self._clock = clock
        self._last = -math.inf  # clock seconds of the last look; -inf: never

    def look(self) -> FileKey | Literal["not due"] | None:
        """The file's key (None: no file) when the last look is ``recheck_s`` or more ago,
        else :data:`NOT_DUE`."""
        now = self._clock()
        if now - self._last < self.recheck_s:
            return NOT_DUE
        key = file_key(self.path)
        self._last = now
        return key
