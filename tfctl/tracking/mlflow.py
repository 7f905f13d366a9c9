"""MLflow over its REST API (`/api/2.0/mlflow/...`): the controller makes the run, the tasks log
into it with their own `mlflow` (MLFLOW_RUN_ID), and tfctl logs its figures at the end.

A sweep's trials are nested in the sweep's run (the `mlflow.parentRunId` tag, as MLflow's own
nested runs are). The report goes up as an artifact where the server proxies artifacts (what
`mlflow server` does by default: an `mlflow-artifacts:` location).
"""

from __future__ import annotations

from typing import Any, Iterable, Mapping

from tfctl.config.tracking import TrackingSettings
from tfctl.errors import TrackingError
from tfctl.runs.record import TrackerRun
from tfctl.tracking.http import Http, Refused
from tfctl.tracking.trackers import Ending, Opening, Tracker

API = "/api/2.0/mlflow"
BATCH = 1000  # metrics per log-batch request, MLflow's limit
PARAMS_PER_BATCH = 100
VALUE_LIMIT = 5000  # characters of a tag or param value every MLflow version keeps
_STATUS = {"succeeded": "FINISHED", "failed": "FAILED", "stopped": "KILLED"}


def _ms(seconds: float) -> int:
    return int(seconds * 1000)


def _pairs(values: Mapping[str, Any]) -> list[dict[str, str]]:
    return [{"key": k, "value": str(v)[:VALUE_LIMIT]} for k, v in values.items()]


class Mlflow(Tracker):
    kind = "mlflow"
    title = "MLflow"

    def __init__(self, uri: str, experiment: str | None) -> None:
        self.uri = uri
        self.experiment = experiment  # None: the cluster's name
        self.http = Http(uri, f"MLflow at {uri}")

    @classmethod
    def of_settings(cls, settings: TrackingSettings) -> Mlflow | None:
        return None if settings.mlflow is None else cls(settings.mlflow.uri, settings.mlflow.experiment)

    @classmethod
    def of_link(cls, link: TrackerRun) -> Mlflow:
        return cls(link.uri, link.experiment)

    def open(self, opening: Opening) -> TrackerRun:
        tags = {
            "tfctl.run_id": opening.run_id,
            "tfctl.cluster": opening.cluster,
            "tfctl.backend": opening.backend,
            "tfctl.command": opening.command,
            "mlflow.user": opening.user,
            "mlflow.source.name": "tfctl",
            "mlflow.source.type": "JOB",
        }
        if opening.parent is not None:
            tags["mlflow.parentRunId"] = opening.parent.run_id
        link = self._create(opening, tags)
        params = {**opening.params, **{f"tfctl.{job}": n for job, n in opening.shape.items()}}
        items = _pairs(params)
        try:
            for start in range(0, len(items), PARAMS_PER_BATCH):
                self._batch(link.run_id, params=items[start : start + PARAMS_PER_BATCH])
        except Refused:
            pass  # a value the server will not keep: the run is made, and linked all the same
        return link

    def open_parent(self, opening: Opening) -> TrackerRun:
        tags = {"tfctl.sweep": opening.run_id, "tfctl.cluster": opening.cluster, "mlflow.user": opening.user}
        return self._create(opening, tags)

    def _create(self, opening: Opening, tags: Mapping[str, str]) -> TrackerRun:
        name = self.experiment or opening.cluster
        experiment_id = self._experiment_id(name)
        answer = self.http.json(
            "POST",
            f"{API}/runs/create",
            {
                "experiment_id": experiment_id,
                "run_name": opening.run_id,
                "start_time": _ms(opening.started_at),
                "tags": _pairs({"mlflow.runName": opening.run_id, **tags}),
            },
        )
        info = _field(answer, "run", "info")
        run_id = str(info.get("run_id") or info.get("run_uuid") or "") if isinstance(info, dict) else ""
        if not run_id:
            raise TrackingError(f"{self.http.name} made a run but did not say its id")
        return TrackerRun(
            kind=self.kind,
            run_id=run_id,
            url=f"{self.uri}/#/experiments/{experiment_id}/runs/{run_id}",
            uri=self.uri,
            experiment=name,
            experiment_id=experiment_id,
            artifacts=str(info.get("artifact_uri") or "") if isinstance(info, dict) else "",
            parent="" if opening.parent is None else opening.parent.run_id,
        )

    def _experiment_id(self, name: str) -> str:
        """The experiment's id, made if it does not exist (another run making it meanwhile is fine)."""
        for attempt in range(2):
            try:
                found = self.http.json("GET", f"{API}/experiments/get-by-name", query={"experiment_name": name})
                return self._id(_field(found, "experiment", "experiment_id"), "experiment")
            except Refused as error:
                if error.code != "RESOURCE_DOES_NOT_EXIST" and error.status != 404:
                    raise
            try:
                made = self.http.json("POST", f"{API}/experiments/create", {"name": name})
                return self._id(_field(made, "experiment_id"), "experiment")
            except Refused as error:
                if error.code != "RESOURCE_ALREADY_EXISTS" or attempt:
                    raise
        raise TrackingError(f"{self.http.name} has no experiment {name!r} and made none")

    def reopen(self, link: TrackerRun, run_id: str) -> None:
        self.http.json("POST", f"{API}/runs/update", {"run_id": link.run_id, "status": "RUNNING"})
        self._batch(link.run_id, tags=_pairs({"tfctl.latest_run": run_id}))

    def close(self, link: TrackerRun, ending: Ending) -> list[str]:
        """Each part on its own: one the server refuses is said and the rest still go, the run's
        status last. A server that does not answer ends it (TrackingError): nothing would go."""
        missed = []
        metrics = list(self._metrics(ending))
        try:
            for start in range(0, len(metrics), BATCH):
                self._batch(link.run_id, metrics=metrics[start : start + BATCH])
        except Refused as error:
            missed.append(f"tfctl's figures and curves ({error.message})")
        tags = {"tfctl.state": ending.state, "tfctl.reason": ending.reason, "tfctl.latest_run": ending.run_id}
        try:
            self._batch(link.run_id, tags=_pairs(tags))
        except Refused as error:
            missed.append(f"how the run ended ({error.message})")
        if ending.report is None:
            missed.append("the report (its hosts could not say enough to make it)")
        elif (path := _proxied(link.artifacts)) is None:
            missed.append(
                f"the report: the server keeps artifacts at {link.artifacts}; tfctl writes them only through "
                "the server's artifact proxy (`mlflow server`'s default)"
            )
        else:
            try:
                self.http.send(
                    "PUT",
                    f"/api/2.0/mlflow-artifacts/artifacts/{path}/tfctl-report.html",
                    ending.report.encode(),
                    "text/html",
                )
            except Refused as error:
                missed.append(f"the report ({error.message})")
        status = _STATUS.get(ending.state, "FINISHED")
        self.http.json(
            "POST", f"{API}/runs/update", {"run_id": link.run_id, "status": status, "end_time": _ms(ending.ended_at)}
        )
        return missed

    def _id(self, value: object, what: str) -> str:
        if isinstance(value, (str, int)) and not isinstance(value, bool) and str(value):
            return str(value)
        raise TrackingError(f"{self.http.name} answered without the {what}'s id")

    def close_parent(self, link: TrackerRun, state: str, at: float) -> None:
        status = "FINISHED" if state == "done" else "KILLED"
        self.http.json("POST", f"{API}/runs/update", {"run_id": link.run_id, "status": status, "end_time": _ms(at)})

    def task_env(self, link: TrackerRun) -> dict[str, str]:
        return {
            "MLFLOW_TRACKING_URI": link.uri,
            "MLFLOW_RUN_ID": link.run_id,
            "MLFLOW_EXPERIMENT_NAME": link.experiment,
            "MLFLOW_EXPERIMENT_ID": link.experiment_id,
        }

    def _metrics(self, ending: Ending) -> Iterable[dict[str, Any]]:
        at = _ms(ending.ended_at)
        for name, value in ending.figures.items():
            yield {"key": f"tfctl/{name}", "value": value, "timestamp": at, "step": 0}
        for name, points in ending.series.items():
            for point in points:
                yield {"key": f"tfctl/{name}", "value": point.value, "timestamp": _ms(point.at), "step": point.step}
        for name, point in ending.result.items():
            yield {"key": f"tfctl/final/{name}", "value": point.value, "timestamp": _ms(point.at), "step": point.step}

    def _batch(self, run_id: str, **items: list[dict[str, Any]]) -> None:
        self.http.json("POST", f"{API}/runs/log-batch", {"run_id": run_id, **items})


def _field(answer: Any, *keys: str) -> Any:
    """`answer[k1][k2]...`, or None where the server's answer has another shape."""
    for key in keys:
        answer = answer.get(key) if isinstance(answer, dict) else None
    return answer


def _proxied(artifacts: str) -> str | None:
    """The path under the server's artifact proxy of an `mlflow-artifacts:` location, else None."""
    scheme, _, rest = artifacts.partition(":")
    if scheme != "mlflow-artifacts":
        return None
    rest = rest.lstrip("/")
    if artifacts.startswith("mlflow-artifacts://"):  # mlflow-artifacts://host:port/path names the server too
        rest = rest.partition("/")[2]
    return rest.strip("/") or None
