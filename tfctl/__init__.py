"""tfctl: one cluster file, four verbs, nothing left running.

Importing the package must stay cheap: no TensorFlow, no paramiko, no rich here.
"""

__version__ = "0.1.0"
