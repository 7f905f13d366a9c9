"""Benchmarks, and what the test suite uses of them: the simulated SSH hosts (netns_hosts), a real
Slurm on them (slurm_lab), the fault-injection engine (fault_lab) and wait_until (waiting).

Run the scripts from the repo root as modules, e.g. `python -m bench.fanout`: they import each
other as `bench.<module>`. Nothing here imports from tests/.
"""
