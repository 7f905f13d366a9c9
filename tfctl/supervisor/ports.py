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

ROOM = 1000  # ports outside the ephemeral range above LOWEST below which ports under LOWEST are used too

# argv: seconds, count, the spans ("10000-32767,61000-65535"), then the ports to avoid. Binds
# ports from a random start among the spans' ports, listens on each (a bound socket that does
# not listen does not stop another SO_REUSEADDR bind), prints them, and holds them.
HOLDER = """
import random, socket, sys, time
seconds, count, spans = float(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
avoid = set(int(p) for p in sys.argv[4:])
ports = [p for span in spans.split(",") for p in range(int(span.split("-")[0]), int(span.split("-")[1]) + 1)]
held = []
start = random.randrange(len(ports))
for i in range(len(ports)):
    if len(held) == count:
        break
    port = ports[(start + i) % len(ports)]
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
    sys.exit("only %d of %d ports in %s are free" % (len(held), count, spans.replace(",", ", ")))
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


def candidates(ephemeral: Tuple[int, int]) -> List[Tuple[int, int]]:
    """The spans ports are picked from, never inside the ephemeral range: from LOWEST up, and
    from 1024 when there is little room above LOWEST (none at all: an empty list)."""
    low, high = ephemeral
    spans = [(LOWEST, low - 1), (max(high + 1, LOWEST), 65535)]
    if sum(max(0, b - a + 1) for a, b in spans) < ROOM:
        spans = [(1024, min(low, LOWEST) - 1), (max(high + 1, 1024), LOWEST - 1)] + spans
    return [(a, b) for a, b in spans if a <= b]


def pick_ports(root: str, request: PickPortsRequest) -> PickPortsAnswer:
    ephemeral = ephemeral_range()
    spans = candidates(ephemeral)
    failed = "cannot pick %d free ports outside the ephemeral range %d-%d (%s)" % (
        (request.count,) + ephemeral + (EPHEMERAL_RANGE,)
    )
    if not spans:
        raise AgentError("%s: it leaves no port above 1024 outside it" % failed)
    argv = [str(request.seconds), str(request.count), ",".join("%d-%d" % span for span in spans)]
    pid, line = hold(HOLDER, argv + [str(p) for p in request.avoid], request.run_id, request.store, "ports", failed)
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
    # Closed here, whatever happens: a file object left open would be closed when collected, and
    # collected maybe in a monitor forked later, where its number names another file by then
    # (a container task's FIFO, which its tether then took for its monitor's death).
    with proc.stdout, proc.stderr:
        line = proc.stdout.readline().decode()
        if not line.startswith(ready):
            proc.wait()
            reason = (proc.stderr.read().decode(errors="replace").strip().splitlines() or ["?"])[-1]
            raise AgentError("%s: %s" % (failed, reason))
    return proc.pid, line
