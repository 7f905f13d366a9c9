"""Log tfctl's figures of an ended run into its W&B run: run by `wandb.Wandb.close` as a child
process (the job as JSON on stdin), so the controller never imports `wandb` itself."""

from __future__ import annotations

import json
import os
import sys
import tempfile


def main() -> int:
    import wandb

    job = json.load(sys.stdin)
    link, ending = job["link"], job["ending"]
    run = wandb.init(
        id=link["run_id"],
        project=link["experiment"],
        entity=link.get("entity") or None,
        group=link.get("group") or None,
        mode=link.get("mode") or None,
        resume="allow",
        dir=ending["folder"],
    )
    # Tables, not logged steps: W&B's step is the chief's (it logs with step=), and a point
    # logged here would move it past the chief's next ones after a resume.
    summary: dict[str, object] = {
        f"tfctl/{name}": wandb.Table(
            columns=["step", "value", "time"], data=[[p["step"], p["value"], p["at"]] for p in points]
        )
        for name, points in ending["series"].items()
    }
    summary.update({f"tfctl/{name}": value for name, value in ending["figures"].items()})
    summary.update({f"tfctl/final/{name}": point["value"] for name, point in ending["result"].items()})
    summary.update({"tfctl/state": ending["state"], "tfctl/reason": ending["reason"]})
    run.summary.update(summary)
    if ending["report"] is not None:
        with tempfile.TemporaryDirectory() as folder:
            page = os.path.join(folder, "tfctl-report.html")
            with open(page, "w", encoding="utf-8") as out:
                out.write(ending["report"])
            artifact = wandb.Artifact(f"tfctl-report-{ending['run_id']}", type="report")
            artifact.add_file(page)
            run.log_artifact(artifact)
            run.finish(exit_code=0 if ending["state"] == "succeeded" else 1)
    else:
        run.finish(exit_code=0 if ending["state"] == "succeeded" else 1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
