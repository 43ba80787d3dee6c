"""loadtests.machine: the reference workload a campaign times before and after its load."""

from __future__ import annotations

import pytest

from loadtests.machine import MAX_IO_SIZE, _round_trips, _workload, reference_io_ms, reference_ms


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


def test_the_io_reference_times_real_round_trips_over_a_socket_pair() -> None:
    ms = reference_io_ms(rounds=2, n=500, size=300)
    assert isinstance(ms, float) and ms > 0
    # every byte sent came back: 2 x n x size moved (a short read is read on, not counted)
    assert _round_trips(500, 300) == 2 * 500 * 300
    assert _round_trips(3, MAX_IO_SIZE) == 2 * 3 * MAX_IO_SIZE  # more than one read's worth


@pytest.mark.parametrize(
    ("rounds", "n", "size"), [(0, 10, 1), (1, 0, 1), (1, 1, 0), (1, 1, MAX_IO_SIZE + 1)]
)
def test_nonsense_io_sizes_are_refused(rounds: int, n: int, size: int) -> None:
    with pytest.raises(ValueError, match=r"size within 1\.\.65536"):
        reference_io_ms(rounds=rounds, n=n, size=size)
