"""Between-graph TF1 SGD in the shape of the public Hogwild examples, for the real-TF tests.

Every worker builds its own graph from TF_CONFIG and runs a `tf.compat.v1.train.Supervisor`
(is_chief for worker 0). With `--place own` each worker puts its variables on its own task
(`tf.device("/job:worker/task:N")`): only the chief's init op runs, on the chief's graph, so a
non-chief's variables are never initialised and it waits for ever, saying so every
`--recovery_wait` seconds. With `--place chief` (or `ps`) they live on worker 0 (ps 0), the
chief initialises them, and every worker trains.
`--print arrays` prints the weights as a bare array (a format no built-in pattern reads),
`--print steps` prints `step N loss L`. `--log_level default` keeps TF's own level (WARN), so a
non-chief's wait says nothing at all. The chief's Supervisor logs `global_step/sec: R` every
`--summaries_secs` (the first, at its start, says 0), as its step counter does.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time

import tensorflow as tf


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--place", choices=("own", "chief", "ps"), default="own")
    p.add_argument("--print", dest="shape", choices=("arrays", "steps"), default="arrays")
    p.add_argument("--chief_print", choices=("arrays", "steps"), help="the chief's --print, if another")
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--every", type=int, default=20, help="print every this many steps")
    p.add_argument("--pause", type=float, default=0.0, help="seconds between steps (a longer run)")
    p.add_argument("--summaries_secs", type=float, default=120.0, help="0: no global_step/sec lines")
    p.add_argument("--recovery_wait", type=float, default=30.0, help="seconds between a non-chief's checks")
    p.add_argument("--log_level", choices=("info", "default"), default="info", help="default: TF's own, WARN")
    a = p.parse_args()
    config = json.loads(os.environ["TF_CONFIG"])
    job, index = config["task"]["type"], int(config["task"]["index"])
    tf.compat.v1.disable_eager_execution()
    if a.log_level == "info":
        tf.compat.v1.logging.set_verbosity(tf.compat.v1.logging.INFO)  # as the examples do: TF's waits show
    cluster = tf.train.ClusterSpec(config["cluster"])
    server = tf.distribute.Server(cluster, job_name=job, task_index=index, start=True)
    if job == "ps":
        server.join()
        return
    where = {"own": f"/job:worker/task:{index}", "chief": "/job:worker/task:0", "ps": "/job:ps/task:0"}[a.place]
    shape = a.chief_print if index == 0 and a.chief_print else a.shape
    with tf.device(where):
        w = tf.compat.v1.get_variable("w", initializer=tf.constant([0.9, 0.1]))
        step = tf.compat.v1.train.get_or_create_global_step()
    with tf.device(f"/job:worker/task:{index}"):
        x = tf.random.uniform([8, 2])
        loss = tf.reduce_mean(tf.square(tf.reduce_sum(x * w, axis=1) - tf.reduce_sum(x, axis=1) / 2))
        train = tf.compat.v1.train.GradientDescentOptimizer(0.1).minimize(loss, global_step=step)
    sv = tf.compat.v1.train.Supervisor(
        is_chief=index == 0,
        logdir=tempfile.mkdtemp(prefix="hogwild-"),
        global_step=step,
        summary_op=None,
        saver=None,
        save_summaries_secs=a.summaries_secs,
        recovery_wait_secs=a.recovery_wait,
    )
    with sv.managed_session(server.target) as sess:
        for _ in range(a.steps):
            _, n, weights = sess.run([train, step, w])
            if n % a.every == 0:
                print(weights if shape == "arrays" else f"step {n} loss {sess.run(loss):.4f}", flush=True)
            time.sleep(a.pause)
    os._exit(0)  # a TF server's threads would keep a normal exit waiting


if __name__ == "__main__":
    main()
