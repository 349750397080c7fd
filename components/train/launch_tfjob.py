"""The tfjob launcher: multi-worker training as a Kubeflow TFJob (training-operator v1).

Creates the TFJob from `manifests/tfjob.yaml` with N workers, GPUs per worker, the image and the resolved
configuration; waits for the job's final condition with a timeout; streams the chief's log; deletes the
job when done. A job that ends Failed, or does not end in time, fails this step: only a `Succeeded`
condition whose status is "True" counts as success.
"""

from __future__ import annotations

import copy
import hashlib
import json
import logging
import re
import threading
import time
import uuid
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import yaml

from components.common.config import config_to_dict
from components.images import image
from components.train.config import TrainConfig

logger = logging.getLogger(__name__)

GROUP, VERSION, PLURAL = "kubeflow.org", "v1", "tfjobs"
TEMPLATE = Path(__file__).resolve().parents[2] / "manifests" / "tfjob.yaml"
POLL_SECONDS = 10.0
CONTAINER_NAME = "tensorflow"


class TFJobError(RuntimeError):
    """The TFJob failed, was not created, or did not finish in time."""


def unique_job_name(prefix: str = "cifar10-train") -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def job_name_for_run(run_id: str, prefix: str = "cifar10-train") -> str:
    """The same name for every attempt of one pipeline run's train step, different for every run."""
    return f"{prefix}-{hashlib.sha256(run_id.encode()).hexdigest()[:16]}"


def valid_job_name(name: str) -> str:
    if not re.fullmatch(r"[a-z0-9]([-a-z0-9]{0,46}[a-z0-9])?", name):
        raise ValueError(f"tfjob_name: {name!r} is not a valid Kubernetes name (lowercase, digits, '-', <= 48)")
    return name


def build_tfjob(config: TrainConfig, name: str, template_path: Path = TEMPLATE) -> dict[str, Any]:
    """The TFJob object for `config`: the template with name, namespace, workers, image, args and GPUs set."""
    template = yaml.safe_load(template_path.read_text())
    job = copy.deepcopy(template)
    job["metadata"]["name"] = valid_job_name(name)
    job["metadata"]["namespace"] = config.tfjob_namespace
    worker = job["spec"]["tfReplicaSpecs"]["Worker"]
    worker["replicas"] = config.workers
    pod = worker["template"]["spec"]
    pod["serviceAccountName"] = config.tfjob_service_account
    (container,) = [c for c in pod["containers"] if c["name"] == CONTAINER_NAME]
    container["image"] = config.tfjob_image or image("train")
    worker_config = config_to_dict(replace(config, launcher="worker"))
    container["args"] = ["--config", json.dumps(worker_config, sort_keys=True)]
    if config.gpus_per_worker:
        container.setdefault("resources", {}).setdefault("limits", {})["nvidia.com/gpu"] = config.gpus_per_worker
    return job


@dataclass(frozen=True)
class JobOutcome:
    succeeded: bool
    reason: str
    message: str


def final_condition(job: dict[str, Any]) -> JobOutcome | None:
    """Succeeded or Failed when the job has ended, else None. Only a condition with status "True" counts."""
    conditions = (job.get("status") or {}).get("conditions") or []
    for condition in reversed(conditions):
        if condition.get("status") != "True":
            continue
        if condition.get("type") == "Succeeded":
            return JobOutcome(True, condition.get("reason", ""), condition.get("message", ""))
        if condition.get("type") == "Failed":
            return JobOutcome(False, condition.get("reason", ""), condition.get("message", ""))
    return None


def _is_running(job: dict[str, Any]) -> bool:
    conditions = (job.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Running" and c.get("status") == "True" for c in conditions)


class TFJobLauncher:
    """Talks to the Kubernetes API through the `kubernetes` client (injected, so tests can pass fakes)."""

    def __init__(self, custom_objects_api, core_api, poll_seconds: float = POLL_SECONDS, clock=time.monotonic):
        self.custom = custom_objects_api
        self.core = core_api
        self.poll_seconds = poll_seconds
        self.clock = clock

    def run(self, config: TrainConfig, name: str | None = None) -> JobOutcome:
        job = build_tfjob(config, name or config.tfjob_name or unique_job_name())
        job_name, namespace = job["metadata"]["name"], job["metadata"]["namespace"]
        logger.info("creating TFJob %s/%s with %d worker(s)", namespace, job_name, config.workers)
        try:
            self.custom.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, job)
        except Exception as error:
            if getattr(error, "status", None) != 409:
                raise TFJobError(f"could not create TFJob {namespace}/{job_name}: {error}") from error
            # An earlier attempt of this step created it and died; follow that job rather than start a second
            # one writing into the same model directory.
            logger.warning(
                "TFJob %s/%s exists already (an earlier attempt of this step): following it", namespace, job_name
            )
        try:
            outcome = self._wait(job_name, namespace, config.tfjob_timeout_seconds)
        finally:
            self._delete(job_name, namespace)
        if not outcome.succeeded:
            raise TFJobError(f"TFJob {namespace}/{job_name} failed: {outcome.reason}: {outcome.message}")
        logger.info("TFJob %s/%s succeeded", namespace, job_name)
        return outcome

    def _wait(self, name: str, namespace: str, timeout: float) -> JobOutcome:
        deadline = self.clock() + timeout
        streaming: threading.Thread | None = None
        while True:
            job = self.custom.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name)
            outcome = final_condition(job)
            if streaming is None and (outcome is not None or _is_running(job)):
                streaming = threading.Thread(target=self._stream_chief_log, args=(name, namespace), daemon=True)
                streaming.start()
            if outcome is not None:
                if streaming is not None:
                    streaming.join(timeout=30)
                return outcome
            if self.clock() >= deadline:
                raise TFJobError(f"TFJob {namespace}/{name} did not finish within {timeout:.0f} s; it was deleted")
            time.sleep(self.poll_seconds)

    def _stream_chief_log(self, name: str, namespace: str) -> None:
        pod = f"{name}-worker-0"
        try:
            stream = self.core.read_namespaced_pod_log(
                pod, namespace, container=CONTAINER_NAME, follow=True, _preload_content=False
            )
            for line in stream.stream():
                text = line.decode(errors="replace") if isinstance(line, bytes) else str(line)
                for part in text.splitlines():
                    logger.info("[%s] %s", pod, part)
        except Exception as error:  # the job's outcome decides success; a lost log stream only warns
            logger.warning("could not stream the log of %s: %s", pod, error)

    def _delete(self, name: str, namespace: str) -> None:
        try:
            self.custom.delete_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name)
            logger.info("deleted TFJob %s/%s", namespace, name)
        except Exception as error:
            logger.warning("could not delete TFJob %s/%s: %s", namespace, name, error)


def launch_tfjob(config: TrainConfig) -> int:
    """Run the training as a TFJob with the cluster's credentials (in-cluster, else ~/.kube/config)."""
    from kubernetes import client
    from kubernetes import config as kubernetes_config

    try:
        kubernetes_config.load_incluster_config()
    except kubernetes_config.ConfigException:
        kubernetes_config.load_kube_config()
    TFJobLauncher(client.CustomObjectsApi(), client.CoreV1Api()).run(config)
    return 0
