"""What a person sees of a local run: a line when each step starts and ends, the progress lines, warnings and errors,
from the chief worker only. Everything (kfp.local's executor input, TensorFlow's start-up lines, every worker's
output) goes to the run's log file, and to the terminal too with `verbose`.

kfp.local prints each step's output line by line to `sys.stdout`, as it prints its own log, so a `StepView` put in
place of `sys.stdout` for the run sees all of it.
"""

from __future__ import annotations

import collections
import contextlib
import io
import logging
import re
import sys
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import TextIO

from components.common import filesystem, secrets
from components.common.logs import LOG_FORMAT, EscapingFormatter

# kfp.local's names of the pipeline's tasks (component names), as a person would name the steps.
STEP_NAMES = {
    "source-fingerprint-component": "fingerprint the source",
    "prepare-data-component": "prepare data",
    "check-data-component": "check the data",
    "warm-start-component": "choose the warm start",
    "launch-training-job-component": "train",
    "train-component": "train",
    "evaluate-component": "evaluate",
    "promote-component": "promote",
    "delete-training-job-component": "clean up",
    "prepare-part-component": "prepare a part",
}
# Steps whose start and end are not worth a line: the prepare fan-out's (with one worker they do nothing). Their
# progress, warnings and failures are shown as any step's.
QUIET_STEPS = frozenset({"prepare-worker-indices-component", "prepare-part-component"})
# A line a stage logs: "[worker-1] 2026-01-01 12:00:00,000 INFO components.train.loop: step 100/300 ..."
_STAGE_LINE = re.compile(
    r"^(?:\[(?P<worker>[a-z]+-\d+)\] )?\d{4}-\d\d-\d\d (?P<time>\d\d:\d\d:\d\d),\d+ (?P<level>[A-Z]+) "
    r"(?P<logger>\S+): (?P<message>.*)$"
)
_KFP_LINE = re.compile(r"^(?P<time>\d\d:\d\d:\d\d)\.\d+ - (?P<level>[A-Z]+) - (?P<message>.*)$")
_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_TASK = re.compile(r"[Tt]ask '(?P<task>[^']+)'")
_CACHE_HIT = re.compile(r"Task '?(?P<task>[^' ]+)'? cache hit")
# The INFO lines of the stages a person wants to see: (logger prefix, message pattern).
SHOWN = (
    ("components.", re.compile(r"\(\d+%\), .* ETA ")),  # any stage's progress
    ("components.train.loop", re.compile(r"^(step \d+/\d+ |step \d+ validation-|resuming from |starting from step )")),
    ("components.prepare_data.prepare", re.compile(r"^published |already holds this dataset")),
    ("components.evaluate.", re.compile(r"^(BLESSED|NOT BLESSED|step \d+ \(|promoted version |not promoted)")),
    ("components.evaluate.data_check", re.compile(r"^(data check against |(ERROR|WARNING|NOTE) finding: )")),
    (
        "components.sweep.sweep",
        re.compile(
            r"^(trial \d+ (started|step \d+: validation accuracy|validation accuracy|pruned|failed|was|stopped with|: )"
            r"|sweep done)"
        ),
    ),  # each trial's measures as they come: a trial is minutes long
    ("components.sweep.kfp_run", re.compile(r"^best trial ")),
)
TAIL_LINES = 20  # of a failed step that said nothing itself


def step_name(task: str) -> str:
    return STEP_NAMES.get(task, task.removesuffix("-component"))


class StepView(io.TextIOBase):
    """A text stream that writes every line to `log` and the lines worth a person's attention to `terminal`."""

    def __init__(self, log: TextIO, terminal: TextIO, verbose: bool):
        self.log = log
        self.terminal = terminal
        self.verbose = verbose
        self.step = ""
        self.step_said_something = False
        self.failed_steps: list[str] = []  # the tasks that failed, in the order they did
        self.stopping: Callable[[], bool] = lambda: False  # whether the run is being stopped
        self.tail: collections.deque[str] = collections.deque(maxlen=TAIL_LINES)
        self._partial = ""

    def writable(self) -> bool:
        return True

    def write(self, text: str) -> int:
        self._partial += text
        *lines, self._partial = self._partial.split("\n")
        for line in lines:
            self._line(line)
        return len(text)

    def flush(self) -> None:
        self.log.flush()
        self.terminal.flush()

    def _line(self, raw: str) -> None:
        raw = secrets.mask(raw)  # a step's line that names a credential (its own output, a server's words)
        self.log.write(raw + "\n")
        if self.verbose:
            self.terminal.write(raw + "\n")
            return
        shown = self.select(raw)
        if shown is not None:
            self.terminal.write(shown + "\n")

    def select(self, raw: str) -> str | None:
        """The line to show for `raw`, or None."""
        line = _ANSI.sub("", raw).strip()
        kfp = _KFP_LINE.match(line)
        if kfp:
            return self._kfp_line(kfp["time"], kfp["message"])
        if not line:
            return None
        self.tail.append(line)
        stage = _STAGE_LINE.match(line)
        if stage is None or (stage["worker"] and stage["worker"] not in ("worker-0", "chief-0")):
            return None
        cached = _CACHE_HIT.search(stage["message"]) if stage["logger"] == "root" else None
        if cached and cached["task"] in QUIET_STEPS:
            return None
        if cached:  # kfp.local's own line, through the root logger
            return f"{stage['time']} {step_name(cached['task'])}: reused from an earlier run (same inputs)"
        important = stage["level"] in ("WARNING", "ERROR", "CRITICAL")
        wanted = any(
            stage["logger"].startswith(prefix) and pattern.search(stage["message"]) for prefix, pattern in SHOWN
        )
        if not (important or wanted):
            return None
        self.step_said_something = self.step_said_something or important
        level = "" if stage["level"] == "INFO" else f"{stage['level']} "
        return f"{stage['time']} {step_name(self.step)}: {level}{stage['message']}"

    def _kfp_line(self, time: str, message: str) -> str | None:
        task = _TASK.search(message)
        if message.startswith("Executing task") and task:
            self.step, self.step_said_something = task["task"], False
            self.tail.clear()
            return None if self.step in QUIET_STEPS else f"{time} {step_name(self.step)}: started"
        if "finished with status" in message and task:
            if "SUCCESS" in message:
                return None if task["task"] in QUIET_STEPS else f"{time} {step_name(task['task'])}: done"
            if self.stopping():  # ended because the run was stopped (Ctrl-C, SIGTERM), not by a failure of its own
                return f"{time} {step_name(task['task'])}: stopped"
            self.failed_steps.append(task["task"])
            said = "" if self.step_said_something else "\n".join(f"    {line}" for line in self.tail) + "\n"
            return f"{said}{time} {step_name(task['task'])}: FAILED (the full log has everything)"
        if "Retrying in" in message:
            return f"{time} {message}"
        return None


@contextlib.contextmanager
def steps_shown(log_path: Path, verbose: bool):
    """For the duration of a local run: kfp.local's output (and Python warnings) through a StepView."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    # Line-buffered: every line is in the file as soon as it is written (a stopped run leaves its record).
    with filesystem.open_for_append(log_path, text=True) as log:
        view = StepView(log, sys.stdout, verbose)
        original_stdout, original_showwarning = sys.stdout, warnings.showwarning

        def show_warning(message, category, filename, lineno, file=None, line=None):
            view.log.write(warnings.formatwarning(message, category, filename, lineno, line))

        # kfp.local logs some lines (a cache hit, a skipped branch) through the root logger: into the view, too.
        root = logging.getLogger()
        to_view = logging.StreamHandler(view)
        to_view.setFormatter(EscapingFormatter(LOG_FORMAT))
        to_view.addFilter(lambda record: record.name == "root")
        not_root = [(handler, _not_from_root) for handler in root.handlers]
        sys.stdout = view
        root.addHandler(to_view)
        for handler, rule in not_root:
            handler.addFilter(rule)
        if not verbose:  # kfp.local's warnings about settings a local runner ignores: the log has them
            warnings.showwarning = show_warning
        try:
            yield view
        finally:
            view.write("\n")
            root.removeHandler(to_view)
            for handler, rule in not_root:
                handler.removeFilter(rule)
            sys.stdout, warnings.showwarning = original_stdout, original_showwarning


def _not_from_root(record: logging.LogRecord) -> bool:
    return record.name != "root"
