"""The run engine: what to do about a run, decided in pure code from what was observed.

`observed` is what the hosts said of each task; `verdicts` how a run ends from that;
`reconcile` one step of a running run per look (what the look saw in; the actions and when and
how to look next out), over `live_run` (a silent host judged lost or moved, a failure held while
a peer's host is silent, a `down` asked for); `events` what `notify:` hears of; `moving`,
`retiring`, `starting`, `probing` and `resubmission` the decisions of a move, a left host, a
start, a refused probe and a new allocation; `clock` the time it is fed and the one token that
cancels a run's loops. Nothing here does I/O, reads the real clock or starts a thread: the
driver (`cluster.control.supervise`) does, so every decision can be replayed as a table on a
fake clock. It may import `runs`, `config` and the wire types of `supervisor`, nothing above.
"""
