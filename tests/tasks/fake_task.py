"""A stand-in for a TF task: binds its port like a tf.train.Server, prints, then exits or serves.

Flags: --port P (listen like a server; 0 = no listening; -1 = its own address in TF_CONFIG),
--lines N (print N lines), --sleep S (seconds to run before exiting; -1 = forever, like a ps),
--tick T (print a numbered line every T seconds while it runs), --steps-per-sec R (print
`step N loss ...` R times a second, like a training loop; --steps-for S: only for the first S
seconds, then run on silently), --exit C (exit code), --ignore-term (ignore SIGTERM like an MWMS
worker), --fork K (start K children that sleep in the same group), --setsid-child (start one
child in its own session, escaping the process group), --devices (print what a GPU and CPU
placement gave it: CUDA_VISIBLE_DEVICES, ENV_GPUS and the cores it may run on), --checkpoint
(resume like a template: count on from the step in $TFCTL_RUN_DIR/checkpoints/NAME, one step
per line printed, rewriting that file in place after each; --until N: up to step N in all,
--step-every S: S seconds a step, like training that outlasts its allocation), --busy (spin on a
core instead of sleeping), --hold-mb M (keep M MiB of touched memory), --connect-peers S (once
listening, connect to every other task in TF_CONFIG, retrying for up to S seconds, and print
`connected to N peers`; exit 3 if some never answered), --accuracy A,B,... (once listening,
print `step 10 accuracy A`, `step 20 accuracy B`, ..., a training loop's log of its accuracy).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import time


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--name", default="task")
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--lines", type=int, default=3)
    p.add_argument("--sleep", type=float, default=0)
    p.add_argument("--exit", type=int, default=0)
    p.add_argument("--ignore-term", action="store_true")
    p.add_argument("--fork", type=int, default=0)
    p.add_argument("--setsid-child", action="store_true")
    p.add_argument("--delay-listen", type=float, default=0)
    p.add_argument("--tick", type=float, default=0)
    p.add_argument("--steps-per-sec", type=float, default=0)
    p.add_argument("--steps-for", type=float, default=-1)
    p.add_argument("--devices", action="store_true")
    p.add_argument("--checkpoint", action="store_true")
    p.add_argument("--until", type=int, default=0)
    p.add_argument("--step-every", type=float, default=0)
    p.add_argument("--busy", action="store_true")
    p.add_argument("--hold-mb", type=int, default=0)
    p.add_argument("--connect-peers", type=float, default=0)
    p.add_argument("--accuracy", default="")
    a = p.parse_args()
    held = bytearray(b"x" * (a.hold_mb << 20))  # noqa: F841 - resident until the task ends
    if a.devices:
        with open("/proc/self/status") as f:
            cores = next(line.split(":", 1)[1].strip() for line in f if line.startswith("Cpus_allowed_list:"))
        shown = {"cuda": os.environ.get("CUDA_VISIBLE_DEVICES"), "env_gpus": os.environ.get("ENV_GPUS")}
        print("devices " + json.dumps({**shown, "cores": cores}), flush=True)
    if a.ignore_term:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    children = [subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)"]) for _ in range(a.fork)]
    if a.setsid_child:
        children.append(
            subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)"], start_new_session=True)
        )
    time.sleep(a.delay_listen)
    if a.port < 0:
        tf_config = json.loads(os.environ["TF_CONFIG"])
        me = tf_config["task"]
        a.port = int(tf_config["cluster"][me["type"]][me["index"]].rsplit(":", 1)[1])
    if a.port:
        server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        server.bind(("0.0.0.0", a.port))
        server.listen()
    print(f"{a.name} started pid={os.getpid()} tf_config={os.environ.get('TF_CONFIG', '')}")
    if a.connect_peers:
        peers = connect_peers(a.connect_peers)
        print(f"{a.name} connected to {len(peers)} peers: {' '.join(sorted(peers))}", flush=True)
        if peers != others():
            return 3
    for i, value in enumerate(v for v in a.accuracy.split(",") if v):
        print(f"step {10 * (i + 1)} accuracy {value}", flush=True)
    if a.checkpoint:
        checkpoint(a.name, a.lines, a.until, a.step_every)
    else:
        for i in range(a.lines):
            print(f"{a.name} line {i}")
    end = None if a.sleep < 0 else time.monotonic() + a.sleep
    tick = step = 0
    begun = time.monotonic()
    while end is None or time.monotonic() < end:
        if a.tick:
            print(f"{a.name} tick {tick}", flush=True)
            tick += 1
        if a.steps_per_sec:
            if a.steps_for < 0 or time.monotonic() - begun < a.steps_for:
                print(f"step {step} loss {1.0 / (step + 1):.4f}", flush=True)
                step += 1
            pause(1 / a.steps_per_sec, a.busy)
            continue
        pause(a.tick or (3600 if end is None else max(0.0, end - time.monotonic())), a.busy)
    print(f"{a.name} done, exit {a.exit}")
    return a.exit


def others() -> set[str]:
    """Every other task's address in TF_CONFIG, as a TF server would dial them."""
    tf_config = json.loads(os.environ["TF_CONFIG"])
    me = tf_config["task"]
    mine = tf_config["cluster"][me["type"]][me["index"]]
    return {address for job in tf_config["cluster"].values() for address in job if address != mine}


def connect_peers(patience: float) -> set[str]:
    """The peers that accepted a connection within `patience` seconds (they start meanwhile)."""
    reached: set[str] = set()
    deadline = time.monotonic() + patience
    while reached != others() and time.monotonic() < deadline:
        for address in others() - reached:
            host, _, port = address.rpartition(":")
            try:
                socket.create_connection((host.strip("[]"), int(port)), timeout=1).close()
                reached.add(address)
            except OSError:
                pass
        time.sleep(0.1)
    return reached


def checkpoint(name: str, steps: int, until: int = 0, every: float = 0) -> None:
    saved = os.path.join(os.environ["TFCTL_RUN_DIR"], "checkpoints", name)
    os.makedirs(os.path.dirname(saved), exist_ok=True)
    first = 0
    if os.path.exists(saved):
        with open(saved) as f:
            first = int(f.read())
        print(f"{name} resumed at step {first}", flush=True)
    for step in range(first + 1, (until or first + steps) + 1):
        time.sleep(every)
        with open(saved, "w") as f:  # in place, as programs that write their own index do
            f.write(str(step))
        print(f"{name} checkpoint step {step}", flush=True)


def pause(seconds: float, busy: bool) -> None:
    if not busy:
        time.sleep(seconds)
        return
    until = time.monotonic() + seconds
    while time.monotonic() < until:
        pass


if __name__ == "__main__":
    sys.exit(main())
