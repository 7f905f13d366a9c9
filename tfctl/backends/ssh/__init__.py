"""Runs on hosts the cluster file lists per job, reached over SSH (or this machine directly)."""
