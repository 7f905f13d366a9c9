"""The queue's decisions (`engine/queueing.py`) as tables: two users' queues announcing starts
on one host (`yields`: of two intents for the same room at most one goes, in every order of
their writes and reads; room enough for both lets both go), and one look of the queue
(`decide`: concurrent submits, a frozen claimant, a foreign GPU process, a run too big)."""

from __future__ import annotations

import pytest

from tfctl.engine.placement import Offer, Taken, TaskAsk
from tfctl.engine.queueing import Intent, Queued, decide, yields

HOST = Offer("gpu1", (0, 1), cpus=8, tasks=4)


def intent(run: str, written: float, gpus: tuple[int, ...] = (), cpus: int = 0) -> Intent:
    return Intent(run, written, frozenset(gpus), cpus, 1)


CASES = [
    # (a written first, b written second, what the host has taken, which may go)
    ("one GPU, both want it", intent("a", 1.0, (0,)), intent("b", 2.0, (0,)), Taken(), {"a"}),
    ("different GPUs", intent("a", 1.0, (0,)), intent("b", 2.0, (1,)), Taken(), {"a", "b"}),
    ("the GPU claimed meanwhile", intent("a", 1.0, (0,)), intent("b", 2.0, (1,)), Taken(frozenset({0})), {"b"}),
    ("cores for one of them", intent("a", 1.0, cpus=5), intent("b", 2.0, cpus=5), Taken(), {"a"}),
    ("cores for both", intent("a", 1.0, cpus=4), intent("b", 2.0, cpus=4), Taken(), {"a", "b"}),
    ("cores held by a third", intent("a", 1.0, cpus=2), intent("b", 2.0, cpus=2), Taken(cpus=5), {"a"}),
    ("task slots", intent("a", 1.0), intent("b", 2.0), Taken(tasks=3), {"a"}),
    ("written in the same instant", intent("a", 1.0, (0,)), intent("b", 1.0, (0,)), Taken(), {"a", "b"}),
]


@pytest.mark.parametrize("a, b, taken, may_go", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_of_two_intents_for_the_same_room_at_most_one_goes_whatever_each_saw(
    a: Intent, b: Intent, taken: Taken, may_go: set[str]
) -> None:
    # Each side writes, then reads: b (written second) always sees a; a sees b only if it read
    # after b's write (in the same instant, each may have read before the other's write).
    for a_saw_b in (False, True):
        b_saw_a = True if a.written < b.written else not a_saw_b
        seen = {"a": [b] if a_saw_b else [], "b": [a] if b_saw_a else []}
        went = {i.run_id for i in (a, b) if not yields(i, seen[i.run_id], HOST, taken)}
        assert went <= may_go, (a_saw_b, went)
        if a.gpus & b.gpus or not (a.gpus or b.gpus) and len(may_go) < 2:
            assert len(went) <= 1, (a_saw_b, went)  # never both on room for one
        else:
            assert went == may_go


def test_an_intent_never_waits_for_itself_or_for_one_written_after_it() -> None:
    mine = intent("a", 1.0, (0,))
    assert not yields(mine, [mine, intent("b", 5.0, (0,))], HOST, Taken())
    assert yields(mine, [intent("c", 0.5, (0,))], HOST, Taken())


def queued(run: str, at: float, gpus: int = 1, user: str = "ann", priority: int = 0) -> Queued:
    return Queued(run, user, at, (TaskAsk("worker:0", gpus),), priority)


LOOKS = [
    # (what the hosts say is taken, the runs waiting, which start now)
    ("two submits in one look, one GPU free", {"gpu1": Taken(frozenset({0}))}, [queued("a", 1), queued("b", 2)], ["a"]),
    ("a host answers again with a foreign GPU process", {"gpu1": Taken(frozenset({1}))}, [queued("a", 1)], ["a"]),
    ("a frozen claimant still holds its GPUs", {"gpu1": Taken(frozenset({0, 1}))}, [queued("a", 1)], []),
    ("a run too big for the host waits, smaller ones pass", {}, [queued("a", 1, gpus=3), queued("b", 2)], ["b"]),
    ("priority over submission", {"gpu1": Taken(frozenset({0}))}, [queued("a", 1), queued("b", 2, priority=1)], ["b"]),
]


@pytest.mark.parametrize("taken, waiting, started", [c[1:] for c in LOOKS], ids=[c[0] for c in LOOKS])
def test_one_look_of_the_queue(taken: dict[str, Taken], waiting: list[Queued], started: list[str]) -> None:
    decision = decide(waiting, [HOST], taken, {}, now=10.0)
    assert [run for run, _placed in decision.start] == started
    held = [g for _run, placed in decision.start for p in placed for g in p.gpus]
    assert len(held) == len(set(held)) and not set(held) & set(taken.get("gpu1", Taken()).gpus)  # never twice
    assert set(decision.waiting) == {q.run_id for q in waiting} - set(started)
