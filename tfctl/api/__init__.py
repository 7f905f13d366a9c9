"""The Python API: what `import tfctl` offers (`tfctl.__all__`), and what the CLI's verbs call
to start and read runs, so the two cannot drift. It imports the controller and below, never the
command line; it prints nothing (a `progress=` callback hears what the CLI prints), and raises
`TfctlError` and its subclasses, never `SystemExit`."""
