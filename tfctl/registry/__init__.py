"""Registries of what tfctl loads by name, on the lowest floor beside the errors: each names its
entries and loads them on first use (`importlib`), so the layers that read a name (the cluster
file's `backend:`, a run record's transport) need not import what the name stands for. It
imports nothing of tfctl.
"""
