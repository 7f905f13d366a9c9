"""Between-graph, asynchronous data-parallel MNIST training (classic TF1 style).

Every task runs this same script. The ps task hosts the variables and blocks
in ``server.join()`` forever (the launcher is expected to stop it); each
worker builds its own copy of the graph, places the variables on the ps via
``replica_device_setter`` and applies its gradients without waiting for the
other workers. Worker 0 is the chief: it initialises the variables and
reports the final test accuracy.

Example (1 ps, 2 workers on localhost)::

    python train.py --job_name ps     --task_index 0 --ps_hosts localhost:2222 \
        --worker_hosts localhost:2223,localhost:2224
    python train.py --job_name worker --task_index 0 --ps_hosts localhost:2222 \
        --worker_hosts localhost:2223,localhost:2224
    python train.py --job_name worker --task_index 1 --ps_hosts localhost:2222 \
        --worker_hosts localhost:2223,localhost:2224
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import tensorflow.compat.v1 as tf

from tracker import open_tracker

tf.disable_v2_behavior()

# Progress is printed every this many local steps.
LOG_EVERY = 50
# A non-chief polls the ps this often while waiting for the chief to initialise.
POLL_SECS = 0.5


def log(message: str) -> None:
    """Print and flush at once, so a launcher tailing the output sees it live."""
    print(message, flush=True)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Parse the classic TF1 cluster flags plus a few training knobs."""
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--job_name", required=True, choices=["ps", "worker"])
    p.add_argument("--task_index", type=int, default=0)
    p.add_argument("--ps_hosts", required=True, help="comma-separated host:port list")
    p.add_argument("--worker_hosts", required=True, help="comma-separated host:port list")
    p.add_argument("--train_steps", type=int, default=5000, help="global steps, summed over all workers")
    p.add_argument("--batch_size", type=int, default=100)
    p.add_argument("--learning_rate", type=float, default=0.2)
    p.add_argument("--data_dir", default=None, help="directory holding a Keras-style mnist.npz")
    p.add_argument(
        "--checkpoint_dir",
        default=None,
        help="chief saves/restores checkpoints here; default none, so every run starts fresh",
    )
    p.add_argument(
        "--ready_timeout",
        type=float,
        default=120.0,
        help="seconds a non-chief waits for the chief to initialise the variables before giving up",
    )
    return p.parse_args(argv)


def load_data(data_dir: str | None) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, str]:
    """Return flattened float32 images in [0, 1], int64 labels and a description.

    Never downloads anything: the cluster may have no internet, so we take a
    local mnist.npz if there is one and otherwise the small digits set that
    ships inside scikit-learn.
    """
    candidates = []
    if data_dir:
        candidates.append(Path(data_dir).expanduser() / "mnist.npz")
    candidates.append(Path.home() / ".keras" / "datasets" / "mnist.npz")
    for path in candidates:
        if path.is_file():
            with np.load(path) as d:
                x_train, y_train, x_test, y_test = (d[k] for k in ("x_train", "y_train", "x_test", "y_test"))
            desc = f"MNIST from {path} ({len(x_train)} train / {len(x_test)} test images 28x28)"
            return (
                x_train.reshape(len(x_train), -1).astype(np.float32) / 255.0,
                y_train.astype(np.int64),
                x_test.reshape(len(x_test), -1).astype(np.float32) / 255.0,
                y_test.astype(np.int64),
                desc,
            )

    from sklearn.datasets import load_digits

    digits = load_digits()
    x = digits.data.astype(np.float32) / 16.0  # pixel values are 0..16
    y = digits.target.astype(np.int64)
    # Same fixed permutation on every task, so the test split never overlaps
    # any worker's training shard.
    order = np.random.RandomState(0).permutation(len(x))
    n_test = len(x) // 5
    test, train = order[:n_test], order[n_test:]
    where = "--data_dir or ~/.keras/datasets" if data_dir else "~/.keras/datasets"
    desc = f"sklearn load_digits ({len(x)} images 8x8; no MNIST found in {where})"
    return x[train], y[train], x[test], y[test], desc


def batches(
    x: np.ndarray, y: np.ndarray, batch_size: int, seed: int
) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """Yield shuffled mini-batches forever (training is bounded by global steps, not epochs)."""
    rng = np.random.RandomState(seed)
    batch_size = min(batch_size, len(x))  # a batch larger than the shard would never yield
    while True:
        order = rng.permutation(len(x))
        for start in range(0, len(order) - batch_size + 1, batch_size):
            idx = order[start : start + batch_size]
            yield x[idx], y[idx]


def build_model(n_inputs: int, n_classes: int, learning_rate: float) -> dict[str, tf.Tensor]:
    """One-hidden-layer MLP; variables go wherever the enclosing device scope says."""
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
    # Asynchronous: each worker applies its own gradients to the ps variables
    # as soon as it has them (no SyncReplicasOptimizer).
    train_op = tf.train.GradientDescentOptimizer(learning_rate).minimize(loss, global_step=global_step)
    return {
        "x": x,
        "y": y,
        "global_step": global_step,
        "loss": loss,
        "accuracy": accuracy,
        "train_op": train_op,
    }


def wait_for_chief(target: str, config: tf.ConfigProto, global_step: tf.Tensor, timeout: float) -> int | None:
    """Block until the chief has initialised the variables; return the global step.

    A non-chief MonitoredTrainingSession that finds the variables uninitialised
    logs "Waiting for model to be ready" and sleeps 30 s before looking again.
    Polling ourselves every POLL_SECS makes the worker start within half a
    second of the chief. Returns None if the variables are still not ready
    after `timeout` seconds (e.g. the chief never came up).
    """
    uninitialized = tf.report_uninitialized_variables()
    deadline = time.monotonic() + timeout
    with tf.Session(target, config=config) as sess:
        announced = False
        while len(sess.run(uninitialized)) > 0:
            if time.monotonic() > deadline:
                return None
            if not announced:
                log("waiting for chief to initialise variables")
                announced = True
            time.sleep(POLL_SECS)
        return int(sess.run(global_step))


def run_ps(server: tf.train.Server) -> None:
    """Serve variables until killed; a classic ps never exits on its own."""
    log("ps: serving variables (runs until stopped by the launcher)")
    server.join()


def run_worker(args: argparse.Namespace, cluster: tf.train.ClusterSpec, server: tf.train.Server) -> int:
    """Train on this worker's shard until the global step reaches --train_steps."""
    num_workers = cluster.num_tasks("worker")
    i = args.task_index
    is_chief = i == 0

    x_train, y_train, x_test, y_test, desc = load_data(args.data_dir)
    log(f"data: {desc}")
    # Shard by worker: every num_workers-th example, so the shards are disjoint.
    x_shard, y_shard = x_train[i::num_workers], y_train[i::num_workers]
    log(f"worker {i}: shard of {len(x_shard)} examples ({num_workers} workers)")

    with tf.device(tf.train.replica_device_setter(worker_device=f"/job:worker/task:{i}", cluster=cluster)):
        model = build_model(x_train.shape[1], 10, args.learning_rate)

    # The device filters are essential: without them the session's master
    # waits at CreateSession until *every* task in the cluster answers, so a
    # worker would block on other workers (a late or already finished one
    # hangs it). A worker only needs the ps and itself.
    config = tf.ConfigProto(device_filters=["/job:ps", f"/job:worker/task:{i}"])

    if not is_chief:
        step = wait_for_chief(server.target, config, model["global_step"], args.ready_timeout)
        if step is None:
            log(f"worker {i}: chief did not initialise the variables within {args.ready_timeout:g}s")
            return 1
        if step >= args.train_steps:
            log(f"worker {i}: global step {step} >= {args.train_steps}, training already done")
            return 0

    hooks = [tf.train.StopAtStepHook(last_step=args.train_steps)]
    local_step = 0
    tracker = open_tracker(log)  # with `tracking:` in the cluster file, the chief logs into the run's tracker
    with tf.train.MonitoredTrainingSession(
        master=server.target,
        is_chief=is_chief,
        checkpoint_dir=args.checkpoint_dir,
        hooks=hooks,
        config=config,
    ) as sess:
        start = time.monotonic()
        first_step = int(sess.run(model["global_step"]))
        for xb, yb in batches(x_shard, y_shard, args.batch_size, seed=i):
            if sess.should_stop():
                break
            feed = {model["x"]: xb, model["y"]: yb}
            _, loss, acc, step = sess.run(
                [model["train_op"], model["loss"], model["accuracy"], model["global_step"]], feed
            )
            local_step += 1
            if local_step % LOG_EVERY == 0:
                log(f"step {step} worker {i} loss {loss:.4f} accuracy {acc:.4f}")
                if tracker is not None:
                    tracker.metrics({"loss": loss, "accuracy": acc}, step)

    elapsed = time.monotonic() - start
    log(f"worker {i}: done after {local_step} local steps")
    if is_chief:
        # Variables live on the ps, so they outlive the monitored session.
        with tf.Session(server.target, config=config) as eval_sess:
            test_acc, step = eval_sess.run(
                [model["accuracy"], model["global_step"]], {model["x"]: x_test, model["y"]: y_test}
            )
        rate = (step - first_step) / elapsed
        if tracker is not None:
            tracker.metrics({"test_accuracy": test_acc}, step)
            tracker.close()
        log(
            f"final test accuracy {test_acc:.4f} after {step} global steps"
            f" ({elapsed:.1f}s, {rate:.1f} steps/s)"
        )
    return 0


def main(argv: list[str] | None = None) -> int:
    """Start this task's server and run the ps or worker role."""
    args = parse_args(argv)
    cluster = tf.train.ClusterSpec(
        {"ps": args.ps_hosts.split(","), "worker": args.worker_hosts.split(",")}
    )
    server = tf.train.Server(cluster, job_name=args.job_name, task_index=args.task_index)
    if args.job_name == "ps":
        run_ps(server)
        return 0
    return run_worker(args, cluster, server)


if __name__ == "__main__":
    sys.exit(main())
