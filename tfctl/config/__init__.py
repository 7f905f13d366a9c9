"""The cluster file: read, checked strictly, and turned into the frozen `ClusterConfig` every
part of tfctl runs from.

`loader` reads the YAML and reports every problem at once (file, line, key and fix); `fields`,
`ssh_hosts`, `container`, `devices` and `kubernetes` validate their keys; `model` holds the frozen
dataclasses; `key_docs` the one-line doc of each key; `home` where tfctl keeps its state. It may
import only the errors, the host supervisor's protocol and the backend registry (whose backends'
`settings` declare their own keys): nothing that connects, starts or renders.
"""
