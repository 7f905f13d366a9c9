"""The live controller of a running run: the one driver of its supervision (`driver`: attached,
watcher and in-allocation alike), the engine's rules and actions wired to the run
(`reconciling`), its start (`launch`), moves to spares, resubmission, the door `status` and
`down` reach it through (`rpc*`), its watcher process and `notify:` commands. It may import the
engine, the cluster, the backends, `tf/` and `controller/start`; not the verbs, which call it."""
