"""Ways of reaching a host: base.py is the interface, specs.py the typed record of each kind."""

from __future__ import annotations

LOCAL_NAMES = ("localhost", "127.0.0.1", "::1")


def is_local_name(host: str) -> bool:
    return host in LOCAL_NAMES or host.startswith("127.")
