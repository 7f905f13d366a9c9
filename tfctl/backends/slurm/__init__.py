"""Runs on a Slurm cluster: one allocation per run (`allocation.py`), tasks placed on its nodes
(`placement.py`), each task a job step under tfctl's host supervisor (`transport/slurm.py`).

Nothing here knows TensorFlow: placement fills in a cluster's addresses, and the rest of tfctl
runs it exactly as it runs hosts reached over ssh.
"""
