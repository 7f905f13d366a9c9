"""JSON over HTTP with the standard library: a tracker's REST API needs no client library here.

Credentials come from the variables MLflow's own client reads (`MLFLOW_TRACKING_TOKEN`, or
`MLFLOW_TRACKING_USERNAME` and `MLFLOW_TRACKING_PASSWORD`), never from the cluster file.
"""

from __future__ import annotations

import base64
import http.client
import json
import os
import urllib.error
import urllib.parse
import urllib.request
from typing import Any, Mapping

from tfctl.errors import TrackingError

TIMEOUT = 10.0  # seconds a tracker has to answer one request


def auth_headers(env: Mapping[str, str]) -> dict[str, str]:
    token = env.get("MLFLOW_TRACKING_TOKEN")
    if token:
        return {"Authorization": f"Bearer {token}"}
    user, password = env.get("MLFLOW_TRACKING_USERNAME"), env.get("MLFLOW_TRACKING_PASSWORD")
    if user and password:
        return {"Authorization": "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()}
    return {}


class Http:
    """Requests to one server; constructing it does no I/O."""

    def __init__(self, base: str, name: str, timeout: float = TIMEOUT, env: Mapping[str, str] | None = None) -> None:
        self.base = base.rstrip("/")
        self.name = name  # "MLflow at http://...": how errors name the server
        self.timeout = timeout
        self.headers = auth_headers(os.environ if env is None else env)

    def json(
        self, method: str, path: str, body: Mapping[str, Any] | None = None, query: Mapping[str, str] | None = None
    ) -> dict[str, Any]:
        """The server's JSON answer; TrackingError saying how it failed (`error_code`: MLflow's)."""
        data = None if body is None else json.dumps(body).encode()
        raw = self.send(method, path, data, "application/json", query)
        try:
            answer = json.loads(raw or b"{}")
        except ValueError:
            raise TrackingError(f"{self.name} answered {path} with something not JSON") from None
        return answer if isinstance(answer, dict) else {}

    def send(
        self, method: str, path: str, data: bytes | None, content_type: str, query: Mapping[str, str] | None = None
    ) -> bytes:
        url = self.base + path + ("?" + urllib.parse.urlencode(query) if query else "")
        request = urllib.request.Request(url, data=data, method=method, headers=dict(self.headers))
        if data is not None:
            request.add_header("Content-Type", content_type)
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as response:
                return bytes(response.read())
        except urllib.error.HTTPError as error:
            raise Refused(self.name, path, error.code, error.read()) from None
        except (urllib.error.URLError, OSError, http.client.HTTPException, ValueError) as error:
            reason = getattr(error, "reason", error)
            raise TrackingError(f"{self.name} did not answer ({reason or type(error).__name__})") from None


class Refused(TrackingError):
    """The server answered with an error: its code (`RESOURCE_DOES_NOT_EXIST`) and its words."""

    def __init__(self, name: str, path: str, status: int, body: bytes) -> None:
        try:
            said = json.loads(body)
        except ValueError:
            said = {}
        said = said if isinstance(said, dict) else {}
        self.status = status
        self.code = str(said.get("error_code", ""))
        words = str(said.get("message") or body[:200].decode("utf-8", "replace").strip() or f"HTTP {status}")
        super().__init__(f"{name} refused {path}: {words}")
