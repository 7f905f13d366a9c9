"""The tests' backend: hosts that are `fakes.FakeHost`s in this process, reached through the same
`Backend` interface as ssh and Slurm. Registered by the `fake_backend` fixture (tests/conftest.py)
with one line in the registry, as any backend is; a cluster file says `backend: fake`.

Like a scheduler, it acquires something for each run (a lease on the `pool` its section names)
and releases it, and it can end a run under its tasks (`LAB.end_run`), so every branch generic
code takes for a backend runs here in milliseconds.
"""
