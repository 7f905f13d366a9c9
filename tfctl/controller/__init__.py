"""What the verbs do, between the command line and the hosts: each verb's steps (`verbs`), a run's
start (`start`), the live controller of a running run (`live`: the attached `up`, the detached
watcher and their door), and what `status`, `top` and `report` gather (`views`).

It may import every floor below it (the cluster, the backends, the engine, TensorFlow's rules in
`tf/`) and never the command line; views return plain data that `tfctl.cli` renders.
"""
