"""The controller's side of a run's hosts: every request to their supervisors, on every host at once.

`agent` speaks to one host's supervisor; `group` fans a call out to all of them, a host's failure
kept as data; `cluster.Cluster` is one run's tasks and hosts behind one façade, its answers typed
in `answers`; `output` merges the hosts' task logs into one stream; `reach` opens a shell where a
task runs; `control` carries out a start phase by phase and drives the run's looks through the
engine. It may import the engine, the run store, config, transports and the host supervisor's
protocol: nothing of TensorFlow (`tf/`), of a backend, or of the verbs above it.
"""
