"""The same model trained asynchronously or synchronously on the same 1 ps + 2 worker cluster.

    python train.py --mode async ...   # every worker applies its own updates as soon as it has them
    python train.py --mode sync  ...   # SyncReplicasOptimizer: one averaged update per global step

Everything else is identical: a one-hidden-layer MLP on scikit-learn's bundled `load_digits`
(nothing is downloaded), each worker training on its own half, batch 100 per worker, plain SGD,
variables on the ps (replica_device_setter), device filters, chief = worker 0.

A global step means different amounts of work in the two modes:
- async: one update computed from ONE worker's batch (100 examples);
- sync:  one update averaged over ALL workers' batches (2 x 100 examples).
The defaults give both the same number of examples: async 600 steps, sync 300 steps.

The chief prints one summary line, which compare.sh parses:
    final step 300 loss 0.14 accuracy 0.9611 time 7.1s steps/s 41.7 checkpoint DIR mode sync examples/s 8340.0

See templates/between-graph-async and templates/between-graph-sync for the commented versions
(the sync end-of-run handling -- stop_grace_period_secs, the token-queue watchdog -- is the same).

Security: TF gRPC servers are unauthenticated and bind *:PORT. Trusted networks only.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from pathlib import Path

import numpy as np
import tensorflow.compat.v1 as tf

tf.disable_v2_behavior()

# Do NOT set TF_CPP_MIN_LOG_LEVEL: TF's INFO lines are how a hang is diagnosed, e.g.
#   master.cc:...] CreateSession still waiting for response from worker: /job:ps/replica:0/task:0
# which TF 2.21 logs every 10 s, forever (there is no timeout), while a task it needs is missing.

LOG_EVERY = 50  # local steps between progress lines
POLL_SECS = 0.5  # how often a non-chief looks whether the chief has initialised the variables
# How long MonitoredTrainingSession waits for the chief queue runner thread when it closes. The
# thread is then blocked for good (waiting for gradients of a step nobody computes), so every
# second of this is wasted; TF's default is 120 s.
STOP_GRACE_SECS = 1
# A non-chief still inside a train step this long after the global step reached the target closes
# the sync token queue (see the module docstring).
WATCHDOG_SECS = 3.0


def log(message: str) -> None:
    """One write per line, flushed at once: tfctl's logs stay live and lines from threads never mix."""
    sys.stdout.write(message + "\n")
    sys.stdout.flush()


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--job_name", choices=["ps", "worker"], help="default: from TF_CONFIG")
    p.add_argument("--task_index", type=int, help="default: from TF_CONFIG")
    p.add_argument("--ps_hosts", help="comma-separated host:port list (default: from TF_CONFIG)")
    p.add_argument("--worker_hosts", help="comma-separated host:port list (default: from TF_CONFIG)")
    p.add_argument("--mode", choices=["async", "sync"], required=True)
    p.add_argument("--train_steps", type=int, default=None,
                   help="global steps (default: 600 async, 300 sync: the same number of examples)")
    p.add_argument("--batch_size", type=int, default=100)
    p.add_argument("--learning_rate", type=float, default=0.2)
    p.add_argument("--data_dir", default=None, help="directory holding a Keras-style mnist.npz")
    p.add_argument("--checkpoint_dir", default=None,
                   help="where the chief saves (and resumes from) checkpoints; default "
                        "$TFCTL_RUN_DIR/checkpoints (the run's own directory), so a new run never resumes an old one")
    p.add_argument("--ready_timeout", type=float, default=120.0,
                   help="seconds a non-chief waits for the chief to initialise the variables")
    args = p.parse_args(argv)
    fill_from_tf_config(args)
    if args.train_steps is None:
        args.train_steps = 600 if args.mode == "async" else 300
    if args.checkpoint_dir is None:  # outside tfctl: a fresh directory here
        run_dir = os.environ.get("TFCTL_RUN_DIR") or time.strftime("manual-%Y%m%d-%H%M%S")
        args.checkpoint_dir = os.path.join(run_dir, "checkpoints")
    return args


def fill_from_tf_config(args: argparse.Namespace) -> None:
    """Take whatever the flags did not give from TF_CONFIG (as set by tfctl)."""
    if args.job_name and args.task_index is not None and args.ps_hosts and args.worker_hosts:
        return
    raw = os.environ.get("TF_CONFIG")
    if not raw:
        sys.exit("error: give --job_name --task_index --ps_hosts --worker_hosts, or set TF_CONFIG")
    conf = json.loads(raw)
    cluster, task = conf.get("cluster", {}), conf.get("task", {})
    args.job_name = args.job_name or task.get("type")
    args.task_index = args.task_index if args.task_index is not None else int(task.get("index", 0))
    args.ps_hosts = args.ps_hosts or ",".join(cluster.get("ps", []))
    args.worker_hosts = args.worker_hosts or ",".join(cluster.get("worker", []))
    if args.job_name not in ("ps", "worker") or not args.ps_hosts or not args.worker_hosts:
        sys.exit(f"error: this script needs a ps and a worker job, got TF_CONFIG {raw}")


def load_data(data_dir: str | None):
    """Flattened float32 images in [0, 1], int64 labels, and a description. Never downloads."""
    candidates = [Path(data_dir).expanduser() / "mnist.npz"] if data_dir else []
    candidates.append(Path.home() / ".keras" / "datasets" / "mnist.npz")
    for path in candidates:
        if path.is_file():
            with np.load(path) as d:
                xtr, ytr, xte, yte = (d[k] for k in ("x_train", "y_train", "x_test", "y_test"))
            return (xtr.reshape(len(xtr), -1).astype(np.float32) / 255.0, ytr.astype(np.int64),
                    xte.reshape(len(xte), -1).astype(np.float32) / 255.0, yte.astype(np.int64),
                    f"MNIST from {path}")
    from sklearn.datasets import load_digits

    digits = load_digits()
    x = digits.data.astype(np.float32) / 16.0
    y = digits.target.astype(np.int64)
    # The same permutation on every task: the test split never overlaps a training shard.
    order = np.random.RandomState(0).permutation(len(x))
    test, train = order[: len(x) // 5], order[len(x) // 5:]
    return x[train], y[train], x[test], y[test], f"sklearn load_digits ({len(x)} images 8x8, no mnist.npz found)"


def batches(x, y, batch_size: int, seed: int):
    """Shuffled mini-batches forever: training is bounded by the global step, not by epochs."""
    rng = np.random.RandomState(seed)
    batch_size = min(batch_size, len(x))
    while True:
        order = rng.permutation(len(x))
        for start in range(0, len(order) - batch_size + 1, batch_size):
            idx = order[start:start + batch_size]
            yield x[idx], y[idx]


def build_model(n_inputs: int, n_classes: int, learning_rate: float, num_workers: int, sync: bool) -> dict:
    """One-hidden-layer MLP; variables go wherever the enclosing device scope puts them."""
    hidden = 128
    x = tf.placeholder(tf.float32, [None, n_inputs], name="x")
    y = tf.placeholder(tf.int64, [None], name="y")
    global_step = tf.train.get_or_create_global_step()
    init = tf.glorot_uniform_initializer()
    w1 = tf.get_variable("w1", [n_inputs, hidden], initializer=init)
    b1 = tf.get_variable("b1", [hidden], initializer=tf.zeros_initializer())
    w2 = tf.get_variable("w2", [hidden, n_classes], initializer=init)
    b2 = tf.get_variable("b2", [n_classes], initializer=tf.zeros_initializer())
    logits = tf.matmul(tf.nn.relu(tf.matmul(x, w1) + b1), w2) + b2
    loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y, logits=logits))
    accuracy = tf.reduce_mean(tf.cast(tf.equal(tf.argmax(logits, 1), y), tf.float32))
    # Start barrier, so both modes are timed with every worker present (tfctl starts the other
    # workers only once the chief listens; an async chief would otherwise train alone at first).
    workers_ready = tf.get_variable("workers_ready", [], tf.int32, tf.zeros_initializer(), trainable=False)
    barrier = {"workers_ready": workers_ready, "mark_ready": workers_ready.assign_add(1)}
    sgd = tf.train.GradientDescentOptimizer(learning_rate)
    if not sync:
        # Asynchronous: each worker's update is applied to the ps variables as soon as it arrives.
        train_op = sgd.minimize(loss, global_step=global_step)
        return {"x": x, "y": y, "global_step": global_step, "loss": loss, "accuracy": accuracy,
                "train_op": train_op, "opt": None, **barrier}
    # Synchronous: the chief's queue runner averages one gradient per worker, applies it once and
    # hands every worker a token for the next step.
    opt = tf.train.SyncReplicasOptimizer(sgd, replicas_to_aggregate=num_workers, total_num_replicas=num_workers)
    train_op = opt.minimize(loss, global_step=global_step)
    getattr(opt.ready_for_local_init_op, "mark_used", lambda: None)()
    return {"x": x, "y": y, "global_step": global_step, "loss": loss, "accuracy": accuracy, "train_op": train_op,
            "opt": opt, **barrier}


def wait_for_chief(target: str, config, global_step, timeout: float) -> int | None:
    """Block until the chief has initialised the variables; return the global step (None: timeout).

    A non-chief MonitoredTrainingSession that starts before the chief has initialised the
    variables logs "Waiting for model to be ready" and sleeps 30 s before it looks again (TF 2.21).
    Polling every POLL_SECS starts this worker within half a second of the chief instead.
    """
    uninitialized = tf.report_uninitialized_variables(tf.global_variables())
    deadline = time.monotonic() + timeout
    with tf.Session(target, config=config) as sess:
        announced = False
        while len(sess.run(uninitialized)) > 0:
            if time.monotonic() > deadline:
                return None
            if not announced:
                log("waiting for the chief to initialise the variables")
                announced = True
            time.sleep(POLL_SECS)
        return int(sess.run(global_step))


def quiet_queue_runner_cancel(hook_args) -> None:
    """At the chief's end the queue runner's blocked step is cancelled by Session::Close():
    print one line for that instead of a traceback ("Exception in thread QueueRunnerThread-...")."""
    if hook_args.thread is not None and hook_args.thread.name.startswith("QueueRunnerThread") \
            and issubclass(hook_args.exc_type, tf.errors.CancelledError):
        log("chief queue runner stopped (its pending step was cancelled when the session closed)")
        return
    threading.__excepthook__(hook_args)


def start_watchdog(target: str, config, global_step, token_queue, train_steps: int, in_step: threading.Event,
                   stop: threading.Event) -> threading.Thread:
    """Non-chief only: unblock this worker if the chief is gone without closing the token queue.

    The caller sets `stop` and joins the thread before exiting: a daemon thread still inside a TF
    call when the interpreter shuts down aborts the process ("terminate called after throwing an
    instance of ''", "FATAL: exception not rethrown", exit 134 -- seen with TF 2.21).
    """
    with tf.device(global_step.device):
        close_queue = token_queue.close(cancel_pending_enqueues=True)

    def watch() -> None:
        # graph= is needed: the default graph is per thread, and this thread's own is empty.
        with tf.Session(target, graph=global_step.graph, config=config) as sess:
            reached = None
            while not stop.wait(POLL_SECS):
                try:
                    step = int(sess.run(global_step))
                except tf.errors.OpError:
                    return  # the ps is gone: the launcher is stopping the cluster
                if step < train_steps or not in_step.is_set():
                    reached = None
                    continue
                reached = reached or time.monotonic()
                if time.monotonic() - reached > WATCHDOG_SECS:
                    log(f"watchdog: global step {step} >= {train_steps} for {WATCHDOG_SECS:g}s but this worker is "
                        "still blocked on the sync token queue (no chief to fill it): closing the queue")
                    sess.run(close_queue)
                    return

    thread = threading.Thread(target=watch, name="sync-watchdog", daemon=True)
    thread.start()
    return thread


def run_worker(args: argparse.Namespace, cluster, server) -> int:
    num_workers = cluster.num_tasks("worker")
    i = args.task_index
    is_chief = i == 0

    x_train, y_train, x_test, y_test, desc = load_data(args.data_dir)
    log(f"data: {desc}")
    x_shard, y_shard = x_train[i::num_workers], y_train[i::num_workers]  # disjoint shards
    log(f"worker {i}: shard of {len(x_shard)} examples ({num_workers} workers)")

    with tf.device(tf.train.replica_device_setter(worker_device=f"/job:worker/task:{i}", cluster=cluster)):
        sync = args.mode == "sync"
        model = build_model(x_train.shape[1], 10, args.learning_rate, num_workers, sync)

    # Device filters: without them a worker's session waits at CreateSession until EVERY task of
    # the cluster answers, so it blocks on a late (or already finished) peer worker. A worker only
    # needs the ps and itself.
    config = tf.ConfigProto(device_filters=["/job:ps", f"/job:worker/task:{i}"])

    if not is_chief:
        step = wait_for_chief(server.target, config, model["global_step"], args.ready_timeout)
        if step is None:
            log(f"worker {i}: the chief did not initialise the variables within {args.ready_timeout:g}s")
            return 1
        # A non-chief MonitoredTrainingSession started after the chief has finished would wait
        # forever: there is nothing left to do, so say so and exit 0.
        if step >= args.train_steps:
            log(f"worker {i}: global step {step} >= {args.train_steps}, training already done")
            return 0

    threading.excepthook = quiet_queue_runner_cancel
    in_step, stop_watchdog, watchdog = threading.Event(), threading.Event(), None
    if sync and not is_chief:
        watchdog = start_watchdog(server.target, config, model["global_step"], model["opt"]._sync_token_queue,
                                  args.train_steps, in_step, stop_watchdog)

    local_step = 0
    loss = float("nan")
    with tf.train.MonitoredTrainingSession(
        master=server.target,
        is_chief=is_chief,
        checkpoint_dir=args.checkpoint_dir if is_chief else None,
        save_checkpoint_steps=max(args.train_steps // 4, 1),
        save_summaries_steps=None,
        save_summaries_secs=None,
        log_step_count_steps=None,  # we print our own steps/s
        hooks=([model["opt"].make_session_run_hook(is_chief, num_tokens=0)] if sync else [])
        + [tf.train.StopAtStepHook(last_step=args.train_steps)],
        stop_grace_period_secs=STOP_GRACE_SECS,
        config=config,
    ) as sess:
        step = int(sess.run(model["global_step"]))
        if is_chief and step > 0:
            log(f"resumed from {args.checkpoint_dir} at global step {step}")
        sess.run(model["mark_ready"])
        while sess.run(model["workers_ready"]) < num_workers and not sess.should_stop():
            time.sleep(0.05)
        if is_chief:
            log(f"all {num_workers} workers ready: training ({args.mode})")
        for xb, yb in batches(x_shard, y_shard, args.batch_size, seed=i):
            if sess.should_stop():
                break
            in_step.set()
            _, loss, acc, step = sess.run(
                [model["train_op"], model["loss"], model["accuracy"], model["global_step"]],
                {model["x"]: xb, model["y"]: yb})
            in_step.clear()
            local_step += 1
            if local_step == 1:
                # Time from the end of the first step: the first one waits for every worker.
                start = last_time = time.monotonic()
                first_step = last_step = step
            if local_step % LOG_EVERY == 0:
                now = time.monotonic()
                rate = (step - last_step) / max(now - last_time, 1e-9)
                log(f"step {step} loss {loss:.4f} steps/s {rate:.1f} worker {i} accuracy {acc:.4f}")
                last_step, last_time = step, now
    if watchdog is not None:
        stop_watchdog.set()
        watchdog.join(timeout=30)
    log(f"worker {i}: done after {local_step} local steps")
    if is_chief and local_step > 0:
        elapsed = time.monotonic() - start
        # The variables live on the ps, so they outlive the monitored session.
        with tf.Session(server.target, config=config) as s:
            test_acc, step = s.run([model["accuracy"], model["global_step"]],
                                   {model["x"]: x_test, model["y"]: y_test})
        rate = (step - first_step) / max(elapsed, 1e-9)
        log(f"final step {step} loss {loss:.4f} accuracy {test_acc:.4f} time {elapsed:.1f}s"
            f" steps/s {rate:.1f} checkpoint {args.checkpoint_dir} mode {args.mode}"
            f" examples/s {rate * args.batch_size * (num_workers if sync else 1):.1f}")
    return 0


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    cluster = tf.train.ClusterSpec({"ps": args.ps_hosts.split(","), "worker": args.worker_hosts.split(",")})
    # Binds *:PORT (all interfaces), whatever host the cluster spec names for this task.
    server = tf.train.Server(cluster, job_name=args.job_name, task_index=args.task_index)
    if args.job_name == "ps":
        log("ps: serving variables (runs until tfctl stops it)")
        server.join()
        return 0
    return run_worker(args, cluster, server)


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    # Skip the interpreter's teardown of TF: in a distributed TF1 process (gRPC server, master
    # sessions, coordination service) it took 1.5 s on an idle machine and up to 9 s on a busy one
    # (TF 2.21), long enough for tfctl to find a worker that is done but "still running" and stop
    # it. Everything worth keeping is written by now (the chief's checkpoint is saved when its
    # MonitoredTrainingSession closes).
    os._exit(code)
