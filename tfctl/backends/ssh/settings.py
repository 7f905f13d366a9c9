"""The ssh backend's cluster-file keys. Its `ssh:` and `hosts:` sections are the cluster file's
own (`tfctl.config.ssh_hosts`): every run's hosts are reached by them, whichever backend places
the tasks, so nothing here adds to them."""

from __future__ import annotations

from typing import Any, Mapping

from tfctl.config.base import Doc, Validator

DESCRIPTION = "`ssh` (the default) runs on the hosts listed under each job"
SECTIONS: dict[str, Validator] = {}
JOB_KEYS: dict[str, Validator] = {}


def settings(_sections: Mapping[str, Any]) -> None:
    return None


def check(_doc: Doc, _root: Mapping[str, Any]) -> None:
    """Nothing spans keys beyond what every cluster file is checked for."""
