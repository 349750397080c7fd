"""The trainjob launcher: multi-worker training as a Kubeflow Trainer v2 TrainJob (Kubeflow 1.11, 26.03 and later).

Trainer v2 has no TensorFlow plugin: the TrainJob references the ClusterTrainingRuntime the admin installs once
(`manifests/admin/trainer/trainjob-runtime.yaml`: the PlainML policy, one replicated job `node` whose container `node`
runs
the train image, the restricted Pod Security profile, and the failure policies that restart every worker together
after a preemption and fail at once on a final error). PlainML only sets the node count and the TrainJob's env; so
the TrainJob's env tells each worker its job's name and size, and the worker builds TF_CONFIG from them, its
completion index and the stable JobSet host names `<job>-node-0-<i>.<job>` (`distribution.cluster_from_jobset`).

What a profile's default-editor may do (Trainer's kubeflow-trainer-roles.yaml): create, watch and delete TrainJobs,
read pods and their logs, read ClusterTrainingRuntimes; not JobSets or runtimes. So this launcher touches nothing
else: worker 0 is found among the job's pods by the JobSet's labels, and a JobSet restart shows as a new pod.

Two TrainJob APIs are in use: Kubeflow 1.11 and 26.03 install Trainer v2.1, whose pod settings go into
`podTemplateOverrides` (no grace period, no `activeDeadlineSeconds`); Trainer v2.2 and later take `runtimePatches`.
The launcher reads which one the cluster serves from its published OpenAPI schema, and creates the job with strict
field validation, so a field the cluster does not know is an error, never silently dropped.
"""

from __future__ import annotations

import logging
from typing import Any

from components.train import step_lease
from components.train.cluster_job import (
    ClusterJobLauncher,
    JobError,
    JobOutcome,
    Worker0,
    api_reason,
    gpu_tolerations,
    job_labels,
    object_store_environment,
    status_of,
    suspended,
    worker_arguments,
    worker_image,
    worker_resources,
)
from components.train.config import TrainConfig
from components.train.distribution import TRAINJOB_NAME, TRAINJOB_NUM_NODES
from components.train.launch_config import JOB_NAME_RESERVE, LaunchConfig, check_dns_1035_label

NODE = "node"  # the runtime's replicated job and container (Trainer's constants.Node)
RUNTIME_MANIFEST = "manifests/admin/trainer/trainjob-runtime.yaml"
PATCH_MANAGER = "cifar10-pipeline/launcher"  # a runtime patch's owner: a domain-prefixed path
JOBSET_NAME_LABEL = "jobset.sigs.k8s.io/jobset-name"
RESTART_ATTEMPT_LABEL = "jobset.sigs.k8s.io/restart-attempt"
COMPLETION_INDEX = "batch.kubernetes.io/job-completion-index"  # an annotation on every pod of an Indexed Job

logger = logging.getLogger(__name__)


# The TrainJob spec fields of Trainer v2.3 (what the launcher builds when the cluster's schema cannot be read).
CURRENT_SPEC_FIELDS = frozenset({"runtimeRef", "trainer", "runtimePatches", "activeDeadlineSeconds"})
CURRENT_POD_PATCH_FIELDS = frozenset(
    {"serviceAccountName", "imagePullSecrets", "tolerations", "terminationGracePeriodSeconds"}
)  # of the ones this launcher sets


def check_pod_names(name: str, workers: int) -> None:
    """JobSet's webhook refuses a JobSet whose longest pod name, `<name>-node-<job>-<pod>-<5 random>`, is not a
    DNS-1035 label of at most 63 characters (Trainer v2.3 then only emits a Warning event): refused here, before
    anything is created, naming the longest name the job may have."""
    longest = f"{name}-{NODE}-0-{workers - 1}-abcde"
    if len(longest) > 63:
        room = 63 - (len(longest) - len(name))
        raise ValueError(
            f"job_name: {name!r} is {len(name)} characters; with {workers} workers JobSet names a pod {longest!r} "
            f"({len(longest)} characters, more than Kubernetes' 63): give a name of at most {room} characters"
        )


class TrainJobKind:
    kind, group, version, plural = "TrainJob", "trainer.kubeflow.org", "v1alpha1", "trainjobs"
    operator = "Kubeflow Trainer v2 (TrainJob)"

    def __init__(
        self,
        spec_fields: frozenset[str] = CURRENT_SPEC_FIELDS,
        runtime: dict | None = None,
        pod_patch_fields: frozenset[str] = CURRENT_POD_PATCH_FIELDS,
    ):
        self.spec_fields = spec_fields  # the TrainJob spec fields the cluster's Trainer knows
        self.pod_patch_fields = pod_patch_fields  # the pod fields its runtime patch (or pod override) takes
        self.runtime = runtime or {}

    def build(self, train: TrainConfig, launch: LaunchConfig, name: str, namespace: str) -> dict[str, Any]:
        """The TrainJob: the runtime, N nodes with their image, command, arguments, resources and env, and the pod
        settings (service account, pull secrets, GPU tolerations, grace period) where this Trainer takes them."""
        check_dns_1035_label(name, "job_name", reserve=JOB_NAME_RESERVE)
        check_pod_names(name, train.workers)
        pod_patch: dict[str, Any] = {"serviceAccountName": launch.service_account}
        if "terminationGracePeriodSeconds" in self.pod_patch_fields:
            pod_patch["terminationGracePeriodSeconds"] = launch.termination_grace_seconds
        if launch.image_pull_secrets:
            pod_patch["imagePullSecrets"] = [{"name": secret} for secret in launch.image_pull_secrets]
        if tolerations := gpu_tolerations(launch):
            pod_patch["tolerations"] = tolerations
        identity = [
            {"name": TRAINJOB_NAME, "value": name},
            {"name": TRAINJOB_NUM_NODES, "value": str(train.workers)},
        ]
        spec: dict[str, Any] = {
            "runtimeRef": {"name": launch.runtime, "apiGroup": self.group, "kind": "ClusterTrainingRuntime"},
            "trainer": {
                "image": worker_image(launch),
                "command": ["python", "-m", "components.train"],
                "args": worker_arguments(train),
                "numNodes": train.workers,
                "resourcesPerNode": worker_resources(launch),
                "env": identity
                + object_store_environment(launch, train.model_dir)
                + step_lease.worker_environment(self, name, launch.step_lease_seconds),
            },
        }
        if "activeDeadlineSeconds" in self.spec_fields:
            spec["activeDeadlineSeconds"] = int(launch.job_timeout_seconds)
        if "runtimePatches" in self.spec_fields:
            replicated = [{"name": NODE, "template": {"spec": {"template": {"spec": pod_patch}}}}]
            runtime_spec = {"template": {"spec": {"replicatedJobs": replicated}}}
            spec["runtimePatches"] = [{"manager": PATCH_MANAGER, "trainingRuntimeSpec": runtime_spec}]
        elif "podTemplateOverrides" in self.spec_fields:
            spec["podTemplateOverrides"] = [{"targetJobs": [{"name": NODE}], "spec": pod_patch}]
        else:
            raise JobError(
                "this cluster's TrainJob API takes neither runtimePatches nor podTemplateOverrides: the workers' "
                "service account, pull secrets and tolerations cannot be set (Kubeflow Trainer v2.1 or later needed)"
            )
        return {
            "apiVersion": f"{self.group}/{self.version}",
            "kind": self.kind,
            "metadata": {"name": name, "namespace": namespace, "labels": job_labels(launch)},
            "spec": spec,
        }

    def outcome(self, job: dict[str, Any]) -> JobOutcome | None:
        """Complete or Failed (status "True") when the job has ended, else None."""
        for condition in (job.get("status") or {}).get("conditions") or []:
            if condition.get("status") == "True" and condition.get("type") in ("Complete", "Failed"):
                return JobOutcome(
                    condition["type"] == "Complete", condition.get("reason", ""), condition.get("message", "")
                )
        return None

    def waiting(self, job: dict[str, Any]) -> str | None:
        return suspended(job)

    def pod_selector(self, name: str) -> str:
        return f"{JOBSET_NAME_LABEL}={name}"

    def worker0(self, core, name: str, namespace: str) -> Worker0 | None:
        """The newest pod of completion index 0 among the job's pods (a JobSet restart makes new pods)."""
        pods = core.list_namespaced_pod(namespace, label_selector=f"{JOBSET_NAME_LABEL}={name}").items
        candidates = [pod for pod in pods if ((pod.metadata.annotations or {}).get(COMPLETION_INDEX)) == "0"]
        if not candidates:
            return None

        def age(pod) -> tuple:
            attempt = (pod.metadata.labels or {}).get(RESTART_ATTEMPT_LABEL, "0")
            return int(attempt) if attempt.isdigit() else 0, pod.metadata.creation_timestamp or 0

        newest = max(candidates, key=age)
        statuses = [s for s in (newest.status.container_statuses or []) if s.name == NODE]
        restarts = statuses[0].restart_count if statuses else 0
        attempt = age(newest)[0]
        return Worker0(
            newest.metadata.name, NODE, newest.status.phase, (newest.metadata.name, restarts),
            f"a new pod after JobSet restart {attempt}" if attempt else f"restart {restarts}",
        )  # fmt: skip

    def prepare(self, launcher: ClusterJobLauncher, launch: LaunchConfig) -> None:
        """Before building: the runtime must exist (every profile may read ClusterTrainingRuntimes), and the job is
        built for the TrainJob API this cluster's Trainer serves."""

        def get_runtime():
            return launcher.custom.get_cluster_custom_object(self.group, self.version, "clustertrainingruntimes",
                                                             launch.runtime)  # fmt: skip

        try:
            self.runtime = launcher.read(f"get ClusterTrainingRuntime {launch.runtime}", get_runtime)
        except Exception as error:
            status = status_of(error)
            if status == 404 and "clustertrainingruntimes" in api_reason(error):
                raise JobError(
                    f"ClusterTrainingRuntime {launch.runtime!r} is not installed on this cluster: the cluster admin "
                    f"applies it once with `kubectl apply -k manifests/admin/trainer/` ({RUNTIME_MANIFEST})"
                ) from error
            if status == 404:
                raise JobError(
                    f"this cluster does not serve trainer.kubeflow.org/v1alpha1 (Kubeflow Trainer v2 is not "
                    f"installed): {api_reason(error)}"
                ) from error
            raise JobError(f"could not read ClusterTrainingRuntime {launch.runtime!r}: {api_reason(error)}") from error
        self.spec_fields, self.pod_patch_fields = served_spec_fields(launcher)
        if "terminationGracePeriodSeconds" not in self.pod_patch_fields:
            runtime_grace = _runtime_grace_seconds(self.runtime)
            if runtime_grace != launch.termination_grace_seconds:
                logger.warning(
                    "this cluster's Trainer (before v2.3) cannot set a TrainJob's termination grace period: the "
                    "runtime's %s s applies, not %d s", runtime_grace, launch.termination_grace_seconds,
                )  # fmt: skip


def served_spec_fields(launcher: ClusterJobLauncher) -> tuple[frozenset[str], frozenset[str]]:
    """The TrainJob spec fields of the cluster's Trainer and the pod fields its runtime patch takes, from the OpenAPI
    schema the API server publishes to every authenticated user; the current Trainer's when it cannot be read
    (strict field validation then says so). Only served fields are sent: Trainer v2.2's pod patch, for one, has no
    terminationGracePeriodSeconds."""
    path = f"/openapi/v3/apis/{TrainJobKind.group}/{TrainJobKind.version}"
    try:
        document = launcher.read("read the TrainJob schema", lambda: launcher.custom.api_client.call_api(
            path, "GET", header_params={"Accept": "application/json"}, auth_settings=["BearerToken"],
            response_type="object", _return_http_data_only=True,
        ))  # fmt: skip
        for schema in (document.get("components") or {}).get("schemas", {}).values():
            kinds = schema.get("x-kubernetes-group-version-kind") or []
            if any(kind.get("kind") == TrainJobKind.kind for kind in kinds):
                spec = schema["properties"]["spec"]["properties"]
                return frozenset(spec), _pod_patch_fields(spec)
        raise ValueError(f"{path} has no TrainJob schema")
    except Exception as error:
        reason = api_reason(error)
        logger.warning("could not read the cluster's TrainJob schema (%s); building for Trainer v2.3", reason)
        return CURRENT_SPEC_FIELDS, CURRENT_POD_PATCH_FIELDS


_RUNTIME_PATCH_POD = ("runtimePatches", "items", "trainingRuntimeSpec", "template", "spec", "replicatedJobs", "items",
                      "template", "spec", "template", "spec")  # fmt: skip
_OVERRIDE_POD = ("podTemplateOverrides", "items", "spec")


def _pod_patch_fields(spec: dict) -> frozenset[str]:
    """The pod fields the TrainJob's runtime patch (v2.2 and later) or pod override (v2.1) takes."""
    for path in (_RUNTIME_PATCH_POD, _OVERRIDE_POD):
        node: Any = {"properties": spec}
        for step in path:
            node = node.get("items", {}) if step == "items" else (node.get("properties") or {}).get(step, {})
        if node.get("properties"):
            return frozenset(node["properties"])
    return frozenset()


def _runtime_grace_seconds(runtime: dict) -> int | str:
    for job in runtime.get("spec", {}).get("template", {}).get("spec", {}).get("replicatedJobs", []):
        if job["name"] == NODE:
            return job["template"]["spec"]["template"]["spec"].get("terminationGracePeriodSeconds", 30)
    return "its own"


def trainjob_launcher(custom_objects_api, core_api, **options) -> ClusterJobLauncher:
    return ClusterJobLauncher(TrainJobKind(), custom_objects_api, core_api, **options)
