"""A TF task that asks a peer nobody serves, so gRPC logs how long it backs off between attempts.

Run with GRPC_TRACE=subchannel and GRPC_VERBOSITY=debug: every refused attempt logs "backing off
for N ms". Its own server is task 0 of `worker` at --own; the peer, task 1, at --peer. It exits 0
after --seconds, whatever the peer did.
"""

from __future__ import annotations

import argparse
import os
import threading
import time

import tensorflow as tf


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--own", required=True)
    p.add_argument("--peer", required=True)
    p.add_argument("--seconds", type=float, default=1.5)
    a = p.parse_args()
    tf.compat.v1.disable_eager_execution()
    cluster = tf.train.ClusterSpec({"worker": [a.own, a.peer]})
    server = tf.distribute.Server(cluster, job_name="worker", task_index=0, start=True)
    with tf.device("/job:worker/task:1"):
        on_peer = tf.constant(1)
    # CreateSession waits for the peer for ever: ask from a thread and leave when time is up.
    session = tf.compat.v1.Session(server.target, graph=on_peer.graph)
    threading.Thread(target=session.run, args=(on_peer,), daemon=True).start()
    time.sleep(a.seconds)
    print("probe done", flush=True)
    os._exit(0)  # a TF server's threads would keep a normal exit waiting


if __name__ == "__main__":
    main()
