"""The fault-injection series (bench/fault_lab.py) on simulated SSH hosts, in both home modes.

Every fault of FAULTS at least once with own homes, and those whose cleanup reads or writes the
home (SHARED_HOME_FAULTS) with one shared home too, in an order and with timings drawn from a
seed: TFCTL_FAULT_SEED replays a series (the seed is in every failure message); unset, each run
draws a new one. TFCTL_FAULT_CYCLES sets the length (default: each fault once). The long series
with figures is `bench/faults.py`. How a killed ps or worker, a host gone or frozen end the run is
decided by the engine, in tables (tests/test_engine.py, tests/test_decide.py).
"""

from __future__ import annotations

import os
import random

import pytest

from bench.fault_lab import FAULTS, FaultLab, series
from bench.netns_hosts import TestHostLab, require_netns

# The faults whose cleanup goes through files in the home: the watcher's and the supervisor's
# state, a monitor's restart, the log follower's offsets, a full disk.
SHARED_HOME_FAULTS = (
    "kill_attached_up",
    "kill_watcher",
    "kill_worker_with_restart",
    "kill_host_tfctl",
    "link_flap",
    "disk_full",
)

pytestmark = pytest.mark.netns


@pytest.fixture(scope="module", params=["own", "shared"], ids=["own-home", "shared-home"])
def lab(request, tmp_path_factory):
    require_netns()
    workdir = tmp_path_factory.mktemp(f"faults-lab-{request.param}")
    with TestHostLab(
        3, workdir=workdir, prefix="tfctl-f", bridge="tfctlbr8", subnet="10.77.8", shared_home=request.param == "shared"
    ) as lab:
        yield lab


def test_no_fault_leaves_a_process_a_port_or_a_lost_line(lab, tmp_path) -> None:
    faults = SHARED_HOME_FAULTS if lab.shared_home else FAULTS
    seed = int(os.environ.get("TFCTL_FAULT_SEED") or random.SystemRandom().randrange(1 << 32))
    cycles = int(os.environ.get("TFCTL_FAULT_CYCLES") or len(faults))
    results = series(FaultLab(lab, tmp_path), seed, cycles, faults)
    print(f"seed {seed}: " + ", ".join(f"{r.fault} {r.cleanup_seconds:.1f}s" for r in results))
    assert sorted({r.fault for r in results}) == sorted(faults[:cycles] if cycles < len(faults) else faults)
    assert sum(r.lines for r in results) > 0 and all(r.lines_lost == 0 for r in results)
    expected = {
        "kill_attached_up": "stopped",
        "kill_ps": "failed",
        "kill_worker": "failed",
        "kill_worker_with_restart": "succeeded",
        "host_gone": "failed",
        "freeze_host": "succeeded",  # frozen for less than host_timeout: nothing to fail
    }
    for r in results:
        if r.fault in expected:
            assert r.state == expected[r.fault], (seed, r)
