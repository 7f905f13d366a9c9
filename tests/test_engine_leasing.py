"""Renewing a run's lease (`engine/leasing.py`) as a table: at each renewal round, which hosts
are asked, given which answered since and which left the run."""

from __future__ import annotations

import pytest

from tfctl.engine.leasing import Leases

# Rounds of (hosts whose renewal answered before the round, hosts that left the run) -> the hosts
# asked at each round. h1..h3 hold the lease from the start.
ROUNDS = [
    pytest.param([((), ()), (("h1", "h2", "h3"), ())], [["h1", "h2", "h3"]] * 2, id="all answer: all asked again"),
    pytest.param(
        [((), ()), (("h1", "h3"), ()), ((), ()), (("h1", "h2", "h3"), ())],
        [["h1", "h2", "h3"], ["h1", "h3"], [], ["h1", "h2", "h3"]],
        id="a frozen host is skipped while its renewal is under way, the others are not held up",
    ),
    pytest.param(
        [((), ()), (("h1", "h2", "h3"), ("h2",)), (("h1", "h3"), ())],
        [["h1", "h2", "h3"], ["h1", "h3"], ["h1", "h3"]],
        id="a host the run left is renewed no more",
    ),
]


@pytest.mark.parametrize(("rounds", "asked"), ROUNDS)
def test_each_round_asks_the_held_hosts_without_a_renewal_under_way(
    rounds: list[tuple[tuple[str, ...], tuple[str, ...]]], asked: list[list[str]]
) -> None:
    leases = Leases(60.0)
    leases.hold(["h3", "h1", "h2"])
    got = []
    for answered, left in rounds:
        for host in answered:
            leases.answered(host)
        for host in left:
            leases.leave(host)
        got.append(leases.due())
    assert got == asked


def test_six_renewals_per_lease_period() -> None:
    assert Leases(60.0).every == 10.0
