"""TCP sockets in one state, from the kernel's sock_diag netlink interface.

`status` asks which ports listen on every call. Reading /proc/net/tcp makes the kernel walk its
whole connection table and print it (~9 ms of CPU on a busy host, on every status); a sock_diag
dump filtered by state walks just the sockets in that state (~0.06 ms). Linux only, like /proc:
None where the interface is missing, and the caller reads /proc/net/tcp instead.
"""

from __future__ import annotations

import socket
import struct
from typing import Dict, Optional, Set

NETLINK_SOCK_DIAG = 4
SOCK_DIAG_BY_FAMILY = 20
NLM_F_REQUEST = 0x1
NLM_F_DUMP = 0x300
NLMSG_ERROR = 2
NLMSG_DONE = 3
HEADER = struct.Struct("=IHHII")  # nlmsghdr: length, type, flags, seq, pid
REQUEST = struct.Struct("=BBBBI48x")  # inet_diag_req_v2: family, protocol, ext, pad, states, id
PORT_AT = 4  # in inet_diag_msg: after family, state, timer, retrans; big-endian
INODE_AT = 4 + 48 + 16  # after the socket id (48 bytes) and expires, rqueue, wqueue, uid


def tcp_sockets(state: int) -> Optional[Dict[int, Set[int]]]:
    """local port -> socket inodes of IPv4 and IPv6 TCP sockets in kernel state `state`."""
    ports: Dict[int, Set[int]] = {}
    try:
        with socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM, NETLINK_SOCK_DIAG) as conn:
            conn.settimeout(5)
            for seq, family in enumerate((socket.AF_INET, socket.AF_INET6), 1):
                body = REQUEST.pack(family, socket.IPPROTO_TCP, 0, 0, 1 << state)
                conn.send(
                    HEADER.pack(HEADER.size + len(body), SOCK_DIAG_BY_FAMILY, NLM_F_REQUEST | NLM_F_DUMP, seq, 0) + body
                )
                if not _read_dump(conn, ports):
                    return None
    except (OSError, AttributeError, struct.error):  # no netlink here (AttributeError: no AF_NETLINK)
        return None
    return ports


def _read_dump(conn: socket.socket, ports: Dict[int, Set[int]]) -> bool:
    """Add one dump's sockets to `ports`; False if the kernel refused it."""
    while True:
        data = conn.recv(65536)
        offset = 0
        while offset + HEADER.size <= len(data):
            length, kind, _flags, _seq, _pid = HEADER.unpack_from(data, offset)
            if kind == NLMSG_DONE:
                return True
            if kind == NLMSG_ERROR or length < HEADER.size:
                return False
            start = offset + HEADER.size
            port = struct.unpack_from("!H", data, start + PORT_AT)[0]
            inode = struct.unpack_from("=I", data, start + INODE_AT)[0]
            ports.setdefault(port, set()).add(inode)
            offset += (length + 3) & ~3
        if not data:
            return False
