"""What each KFP backend release runs of a compiled pipeline.

kfp.local runs whatever the SDK compiles; a cluster's backend (its API server's Argo compiler and its driver) runs
less, and each release a different less. This module holds the IR constructs the project's pipelines use, the first
backend version that executes each (read from kubeflow/pipelines' backend sources at the tags Kubeflow ships, with the
file and line), what an older one does with it, and the check that a compiled pipeline uses nothing its target lacks:
at `make compile` (tests/test_backend_support.py walks every compiled pipeline) and at submission, against the
version the endpoint's health check names.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass

# The KFP backends users run: the release that ships each (docs/cluster.md's table), oldest first.
RELEASES = {
    "2.3.0": "Kubeflow 1.9.1",
    "2.5.0": "Kubeflow 1.10.2",
    "2.15.0": "Kubeflow 1.11.0",
    "2.16.0": "Kubeflow 26.03",
    "2.17.0": "standalone KFP 2.17.0",
}
NEVER = "none"  # a construct no release runs: never compiled into the project's pipelines


@dataclass(frozen=True)
class Construct:
    """An IR construct: `since` is the first backend version found to execute it (NEVER: none); an older backend
    `fails` the run on it, or else runs without it (`older` says what happens); `source` is where each was read."""

    description: str
    since: str
    older: str
    source: str
    fails: bool = True


D23, D25 = "2.3.0:backend/src/v2/driver/driver.go", "2.5.0:backend/src/v2/driver/driver.go"
CONSTRUCTS = {
    "parallel-for": Construct(
        "a ParallelFor over a task's output (parameterIterator)", "2.3.0", "", f"{D23}:755 (the iterator's driver)"
    ),
    "collected-parameters": Construct(
        "dsl.Collected of a ParallelFor's output parameters",
        "2.14.0",
        "skips a ParallelFor's inside, then fails: 'subTaskName, ..., not in tasks'",
        f"2.14.0:backend/src/v2/driver/resolve.go:610 (PR #11725); {D25}:1767 and :1910",
    ),
    "collected-artifacts": Construct(
        "dsl.Collected of a ParallelFor's output artifacts",
        "2.14.0",
        "skips a ParallelFor's inside, then fails: 'subTaskName, ..., not in tasks'",
        f"2.14.0:backend/src/v2/driver/resolve.go:707; {D25}:1767",
    ),
    "named-loop": Construct(
        "a ParallelFor given a name= whose outputs are collected",
        "2.16.0",
        "records the iterations under the display name: the collecting step's inputs are not found (issue #13239)",
        "2.16.0:backend/src/v2/compiler/argocompiler/dag.go (PR #12808, commit fdd799af59)",
    ),
    "loop-in-exit-handler": Construct(
        "a ParallelFor inside an ExitHandler",
        NEVER,
        "fails without a message on 2.14.3 (issue #12390, open); its status never reaches the exit task before 2.17.0 "
        "(issue #13321)",
        "kubeflow/pipelines issues #12390 and #13321",
    ),
    "display-name-on-producer": Construct(
        "set_display_name on a task whose outputs another task reads",
        "2.14.0",
        "records the task under its display name: its readers fail with 'producer task, ..., not in tasks' "
        "(issue #11173)",
        f"2.14.0:backend/src/v2/cmd/driver/main.go:63 (--task_name, PRs #11938 and #12061); {D25}:1161",
    ),
    "exit-handler": Construct("an ExitHandler", "2.3.0", "", "2.3.0:backend/src/v2/compiler/argocompiler/dag.go:223"),
    "task-final-status": Construct(
        "an exit task reading PipelineTaskFinalStatus",
        "2.14.0",
        "refuses the run: 'task final status not supported yet'",
        "2.14.0:backend/src/v2/driver/resolve.go:412 (PR #11953); "
        "2.5.0:backend/src/v2/compiler/argocompiler/dag.go:629",
    ),
    "condition": Construct("dsl.If / Elif / Else (a trigger condition)", "2.3.0", "", f"{D23}:266"),
    "nested-pipeline-outputs": Construct(
        "a pipeline used as a component, its outputs read by another task",
        "2.5.0",
        "reads a sub-pipeline's outputs as a step's, and finds none",
        f"{D25}:1973 (the producer subtask)",
    ),
    "caching-options": Construct("set_caching_options", "2.3.0", "", f"{D23}:321"),
    "retry-policy": Construct(
        "set_retry",
        "2.5.0",
        "runs the step once, without retries",
        "2.5.0:backend/src/v2/compiler/argocompiler/container.go:329",
        fails=False,
    ),
    "resources-from-parameters": Construct(
        "CPU, memory or GPUs from a pipeline parameter",
        "2.5.0",
        "ignores them: the pod gets the namespace's defaults",
        f"{D25}:545 and :557",
        fails=False,
    ),
    "secret-env-name-parameter": Construct(
        "use_secret_as_env with the secret's name from a parameter",
        "2.5.0",
        "reads only a constant name: the environment names the secret '' and the pod is refused",
        f"{D25}:905; {D23}:551",
    ),
    "config-map-env-name-parameter": Construct(
        "use_config_map_as_env with the name from a parameter alone",
        "2.5.0",
        "names the config map ''",
        f"{D25}:973; {D23}:585",
    ),
    "optional-env": Construct(
        "use_secret_as_env / use_config_map_as_env with optional=True",
        "2.15.0",
        "ignores optional: the pod waits until the secret and the config map exist",
        "2.15.0:backend/src/v2/driver/k8s.go:340 and :436",
        fails=False,
    ),
    "image-pull-secret-name-parameter": Construct(
        "set_image_pull_secrets from a parameter",
        "2.5.0",
        "pulls without a secret",
        f"{D25}:993; {D23}:601",
        fails=False,
    ),
    "tolerations": Construct("add_toleration", "2.3.0", "", f"{D23}:511"),
    "field-path-env": Construct("use_field_path_as_env", "2.3.0", "", f"{D23}:606"),
    "timeout": Construct("kubernetes.set_timeout (activeDeadlineSeconds)", "2.3.0", "", f"{D23}:619"),
}
# The kfp-kubernetes fields of an executor that the constructs above cover (any other is refused, unread).
KUBERNETES_FIELDS = {
    "secretAsEnv", "configMapAsEnv", "imagePullSecret", "tolerations", "fieldPathAsEnv", "activeDeadlineSeconds"
}  # fmt: skip
_PLACEHOLDER = re.compile(r"\{\{\$")


def version_key(version: str) -> tuple[int, ...] | None:
    """(2, 15, 0) of '2.15.0' or 'v2.15.0-rc.1' (a pre-release counts as its release); None if not a version."""
    match = re.fullmatch(r"v?(\d+)\.(\d+)(?:\.(\d+))?(?:[-+.].*)?", version.strip())
    return tuple(int(part or 0) for part in match.groups()) if match else None


def runs(construct: Construct, version: str) -> bool:
    return construct.since != NEVER and version_key(version) >= version_key(construct.since)


def first_release(construct: Construct) -> str | None:
    """The oldest of RELEASES that runs `construct` (None: none does)."""
    return next((release for release in RELEASES if runs(construct, release)), None)


def _dags(ir: dict) -> Iterator[tuple[str, dict, dict]]:
    """(the DAG's component name, its dag, its outputs) for the root and every sub-DAG."""
    yield "root", ir["root"]["dag"], ir["root"].get("dag", {}).get("outputs", {})
    for name, component in ir.get("components", {}).items():
        if "dag" in component:
            yield name, component["dag"], component["dag"].get("outputs", {})


def _producers(task: dict) -> Iterator[tuple[str, str]]:
    """(producer task, 'parameters' or 'artifacts') of each input of `task` read from a sibling task."""
    for kind, reference in (("parameters", "taskOutputParameter"), ("artifacts", "taskOutputArtifact")):
        for spec in task.get("inputs", {}).get(kind, {}).values():
            if reference in spec:
                yield spec[reference]["producerTask"], kind


def _subtask_producers(outputs: dict) -> Iterator[str]:
    for spec in outputs.get("parameters", {}).values():
        if "valueFromParameter" in spec:
            yield spec["valueFromParameter"]["producerSubtask"]
    for spec in outputs.get("artifacts", {}).values():
        for selector in spec.get("artifactSelectors", []):
            yield selector["producerSubtask"]


def constructs_used(documents: list[dict]) -> dict[str, list[str]]:
    """{construct: [where]} of a compiled pipeline's YAML documents (the IR, then its platform spec if any)."""
    ir = documents[0]
    found: dict[str, list[str]] = {}

    def add(name: str, where: str) -> None:
        found.setdefault(name, []).append(where)

    components = ir.get("components", {})
    for dag_name, dag, outputs in _dags(ir):
        tasks = dag.get("tasks", {})
        read = {producer for task in tasks.values() for producer, _kind in _producers(task)}
        read |= set(_subtask_producers(outputs))
        for key, task in tasks.items():
            where = f"{dag_name}/{key}"
            component = components.get(task.get("componentRef", {}).get("name"), {})
            loop = "parameterIterator" in task or "artifactIterator" in task
            if loop:
                add("parallel-for", where)
                if task["taskInfo"]["name"] != key and key in read:
                    add("named-loop", where)
                if dag_name.startswith("comp-exit-handler"):
                    add("loop-in-exit-handler", where)
            elif task["taskInfo"]["name"] != key and key in read:
                add("display-name-on-producer", f"{where} ({task['taskInfo']['name']!r})")
            if "dag" in component and key in read and not loop:
                add("nested-pipeline-outputs", where)
            for producer, kind in _producers(task):
                producer_task = tasks.get(producer, {})
                if "parameterIterator" in producer_task or "artifactIterator" in producer_task:
                    add(f"collected-{kind}", f"{where} <- {producer}")
            if "taskFinalStatus" in str(task.get("inputs", {})):
                add("task-final-status", where)
            if task.get("triggerPolicy", {}).get("condition"):
                add("condition", where)
            if "cachingOptions" in task:
                add("caching-options", where)
            if "retryPolicy" in task:
                add("retry-policy", where)
        if dag_name.startswith("comp-exit-handler"):
            add("exit-handler", dag_name)
    for name, executor in ir.get("deploymentSpec", {}).get("executors", {}).items():
        resources = executor.get("container", {}).get("resources", {})
        if _PLACEHOLDER.search(str(resources)):
            add("resources-from-parameters", name)
    for name, executor in _kubernetes_executors(documents[1:]):
        _add_kubernetes(name, executor, add)
    return found


def _kubernetes_executors(platforms: list[dict]) -> Iterator[tuple[str, dict]]:
    for document in platforms:
        executors = document.get("platforms", {}).get("kubernetes", {}).get("deploymentSpec", {}).get("executors", {})
        yield from executors.items()


def _add_kubernetes(name: str, executor: dict, add) -> None:
    for field in executor:
        if field not in KUBERNETES_FIELDS:
            add(f"unread kfp-kubernetes field {field}", name)
    for entry in executor.get("secretAsEnv", []):
        if "secretNameParameter" in entry and not entry.get("secretName"):
            add("secret-env-name-parameter", name)
        if entry.get("optional"):
            add("optional-env", name)
    for entry in executor.get("configMapAsEnv", []):
        if "configMapNameParameter" in entry and not entry.get("configMapName"):
            add("config-map-env-name-parameter", name)
        if entry.get("optional"):
            add("optional-env", name)
    for entry in executor.get("imagePullSecret", []):
        if "secretNameParameter" in entry and not entry.get("secretName"):
            add("image-pull-secret-name-parameter", name)
    for field, construct in (("tolerations", "tolerations"), ("fieldPathAsEnv", "field-path-env"),
                             ("activeDeadlineSeconds", "timeout")):  # fmt: skip
        if field in executor:
            add(construct, name)


def oldest_release(documents: list[dict]) -> str | None:
    """The oldest of RELEASES that runs the compiled pipeline (None: none does)."""
    used = constructs_used(documents)
    for release in RELEASES:
        if not problems(used, release)[0]:
            return release
    return None


def problems(used: dict[str, list[str]], version: str) -> tuple[list[str], list[str]]:
    """(what fails, what is ignored) on the KFP backend `version`, one sentence each, naming where in the pipeline."""
    failing, ignored = [], []
    for name, places in sorted(used.items()):
        construct = CONSTRUCTS.get(name)
        if construct is None:
            failing.append(f"{name} ({places[0]}): not in pipeline/backend_support.py's table of what backends run")
            continue
        if runs(construct, version):
            continue
        since = "no release" if construct.since == NEVER else construct.since
        sentence = f"{construct.description} ({places[0]}): {construct.older} (runs from {since}; {construct.source})"
        (failing if construct.fails else ignored).append(sentence)
    return failing, ignored
