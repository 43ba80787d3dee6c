"""The flame summary of benchmarks/service_capacity: py-spy's collapsed stacks, folded into
self-by-package, self-by-function and the project's inclusive costs."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from benchmarks import _pyspy


def test_summary_counts_leaves_by_package_and_own_functions_inclusively(tmp_path: Path) -> None:
    folded = tmp_path / "p.folded"
    folded.write_text(
        "run (asyncio/runners.py:118);route (context_core/routing/router.py:300);"
        "dumps (json/__init__.py:238) 6\n"
        "run (asyncio/runners.py:118);route (context_core/routing/router.py:301);"
        "round (context_core/redis/loop_client.py:101) 3\n"
        "run (asyncio/runners.py:118);send (uvicorn/protocols/http/httptools_impl.py:524) 1\n"
        "malformed line\n",
        encoding="utf-8",
    )
    s = _pyspy.summarise(folded)
    assert s["samples"] == [("samples", 10.0)]
    assert s["self_by_package"] == [
        ("json", 0.6),
        ("context_core.redis", 0.3),  # the project's own code by package
        ("uvicorn", 0.1),
    ]
    assert s["self_by_function"][0] == ("dumps (json/__init__.py)", 0.6)
    # one route frame per stack whatever its line: 9 of the 10 samples are under it
    inclusive = dict(s["inclusive_own"])
    assert inclusive["route (context_core/routing/router.py)"] == pytest.approx(0.9)
    assert inclusive["round (context_core/redis/loop_client.py)"] == pytest.approx(0.3)


@pytest.mark.skipif(_pyspy.available() is None, reason="py-spy is not installed (dev extra)")
def test_record_samples_a_live_process(tmp_path: Path) -> None:
    busy = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent("""
            import time
            def spin_here():
                end = time.time() + 30
                while time.time() < end:
                    sum(range(1000))
            spin_here()
        """)]
    )  # fmt: skip
    try:
        time.sleep(0.5)
        out = tmp_path / "busy.folded"
        try:
            with _pyspy.record(busy.pid, out, rate=200):
                time.sleep(1.5)
        except RuntimeError as e:  # no ptrace here (a container without CAP_SYS_PTRACE)
            if "Permission" in str(e) or "ptrace" in str(e).lower():
                pytest.skip(f"py-spy cannot attach on this machine: {e}")
            raise
        s = _pyspy.summarise(out)
        assert s["samples"][0][1] > 50
        assert any("spin_here" in name for name, _ in s["self_by_function"] + s["inclusive_own"])
    finally:
        busy.kill()
        busy.wait()
