"""loadtests.machine: the reference workload a campaign times before and after its load."""

from __future__ import annotations

import pytest

from loadtests.machine import _workload, reference_ms


def test_the_reference_is_a_cpu_time_in_milliseconds_of_a_fixed_workload() -> None:
    ms = reference_ms(rounds=2, n=2_000)
    assert isinstance(ms, float) and ms > 0
    # the workload is fixed: the same n does the same work (so runs compare by its time)
    assert (
        _workload(2_000)
        == _workload(2_000)
        == sum(len(f"item-{i}|{i}|{i % 7}") + (i % 11) * (i & 3) for i in range(2_000))
    )


@pytest.mark.parametrize(("rounds", "n"), [(0, 10), (1, 0), (-1, 5)])
def test_nonsense_sizes_are_refused(rounds: int, n: int) -> None:
    with pytest.raises(ValueError, match="rounds and n must be positive"):
        reference_ms(rounds=rounds, n=n)
