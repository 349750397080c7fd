"""No training job outlives the step that launched it: the step's lease, renewed by the step, watched by the workers.

A KFP step gets SIGTERM and about a second later SIGKILL when its run is cancelled or its pod ends
(docs/cluster.md), too little to delete the job it launched, and Kubernetes removes nothing by itself: KFP keeps a
cancelled run's step pods (so an ownerReference to the pod would not fire) and its Workflow until the run is
deleted. So the launching step holds a `coordination.k8s.io/v1` Lease named after its job (`<job>-step`) and renews
it every `seconds / 6` while it follows the job; the job's workers (each worker's supervisor, which imports no
TensorFlow and always answers) read it and, when it has not been renewed for `seconds` as they measure it (their own
monotonic clock since they last saw it change: no two clocks are compared), delete their own job, whose pods then
stop with their grace period (a checkpoint is saved). A retried step takes the lease over and follows the job on;
a step that ends normally deletes the job, then the lease.

What a worker cannot tell apart it does not act on: an API error is not a lapse (it reads again; if the step died
meanwhile, the lease is found unchanged once the API answers and the job is deleted then); a lease it may not read
(RBAC) is said once and not watched.
"""

from __future__ import annotations

import datetime
import logging
import os
import threading
import time
from collections.abc import Callable

from components.common import access, coordination

logger = logging.getLogger(__name__)

LEASE_VARIABLE = "CIFAR10_PIPELINE_STEP_LEASE"  # the lease's name, in the workers' environment
SECONDS_VARIABLE = "CIFAR10_PIPELINE_STEP_LEASE_SECONDS"
JOB_VARIABLE = "CIFAR10_PIPELINE_TRAINING_JOB"  # group/version/plural/name of the job the workers belong to
MIN_CHECK_SECONDS, MAX_CHECK_SECONDS = 1.0, 15.0
# How `make leases` finds a step's lease (pipeline/leases.py), beside the documents' (components/common/coordination.py)
LABELS = {"app.kubernetes.io/part-of": "cifar10-pipeline", "app.kubernetes.io/component": "step-lease"}
JOB_ANNOTATION = "cifar10-pipeline.io/training-job"  # the job's name, which the lease stops when the step is gone


def lease_name(job_name: str) -> str:
    return f"{job_name}-step"


def check_every(seconds: float) -> float:
    return min(max(seconds / 6, MIN_CHECK_SECONDS), MAX_CHECK_SECONDS)


def request_seconds(lease_seconds: float) -> float:
    """How long one request about the lease may take: a third of the lease, so that a hung one is given up and
    tried again before the lease could lapse (at most the coordination's own bound)."""
    return max(1.0, min(coordination.REQUEST_SECONDS, lease_seconds / 3))


def _micro_time(now: datetime.datetime | None = None) -> str:
    now = now or datetime.datetime.now(datetime.timezone.utc)
    return now.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _status(error: BaseException) -> int | None:
    return getattr(error, "status", None)


def worker_environment(kind, name: str, seconds: float) -> list[dict]:
    """What the job's workers need to watch its step's lease (`kind`: the job's JobKind)."""
    return [
        {"name": LEASE_VARIABLE, "value": lease_name(name)},
        {"name": SECONDS_VARIABLE, "value": f"{seconds:g}"},
        {"name": JOB_VARIABLE, "value": f"{kind.group}/{kind.version}/{kind.plural}/{name}"},
    ]


def strip_environment(value) -> None:
    """Remove the lease's variables from every env list of a job (when the step cannot hold the lease)."""
    names = {LEASE_VARIABLE, SECONDS_VARIABLE, JOB_VARIABLE}
    if isinstance(value, dict):
        for key, item in value.items():
            if key == "env" and isinstance(item, list):
                item[:] = [entry for entry in item if entry.get("name") not in names]
            else:
                strip_environment(item)
    elif isinstance(value, list):
        for item in value:
            strip_environment(item)


class StepLease:
    """The launching step's side: hold the lease (create it, or take it over from an earlier attempt), renew it from
    a thread until `release`, which deletes it."""

    def __init__(self, coordination_api, namespace: str, name: str, seconds: float, holder: str):
        self.api, self.namespace, self.name, self.seconds, self.holder = (
            coordination_api, namespace, name, seconds, holder,
        )  # fmt: skip
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.renewed = time.monotonic()

    def _call(self, what: str, function):
        """One call to the Leases API as the coordination makes it (components/common/coordination.py): each
        request bounded by a third of the lease, throttling and 5xx retried, a closed or hung connection tried
        again, an answer that is not a Lease refused in one line."""
        return coordination.call(what, function, self.namespace)

    def hold(self) -> bool:
        """Take the lease and start renewing it; False (said once) when RBAC does not allow it."""
        try:
            self._write(take_over=True)
        except Exception as error:
            if isinstance(error, access.AccessError) or _status(error) == 403:
                logger.warning(
                    "cannot hold the lease %s/%s (forbidden: the cluster admin applies manifests/admin/ once): the job "
                    "will not stop by itself if this step is cancelled or its pod ends", self.namespace, self.name,
                )  # fmt: skip
                return False
            raise
        self._thread = threading.Thread(target=self._renew, name="step-lease", daemon=True)
        self._thread.start()
        return True

    def _body(self, current: dict | None) -> dict:
        from kubernetes import client

        now = _micro_time()
        acquired = (current or {}).get("acquire_time") if (current or {}).get("holder") == self.holder else None
        return client.V1Lease(
            metadata=client.V1ObjectMeta(
                name=self.name, resource_version=(current or {}).get("resource_version"), labels=dict(LABELS),
                annotations={JOB_ANNOTATION: self.name.removesuffix("-step")},
            ),
            spec=client.V1LeaseSpec(
                holder_identity=self.holder, lease_duration_seconds=max(1, round(self.seconds)),
                acquire_time=acquired or now, renew_time=now,
            ),
        )  # fmt: skip

    def _read(self) -> dict | None:
        try:
            lease = self._call("read", lambda: self.api.read_namespaced_lease(
                self.name, self.namespace, _request_timeout=request_seconds(self.seconds)))  # fmt: skip
        except Exception as error:
            if _status(error) == 404:
                return None
            raise
        acquire = lease.spec.acquire_time
        return {
            "resource_version": lease.metadata.resource_version,
            "holder": lease.spec.holder_identity,
            "acquire_time": _micro_time(acquire) if isinstance(acquire, datetime.datetime) else acquire,
        }

    def _write(self, take_over: bool = False) -> None:
        for _ in range(5):
            current = self._read()
            if current is not None and current["holder"] != self.holder:
                if not take_over:
                    return  # another attempt of the step took it over: it renews now
                logger.info("taking over the lease %s/%s from %s", self.namespace, self.name, current["holder"])
            try:
                body, timeout = self._body(current), request_seconds(self.seconds)
                if current is None:
                    self._call("create", lambda body=body, timeout=timeout: self.api.create_namespaced_lease(
                        self.namespace, body, _request_timeout=timeout))  # fmt: skip
                else:
                    self._call("replace", lambda body=body, timeout=timeout: self.api.replace_namespaced_lease(
                        self.name, self.namespace, body, _request_timeout=timeout))  # fmt: skip
            except Exception as error:
                if _status(error) in (404, 409):
                    continue  # changed in between: read it again
                raise
            self.renewed = time.monotonic()
            return

    def _renew(self) -> None:
        while not self._stop.wait(check_every(self.seconds)):
            try:
                self._write()
            except Exception as error:  # the API may come back: keep trying while the step runs
                logger.warning("could not renew the lease %s/%s: %s", self.namespace, self.name, error)

    def release(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
        try:
            self._call("delete", lambda: self.api.delete_namespaced_lease(
                self.name, self.namespace, _request_timeout=request_seconds(self.seconds)))  # fmt: skip
        except Exception as error:
            if _status(error) != 404:
                logger.warning("could not delete the lease %s/%s: %s", self.namespace, self.name, error)


class LeaseWatch:
    """The workers' side: `lapsed()` blocks until the step's lease has gone unrenewed for `seconds`, then returns
    what was seen; None when it cannot be watched (RBAC) or `stop` was set."""

    def __init__(
        self, coordination_api, namespace: str, name: str, seconds: float,
        clock: Callable[[], float] = time.monotonic, stop: threading.Event | None = None,
    ):  # fmt: skip
        self.api, self.namespace, self.name, self.seconds = coordination_api, namespace, name, seconds
        self.clock = clock
        self.stop = stop or threading.Event()

    def lapsed(self) -> str | None:
        seen, changed_at, warned = object(), self.clock(), False
        while True:
            try:
                lease = self.api.read_namespaced_lease(
                    self.name, self.namespace, _request_timeout=request_seconds(self.seconds)
                )  # a hung read must not keep the watch from seeing a lapse
                coordination.check_answer(lease, "read")
                current = lease.metadata.resource_version
            except Exception as error:
                status = _status(error)
                if status == 403:
                    logger.warning(
                        "cannot read the lease %s/%s of the step that launched this job (forbidden: the profile "
                        "applies manifests/rbac.yaml): the job does not stop by itself if that step ends",
                        self.namespace, self.name,
                    )  # fmt: skip
                    return None
                if status != 404:
                    if not warned:
                        logger.warning("cannot read the step's lease %s/%s now (%s): reading it again",
                                       self.namespace, self.name, error)  # fmt: skip
                        warned = True
                    if self.stop.wait(check_every(self.seconds)):
                        return None
                    continue
                current = None
            now = self.clock()
            if current != seen:
                seen, changed_at = current, now
            elif now - changed_at >= self.seconds:
                state = "was deleted" if current is None else "was not renewed"
                return f"the lease {self.namespace}/{self.name} of the step that launched this job {state} for " \
                       f"{now - changed_at:.0f} s (the step was cancelled or its pod ended)"  # fmt: skip
            if self.stop.wait(check_every(self.seconds)):
                return None


def cluster_client():
    """An ApiClient and the namespace: in a pod, its service account's (in-cluster); elsewhere the kubeconfig's
    current context, as the launching step finds the cluster."""
    if coordination.available():
        return coordination.in_cluster_client()
    from kubernetes import config

    _contexts, current = config.list_kube_config_contexts()
    return config.new_client_from_config(), current["context"].get("namespace") or "default"


def check_worker_rights(environment=None) -> None:
    """Before a worker's first step: whether its service account may read the step's lease and delete its own job
    (asked of the API server); AccessError naming the missing one, in one line. Nothing to ask outside a job."""
    environment = os.environ if environment is None else environment
    name, job = environment.get(LEASE_VARIABLE), environment.get(JOB_VARIABLE)
    if not name or not job or not coordination.available():
        return
    try:
        api_client, namespace = cluster_client()
        account, permissions = coordination.service_account_name(), access.worker_permissions(name, job)
        access.check(api_client, namespace, account, permissions, coordination.call)
    except access.AccessError:
        raise
    except Exception as error:  # the review could not be made: the watch says what it cannot do, as before
        logger.warning("the workers' rights could not be checked (%s): training on", type(error).__name__)


def watch_from_environment(on_lapse: Callable[[str, str], None], environment=None) -> threading.Thread | None:
    """In a worker's supervisor: watch the step's lease named in the environment from a thread; on a lapse, call
    `on_lapse(reason, job)` (job: group/version/plural/name). None when the job was not launched with one."""
    environment = os.environ if environment is None else environment
    name, job = environment.get(LEASE_VARIABLE), environment.get(JOB_VARIABLE)
    if not name or not job:
        return None
    seconds = float(environment.get(SECONDS_VARIABLE) or 90)

    def run() -> None:
        from kubernetes import client

        try:
            api_client, namespace = cluster_client()
            reason = LeaseWatch(client.CoordinationV1Api(api_client), namespace, name, seconds).lapsed()
        except Exception as error:  # a worker trains on when it cannot watch: say so
            logger.warning("cannot watch the step's lease %s: %s", name, error)
            return
        if reason is not None:
            on_lapse(reason, job)

    thread = threading.Thread(target=run, name="step-lease-watch", daemon=True)
    thread.start()
    return thread


def delete_own_job(job: str, reason: str) -> bool:
    """Delete the job this worker belongs to (its pods then stop with their grace period); False if it cannot."""
    from kubernetes import client

    group, version, plural, name = job.split("/")
    namespace = "?"
    try:
        api_client, namespace = cluster_client()
        client.CustomObjectsApi(api_client).delete_namespaced_custom_object(
            group, version, namespace, plural, name, body=client.V1DeleteOptions(propagation_policy="Background")
        )
    except Exception as error:
        if _status(error) == 404:
            return True
        logger.error("%s; deleting this job %s failed (%s): this worker stops", reason, name, error)
        return False
    logger.error("%s: deleted this job %s/%s; its workers stop", reason, namespace, name)
    return True
