"""The host supervisor: the only tfctl code that runs on cluster hosts.

Stdlib only, Python >= 3.8. tfctl ships these modules (all but `bundle`) to each host as one
zipapp named by its content hash, where they are the package `tfctl_supervisor`; hence relative
imports only. `protocol` is shared with the controller.
"""
