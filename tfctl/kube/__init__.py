"""Kubernetes exports of a cluster file: a Kubeflow TFJob (`tfjob`), a JobSet or an Indexed Job
with its Service (`jobset`), and what they share (`pods`: names, the image, the command as the
shell must receive it).

Nothing here talks to a cluster: each export is text for `kubectl apply`. They read the cluster
file's model (`tfctl.config`) and TensorFlow's task layout (`tfctl.tf.tasks`), and are read by
the `export` verbs alone (`tfctl.cli.export`).
"""
