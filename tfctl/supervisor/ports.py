"""Free ports for a run's tasks written without one, picked and held on the host itself.

Only this host knows which of its ports are free, and a port found free is only worth something
if nothing takes it before the task binds it: so the listener that proves a port free keeps it,
until the controller stops it just before starting the tasks (or after `seconds`). Ports are
taken outside the ephemeral range, where the kernel hands out the local ports of outgoing
connections (a TF task's own gRPC clients among them) at any moment.
"""

from __future__ import annotations

import os
import subprocess
import sys
from typing import List, Tuple

from .errors import AgentError
from .procfs import RUN_ENV, STORE_ENV
from .protocol import PickPortsAnswer, PickPortsRequest

EPHEMERAL_RANGE = "/proc/sys/net/ipv4/ip_local_port_range"
LINUX_EPHEMERAL = (32768, 60999)  # the kernel's default, when the file cannot be read
LOWEST = 10000  # below: the well-known and registered ports people write by hand (2222, 8080...)

# argv: seconds, lowest, highest, count, then the ports to avoid. Binds ports from a random
# start in [lowest, highest], listens on each (a bound socket that does not listen does not
# stop another SO_REUSEADDR bind), prints them, and holds them.
HOLDER = """
import random, socket, sys, time
seconds, low, high, count = float(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
avoid = set(int(p) for p in sys.argv[5:])
span, held = high - low + 1, []
start = random.randrange(span)
for i in range(span):
    if len(held) == count:
        break
    port = low + (start + i) % span
    if port in avoid:
        continue
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        s.bind(("0.0.0.0", port))
        s.listen(16)
    except OSError:
        s.close()
        continue
    held.append(s)
if len(held) < count:
    sys.exit("only %d of %d ports between %d and %d are free" % (len(held), count, low, high))
print("ports " + " ".join(str(s.getsockname()[1]) for s in held), flush=True)
time.sleep(seconds)
"""


def ephemeral_range() -> Tuple[int, int]:
    try:
        with open(EPHEMERAL_RANGE) as f:
            low, high = (int(word) for word in f.read().split())
        return low, high
    except (OSError, ValueError):
        return LINUX_EPHEMERAL


def candidates(ephemeral: Tuple[int, int]) -> Tuple[int, int]:
    """The span ports are picked from: below the ephemeral range, else above it."""
    low, high = ephemeral
    if low - LOWEST >= 1000:
        return LOWEST, low - 1
    if 65535 - high >= 1000:
        return high + 1, 65535
    return 1024, 65535  # the whole range is ephemeral: nothing better to do


def pick_ports(root: str, request: PickPortsRequest) -> PickPortsAnswer:
    low, high = candidates(ephemeral_range())
    argv = [str(request.seconds), str(low), str(high), str(request.count)] + [str(p) for p in request.avoid]
    pid, line = hold(HOLDER, argv, request.run_id, request.store, "ports", "cannot pick %d free ports" % request.count)
    return PickPortsAnswer([int(p) for p in line.split()[1:]], pid)


def hold(script: str, argv: List[str], run_id: str, store: str, ready: str, failed: str) -> Tuple[int, str]:
    """Start `script` as a process of the run (marked with it: the run's `stop`, and `down`, end it
    like any of its processes) that holds ports and says so in a first line starting with
    `ready`; its pid and that line. AgentError `failed: <its last error line>` if it could not."""
    env = dict(os.environ)
    env[RUN_ENV] = run_id
    if store:
        env[STORE_ENV] = store
    proc = subprocess.Popen(
        [sys.executable, "-c", script] + argv,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    assert proc.stdout is not None and proc.stderr is not None
    line = proc.stdout.readline().decode()
    if not line.startswith(ready):
        proc.wait()
        reason = (proc.stderr.read().decode(errors="replace").strip().splitlines() or ["?"])[-1]
        raise AgentError("%s: %s" % (failed, reason))
    return proc.pid, line
