"""What tfctl knows of TensorFlow, apart from the orchestration: TF_CONFIG and the classic flags
(`tasks`), the log lines that say why a task is stuck or dead (`diagnose`, `doctor`, `explain`,
`silence`, `noise`), training progress (`progress`), what moving a task means to its peers
(`moves`), the judges of a running run (`judges`), TensorBoard and the templates.

The judges answer the engine's `ask_judges` on one look at the hosts; what they do beyond a
verdict (the stall judge's restart and notice) they do through callbacks the live controller
hands them. It may import the cluster and the floors below it, never the controller or the
command line.
"""
