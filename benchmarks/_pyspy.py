"""Where a service worker's CPU goes: a py-spy recording of one process, summarised.

py-spy samples the interpreter's stacks from outside (no instrumentation in the service, so
the figures are the service's own). ``record`` writes the stacks in the collapsed format
(``frame;frame;frame count`` per line, what ``flamegraph.pl`` and speedscope read); the
summary folds them into two tables a person can read without a flame graph viewer: self
samples by package (where the leaf frames are) and inclusive samples of the project's own
functions (what each one costs with everything it calls).
"""

from __future__ import annotations

import collections
import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

__all__ = ["FrameSummary", "available", "record", "summarise"]

#: ``name (path/to/file.py:LINE)`` as py-spy prints a frame
_FRAME = re.compile(r"^(?P<fn>.*) \((?P<file>[^()]*?):(?P<line>\d+)\)$")
#: package of a frame's file: the project's own modules by module, the rest by distribution
_OWN = ("context_core/", "context_app/", "loadtests/", "evaluation/")


def available() -> str | None:
    """The py-spy executable (beside this interpreter, as in a venv not on PATH, or on
    PATH), or None when it is not installed."""
    here = Path(sys.executable).parent / "py-spy"
    return str(here) if os.access(here, os.X_OK) else shutil.which("py-spy")


@contextlib.contextmanager
def record(pid: int, out: Path, *, rate: int = 100) -> Iterator[Path]:
    """Sample ``pid`` while the block runs; the collapsed stacks are in ``out`` after it."""
    exe = available()
    if exe is None:
        raise RuntimeError("py-spy is not installed: pip install py-spy")
    out.parent.mkdir(parents=True, exist_ok=True)
    proc = subprocess.Popen(
        [exe, "record", "--pid", str(pid), "--rate", str(rate), "--format", "raw",
         "--nonblocking", "--output", str(out)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )  # fmt: skip
    try:
        yield out
    finally:
        proc.send_signal(signal.SIGINT)  # py-spy writes its output on Ctrl-C
        try:
            _, err = proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            _, err = proc.communicate()
        if not out.exists():
            raise RuntimeError(
                f"py-spy wrote no profile of pid {pid}: {err.decode(errors='replace')[-400:]}"
            )


def _package(frame: str) -> str:
    """The project's own code by package (``context_core.routing``, ``context_core.redis``,
    ``context_app.service``; a root module by its name, ``context_core.traces``); anything
    else by the first part of its path as py-spy prints it (``uvicorn``, ``asyncio``,
    ``json``, ``pydantic``)."""
    m = _FRAME.match(frame)
    if m is None:
        return "(native or idle)" if not frame.strip() else frame
    path = m["file"]
    for own in _OWN:
        i = path.find(own)
        if i >= 0:
            return ".".join(path[i:].removesuffix(".py").split("/")[:2])
    if path.startswith("<"):
        return path  # generated code (a dataclass __init__ and the like)
    return path.split("site-packages/", 1)[-1].split("/", 1)[0].removesuffix(".py")


class FrameSummary:
    """Sample counts of one collapsed-stacks file."""

    def __init__(self, path: Path) -> None:
        self.total = 0
        self.self_by_package: collections.Counter[str] = collections.Counter()
        self.inclusive_own: collections.Counter[str] = collections.Counter()
        self.self_by_function: collections.Counter[str] = collections.Counter()
        for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
            stack, _, count = line.rstrip().rpartition(" ")
            if not stack or not count.isdigit():
                continue
            n = int(count)
            frames = stack.split(";")
            self.total += n
            leaf = frames[-1]
            self.self_by_package[_package(leaf)] += n
            self.self_by_function[_short(leaf)] += n
            for f in {_short(f) for f in frames if any(o in f for o in _OWN)}:
                self.inclusive_own[f] += n

    def share(self, n: int) -> float:
        return n / self.total if self.total else 0.0


def _short(frame: str) -> str:
    m = _FRAME.match(frame)
    if m is None:
        return frame.strip() or "(native or idle)"
    path = m["file"]
    for own in _OWN:
        i = path.find(own)
        if i >= 0:
            path = path[i:]
            break
    else:
        path = path.split("site-packages/", 1)[-1]
    return f"{m['fn']} ({path})"


def summarise(path: Path, top: int = 12) -> dict[str, list[tuple[str, float]]]:
    """``{"self_by_package", "self_by_function", "inclusive_own"}``: the ``top`` entries
    of each as (name, share of all samples), largest first; ``"samples"`` gives the total."""
    s = FrameSummary(path)
    return {
        "samples": [("samples", float(s.total))],
        "self_by_package": [(k, s.share(v)) for k, v in s.self_by_package.most_common(top)],
        "self_by_function": [(k, s.share(v)) for k, v in s.self_by_function.most_common(top)],
        "inclusive_own": [(k, s.share(v)) for k, v in s.inclusive_own.most_common(top)],
    }
