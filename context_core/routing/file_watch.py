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
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Final, Generic, Literal, Protocol, TypeVar

__all__ = ["NOT_DUE", "FileKey", "FileWatch", "Keyed", "Reloading", "file_key"]

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


class Keyed(Protocol):
    """A state loaded from a file, with the key of the file it was loaded from."""

    @property
    def key(self) -> object: ...


S = TypeVar("S", bound=Keyed)


class Reloading(Generic[S]):
    """What was loaded from a watched file, loaded again (by ``load``, under ``lock``) when
    the file's key changes; between looks the last state is returned without a lock.

    ``state`` is the current one (``initial`` until the first look finds the file), for a
    loader that wants to know whether this is the first load."""

    __slots__ = ("_load", "_lock", "_watch", "state")

    def __init__(
        self,
        watch: FileWatch,
        load: Callable[[FileKey | None], S],
        initial: S,
        lock: threading.Lock,
    ) -> None:
        self._watch, self._load, self._lock = watch, load, lock
        self.state = initial

    def current(self) -> S:
        snap = self.state
        key = self._watch.look()
        if key == NOT_DUE or key == snap.key:  # not looked at (within the bound) or unchanged
            return snap
        with self._lock:
            if key != self.state.key:
                self.state = self._load(key)
            return self.state
