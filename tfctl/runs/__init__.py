"""The run store: what each run started, where, and how it went, kept under `$TFCTL_HOME/runs`.

`record` is the typed, versioned record (migrated from older versions); `store` reads records
and holds the store's lock; `transitions` is the one writer, every change a named, guarded
transition; `accounting` the cost figures of a run. It may import config, transports and the
host supervisor's protocol: nothing that reaches a host.
"""
