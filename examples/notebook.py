"""A notebook's session with tfctl, as plain Python (each block would be a cell): start the
embedded default detached, follow its logs to the first training step, read every task's
status, wait for the end and read the final accuracy.

    python examples/notebook.py [CLUSTER_FILE]     (default: cluster.yaml.example)
"""

import sys

import tfctl

cluster = sys.argv[1] if len(sys.argv) > 1 else "cluster.yaml.example"

# Start it: returns once every task runs; a watcher process ends the run when its job is done.
run = tfctl.up(cluster, progress=lambda event: print(f"  {event.source:<10} {event.text}"))
print(f"run {run.id} started")

# Follow worker 0's output until its first training step.
for line in run.logs(follow=True, tasks=["worker:0"]):
    if line.text.startswith("step "):
        print(f"first step: {line.text}")
        break

# What every task does now.
for task in run.status().tasks:
    print(f"  {task.name:<9} {task.state.value:<8} on {task.host}  step {task.step}")

# The end, and the final accuracy as the report reads it.
ended = run.wait()
print(f"run {run.id} {ended.state.value}: {ended.reason}")
accuracy = run.metrics().result.get("accuracy")
print("final test accuracy " + (f"{accuracy.value:.4f}" if accuracy else "not printed"))
sys.exit(0 if ended.succeeded else 1)
