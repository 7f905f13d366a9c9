"""The live controller: its socket, its watcher and the run's policies while it runs."""
