"""Runs on a Slurm cluster: one allocation per run (`allocation.py`; a heterogeneous job when jobs
ask for different nodes), tasks placed on its nodes (`placement.py`), each task a job step under
tfctl's host supervisor (`transport.py`); the run's controller on the login node or in the
allocation's batch script (`batch.py`); what Slurm's accounting recorded (`sacct.py`); each
node's steps in a container of the tasks' image where srun has pyxis (`pyxis.py`).

Nothing here knows TensorFlow: placement fills in a cluster's addresses, and the rest of tfctl
runs it exactly as it runs hosts reached over ssh.
"""
