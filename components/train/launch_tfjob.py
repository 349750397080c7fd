"""The tfjob launcher: multi-worker training as a training-operator v1 TFJob (Kubeflow 1.10 and older).

The job comes from the packaged template (`components/train/tfjob.yaml`) with N workers, each worker's CPU, memory
and GPUs (GPU workers tolerate `nvidia.com/gpu` taints, CPU workers do not), the image, the object-store settings,
the resolved configuration and the pod settings of the launch configuration. The operator injects TF_CONFIG into the
container named `tensorflow`; worker 0 is the pod `<job>-worker-0`, restarted in place (`restartPolicy: ExitCode`:
exit codes 128-255, preemption's 143 among them, are retried; 1-127 are final). Only a `Succeeded` condition whose
status is "True" counts as success. Following, retries and deletion are `cluster_job`'s, shared with TrainJobs.
"""

from __future__ import annotations

import copy
from importlib import resources
from typing import Any

import yaml

from components.train import step_lease
from components.train.cluster_job import (
    ClusterJobLauncher,
    JobOutcome,
    Worker0,
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
from components.train.launch_config import JOB_NAME_RESERVE, LaunchConfig, check_dns_1035_label

CONTAINER_NAME = "tensorflow"  # TF_CONFIG is injected only into the container of this name


def template() -> dict[str, Any]:
    """The TFJob template, packaged with the code (found the same way in an editable or a wheel install)."""
    # reader: a YAML template shipped in this package
    template = resources.files("components.train").joinpath("tfjob.yaml").read_text()
    return yaml.safe_load(template)  # reader: the packaged template above


class TFJobKind:
    kind, group, version, plural = "TFJob", "kubeflow.org", "v1", "tfjobs"
    operator = "training-operator v1 (TFJob)"

    def build(self, train: TrainConfig, launch: LaunchConfig, name: str, namespace: str) -> dict[str, Any]:
        """The TFJob: the template with name, namespace, workers, image, resources, env, arguments, pod settings."""
        job = copy.deepcopy(template())
        job["metadata"]["name"] = check_dns_1035_label(name, "job_name", reserve=JOB_NAME_RESERVE)
        job["metadata"]["namespace"] = namespace
        job["metadata"]["labels"] = job_labels(launch)
        job["spec"]["runPolicy"]["activeDeadlineSeconds"] = int(launch.job_timeout_seconds)
        worker = job["spec"]["tfReplicaSpecs"]["Worker"]
        worker["replicas"] = train.workers
        pod = worker["template"]["spec"]
        pod["serviceAccountName"] = launch.service_account
        pod["terminationGracePeriodSeconds"] = launch.termination_grace_seconds
        if launch.image_pull_secrets:
            pod["imagePullSecrets"] = [{"name": secret} for secret in launch.image_pull_secrets]
        if tolerations := gpu_tolerations(launch):
            pod["tolerations"] = tolerations
        (container,) = [c for c in pod["containers"] if c["name"] == CONTAINER_NAME]
        container["image"] = worker_image(launch)
        container["args"] = worker_arguments(train)
        container["resources"] = worker_resources(launch)
        container.setdefault("env", []).extend(object_store_environment(launch, train.model_dir))
        container["env"].extend(step_lease.worker_environment(self, name, launch.step_lease_seconds))
        return job

    def outcome(self, job: dict[str, Any]) -> JobOutcome | None:
        """Succeeded or Failed when the job has ended, else None. Only a condition with status "True" counts."""
        for condition in reversed((job.get("status") or {}).get("conditions") or []):
            if condition.get("status") != "True":
                continue
            if condition.get("type") in ("Succeeded", "Failed"):
                return JobOutcome(
                    condition["type"] == "Succeeded", condition.get("reason", ""), condition.get("message", "")
                )
        return None

    def waiting(self, job: dict[str, Any]) -> str | None:
        return suspended(job)

    def pod_selector(self, name: str) -> str:
        return f"training.kubeflow.org/job-name={name}"

    def worker0(self, core, name: str, namespace: str) -> Worker0 | None:
        """(pod, container, phase, restart count) of `<job>-worker-0`, or None while it does not exist."""
        pod = f"{name}-worker-0"
        try:
            found = core.read_namespaced_pod(pod, namespace)
        except Exception as error:
            if status_of(error) == 404:
                return None
            raise
        statuses = [s for s in (found.status.container_statuses or []) if s.name == CONTAINER_NAME]
        restarts = statuses[0].restart_count if statuses else 0
        return Worker0(pod, CONTAINER_NAME, found.status.phase, (restarts,), f"restart {restarts}")

    def prepare(self, launcher: ClusterJobLauncher, launch: LaunchConfig) -> None:
        """Nothing to read before building: the operator has no runtime objects."""


def tfjob_launcher(custom_objects_api, core_api, **options) -> ClusterJobLauncher:
    return ClusterJobLauncher(TFJobKind(), custom_objects_api, core_api, **options)
