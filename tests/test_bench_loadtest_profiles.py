"""The profile ladder's control flow and table, on hand-made steps (the campaigns themselves
are covered by tests/test_loadtest_run.py)."""

from __future__ import annotations

import pytest

from benchmarks import loadtest_profiles as lp
from benchmarks.loadtest_profiles import LADDERS, Step, climb, ladder_rows, peak_rps


def _step(scale: float, ok: bool, failed: list[str] | None = None) -> Step:
    gates = {"request_p99": {"achieved": 180.0, "target": "< 100 ms"}}
    return Step(scale, scale * 1000, ok, failed or [], gates, 0.0, 1.0)


def test_climb_retries_a_failure_once_and_stops_at_the_second() -> None:
    seen: list[float] = []
    results = {0.5: [True], 1.0: [False, True], 1.5: [False, False]}  # 1.0: a noisy miss

    def run(scale: float) -> Step:
        seen.append(scale)
        ok = results[scale].pop(0)
        return _step(scale, ok, [] if ok else ["request_p99"])

    lad = climb("short_sessions", (0.5, 1.0, 1.5, 2.0), run)
    assert seen == [0.5, 1.0, 1.0, 1.5, 1.5]  # 2.0 never ran
    assert lad.best is not None and lad.best.scale == 1.0
    assert lad.first_failed is not None and lad.first_failed.scale == 1.5
    row = ladder_rows([lad])[0]
    assert row["best held (peak req/s)"] == "1,000"
    assert row["first failed (peak req/s)"] == "1,500"
    assert row["gates that failed there"] == "request_p99 (180, < 100 ms)"
    assert climb("burst", (0.1,), lambda s: _step(s, False, ["x"]), tries=1).steps[0].scale == 0.1


def test_a_ladder_that_never_holds_or_never_fails_says_so() -> None:
    never = climb("burst", (0.1, 0.2), lambda s: _step(s, False, ["achieved_rate"]))
    assert [s.scale for s in never.steps] == [0.1, 0.1]
    assert never.best is None and ladder_rows([never])[0]["best held (peak req/s)"] == "none"
    always = climb("burst", (0.1, 0.2), lambda s: _step(s, True))
    assert ladder_rows([always])[0]["first failed (peak req/s)"] == "not reached"


def test_peak_rates_follow_the_profiles() -> None:
    assert peak_rps("short_sessions", 1.5, 30.0) == pytest.approx(1500.0)
    assert peak_rps("long_sessions", 1.0, 30.0) == pytest.approx(100.0)
    assert peak_rps("burst", 0.1, 30.0) == pytest.approx(300.0, rel=0.01)
    assert set(LADDERS) == {"short_sessions", "long_sessions", "burst"}


@pytest.mark.slow
def test_one_real_step_and_drill_run_end_to_end(capsys: pytest.CaptureFixture[str]) -> None:
    """The benchmark's own path on real campaigns: one burst step at a rate this machine
    holds, and the slow-l3 drill with its degraded-bundle count (printed, not written)."""
    lp.DRILLS = ("slow-l3",)  # the restart drill is in tests/test_loadtest_run.py's peers
    try:
        rc = lp.main(["--profiles", "burst", "--scales", "0.01", "--duration", "15", "--no-write"])
    finally:
        lp.DRILLS = ("slow-l3", "redis-restart")
    out = capsys.readouterr().out
    assert rc == 0
    assert "burst x0.01 (peak 30 req/s): PASS" in out, out[-2000:]
    assert "| burst | 30 | 0.01 | not reached | - | 0 |" in out, out[-2000:]
    assert "drill slow-l3: PASS" in out, out[-2000:]
