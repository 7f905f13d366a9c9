"""A real MLflow tracking server for the tests: SQLite store and proxied artifacts in a folder of
the test's, on an address of the test's (loopback, or a lab's bridge), stopped by its PID."""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest

needs_mlflow = pytest.mark.skipif(
    importlib.util.find_spec("mlflow") is None, reason="MLflow is not installed (pip install -e '.[tracking]')"
)


def free_port(host: str) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


class MlflowServer:
    """`mlflow server` in its own session; `stop` ends it and every process it started."""

    def __init__(self, folder: Path, host: str = "127.0.0.1") -> None:
        self.folder = folder
        self.host = host
        self.port = free_port(host)
        self.uri = f"http://{host}:{self.port}"
        self.proc: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> MlflowServer:
        self.folder.mkdir(parents=True, exist_ok=True)
        log = open(self.folder / "server.log", "wb")
        self.proc = subprocess.Popen(
            [
                *(sys.executable, "-m", "mlflow", "server"),
                *("--host", self.host, "--port", str(self.port), "--workers", "1"),
                *("--backend-store-uri", f"sqlite:///{self.folder / 'mlflow.db'}"),
                *("--artifacts-destination", str(self.folder / "artifacts")),
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env={**os.environ, "MLFLOW_TRACKING_URI": ""},
        )
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError("mlflow server ended: " + (self.folder / "server.log").read_text()[-2000:])
            try:
                with urllib.request.urlopen(f"{self.uri}/health", timeout=2) as answer:
                    if answer.status == 200:
                        return self
            except OSError:
                time.sleep(0.3)
        self.stop()
        raise RuntimeError("mlflow server did not answer within 120 s")

    def __exit__(self, *_exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        if self.proc is None:
            return
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait()
        self.proc = None

    def freeze(self, frozen: bool) -> None:
        assert self.proc is not None
        os.killpg(self.proc.pid, signal.SIGSTOP if frozen else signal.SIGCONT)

    def call(self, path: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(f"{self.uri}/api/2.0/{path}", data=data)
        if data is not None:
            request.add_header("Content-Type", "application/json")
        with urllib.request.urlopen(request, timeout=10) as answer:
            return dict(json.load(answer))

    def runs(self, experiment: str) -> list[dict[str, Any]]:
        """The experiment's runs, each as {id, experiment_id, status, tags, params, metrics (latest)}."""
        found = self.call(f"mlflow/experiments/get-by-name?experiment_name={experiment}")
        listed = self.call("mlflow/runs/search", {"experiment_ids": [found["experiment"]["experiment_id"]]})
        out = []
        for run in listed.get("runs", []):
            data = run["data"]
            out.append(
                {
                    "id": run["info"]["run_id"],
                    "experiment_id": run["info"]["experiment_id"],
                    "status": run["info"]["status"],
                    "tags": {t["key"]: t["value"] for t in data.get("tags", [])},
                    "params": {p["key"]: p["value"] for p in data.get("params", [])},
                    "metrics": {m["key"]: m["value"] for m in data.get("metrics", [])},
                }
            )
        return out

    def history(self, run_id: str, key: str) -> list[tuple[int, float]]:
        got = self.call(f"mlflow/metrics/get-history?run_id={run_id}&metric_key={key}")
        return sorted((int(m["step"]), float(m["value"])) for m in got.get("metrics", []))

    def artifacts(self, run_id: str) -> list[str]:
        return [f["path"] for f in self.call(f"mlflow/artifacts/list?run_id={run_id}").get("files", [])]
