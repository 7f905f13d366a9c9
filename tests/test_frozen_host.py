"""Gray failures in the controller: a host that hangs without dying holds nobody hostage.

A frozen host (every process SIGSTOPped: a paused VM, a hung NFS server) accepts connections and
answers nothing. These tests freeze a fake host's answers; `test_ssh_cluster` freezes a real one.
"""

from __future__ import annotations

import contextlib
import re
import threading
import time
from typing import Any, Iterator

import pytest

from tests.fakes import FakeHost, Journal, fake_hosts, record_of
from tfctl.cluster.agent import HostAgent
from tfctl.cluster.cluster import Cluster, Deadlines
from tfctl.cluster.control import supervise
from tfctl.cluster.group import fan_out
from tfctl.engine.reconcile import Rules
from tfctl.errors import HostError
from tfctl.supervisor import protocol as p
from tfctl.supervisor.protocol import RunState

TASKS = {"ps:0": "h0", "worker:0": "h1", "worker:1": "h2", "worker:2": "h3"}


class UnusedTransport:
    """A transport a test's agent never uses: it is asked for its turn only."""

    host = "tfh3"
    is_local = False

    def close(self) -> None:
        pass


def freeze(host: FakeHost, thaw: threading.Event) -> None:
    """Every request to `host` hangs until `thaw` (or 30 s), as one to a SIGSTOPped host does."""

    def hang(_request: p.Request[Any]) -> None:
        thaw.wait(30)

    host.before = hang


@contextlib.contextmanager
def frozen_h3(deadlines: Deadlines) -> Iterator[tuple[Cluster, dict[str, FakeHost], Journal]]:
    """The run of TASKS started on fake hosts, h3 then frozen; thawed and closed afterwards."""
    record = record_of(TASKS)
    journal = Journal()
    hosts = fake_hosts(record, journal)
    cluster = Cluster(record, dict(hosts), deadlines=deadlines)  # type: ignore[arg-type]
    thaw = threading.Event()
    try:
        cluster.start_tasks(record.tasks)
        freeze(hosts["h3"], thaw)
        yield cluster, hosts, journal
    finally:
        thaw.set()
        cluster.close()


def test_a_fan_out_with_a_deadline_does_not_wait_for_the_host_that_hangs() -> None:
    thaw = threading.Event()

    def call(host: str) -> str:
        if host == "frozen":
            thaw.wait(30)
        return host.upper()

    began = time.monotonic()
    result = fan_out(["a", "frozen", "b"], lambda h: h, call, deadline=0.3)
    took = time.monotonic() - began
    thaw.set()
    assert result.succeeded == {"a": "A", "b": "B"}
    assert isinstance(result.failed["frozen"], HostError) and "no answer within 0.3s" in str(result.failed["frozen"])
    assert 0.3 <= took < 2, took


def test_every_answering_host_keeps_its_lease_while_one_is_frozen() -> None:
    record = record_of(TASKS).replace(lease_timeout=0.6)  # renewed every 0.1 s
    journal = Journal()
    hosts = fake_hosts(record, journal)
    cluster = Cluster(record, dict(hosts), holds_lease=True)  # type: ignore[arg-type]
    thaw = threading.Event()
    try:
        cluster.start_tasks(record.tasks)
        freeze(hosts["h3"], thaw)
        time.sleep(1.5)  # deliberately: renewals are counted over a time 2.5 leases long
        renewals = [h for h, verb, _ in journal.entries if verb == "status"]
    finally:
        thaw.set()
        cluster.close()
    for host in ("h0", "h1", "h2"):
        assert renewals.count(host) >= 8, (host, renewals.count(host))  # ~14 at one per 0.1 s: never held up
    assert renewals.count("h3") <= 2  # one renewal under way on the frozen host, not one per period


def test_a_request_behind_one_that_waits_on_a_frozen_host_fails_at_once() -> None:
    host = HostAgent(UnusedTransport(), None, "/nonexistent", busy_patience=0.2)  # type: ignore[arg-type]
    with host._turn("status", 30):
        time.sleep(0.3)  # deliberately: the request holding the conversation is now late
        began = time.monotonic()
        with pytest.raises(HostError, match=r"tfh3: no answer: its answer to an earlier request is \d+s late"):
            with host._turn("status", 30):
                pass
        assert time.monotonic() - began < 0.1
    with host._turn("status", 30):  # the conversation free again: asked as ever
        pass


def test_a_run_with_a_frozen_host_fails_naming_that_host_and_since_when() -> None:
    with frozen_h3(Deadlines(status=0.1)) as (cluster, _hosts, _journal):
        began = time.monotonic()
        outcome = supervise(cluster, Rules(cluster.record.decisive, cluster.record.essential, 0.5))
        took = time.monotonic() - began
        statuses, unreachable = cluster.status()
    assert outcome.state is RunState.FAILED and took < 3, (outcome, took)
    assert re.fullmatch(
        r"lost contact with h3 since \d\d:\d\d:\d\d \(0.5s, host_timeout\): h3: no answer within 0.1s", outcome.reason
    ), outcome.reason
    assert set(unreachable) == {"h3"} and {s.task for s in statuses if s.state.value == "running"} == {
        "ps:0",
        "worker:0",
        "worker:1",
    }  # the others ran on, unhurt


def test_stop_proves_the_answering_hosts_clean_and_names_the_frozen_one() -> None:
    with frozen_h3(Deadlines(stop=0.2)) as (cluster, hosts, _journal):
        began = time.monotonic()
        report = cluster.stop(grace=0)
        took = time.monotonic() - began
    assert took < 2 and report.processes == 3 and report.unreachable == {"h3": "h3: no answer within 0.2s"}
    assert not report.clean
    assert all(hosts[h].tasks[t].state.value == "stopped" for t, h in TASKS.items() if h != "h3")


def test_the_final_stop_asks_a_host_judged_lost_but_does_not_wait_for_it() -> None:
    """A run failed because h3 froze: its end is not held for the grace period and the stop's
    deadline (32 s) by h3, but only `silent_stop`; the answering hosts are stopped as ever."""
    with frozen_h3(Deadlines(silent_stop=0.2)) as (cluster, _hosts, journal):
        began = time.monotonic()
        report = cluster.stop(grace=2, silent=("h3",))
        took = time.monotonic() - began
        asked = len(journal.entries)
        statuses, unreachable = cluster.status(skip_hosts={"h3"})
        status_verbs = [(h, verb) for h, verb, _ in journal.entries[asked:]]
    assert took < 1.5 and report.processes == 3 and report.unreachable == {"h3": "h3: no answer within 0.2s"}
    assert ("h3", "stop") in [(h, verb) for h, verb, _ in journal.entries]  # asked all the same
    # The last look skips it: its tasks unreachable, no request sent its way to wait on.
    assert unreachable == {} and "h3" not in {h for h, _ in status_verbs}
    assert {s.task: s.state.value for s in statuses}["worker:2"] == "unreachable"
