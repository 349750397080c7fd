"""A local run's record (`run.json` in its folder): the options it was started with, and how it stands.

`local-run` writes it before the first step and again when the run ends; resuming, `RESUME=last` and `clean-runs`
read it, so that a run is continued with its own options, a run that is still going is never resumed or removed,
and an interrupted run is kept until asked. A run whose record says `running` but whose process is gone (killed)
counts as interrupted. Folders of runs from before the record read as `unknown`.

Options that name a place inside the output folder (a resumed run's `model_dir` in an earlier run's folder, the
default `promotion_root`) are recorded relative to the run's folder (listed in `relative`), so the output folder can
be moved or copied and its runs still resumed there; they read back as paths.
"""

from __future__ import annotations

import dataclasses
import json
import os
import socket
import time
from pathlib import Path
from typing import Any

RECORD = "run.json"
MAX_RECORD_BYTES = 1024 * 1024
STATES = ("running", "finished", "interrupted", "failed")


def _schema():
    from components.common import documents

    return documents.Fields(
        {
            "parameters": documents.Fields(),
            "runner": documents.Text(choices=("subprocess", "docker")),
            "state": documents.Text(choices=STATES),
            "pid": documents.Number("[1, 4194304]", integer=True),
            "host": documents.Text(max_length=255),
            "started_at": documents.Number("[0, inf)"),
            "continues": documents.Text(max_length=255, nullable=True),
            "relative": documents.Items(documents.Text(max_length=255), max_items=1000),
        },
        required=("parameters", "runner", "state", "pid", "host", "started_at"),
        closed=True,
    )


@dataclasses.dataclass(frozen=True)
class RunRecord:
    parameters: dict[str, Any]
    runner: str
    state: str
    pid: int
    host: str
    started_at: float
    continues: str | None = None  # the run whose training this one resumed

    def still_running(self) -> bool:
        """`running`, by a process of this host that is alive."""
        from components.common.filesystem import process_alive

        return self.state == "running" and self.host == socket.gethostname() and process_alive(self.pid)

    def resumable(self) -> bool:
        return self.state == "interrupted" or (self.state == "running" and not self.still_running())

    def standing(self) -> str:
        """How the run stands, as a person reads it."""
        if self.state == "running" and not self.still_running():
            return "interrupted (its process is gone)"
        return self.state


def write(run_folder: Path, record: RunRecord) -> None:

    document = dataclasses.asdict(record)
    output_root = os.path.abspath(run_folder.parent)
    relative = []
    for name, value in record.parameters.items():
        if isinstance(value, str) and os.path.isabs(value):
            place = os.path.abspath(value)
            if os.path.commonpath([place, output_root]) == output_root:
                document["parameters"][name] = os.path.relpath(place, run_folder)
                relative.append(name)
    document["relative"] = sorted(relative)
    content = json.dumps(document, indent=2, sort_keys=True).encode()
    from components.common import filesystem

    filesystem.atomic_write_bytes(run_folder / RECORD, content)


def started(run_folder: Path, parameters: dict[str, Any], runner: str, continues: str | None) -> RunRecord:
    record = RunRecord(
        parameters=parameters,
        runner=runner,
        state="running",
        pid=os.getpid(),
        host=socket.gethostname(),
        started_at=time.time(),
        continues=continues,
    )
    write(run_folder, record)
    return record


def ended(run_folder: Path, record: RunRecord, state: str) -> None:
    write(run_folder, dataclasses.replace(record, state=state))


def read(run_folder: Path) -> RunRecord | None:
    """The run's record; None for a run from before records. A damaged record is a ValueError naming the file."""
    from components.common import storage

    path = run_folder / RECORD
    try:
        document = storage.document(path, _schema(), "run record", root=run_folder, max_bytes=MAX_RECORD_BYTES)
    except FileNotFoundError:
        return None
    parameters = dict(document["parameters"])
    for name in document.pop("relative", None) or []:
        value = parameters.get(name)
        if not isinstance(value, str) or os.path.isabs(value):
            raise ValueError(f"{path}: relative: {name} is not a relative place in parameters")
        parameters[name] = os.path.normpath(os.path.join(os.path.abspath(run_folder), value))
    return RunRecord(**{**document, "parameters": parameters})
