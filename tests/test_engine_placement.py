"""Placement on a pool and the queue's order, as tables on a fake clock."""

from __future__ import annotations

import pytest

from tfctl.engine.placement import PS_APART, NoRoom, Offer, Placed, Taken, TaskAsk, never_fits, place
from tfctl.engine.queueing import PATIENCE, Queued, Share, decide, order

G4 = Offer("g4", gpus=(0, 1, 2, 3), cpus=16)
G2 = Offer("g2", gpus=(0, 1), cpus=8)
CPU = Offer("cpu", cpus=4, tasks=2)
POOL = (G4, G2, CPU)


def run(*jobs: tuple[str, int, int, int]) -> tuple[TaskAsk, ...]:
    """(job, count, gpus, cpus) -> the run's task asks, in task order."""
    return tuple(TaskAsk(f"{job}:{i}", gpus, cpus) for job, count, gpus, cpus in jobs for i in range(count))


def where(placed: object) -> dict[str, tuple[str, tuple[int, ...]]]:
    assert not isinstance(placed, NoRoom), placed
    return {p.task: (p.host, p.gpus) for p in placed}  # type: ignore[attr-defined]


PLACEMENTS = [
    (
        "a job that fits one host goes where it fills best",
        run(("worker", 2, 1, 0)),
        {},
        "together",
        {"worker:0": ("g2", (0,)), "worker:1": ("g2", (1,))},
    ),
    (
        "the next job joins a host the run uses",
        run(("ps", 1, 0, 1), ("worker", 2, 1, 1)),
        {},
        "together",
        {"ps:0": ("cpu", ()), "worker:0": ("g2", (0,)), "worker:1": ("g2", (1,))},
    ),
    (
        "a job too big for one host is spread, the fullest fit first",
        run(("worker", 3, 2, 0)),
        {},
        "together",
        {"worker:0": ("g2", (0, 1)), "worker:1": ("g4", (0, 1)), "worker:2": ("g4", (2, 3))},
    ),
    (
        "GPUs held by claims or by another's process are skipped, by index",
        run(("worker", 2, 1, 0)),
        {"g2": Taken(frozenset({0, 1})), "g4": Taken(frozenset({1}))},
        "together",
        {"worker:0": ("g4", (0,)), "worker:1": ("g4", (2,))},
    ),
    (
        "ps_apart keeps the ps off the workers' hosts",
        run(("ps", 1, 0, 0), ("worker", 2, 1, 0)),
        {"cpu": Taken(tasks=2)},
        PS_APART,
        {"ps:0": ("g2", ()), "worker:0": ("g4", (0,)), "worker:1": ("g4", (1,))},
    ),
    (
        "a host's task limit counts every run's tasks",
        run(("ps", 2, 0, 1)),
        {"cpu": Taken(cpus=1, tasks=1)},
        "together",
        {"ps:0": ("g2", ()), "ps:1": ("g2", ())},
    ),
]


@pytest.mark.parametrize("asks, taken, how, expected", [p[1:] for p in PLACEMENTS], ids=[p[0] for p in PLACEMENTS])
def test_placement(asks: tuple[TaskAsk, ...], taken: dict[str, Taken], how: str, expected: dict[str, object]) -> None:
    placed = place(asks, POOL, taken, how)
    assert where(placed) == expected
    assert [p.task for p in placed] == [a.task for a in asks]  # type: ignore[union-attr]


NO_ROOM = [
    (
        "GPUs",
        run(("worker", 1, 2, 0)),
        {"g4": Taken(frozenset({0, 1, 2})), "g2": Taken(frozenset({0}))},
        "together",
        "worker:0 needs 2 GPUs on one host; the most free on any host is 1",
    ),
    (
        "cores",
        run(("worker", 1, 0, 12)),
        {"g4": Taken(cpus=8)},
        "together",
        "worker:0 needs 12 CPU cores on one host; the most free on any host is 8",
    ),
    (
        "ps apart",
        run(("ps", 1, 0, 0), ("worker", 3, 2, 0)),
        {"cpu": Taken(tasks=2)},
        PS_APART,
        "worker:2 needs 2 GPUs on one host apart from the ps; the most free on any host is 0",
    ),
]


@pytest.mark.parametrize("asks, taken, how, why", [n[1:] for n in NO_ROOM], ids=[n[0] for n in NO_ROOM])
def test_a_run_that_does_not_fit_says_why(
    asks: tuple[TaskAsk, ...], taken: dict[str, Taken], how: str, why: str
) -> None:
    assert place(asks, POOL, taken, how) == NoRoom(why)
    assert never_fits(asks, POOL, how) is None  # it fits an empty pool: it waits, it is not refused


def test_a_run_too_big_for_the_pool_is_refused_with_the_reason() -> None:
    assert never_fits(run(("worker", 1, 8, 0)), POOL) == NoRoom(
        "worker:0 needs 8 GPUs on one host; the most free on any host is 4"
    )
    assert never_fits(run(("worker", 4, 2, 0)), POOL) is not None
    assert never_fits(run(("worker", 3, 2, 0)), POOL) is None


def q(run_id: str, user: str, at: float, gpus: int = 1, priority: int = 0) -> Queued:
    return Queued(run_id, user, at, run(("worker", 1, gpus, 0)), priority)


def started(decision: object) -> list[str]:
    return [run_id for run_id, _placed in decision.start]  # type: ignore[attr-defined]


def test_one_look_never_hands_a_gpu_out_twice() -> None:
    decision = decide([q(f"r{i}", "ann", float(i)) for i in range(8)], POOL, {}, {}, now=10.0)
    gpus = [(p.host, g) for _r, placed in decision.start for p in placed for g in p.gpus]
    assert len(gpus) == len(set(gpus)) == 6 and len(decision.start) == 6
    assert set(decision.waiting) == {"r6", "r7"}
    assert decision.waiting["r6"] == "worker:0 needs 1 GPU on one host; the most free on any host is 0"


QUEUE = [
    (
        "priority, then submission order",
        [q("a", "ann", 1.0), q("b", "ann", 2.0, priority=5), q("c", "ann", 0.5)],
        {},
        ["b", "c", "a"],
    ),
    (
        "the user holding least goes first",
        [q("a1", "ann", 1.0), q("a2", "ann", 2.0), q("b1", "bob", 3.0)],
        {"ann": Share(gpus=1, tasks=1)},
        ["b1", "a1", "a2"],
    ),
]


@pytest.mark.parametrize("queued, shares, expected", [c[1:] for c in QUEUE], ids=[c[0] for c in QUEUE])
def test_queue_order(queued: list[Queued], shares: dict[str, Share], expected: list[str]) -> None:
    assert [r.run_id for r in order(queued, shares)] == expected


def test_two_users_waiting_share_the_pool_instead_of_first_come_taking_all() -> None:
    queued = [q(f"a{i}", "ann", float(i)) for i in range(6)] + [q(f"b{i}", "bob", 10.0 + i) for i in range(6)]
    decision = decide(queued, (G4,), {}, {}, now=20.0)
    assert started(decision) == ["a0", "b0", "a1", "b1"]
    assert decision.position["a0"] == 1 and decision.position["b0"] == 7  # its place before anything started


def test_a_big_run_lets_small_ones_pass_until_it_waited_its_patience() -> None:
    big, small = q("big", "ann", 0.0, gpus=4), q("small", "bob", 1.0, gpus=1)
    taken = {"g4": Taken(frozenset({3})), "g2": Taken(frozenset({0, 1}))}
    early = decide([big, small], POOL, taken, {}, now=PATIENCE - 1)
    assert started(early) == ["small"] and "needs 4 GPUs" in early.waiting["big"]
    late = decide([big, small], POOL, taken, {}, now=PATIENCE)
    assert started(late) == [] and late.waiting["small"] == "behind a run that has waited longest for room"


def test_placed_tasks_name_the_gpus_to_claim() -> None:
    placed = place(run(("worker", 1, 2, 3)), (G4,), {"g4": Taken(frozenset({0}), cpus=1, tasks=1)})
    assert placed == (Placed("worker:0", "g4", (1, 2), 3),)
