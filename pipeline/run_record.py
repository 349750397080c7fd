"""A local run's record (`run.json` in its folder): the options it was started with, and how it stands.

`local-run` writes it before the first step and again when the run ends; resuming, `RESUME=last` and `clean-runs`
read it, so that a run is continued with its own options, a run that is still going is never resumed or removed,
and an interrupted run is kept until asked. A run whose record says `running` but whose process is gone (killed)
counts as interrupted. Folders of runs from before the record read as `unknown`.
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
        from components.common.storage import process_alive

        return self.state == "running" and self.host == socket.gethostname() and process_alive(self.pid)

    def resumable(self) -> bool:
        return self.state == "interrupted" or (self.state == "running" and not self.still_running())

    def standing(self) -> str:
        """How the run stands, as a person reads it."""
        if self.state == "running" and not self.still_running():
            return "interrupted (its process is gone)"
        return self.state


def write(run_folder: Path, record: RunRecord) -> None:
    from components.common import storage

    content = json.dumps(dataclasses.asdict(record), indent=2, sort_keys=True).encode()
    storage.atomic_write_bytes(run_folder / RECORD, content)


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
        content = storage.read_regular_file(path, MAX_RECORD_BYTES)
    except FileNotFoundError:
        return None
    except OSError as error:
        raise ValueError(f"{path}: cannot be read ({error})") from None
    try:
        document = json.loads(content)
    except ValueError as error:
        raise ValueError(f"{path}: not JSON ({error})") from None
    fields = {field.name: field.type for field in dataclasses.fields(RunRecord)}
    if not isinstance(document, dict) or set(document) - set(fields):
        raise ValueError(f"{path}: not a run record (an object with the fields {sorted(fields)})")
    checks = {
        "parameters": lambda value: isinstance(value, dict),
        "runner": lambda value: value in ("subprocess", "docker"),
        "state": lambda value: value in STATES,
        "pid": lambda value: isinstance(value, int) and not isinstance(value, bool) and 0 < value < 2**22,
        "host": lambda value: isinstance(value, str) and len(value) < 256,
        "started_at": lambda value: isinstance(value, int | float) and not isinstance(value, bool) and value >= 0,
        "continues": lambda value: value is None or (isinstance(value, str) and len(value) < 256),
    }
    for name, valid in checks.items():
        if name not in document and name != "continues":
            raise ValueError(f"{path}: the field {name} is missing")
        if name in document and not valid(document[name]):
            raise ValueError(f"{path}: the field {name} has an invalid value {str(document[name])[:80]!r}")
    return RunRecord(**document)
