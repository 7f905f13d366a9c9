"""The backends: each a package that runs a run's tasks its own way (`ssh`: the hosts a cluster
file lists; `slurm`: an allocation's nodes), behind the one interface in `base.py`. They are
named in `tfctl.registry.backends` alone; generic code reaches them through `base.backend_for`.
"""
