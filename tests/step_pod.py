"""A stand-in for a KFP v2 step's pod on a cluster, faithful in how the step starts and how it is stopped.

On a cluster a step's main container runs Argo's emissary as PID 1 (argoproj/argo-workflows
`cmd/argoexec/commands/emissary.go`, v3.4-v3.6); emissary starts KFP's launcher (kubeflow/pipelines
`backend/src/v2/component/launcher_v2.go`, 2.x) in a process group of its own, and the launcher runs the component's
command (the compiled `sh -ec ... python3 -m kfp.dsl.executor_main` with `--executor_input`) as its child, in that
group. When the pod is stopped (a run cancelled from the UI, an eviction, a node drained), the kubelet sends SIGTERM to
PID 1; emissary forwards it to the launcher's process group (`syscall.Kill(-pgid, SIGTERM)`), so the component gets
it too; the launcher installs no handler, so Go's default ends it at once; emissary notices its child's end at its
next check (it polls once a second) and exits, and with PID 1 gone the kernel kills every process left in the pod.
A step therefore gets SIGTERM and then, within about a second, SIGKILL: an abrupt end, whatever its grace period.

`Step` plays this with real processes: `python -m tests.step_pod emissary` (a child subreaper, so that it can end
every process the step left, as the end of a pod's PID namespace does) runs `python -m tests.step_pod launcher` in
a new process group, which runs the step's command as its child. The command is the executor's own from a compiled
pipeline file, its placeholders resolved as kfp.local resolves them; a retried step is another `Step` of the same
task (the same task folder: the outputs' locations are the attempt's, as the backend's for a retried pod).
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPOSITORY = Path(__file__).resolve().parents[1]
EMISSARY_POLL_SECONDS = 1.0  # emissary checks its child's end once a second
PR_SET_CHILD_SUBREAPER = 36


@dataclass
class StepEnd:
    code: int
    log: str
    stopped: bool  # the pod was stopped (SIGTERM to PID 1) before the step ended by itself
    outputs: dict[str, Any]  # the executor's output parameters (the return value), when it wrote them
    artifacts: dict[str, Any]  # its output artifacts (kfp.dsl objects with their metadata), to give the next step


class Step:
    """One attempt of task `task` (a pipeline task name, e.g. "train-component") of a compiled pipeline file."""

    def __init__(self, pipeline_file: Path, task: str, arguments: dict[str, Any], root: Path, environment=None):
        import yaml
        from google.protobuf import json_format
        from kfp.local import executor_input_utils, placeholder_utils
        from kfp.pipeline_spec import pipeline_spec_pb2

        spec = next(yaml.safe_load_all(Path(pipeline_file).read_text()))  # the pipeline (a platform spec may follow)
        component_name = _task_component(spec, task)
        component = json_format.ParseDict(spec["components"][component_name], pipeline_spec_pb2.ComponentSpec())
        executor = spec["deploymentSpec"]["executors"][component.executor_label]
        self.task_root = Path(root) / "pipeline" / task
        executor_input = executor_input_utils.construct_executor_input(
            component_spec=component, arguments=arguments, task_root=str(self.task_root), block_input_artifact=False
        )
        executor_input_dict = executor_input_utils.executor_input_to_dict(executor_input, component)
        container = executor["container"]
        self.command = placeholder_utils.replace_placeholders(
            full_command=list(container["command"]) + list(container.get("args", [])),
            executor_input_dict=executor_input_dict,
            pipeline_resource_name="pipeline",
            task_resource_name=task,
            pipeline_root=str(root),
            unique_pipeline_id="run",
        )
        self.output_file = Path(executor_input_dict["outputs"]["outputFile"])
        self.artifacts = {  # name -> (its type's title, its location)
            name: (value["artifacts"][0]["type"]["schemaTitle"], value["artifacts"][0]["uri"])
            for name, value in executor_input_dict["outputs"].get("artifacts", {}).items()
        }
        bin_folder = str(Path(sys.executable).parent)  # the container's python3 is this environment's
        self.environment = {
            **os.environ,
            "PATH": bin_folder + os.pathsep + os.environ.get("PATH", ""),
            "PYTHONPATH": str(REPOSITORY),
            **{env["name"]: env["value"] for env in container.get("env", [])},
            **(environment or {}),
        }
        self.process: subprocess.Popen | None = None

    def start(self) -> None:
        self.task_root.mkdir(parents=True, exist_ok=True)
        self.process = subprocess.Popen(
            [sys.executable, "-m", "tests.step_pod", "emissary", "--", *self.command],
            cwd=REPOSITORY, env=self.environment, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )  # fmt: skip

    def stop(self) -> None:
        """The kubelet stopping the pod: SIGTERM to its PID 1."""
        self.process.send_signal(signal.SIGTERM)

    def run(self, stop_at: str | None = None, timeout: float = 600.0) -> StepEnd:
        """Run the step to its end, or stop its pod at the first line of its log matching `stop_at`."""
        self.start()
        lines, stopped = [], False
        deadline = time.monotonic() + timeout
        for line in self.process.stdout:
            lines.append(line)
            if stop_at and not stopped and re.search(stop_at, line):
                self.stop()
                stopped = True
            if time.monotonic() > deadline:
                self.process.kill()
                raise TimeoutError("".join(lines)[-3000:])
        code = self.process.wait(timeout=60)
        written = json.loads(self.output_file.read_text()) if self.output_file.exists() else {}
        return StepEnd(code, "".join(lines), stopped, written.get("parameterValues", {}), self._artifacts(written))

    def _artifacts(self, written: dict) -> dict[str, Any]:
        from kfp import dsl

        kinds = {"system.Dataset": dsl.Dataset, "system.Model": dsl.Model}
        found = {}
        for name, (title, uri) in self.artifacts.items():
            entries = written.get("artifacts", {}).get(name, {}).get("artifacts", [{}])
            found[name] = kinds.get(title, dsl.Artifact)(name=name, uri=uri, metadata=entries[0].get("metadata", {}))
        return found


def _task_component(spec: dict, task: str) -> str:
    """The component of task `task`, in the pipeline's DAG or one nested in it (an exit handler's, a condition's)."""
    dags = [spec["root"]["dag"]] + [component["dag"] for component in spec["components"].values() if "dag" in component]
    for dag in dags:
        if task in dag["tasks"]:
            return dag["tasks"][task]["componentRef"]["name"]
    raise KeyError(f"no task {task} in the pipeline")


# -- the two processes of the pod ----------------------------------------------------------------------------------


def _descendants(root: int) -> list[int]:
    """Every process whose chain of parents reaches `root` (this subreaper adopts the orphans of the step)."""
    parents = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            parents[int(entry)] = int(stat.rsplit(")", 1)[1].split()[1])
    found, frontier = [], [root]
    while frontier:
        parent = frontier.pop()
        children = [pid for pid, ppid in parents.items() if ppid == parent]
        found.extend(children)
        frontier.extend(children)
    return found


def _end_of_pod() -> None:
    """PID 1 exited: the kernel kills every process of the pod's PID namespace."""
    for _ in range(50):
        left = _descendants(os.getpid())
        if not left:
            return
        for pid in left:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        for pid in left:
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, os.WNOHANG)
        time.sleep(0.05)


def emissary(command: list[str]) -> int:
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    launcher = subprocess.Popen([sys.executable, "-m", "tests.step_pod", "launcher", "--", *command],
                                process_group=0)  # fmt: skip

    def forward(number, _frame):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(launcher.pid, number)

    for number in (signal.SIGTERM, signal.SIGINT):
        signal.signal(number, forward)
    while launcher.poll() is None:
        time.sleep(EMISSARY_POLL_SECONDS)
    _end_of_pod()
    return launcher.returncode if launcher.returncode >= 0 else 128 - launcher.returncode


def launcher(command: list[str]) -> int:
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # Go's default: SIGTERM ends the launcher at once
    return subprocess.call(command)


if __name__ == "__main__":
    role, separator, *rest = sys.argv[1:]
    assert separator == "--"
    sys.exit({"emissary": emissary, "launcher": launcher}[role](rest))
