"""All-reduce data-parallel training of a small CNN with MultiWorkerMirroredStrategy.

A step up from templates/multi-worker-mirrored: a two-convolution CNN instead of an MLP, SGD with
momentum (its velocity variables are mirrored too), a learning-rate warm-up and decay, per-epoch
evaluation on the test set, and, at the end, a checksum of every worker's copy of the weights to
show that the all-reduce kept the copies identical.

Every worker runs this script; TF_CONFIG (set by tfctl) says which one it is. Worker 0 is the
chief: it keeps the checkpoint and prints the summary line.

Keras is not used: with TF 2.21 and Keras 3, `model.fit` fails under
MultiWorkerMirroredStrategy. Plain `tf.Module` + `tf.Variable`s + `strategy.run`.

Data: nothing is downloaded: scikit-learn's bundled `load_digits` (1797 images 8x8), 80/20 split.

Security: TF gRPC servers are unauthenticated and bind *:PORT. Trusted networks only.
"""

from __future__ import annotations

import argparse
import math
import os
import shutil
import sys
import time

# Do NOT set TF_CPP_MIN_LOG_LEVEL: TF's INFO lines ("Waiting for 1/2 tasks to connect", ...)
# are how a missing worker shows up.
import numpy as np
import tensorflow as tf


def log(message: str) -> None:
    sys.stdout.write(message + "\n")
    sys.stdout.flush()


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--epochs", type=int, default=8)
    p.add_argument("--global_batch_size", type=int, default=64)
    p.add_argument("--learning_rate", type=float, default=0.05, help="peak, after a one-epoch warm-up")
    p.add_argument("--momentum", type=float, default=0.9)
    p.add_argument("--checkpoint_dir", default=None,
                   help="default $TFCTL_RUN_DIR/checkpoints (the run's own directory, fresh per run)")
    args = p.parse_args(argv)
    if args.checkpoint_dir is None:  # outside tfctl: a fresh directory here
        run_dir = os.environ.get("TFCTL_RUN_DIR") or time.strftime("manual-%Y%m%d-%H%M%S")
        args.checkpoint_dir = os.path.join(run_dir, "checkpoints")
    return args


def load_data():
    from sklearn.datasets import load_digits

    digits = load_digits()
    x = (digits.images.astype(np.float32) / 16.0)[..., None]  # N x 8 x 8 x 1
    y = digits.target.astype(np.int64)
    order = np.random.RandomState(0).permutation(len(x))
    test, train = order[: len(x) // 5], order[len(x) // 5:]
    return x[train], y[train], x[test], y[test]


class CNN(tf.Module):
    """conv3x3(16) - conv3x3(32) - maxpool 2 - dense 64 - dense 10, all plain mirrored variables."""

    def __init__(self) -> None:
        super().__init__()
        he = tf.initializers.HeNormal(seed=1)
        agg = tf.VariableAggregation.ONLY_FIRST_REPLICA  # gradients are all-reduced by hand

        def var(value, name):
            return tf.Variable(value, name=name, aggregation=agg)

        self.c1 = var(he([3, 3, 1, 16]), "conv1")
        self.c1b = var(tf.zeros([16]), "conv1_bias")
        self.c2 = var(he([3, 3, 16, 32]), "conv2")
        self.c2b = var(tf.zeros([32]), "conv2_bias")
        self.d1 = var(he([4 * 4 * 32, 64]), "dense1")
        self.d1b = var(tf.zeros([64]), "dense1_bias")
        self.d2 = var(tf.initializers.GlorotUniform(seed=2)([64, 10]), "dense2")
        self.d2b = var(tf.zeros([10]), "dense2_bias")

    def __call__(self, x):
        h = tf.nn.relu(tf.nn.conv2d(x, self.c1, 1, "SAME") + self.c1b)
        h = tf.nn.relu(tf.nn.conv2d(h, self.c2, 1, "SAME") + self.c2b)
        h = tf.nn.max_pool2d(h, 2, 2, "VALID")
        h = tf.reshape(h, [-1, 4 * 4 * 32])
        h = tf.nn.relu(tf.matmul(h, self.d1) + self.d1b)
        return tf.matmul(h, self.d2) + self.d2b


def hard_exit(code: int) -> None:
    """Flush and leave at once, skipping TF's teardown.

    With MultiWorkerMirroredStrategy (TF 2.21), returning from main() lets Python destroy the
    strategy, datasets and functions, which talks to the other workers; on a busy 2-core machine a
    worker then lingered 2-7 s after its last line, and once until the other worker had gone and
    its coordination-service heartbeat failed ("Failed to send RPC to coordination service"). Safe:
    it is called after a last collective that every worker reaches only after saving.
    """
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if "TF_CONFIG" not in os.environ:
        sys.exit("error: TF_CONFIG is not set (tfctl sets it for every task)")
    strategy = tf.distribute.MultiWorkerMirroredStrategy()  # blocks until every worker is up
    index = strategy.cluster_resolver.task_id
    workers = strategy.num_replicas_in_sync
    is_chief = index == 0
    x_train, y_train, x_test, y_test = load_data()
    steps_per_epoch = len(x_train) // args.global_batch_size
    total_steps = steps_per_epoch * args.epochs
    log(f"worker {index}/{workers}: load_digits {len(x_train)} train / {len(x_test)} test,"
        f" {steps_per_epoch} steps/epoch x {args.epochs} epochs")

    def dataset_fn(ctx: tf.distribute.InputContext):
        ds = tf.data.Dataset.from_tensor_slices((x_train, y_train)).shard(ctx.num_input_pipelines, ctx.input_pipeline_id)
        ds = ds.shuffle(len(x_train), seed=ctx.input_pipeline_id).repeat()
        return ds.batch(ctx.get_per_replica_batch_size(args.global_batch_size), drop_remainder=True).prefetch(2)

    iterator = iter(strategy.distribute_datasets_from_function(dataset_fn))

    with strategy.scope():
        model = CNN()
        velocity = [tf.Variable(tf.zeros_like(v), trainable=False, name=f"velocity_{i}",
                                aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA)
                    for i, v in enumerate(model.trainable_variables)]
        step_var = tf.Variable(0, dtype=tf.int64, name="global_step",
                               aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA)
    checkpoint = tf.train.Checkpoint(model=model, velocity=velocity, global_step=step_var)
    latest = tf.train.latest_checkpoint(args.checkpoint_dir)
    if latest:
        checkpoint.restore(latest)
        log(f"resumed from {latest}")

    def learning_rate(step):
        step = tf.cast(step, tf.float32)
        warmup = float(steps_per_epoch)
        decay = 0.5 * (1 + tf.cos(math.pi * tf.minimum(1.0, (step - warmup) / max(total_steps - warmup, 1))))
        return args.learning_rate * tf.where(step < warmup, (step + 1) / warmup, decay)

    @tf.function
    def train_step(it):
        def step_fn(x, y):
            with tf.GradientTape() as tape:
                per_example = tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y, logits=model(x))
                loss = tf.reduce_sum(per_example) / args.global_batch_size
            grads = tape.gradient(loss, model.trainable_variables)
            # One ring all-reduce for all the gradients (TF packs them into few collectives).
            grads = tf.distribute.get_replica_context().all_reduce(tf.distribute.ReduceOp.SUM, grads)
            lr = learning_rate(step_var)
            for v, m, g in zip(model.trainable_variables, velocity, grads):
                m.assign(args.momentum * m + g)
                v.assign_sub(lr * m)
            step_var.assign_add(1)
            return loss

        return strategy.reduce(tf.distribute.ReduceOp.SUM, strategy.run(step_fn, args=next(it)), axis=None)

    @tf.function
    def evaluate(x, y):
        def eval_fn(x, y):
            logits = model(x)
            correct = tf.reduce_sum(tf.cast(tf.equal(tf.argmax(logits, 1), y), tf.float32))
            loss = tf.reduce_sum(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y, logits=logits))
            return correct, loss, tf.cast(tf.size(y), tf.float32)

        return [strategy.reduce(tf.distribute.ReduceOp.SUM, t, axis=None) for t in strategy.run(eval_fn, args=(x, y))]

    mine = slice(index, None, workers)  # each worker evaluates its share; reduce sums them
    x_eval, y_eval = tf.constant(x_test[mine]), tf.constant(y_test[mine])

    start_step = int(step_var.numpy())
    start = last_time = time.monotonic()
    last_step = start_step
    loss = accuracy = float("nan")
    first = True
    while int(step_var.numpy()) < total_steps:
        loss = float(train_step(iterator))
        step = int(step_var.numpy())
        if first:  # time from the end of the first step, which traces the function
            first = False
            start = last_time = time.monotonic()
            start_step = last_step = step
        if step % 20 == 0:
            now = time.monotonic()
            log(f"step {step} loss {loss:.4f} steps/s {(step - last_step) / max(now - last_time, 1e-9):.1f}")
            last_step, last_time = step, now
        if step % steps_per_epoch == 0:
            correct, test_loss, count = (float(t) for t in evaluate(x_eval, y_eval))
            accuracy = correct / count
            log(f"epoch {step // steps_per_epoch} step {step} test loss {test_loss / count:.4f} accuracy {accuracy:.4f}")
    elapsed = time.monotonic() - start
    step = int(step_var.numpy())

    # Summed in float64 by numpy, in one fixed order: the same weights give the same digits on any
    # machine. Identical on every worker of a run (the all-reduce keeps the copies in step); from
    # run to run, only close on other machines (TF's CPU kernels round as their threads split sums).
    checksum = sum(float(np.abs(v.numpy()).sum(dtype=np.float64)) for v in model.trainable_variables)
    log(f"worker {index}: weight checksum {checksum:.6f}")

    # Every worker takes part in saving; only worker 0 keeps its copy.
    save_dir = args.checkpoint_dir if is_chief else os.path.join(args.checkpoint_dir, f"tmp-worker-{index}")
    checkpoint.write(os.path.join(save_dir, f"ckpt-{step}"))
    if is_chief:
        with open(os.path.join(save_dir, "checkpoint"), "w") as f:
            f.write(f'model_checkpoint_path: "ckpt-{step}"\n')
        log(f"final step {step} loss {loss:.4f} accuracy {accuracy:.4f} time {elapsed:.1f}s"
            f" steps/s {(step - start_step) / max(elapsed, 1e-9):.1f} checkpoint {args.checkpoint_dir}")
    else:
        shutil.rmtree(save_dir, ignore_errors=True)
    # A last collective: every worker has saved before any of them exits.
    strategy.reduce(tf.distribute.ReduceOp.SUM, strategy.run(lambda: tf.constant(1.0)), axis=None)
    hard_exit(0)


if __name__ == "__main__":
    sys.exit(main())
