"""Every read of something tfctl does not control is bounded, and the bound is named in the
error a user sees: the controller's socket, cluster files, tails, notify output."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest

from tfctl.controller import rpc
from tfctl.controller.rpc_messages import StatusAsk, StatusReply
from tfctl.errors import TfctlError


def door_answering(tmp_path: Path, text: str) -> rpc.ControllerDoor:
    return rpc.ControllerDoor(tmp_path / rpc.SOCKET_NAME, {StatusAsk: lambda _ask: StatusReply(text=text)})


def test_an_answer_longer_than_a_request_may_be_comes_through(tmp_path: Path) -> None:
    # `top` of 24 tasks with a minute of history answers about 200 KiB: above the requests' bound
    big = "x" * (4 * rpc.MAX_REQUEST)
    with door_answering(tmp_path, big) as door:
        line = rpc._exchange(door.path, StatusAsk(json=False), 10)
    assert line is not None and json.loads(line)["ok"]["text"] == big


def test_an_answer_beyond_its_bound_is_an_error_that_names_it(tmp_path: Path) -> None:
    with door_answering(tmp_path, "x" * (rpc.MAX_ANSWER + 1)) as door:
        with pytest.raises(TfctlError, match="answer is longer than its bound of 16 MiB"):
            rpc._exchange(door.path, StatusAsk(json=False), 30)


def test_a_request_beyond_its_bound_is_answered_with_an_error_that_names_it(tmp_path: Path) -> None:
    with door_answering(tmp_path, "unused") as door, socket.socket(socket.AF_UNIX) as conn:
        conn.settimeout(10)
        conn.connect(str(door.path))
        conn.sendall(b"x" * (rpc.MAX_REQUEST + 1))
        answer = json.loads(conn.makefile("rb").readline())
    assert answer == {"error": "the controller's request is longer than its bound of 64 KiB"}
