"""The steps of a run's start: its plan, the hosts' setup commands, the workdir's sync."""
