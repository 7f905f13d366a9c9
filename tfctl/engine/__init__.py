"""The run engine: what to do about a run, decided in pure code from what was observed.

`observed` is what the hosts said of each task; `verdicts` how a run ends from that;
`supervision` the decisions of a running run (a silent host judged lost or moved, a failure held
while a peer's host is silent, a `down` asked for) as a state machine fed one look at a time;
`resubmission` whether a run goes on in a new allocation once its own ended under it;
`clock` the time it is fed and the one token that cancels a run's loops. Nothing here does I/O,
reads the real clock or starts a thread: the driver (`cluster.control.supervise`) does, so every
decision can be replayed as a table on a fake clock.
"""
