"""Training as a Kubernetes job, followed to its end: what the TrainJob (Kubeflow Trainer v2) and TFJob
(training-operator v1) launchers share.

A `JobKind` knows its own object: how to build it from the configs, which of its conditions are final, and which pod
and container is worker 0 right now. `ClusterJobLauncher` does the rest, the same for both:
- create the job in the launching pod's own namespace (a KFP profile's), with strict field validation (a field the
  cluster's operator does not know is an error, never silently dropped); when an earlier attempt of the step created
  it already, follow that one instead of starting a second writer of the same model directory;
- wait for a final condition, at most `job_timeout_seconds`, while streaming worker 0's log as whole lines (waiting
  while its pod is Pending, re-attaching when a new container or pod takes over); fail in minutes when a worker
  cannot start (an image that cannot be pulled or named, a container that cannot be created, a pod that stays
  unschedulable) or the controller warns and makes no pods (`StartWatch`);
- retry reads after transient API errors with bounded back-off, so a flaky API server never ends a job;
- delete the job when it ended, failed or timed out, and when the step is cancelled (SIGTERM or SIGINT); when the
  API stays unreachable, leave it for the step's retry, which follows it again (and the pipeline's exit handler
  deletes it when the run ends).

Imports no TensorFlow: the launching step runs in a small pod.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import logging
import os
import signal
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from dataclasses import field as dataclass_field
from typing import Any, Protocol

from components.common import compiled_kernels, documents, filesystem, secrets
from components.common import pod as this_pod
from components.common.config import config_to_dict
from components.images import image
from components.train.config import TrainConfig
from components.train.launch_config import GPU_RESOURCE, LaunchConfig

logger = logging.getLogger(__name__)

POLL_SECONDS = 10.0
SERVICE_ACCOUNT_NAMESPACE = this_pod.SERVICE_ACCOUNT_NAMESPACE
in_kubernetes_pod = this_pod.in_kubernetes_pod
# Non-secret settings the workers get from the launching step's own environment: the object store's (the secret's
# keys are referenced, never copied), and the project's own.
PASSED_ENVIRONMENT = ("AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_REGION", "AWS_DEFAULT_REGION")
PASSED_ENVIRONMENT += (filesystem.ASSUME_SINGLE_WRITER, compiled_kernels.MODE_VARIABLE)
SECRET_KEYS = {"AWS_ACCESS_KEY_ID": "accesskey", "AWS_SECRET_ACCESS_KEY": "secretkey"}  # KFP's object-store secret
TRANSIENT_STATUSES = {408, 429, 500, 502, 503, 504}
READ_ATTEMPTS = 8  # with back-off from 1 s doubling to 30 s: about two and a half minutes of API trouble
LOG_WAIT_SECONDS = 60.0  # after the job ended: how long worker 0's log may take to be read to its end
DELETION_WAIT_SECONDS = 300.0
JOB_LABELS = {"app.kubernetes.io/name": "cifar10-pipeline", "app.kubernetes.io/component": "train"}
KUEUE_QUEUE_LABEL = "kueue.x-k8s.io/queue-name"


class JobError(RuntimeError):
    """The job failed, could not be created, or did not finish in time."""


class Cancelled(BaseException):
    """SIGTERM or SIGINT reached the launcher (a cancelled run, an evicted pod, Ctrl-C)."""


@dataclass(frozen=True)
class JobOutcome:
    succeeded: bool
    reason: str
    message: str


@dataclass(frozen=True)
class Worker0:
    """Worker 0's pod as it is now; `instance` changes whenever another container instance (a restart, a new pod)
    takes over, whose log then starts anew."""

    pod: str
    container: str
    phase: str
    instance: tuple
    description: str = ""  # what took over, for the log: "restart 1", "a new pod after JobSet restart 1"


class JobKind(Protocol):
    kind: str
    group: str
    version: str
    plural: str
    operator: str  # what serves this kind, for messages ("Kubeflow Trainer v2")

    def prepare(self, launcher: ClusterJobLauncher, launch: LaunchConfig) -> None: ...
    def build(self, train: TrainConfig, launch: LaunchConfig, name: str, namespace: str) -> dict[str, Any]: ...
    def outcome(self, job: dict[str, Any]) -> JobOutcome | None: ...
    def waiting(self, job: dict[str, Any]) -> str | None: ...
    def pod_selector(self, name: str) -> str: ...
    def worker0(self, core, name: str, namespace: str) -> Worker0 | None: ...


def unique_job_name(prefix: str = "cifar10-train") -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def job_name_for_run(run_id: str, prefix: str = "cifar10-train") -> str:
    """The same name for every attempt of one pipeline run's train step, different for every run."""
    return f"{prefix}-{hashlib.sha256(run_id.encode()).hexdigest()[:16]}"


def step_holder() -> str:
    """Who holds a step's lease: this pod (its host name) and process."""
    import socket

    return f"{this_pod.name_of_this_pod()[0] or socket.gethostname()} pid {os.getpid()}"


def run_owner(core, namespace: str) -> list[dict[str, str]]:
    """The run's Argo Workflow as the launched job's owner, found from this step's own pod (Argo makes the Workflow
    the owner of each step's pod; its name read as KFP's launcher reads it), so that the cluster's garbage collector
    removes the job with the run when KFP deletes the run's Workflow (Kubeflow 1.11 and 26.03 a day after the run
    ends, KFP 2.17's compiled ttlStrategy an hour), besides the step's lease. [] where there is none: not in a pod,
    or the pod cannot be read (said)."""
    if not this_pod.in_kubernetes_pod():
        return []
    name, read_from = this_pod.name_of_this_pod()
    try:
        pod = core.read_namespaced_pod(name or "", namespace, _request_timeout=30)
    except Exception as error:
        logger.warning("the run's Workflow cannot be found from this pod %s/%s (its name from %s: %s): the job is "
                       "removed by this step's lease alone", namespace, name, read_from, api_reason(error))  # fmt: skip
        return []
    for owner in pod.metadata.owner_references or []:
        if owner.kind == "Workflow" and owner.api_version.startswith("argoproj.io/"):
            return [{"apiVersion": owner.api_version, "kind": "Workflow", "name": owner.name, "uid": owner.uid}]
    logger.info("this pod %s/%s has no Workflow owner: the job is removed by this step's lease alone", namespace, name)
    return []


def own_namespace() -> str:
    """The namespace this pod runs in (a KFP profile's namespace in multi-user Kubeflow)."""
    namespace = this_pod.namespace_of_this_pod(SERVICE_ACCOUNT_NAMESPACE)
    if namespace is None:
        raise ValueError(
            "job_namespace: not set, and this is not a pod that knows its namespace "
            f"({SERVICE_ACCOUNT_NAMESPACE} is missing): give --job-namespace"
        )
    return namespace


# -- what both kinds put into a worker's pod -----------------------------------------------------------------------


def worker_arguments(train: TrainConfig) -> list[str]:
    """The workers run the train CLI with the exact resolved configuration, as workers."""
    return ["--config", json.dumps(config_to_dict(dataclasses.replace(train, launcher="worker")), sort_keys=True)]


def worker_image(launch: LaunchConfig) -> str:
    return launch.worker_image or image("train")


def worker_resources(launch: LaunchConfig) -> dict[str, dict]:
    limits: dict[str, Any] = {"memory": launch.worker_memory}
    if launch.gpus_per_worker:
        limits[GPU_RESOURCE] = launch.gpus_per_worker
    return {"requests": {"cpu": launch.worker_cpu, "memory": launch.worker_memory}, "limits": limits}


def gpu_tolerations(launch: LaunchConfig) -> list[dict]:
    """GPU workers tolerate GPU nodes' taint; CPU workers stay off them."""
    if not launch.gpus_per_worker:
        return []
    return [{"key": GPU_RESOURCE, "operator": "Exists", "effect": "NoSchedule"}]


def object_store_environment(launch: LaunchConfig, location: str = "") -> list[dict]:
    """The launching step's own object-store settings, and its secret's keys by reference. Where the namespace's
    kfp-launcher ConfigMap gave the step the store of `location` (the model directory), the workers get the same
    endpoint and region, and that secret's keys by reference: they may not read the ConfigMap or the secret."""
    from components.common import object_stores

    settings = None
    if filesystem.is_s3_uri(location):
        _scheme, bucket, key = filesystem.split_uri(filesystem.normalize_uri(location))
        settings = object_stores.launcher_settings(bucket, key) if this_pod.in_kubernetes_pod() else None
    environment = [{"name": key, "value": os.environ[key]} for key in PASSED_ENVIRONMENT if os.environ.get(key)]
    if settings is not None:
        given = {"AWS_ENDPOINT_URL": settings.endpoint, "AWS_REGION": settings.region}
        environment = [entry for entry in environment if entry["name"] not in given]
        environment += [{"name": name, "value": value} for name, value in given.items() if value]
    if settings is not None and settings.secret_ref:
        name, access, secret = settings.secret_ref
        references = {"AWS_ACCESS_KEY_ID": (name, access), "AWS_SECRET_ACCESS_KEY": (name, secret)}
    elif launch.object_store_secret:
        references = {variable: (launch.object_store_secret, key) for variable, key in SECRET_KEYS.items()}
    else:
        references = {}
    environment += [
        {"name": variable, "valueFrom": {"secretKeyRef": {"name": secret, "key": key, "optional": True}}}
        for variable, (secret, key) in references.items()
    ]
    return environment


def job_labels(launch: LaunchConfig) -> dict[str, str]:
    labels = dict(JOB_LABELS)
    if launch.queue_name:
        labels[KUEUE_QUEUE_LABEL] = launch.queue_name
    return labels


# -- talking to the API ----------------------------------------------------------------------------------------


def status_of(error: BaseException) -> int | None:
    """The HTTP status of a Kubernetes API error (None for network errors)."""
    status = getattr(error, "status", None)
    return int(status) if isinstance(status, int) or (isinstance(status, str) and status.isdigit()) else None


def is_transient(error: BaseException) -> bool:
    status = status_of(error)
    if status is None:
        return isinstance(error, OSError) or type(error).__module__.startswith("urllib3")
    return status in TRANSIENT_STATUSES


def api_reason(error: BaseException) -> str:
    """The API's own message for an ApiException (its body is a Status object), else the error's text."""
    body = getattr(error, "body", None)
    if body:
        with contextlib.suppress(ValueError, TypeError, AttributeError):
            status = documents.load(body, "the API's answer", "Status", yaml_allowed=False)
            message = status.get("message") if isinstance(status, dict) else None
            return secrets.mask(" ".join(str(message or body).split()))[:300]
    return str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__


def whole_lines(chunks) -> Iterator[bytes]:
    """Reassemble lines from a byte stream cut anywhere (the client reads 64 KiB at a time)."""
    pending = b""
    for chunk in chunks:
        pending += chunk if isinstance(chunk, bytes) else str(chunk).encode()
        *lines, pending = pending.split(b"\n")
        yield from lines
    if pending:
        yield pending


def kubernetes_apis():
    """CustomObjectsApi and CoreV1Api with the cluster's credentials (in-cluster, else ~/.kube/config)."""
    from kubernetes import client
    from kubernetes import config as kubernetes_config

    try:
        kubernetes_config.load_incluster_config()
    except kubernetes_config.ConfigException:
        kubernetes_config.load_kube_config()
    return client.CustomObjectsApi(), client.CoreV1Api()


@contextlib.contextmanager
def signals_cancel():
    """While waiting, SIGTERM and SIGINT raise Cancelled (so the job is deleted), when this is the main thread."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def cancel(_signal_number, _frame):
        raise Cancelled()

    previous = {number: signal.signal(number, cancel) for number in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)


def suspended(job: dict[str, Any]) -> str | None:
    """Why a job of either kind waits although it exists: its Suspended condition (Kueue holds it), else None."""
    conditions = (job.get("status") or {}).get("conditions") or []
    held = any(c.get("type") == "Suspended" and c.get("status") == "True" for c in conditions)
    return "suspended (waiting to be admitted, e.g. by Kueue)" if held else None


# Why a worker's container does not start: at once for what no waiting mends, after `start_timeout_seconds` for what
# may (a registry that is down for a moment, a secret created a little later).
NEVER_STARTS = frozenset({"InvalidImageName", "ErrImageNeverPull"})
MAY_NOT_START = frozenset(
    {"ErrImagePull", "ImagePullBackOff", "CreateContainerConfigError", "CreateContainerError", "RunContainerError"}
)


@dataclass
class StartWatch:
    """Workers that cannot start, and a controller that makes no pods: the one place the wait decides to give up
    before the job's own timeout. Each problem is timed from when it was first seen; one that goes away is
    forgotten."""

    start_timeout_seconds: float
    unschedulable_timeout_seconds: float
    clock: Callable[[], float]
    first_seen: dict[tuple[str, str], float] = dataclass_field(default_factory=dict)

    def problem(self, pods: list, warnings: list) -> str | None:
        """The first problem that has lasted its bound, as a line naming the pod (or the job's event) and why."""
        now, found = self.clock(), []
        for pod in pods:
            name, status = pod.metadata.name, pod.status
            for container in (status.init_container_statuses or []) + (status.container_statuses or []):
                waiting = container.state.waiting if container.state else None
                if waiting is not None and waiting.reason in NEVER_STARTS | MAY_NOT_START:
                    bound = 0.0 if waiting.reason in NEVER_STARTS else self.start_timeout_seconds
                    said = (
                        f"pod {name} cannot start {container.name}: {waiting.reason}: {(waiting.message or '')[:300]}"
                    )
                    found.append(((name, waiting.reason), bound, said))
            for condition in status.conditions or []:
                if (condition.type, condition.status, condition.reason) == ("PodScheduled", "False", "Unschedulable"):
                    said = f"pod {name} cannot be scheduled: {(condition.message or '')[:300]}"
                    found.append(((name, "Unschedulable"), self.unschedulable_timeout_seconds, said))
        if not pods:
            for event in warnings:
                said = f"the controller makes no pods: {event.reason}: {(event.message or '')[:300]}"
                found.append((("", event.reason or ""), self.start_timeout_seconds, said))
        seen = {key: self.first_seen.get(key, now) for key, _bound, _said in found}
        self.first_seen = seen
        for key, bound, said in found:
            if now - seen[key] >= bound:
                return f"{said} (for {now - seen[key]:.0f} s)"
        return None


class ClusterJobLauncher:
    """Runs one job of `kind` through the `kubernetes` client (real in tests too, against a strict stand-in)."""

    def __init__(
        self,
        kind: JobKind,
        custom_objects_api,
        core_api,
        poll_seconds: float = POLL_SECONDS,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
        backoff_seconds: float = 1.0,
        log_poll_seconds: float = 2.0,
    ):
        self.kind = kind
        self.custom = custom_objects_api
        self.core = core_api
        self.poll_seconds = poll_seconds
        self.clock = clock
        self.sleep = sleep
        self.backoff_seconds = backoff_seconds
        self.log_poll_seconds = log_poll_seconds
        self._finished = threading.Event()
        self._events_readable = True

    def describe(self, namespace: str, name: str) -> str:
        return f"{self.kind.kind} {namespace}/{name}"

    def read(self, what: str, call: Callable[[], Any]) -> Any:
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

    def run(self, train: TrainConfig, launch: LaunchConfig, name: str | None = None) -> JobOutcome:
        namespace = launch.job_namespace or own_namespace()
        self.kind.prepare(self, launch)
        job = self.kind.build(train, launch, name or launch.job_name or unique_job_name(), namespace)
        lease = self._hold_step_lease(job, namespace, launch)
        try:
            return self._run(job, namespace, launch)
        finally:
            if lease is not None:
                lease.release()

    def _hold_step_lease(self, job: dict[str, Any], namespace: str, launch: LaunchConfig):
        """This step's lease, which the job's workers watch (components/train/step_lease.py), held before the job
        exists; None, and the job without it, where RBAC does not allow it."""
        from kubernetes import client

        from components.train import step_lease

        lease = step_lease.StepLease(
            client.CoordinationV1Api(self.custom.api_client), namespace,
            step_lease.lease_name(job["metadata"]["name"]), launch.step_lease_seconds, step_holder(),
        )  # fmt: skip
        if self.read(f"hold the lease {namespace}/{lease.name}", lease.hold):
            return lease
        step_lease.strip_environment(job)
        return None

    def _run(self, job: dict[str, Any], namespace: str, launch: LaunchConfig) -> JobOutcome:
        job_name = job["metadata"]["name"]
        self._create(job, namespace)
        delete = True
        watch = StartWatch(launch.start_timeout_seconds, launch.unschedulable_timeout_seconds, self.clock)
        try:
            outcome = self._wait(job_name, namespace, launch.job_timeout_seconds, watch)
        except Cancelled:
            logger.warning("cancelled: deleting %s", self.describe(namespace, job_name))
            raise
        except JobError:
            raise
        except Exception:
            delete = False  # the API is unreachable: leave the job; a retried step follows it again
            logger.error("lost contact with the Kubernetes API; %s is left running", self.describe(namespace, job_name))
            raise
        finally:
            if delete:
                self.delete(job_name, namespace)
        if not outcome.succeeded:
            raise JobError(f"{self.describe(namespace, job_name)} failed: {outcome.reason}: {outcome.message}")
        logger.info("%s succeeded", self.describe(namespace, job_name))
        return outcome

    def _create(self, job: dict[str, Any], namespace: str) -> None:
        name = job["metadata"]["name"]
        described = self.describe(namespace, name)
        owners = run_owner(self.core, namespace)
        if owners:
            job["metadata"]["ownerReferences"] = owners
        logger.info("creating %s%s", described, f", owned by Workflow {owners[0]['name']}" if owners else "")
        deadline = self.clock() + DELETION_WAIT_SECONDS
        while True:
            try:
                self.read(f"create {described}", lambda: self.custom.create_namespaced_custom_object(
                    self.kind.group, self.kind.version, namespace, self.kind.plural, job, field_validation="Strict"
                ))  # fmt: skip
                return
            except Exception as error:
                if status_of(error) != 409:
                    raise JobError(self._refusal(described, namespace, error)) from error
            existing = self.read(f"get {described}", lambda: self.get(name, namespace))
            if existing is None:
                continue  # deleted in between: create it
            if not (existing.get("metadata") or {}).get("deletionTimestamp"):
                # An earlier attempt of this step created it and died; follow that job rather than start a second
                # one writing into the same model directory.
                logger.warning("%s exists already (an earlier attempt of this step): following it", described)
                return
            if self.clock() >= deadline:
                raise JobError(f"{described} is still being deleted after {DELETION_WAIT_SECONDS:.0f} s")
            logger.info("%s is being deleted (a cancelled attempt): waiting to start it", described)
            self.sleep(max(self.poll_seconds, 1.0))

    def _refusal(self, described: str, namespace: str, error: BaseException) -> str:
        status, reason = status_of(error), api_reason(error)
        if status == 404:
            return (
                f"could not create {described}: this cluster does not serve {self.kind.plural}.{self.kind.group}/"
                f"{self.kind.version} ({self.kind.operator} is not installed). {LAUNCHER_HINT}"
            )
        if status == 403:
            return (
                f"could not create {described}: the step's service account may not ({reason}). In a Kubeflow "
                "profile the steps run as default-editor, whose kubeflow-edit role grants the job kind its release "
                "installs; on a standalone KFP the cluster admin applies manifests/single-user/"
            )
        return f"could not create {described}: {reason}"

    def get(self, name: str, namespace: str) -> dict[str, Any] | None:
        try:
            return self.custom.get_namespaced_custom_object(
                self.kind.group, self.kind.version, namespace, self.kind.plural, name
            )
        except Exception as error:
            if status_of(error) == 404:
                return None
            raise

    def _start_problem(self, name: str, namespace: str, watch: StartWatch) -> str | None:
        """What keeps the job's workers from starting, once it has lasted its bound (StartWatch)."""
        pods = self.read(f"list {name}'s pods", lambda: self.core.list_namespaced_pod(
            namespace, label_selector=self.kind.pod_selector(name)).items)  # fmt: skip
        warnings = []
        if not pods and self._events_readable:
            try:
                events = self.read(f"list {name}'s events", lambda: self.core.list_namespaced_event(
                    namespace, field_selector=f"involvedObject.name={name}").items)  # fmt: skip
                warnings = [event for event in events if event.type == "Warning"]
            except Exception as error:
                if status_of(error) != 403:
                    raise
                self._events_readable = False  # a role without events: the job's own timeout still bounds the wait
        return watch.problem(pods, warnings)

    def _wait(self, name: str, namespace: str, timeout: float, watch: StartWatch | None = None) -> JobOutcome:
        described = self.describe(namespace, name)
        deadline = self.clock() + timeout
        self._finished.clear()
        streaming = threading.Thread(target=self._stream_worker0_log, args=(name, namespace), daemon=True)
        streaming.start()
        waiting_said = None
        try:
            with signals_cancel():
                while True:
                    job = self.read(f"get {described}", lambda: self.get(name, namespace))
                    if job is None:
                        raise JobError(f"{described} disappeared (deleted by someone else)")
                    outcome = self.kind.outcome(job)
                    if outcome is not None:
                        self._finished.set()
                        streaming.join(timeout=LOG_WAIT_SECONDS)  # worker 0's last lines
                        return outcome
                    waiting = self.kind.waiting(job)
                    if waiting != waiting_said:
                        if waiting:
                            logger.warning("%s is %s", described, waiting)
                        waiting_said = waiting
                    problem = self._start_problem(name, namespace, watch) if watch is not None else None
                    if problem is not None:
                        raise JobError(f"{described} cannot run: {problem}; it was deleted")
                    if self.clock() >= deadline:
                        raise JobError(f"{described} did not finish within {timeout:.0f} s; it was deleted")
                    self.sleep(self.poll_seconds)
        finally:
            self._finished.set()
            streaming.join(timeout=2.0)

    # -- worker 0's log -----------------------------------------------------------------------------------------

    def _stream_worker0_log(self, name: str, namespace: str) -> None:
        """Follow worker 0's log: wait while it is Pending, print whole lines, re-attach after restarts."""
        seen, last_stamp, pod = None, "", f"{name} worker 0"
        try:
            while True:
                worker = self._worker0(name, namespace)
                if worker is None or worker.phase == "Pending":
                    if self._finished.is_set():
                        return
                    self.sleep(self.log_poll_seconds)
                    continue
                pod = worker.pod
                if worker.instance != seen:
                    if seen is not None:
                        logger.info("%s was restarted (%s): following the new container's log", pod, worker.description)
                    seen, last_stamp = worker.instance, ""
                last_stamp = self._follow(worker, namespace, last_stamp)
                after = self._worker0(name, namespace)
                if self._finished.is_set() and (after is None or after.instance == seen):
                    return  # the job ended and this container's log was read to its end
                if after is not None and after.instance == seen and after.phase in ("Succeeded", "Failed"):
                    self.sleep(self.log_poll_seconds)  # exited; the job's status (or a restart) comes next
        except Exception as error:  # the job's outcome decides success; a lost log stream only warns
            if not self._finished.is_set():
                logger.warning("stopped streaming the log of %s: %s", pod, error)

    def _worker0(self, name: str, namespace: str) -> Worker0 | None:
        return self.read(f"get {name}'s worker 0", lambda: self.kind.worker0(self.core, name, namespace))

    def _follow(self, worker: Worker0, namespace: str, after_stamp: str) -> str:
        """Print the container's log lines stamped after `after_stamp` until the stream ends; the last stamp."""
        try:
            response = self.read(f"read {worker.pod}'s log", lambda: self.core.read_namespaced_pod_log(
                worker.pod, namespace, container=worker.container, follow=True, timestamps=True,
                _preload_content=False,
            ))  # fmt: skip
        except Exception as error:
            if status_of(error) in (400, 404):  # "waiting to start", or replaced: not running after all
                self.sleep(self.log_poll_seconds)
                return after_stamp
            raise
        try:
            for line in whole_lines(response.stream()):
                stamp, _, text = line.decode(errors="replace").partition(" ")
                if stamp <= after_stamp:
                    continue  # already printed before the stream broke
                after_stamp = stamp
                logger.info("[%s] %s", worker.pod, text.rstrip("\r"))
        finally:
            response.release_conn()
        return after_stamp

    def delete(self, name: str, namespace: str) -> None:
        described = self.describe(namespace, name)
        try:
            self.read(f"delete {described}", lambda: self.custom.delete_namespaced_custom_object(
                self.kind.group, self.kind.version, namespace, self.kind.plural, name,
                propagation_policy="Foreground",
            ))  # fmt: skip
            logger.info("deleted %s", described)
        except Exception as error:
            if status_of(error) != 404:
                logger.warning("could not delete %s: %s", described, api_reason(error))


LAUNCHER_HINT = (
    "Kubeflow 1.11 and later serve TrainJobs (launcher trainjob), Kubeflow 1.10 and older TFJobs (launcher tfjob); "
    "launcher auto picks what the cluster serves, and launcher pod trains inside the step's own pod"
)
