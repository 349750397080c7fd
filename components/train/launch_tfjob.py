"""The tfjob launcher: multi-worker training as a Kubeflow TFJob (training-operator v1).

Creates the TFJob from the packaged template (`components/train/tfjob.yaml`) with N workers, each worker's CPU,
memory and GPUs (GPU workers tolerate `nvidia.com/gpu` taints, CPU workers do not), the image, the object-store
settings and the resolved configuration; waits for the job's final condition with a timeout; streams the chief's
log (whole lines, waiting while its pod is Pending, re-attaching after a restart). Only a `Succeeded` condition
whose status is "True" counts as success.

Reads are retried with bounded back-off, so a transient API error never ends the job. The job is deleted when it
succeeded, failed, timed out, or this launcher was cancelled (SIGTERM); when the API itself stays unreachable the
job is left running, and a retried step (same job name) follows it again.

Imports no TensorFlow: the launching step runs in a small image.

Over 300 lines: building, submitting, following (log streaming across restarts) and deleting one TFJob, with bounded
retries on every API call.
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
import json
import logging
import os
import signal
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from components.common.config import config_to_dict
from components.images import image
from components.train.config import TrainConfig, check_dns_1035_label

logger = logging.getLogger(__name__)

GROUP, VERSION, PLURAL = "kubeflow.org", "v1", "tfjobs"
POLL_SECONDS = 10.0
CONTAINER_NAME = "tensorflow"  # TF_CONFIG is injected only into the container of this name
GPU_RESOURCE = "nvidia.com/gpu"
SERVICE_ACCOUNT_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
# Non-secret object-store settings the workers get from this launcher's own environment (the secret's keys are
# referenced, never copied).
PASSED_ENVIRONMENT = ("AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_REGION", "AWS_DEFAULT_REGION")
SECRET_KEYS = {"AWS_ACCESS_KEY_ID": "accesskey", "AWS_SECRET_ACCESS_KEY": "secretkey"}  # KFP's MinIO secret keys
TRANSIENT_STATUSES = {408, 429, 500, 502, 503, 504}
READ_ATTEMPTS = 8  # with back-off from 1 s doubling to 30 s: about two and a half minutes of API trouble
LOG_WAIT_SECONDS = 60.0  # after the job ended: how long the chief's log may take to be read to its end


class TFJobError(RuntimeError):
    """The TFJob failed, was not created, or did not finish in time."""


class Cancelled(BaseException):
    """SIGTERM reached the launcher (a cancelled run, or a pod being evicted)."""


def unique_job_name(prefix: str = "cifar10-train") -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def job_name_for_run(run_id: str, prefix: str = "cifar10-train") -> str:
    """The same name for every attempt of one pipeline run's train step, different for every run."""
    return f"{prefix}-{hashlib.sha256(run_id.encode()).hexdigest()[:16]}"


def own_namespace() -> str:
    """The namespace this pod runs in (a KFP profile's namespace in multi-user Kubeflow)."""
    with contextlib.suppress(OSError):
        return SERVICE_ACCOUNT_NAMESPACE.read_text().strip()
    if os.environ.get("POD_NAMESPACE"):
        return os.environ["POD_NAMESPACE"]
    raise ValueError(
        "tfjob_namespace: not set, and this is not a pod that knows its namespace "
        f"({SERVICE_ACCOUNT_NAMESPACE} is missing): give --tfjob-namespace"
    )


def template() -> dict[str, Any]:
    """The TFJob template, packaged with the code (found the same way in an editable or a wheel install)."""
    return yaml.safe_load(resources.files("components.train").joinpath("tfjob.yaml").read_text())


def build_tfjob(config: TrainConfig, name: str, namespace: str) -> dict[str, Any]:
    """The TFJob object for `config`: the template with name, namespace, workers, image, resources, env and args."""
    job = copy.deepcopy(template())
    job["metadata"]["name"] = check_dns_1035_label(
        name, "tfjob_name", reserve=len("-worker-") + len(str(config.workers))
    )
    job["metadata"]["namespace"] = namespace
    worker = job["spec"]["tfReplicaSpecs"]["Worker"]
    worker["replicas"] = config.workers
    pod = worker["template"]["spec"]
    pod["serviceAccountName"] = config.tfjob_service_account
    (container,) = [c for c in pod["containers"] if c["name"] == CONTAINER_NAME]
    container["image"] = config.tfjob_image or image("train")
    worker_config = config_to_dict(replace(config, launcher="worker", tfjob_namespace=namespace))
    container["args"] = ["--config", json.dumps(worker_config, sort_keys=True)]
    resources_ = container.setdefault("resources", {})
    resources_["requests"] = {"cpu": config.worker_cpu, "memory": config.worker_memory}
    resources_["limits"] = {"memory": config.worker_memory}
    if config.gpus_per_worker:
        resources_["limits"][GPU_RESOURCE] = config.gpus_per_worker
        pod["tolerations"] = [{"key": GPU_RESOURCE, "operator": "Exists", "effect": "NoSchedule"}]
    environment = container.setdefault("env", [])
    environment += [{"name": key, "value": os.environ[key]} for key in PASSED_ENVIRONMENT if os.environ.get(key)]
    if config.object_store_secret:
        environment += [
            {
                "name": variable,
                "valueFrom": {"secretKeyRef": {"name": config.object_store_secret, "key": key, "optional": True}},
            }
            for variable, key in SECRET_KEYS.items()
        ]
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


def status_of(error: BaseException) -> int | None:
    """The HTTP status of a Kubernetes API error (None for network errors)."""
    status = getattr(error, "status", None)
    return int(status) if isinstance(status, int) or (isinstance(status, str) and status.isdigit()) else None


def is_transient(error: BaseException) -> bool:
    status = status_of(error)
    if status is None:
        return isinstance(error, OSError) or type(error).__module__.startswith("urllib3")
    return status in TRANSIENT_STATUSES


def whole_lines(chunks) -> Iterator[bytes]:
    """Reassemble lines from a byte stream cut anywhere (the client reads 64 KiB at a time)."""
    pending = b""
    for chunk in chunks:
        pending += chunk if isinstance(chunk, bytes) else str(chunk).encode()
        *lines, pending = pending.split(b"\n")
        yield from lines
    if pending:
        yield pending


class TFJobLauncher:
    """Talks to the Kubernetes API through the `kubernetes` client (real in tests too, against a strict fake API)."""

    def __init__(
        self,
        custom_objects_api,
        core_api,
        poll_seconds: float = POLL_SECONDS,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
        backoff_seconds: float = 1.0,
        log_poll_seconds: float = 2.0,
    ):
        self.custom = custom_objects_api
        self.core = core_api
        self.poll_seconds = poll_seconds
        self.clock = clock
        self.sleep = sleep
        self.backoff_seconds = backoff_seconds
        self.log_poll_seconds = log_poll_seconds
        self._finished = threading.Event()

    # -- reading with retries -----------------------------------------------------------------------------------

    def _read(self, what: str, call: Callable[[], Any]) -> Any:
        """`call()`, retried with bounded exponential back-off while the API answers with a transient error."""
        delay = self.backoff_seconds
        for attempt in range(1, READ_ATTEMPTS + 1):
            try:
                return call()
            except Exception as error:
                if not is_transient(error) or attempt == READ_ATTEMPTS:
                    raise
                logger.warning("%s: transient API error (%s); retry %d in %.0f s", what, error, attempt, delay)
                self.sleep(delay)
                delay = min(delay * 2, 30.0)
        raise AssertionError("unreachable")

    # -- the job ------------------------------------------------------------------------------------------------

    def run(self, config: TrainConfig, name: str | None = None) -> JobOutcome:
        namespace = config.tfjob_namespace or own_namespace()
        job = build_tfjob(config, name or config.tfjob_name or unique_job_name(), namespace)
        job_name = job["metadata"]["name"]
        self._create(job, namespace)
        delete = True
        try:
            outcome = self._wait(job_name, namespace, config.tfjob_timeout_seconds)
        except Cancelled:
            logger.warning("cancelled: deleting TFJob %s/%s", namespace, job_name)
            raise
        except TFJobError:
            raise
        except Exception:
            delete = False  # the API is unreachable: leave the job; a retried step follows it again
            logger.error("lost contact with the Kubernetes API; TFJob %s/%s is left running", namespace, job_name)
            raise
        finally:
            if delete:
                self._delete(job_name, namespace)
        if not outcome.succeeded:
            raise TFJobError(f"TFJob {namespace}/{job_name} failed: {outcome.reason}: {outcome.message}")
        logger.info("TFJob %s/%s succeeded", namespace, job_name)
        return outcome

    def _create(self, job: dict[str, Any], namespace: str) -> None:
        name = job["metadata"]["name"]
        workers = job["spec"]["tfReplicaSpecs"]["Worker"]["replicas"]
        logger.info("creating TFJob %s/%s with %d worker(s)", namespace, name, workers)
        deadline = self.clock() + 300
        while True:
            try:
                self._read(f"create TFJob {name}", lambda: self.custom.create_namespaced_custom_object(
                    GROUP, VERSION, namespace, PLURAL, job
                ))  # fmt: skip
                return
            except Exception as error:
                if status_of(error) != 409:
                    raise TFJobError(f"could not create TFJob {namespace}/{name}: {_reason(error)}") from error
            existing = self._read(f"get TFJob {name}", lambda: self._get(name, namespace))
            if existing is None:
                continue  # deleted in between: create it
            if not (existing.get("metadata") or {}).get("deletionTimestamp"):
                # An earlier attempt of this step created it and died; follow that job rather than start a second
                # one writing into the same model directory.
                logger.warning(
                    "TFJob %s/%s exists already (an earlier attempt of this step): following it", namespace, name
                )
                return
            if self.clock() >= deadline:
                raise TFJobError(f"TFJob {namespace}/{name} is still being deleted after 300 s; cannot start it")
            logger.info("TFJob %s/%s is being deleted (a cancelled attempt): waiting to start it", namespace, name)
            self.sleep(max(self.poll_seconds, 1.0))

    def _get(self, name: str, namespace: str) -> dict[str, Any] | None:
        try:
            return self.custom.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name)
        except Exception as error:
            if status_of(error) == 404:
                return None
            raise

    def _wait(self, name: str, namespace: str, timeout: float) -> JobOutcome:
        deadline = self.clock() + timeout
        self._finished.clear()
        streaming = threading.Thread(target=self._stream_chief_log, args=(name, namespace), daemon=True)
        streaming.start()
        try:
            with _sigterm_cancels():
                while True:
                    job = self._read(f"get TFJob {name}", lambda: self._get(name, namespace))
                    if job is None:
                        raise TFJobError(f"TFJob {namespace}/{name} disappeared (deleted by someone else)")
                    outcome = final_condition(job)
                    if outcome is not None:
                        self._finished.set()
                        streaming.join(timeout=LOG_WAIT_SECONDS)  # the chief's last lines
                        return outcome
                    if self.clock() >= deadline:
                        raise TFJobError(
                            f"TFJob {namespace}/{name} did not finish within {timeout:.0f} s; it was deleted"
                        )
                    self.sleep(self.poll_seconds)
        finally:
            self._finished.set()
            streaming.join(timeout=2.0)

    # -- the chief's log ----------------------------------------------------------------------------------------

    def _stream_chief_log(self, name: str, namespace: str) -> None:
        """Follow worker 0's log: wait while it is Pending, print whole lines, re-attach after restarts."""
        pod = f"{name}-worker-0"
        seen_restarts, last_stamp = None, ""
        try:
            while True:
                state = self._pod_state(pod, namespace)
                if state is None or state[0] == "Pending":
                    if self._finished.is_set():
                        return
                    self.sleep(self.log_poll_seconds)
                    continue
                _phase, restarts = state
                if restarts != seen_restarts:
                    if seen_restarts is not None:
                        logger.info("%s was restarted (restart %d): following the new container's log", pod, restarts)
                    seen_restarts, last_stamp = restarts, ""
                last_stamp = self._follow(pod, namespace, last_stamp)
                after = self._pod_state(pod, namespace)
                if self._finished.is_set() and (after is None or after[1] == seen_restarts):
                    return  # the job ended and this container's log was read to its end
                if after is not None and after[1] == seen_restarts and after[0] in ("Succeeded", "Failed"):
                    self.sleep(self.log_poll_seconds)  # exited; the job's status (or a restart) comes next
        except Exception as error:  # the job's outcome decides success; a lost log stream only warns
            if not self._finished.is_set():
                logger.warning("stopped streaming the log of %s: %s", pod, error)

    def _pod_state(self, pod: str, namespace: str) -> tuple[str, int] | None:
        """(phase, restart count of the tensorflow container), or None while the pod does not exist."""
        try:
            found = self._read(f"get pod {pod}", lambda: self.core.read_namespaced_pod(pod, namespace))
        except Exception as error:
            if status_of(error) == 404:
                return None
            raise
        statuses = [s for s in (found.status.container_statuses or []) if s.name == CONTAINER_NAME]
        return found.status.phase, (statuses[0].restart_count if statuses else 0)

    def _follow(self, pod: str, namespace: str, after_stamp: str) -> str:
        """Print the container's log lines stamped after `after_stamp` until the stream ends; the last stamp."""
        try:
            response = self.core.read_namespaced_pod_log(
                pod, namespace, container=CONTAINER_NAME, follow=True, timestamps=True, _preload_content=False
            )
        except Exception as error:
            if status_of(error) == 400:  # "waiting to start": not running yet after all
                self.sleep(self.log_poll_seconds)
                return after_stamp
            raise
        try:
            for line in whole_lines(response.stream()):
                stamp, _, text = line.decode(errors="replace").partition(" ")
                if stamp <= after_stamp:
                    continue  # already printed before the stream broke
                after_stamp = stamp
                logger.info("[%s] %s", pod, text.rstrip("\r"))
        finally:
            response.release_conn()
        return after_stamp

    def _delete(self, name: str, namespace: str) -> None:
        try:
            self._read(f"delete TFJob {name}", lambda: self.custom.delete_namespaced_custom_object(
                GROUP, VERSION, namespace, PLURAL, name
            ))  # fmt: skip
            logger.info("deleted TFJob %s/%s", namespace, name)
        except Exception as error:
            if status_of(error) != 404:
                logger.warning("could not delete TFJob %s/%s: %s", namespace, name, _reason(error))


def _reason(error: BaseException) -> str:
    """The API's own message for an ApiException (its body is a Status object), else the error's text."""
    body = getattr(error, "body", None)
    if body:
        with contextlib.suppress(ValueError, TypeError):
            return json.loads(body).get("message") or str(body)
    return str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__


@contextlib.contextmanager
def _sigterm_cancels():
    """While waiting, SIGTERM raises Cancelled (so the job is deleted), when this is the main thread."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def cancel(_signal_number, _frame):
        raise Cancelled()

    previous = signal.signal(signal.SIGTERM, cancel)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def kubernetes_apis():
    """CustomObjectsApi and CoreV1Api with the cluster's credentials (in-cluster, else ~/.kube/config)."""
    from kubernetes import client
    from kubernetes import config as kubernetes_config

    try:
        kubernetes_config.load_incluster_config()
    except kubernetes_config.ConfigException:
        kubernetes_config.load_kube_config()
    return client.CustomObjectsApi(), client.CoreV1Api()


def launch_tfjob(config: TrainConfig) -> int:
    """Run the training as a TFJob; 0 when it succeeded (TFJobError otherwise)."""
    custom, core = kubernetes_apis()
    TFJobLauncher(custom, core).run(config)
    return 0
