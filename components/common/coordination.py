"""Compare-and-swap through the Kubernetes API, for an object store that cannot do it itself.

Publishing a dataset (its manifest), one writer per model directory (its writer lease) and promotion (its pointer)
each rest on a small document replaced only over the version its writer read: a compare-and-swap. The stores
Kubeflow ships do not offer one (MinIO RELEASE.2019-08-14 ignores conditional writes; SeaweedFS 4.00-4.16 checks,
then writes), but every step runs in a pod that reaches the Kubernetes API, whose objects are replaced only over the
`resourceVersion` a writer read (409 Conflict otherwise), and whose `coordination.k8s.io/v1` Leases are made for one
holder at a time. So where the store fails the conditional-write check and the step runs in a pod, each such
document lives in a Lease of the run's namespace:

- one Lease per document (a dataset's manifest, a model directory's writer lease, a promotion root's pointer), named
  `cifar10-pipeline-<hash of its URI>`, annotated with the URI and holding the document's text; its
  `holderIdentity`, `acquireTime` and `renewTime` say who holds the document's claim, when there is one;
- the Lease is the authority: a swap is a create (for a document that must not exist yet: 409 AlreadyExists for a
  second) or a replace carrying the `resourceVersion` read (409 Conflict for a stale one), so exactly one of several
  writers wins, as with a store that honours conditional writes;
- the store's copy is written after the swap, for readers outside the cluster, and only while the swap is still the
  latest (it is read again first): a holder paused past its lease finds, when it wakes, that its swap of the truth
  is refused (its version is stale), and a late copy it still writes is overwritten by the next swap and never read
  by a step (steps read the Lease);
- the API server's own clock and counters decide: a `resourceVersion` is the server's, and a writer lease is taken
  over only after a newcomer has watched it unchanged for the lease's duration on its own monotonic clock (the
  writer claim's rule), so neither a clock that jumps nor two clocks that disagree hand one claim to two holders;
- a lost API server stops every write of the truth (nothing is swapped without it): the step fails retryably, and a
  holder that cannot renew its lease for the lease's duration stops writing by itself.

Outside a pod (no service account, no API address), nothing here is used: the store must honour conditional writes,
or the user assumes a single writer (components/common/filesystem.py).
"""

from __future__ import annotations

import datetime
import functools
import hashlib
import logging
import os
import time
from pathlib import Path
from typing import Any

from components.common import access, pod
from components.common.documents import DocumentError, load
from components.common.filesystem import PublishConflictError, StoreUnavailableError
from components.common.stores import ABSENT, conflict_error

logger = logging.getLogger(__name__)

SERVICE_ACCOUNT = Path("/var/run/secrets/kubernetes.io/serviceaccount")  # token, ca.crt, namespace: as a pod has them
SERVICE_ACCOUNT_VARIABLE = "CIFAR10_PIPELINE_SERVICE_ACCOUNT"  # another folder holding them (tests: a pod's stand-in)
PREFIX = "cifar10-pipeline-"
URI_ANNOTATION = "cifar10-pipeline.io/uri"
CONTENT_ANNOTATION = "cifar10-pipeline.io/content"
LABELS = {"app.kubernetes.io/part-of": "cifar10-pipeline", "app.kubernetes.io/component": "coordination"}
MAX_CONTENT = 200 * 1024  # the API server takes at most 256 KiB of annotations per object
VERSION_PREFIX = "k8s:"
LEASE_SECONDS = 90  # the leaseDurationSeconds shown for a document's claim (the writer claim's LEASE_SECONDS)
REQUEST_SECONDS = 30
CREATE_ATTEMPTS = 3  # a create answered 409 with nothing there (a proxy's answer, not another writer's) is tried again
RETRY_SECONDS = 60.0  # how long throttling (429) and the API server's 5xx are retried through
RETRY_AFTER_MOST = 10.0  # the longest single wait, whatever Retry-After asks


class CoordinationError(StoreUnavailableError):
    """The Kubernetes API could not be asked (unreachable, or it answered 5xx): retryable."""


def _retry_after(error) -> float | None:
    """The seconds a 429's Retry-After asks for (a number; a date is taken as the longest wait)."""
    value = (error.headers or {}).get("Retry-After") if hasattr(error, "headers") else None
    if value is None:
        return None
    try:
        return max(float(value), 0.0)
    except ValueError:
        return RETRY_AFTER_MOST


NotTheApiError = access.NotTheApiError  # what answered is not the Kubernetes API: final, exit 2


def check_answer(answer: Any, what: str) -> None:
    """A read, create or replace answered with the API's Lease (a proxy's login page or another server's HTML is
    parsed by the client into an object with no fields): refused in one line, not taken for a document."""
    if what in ("read", "create", "replace") and (
        getattr(answer, "metadata", None) is None or not getattr(answer.metadata, "resource_version", None)
    ):
        raise NotTheApiError(
            f"the Kubernetes API's answer to {what} a Lease is not a Lease (an HTML page: a proxy's login, or an "
            "address that is not the API server's?); check KUBERNETES_SERVICE_HOST and what stands in front of the "
            "API server"
        )


def lease_name(uri: str) -> str:
    return PREFIX + hashlib.sha256(uri.encode()).hexdigest()[:40]


def service_account() -> Path:
    return Path(os.environ.get(SERVICE_ACCOUNT_VARIABLE) or SERVICE_ACCOUNT)


def available() -> bool:
    """Whether this process runs in a pod that can ask the Kubernetes API: its address and a service account."""
    folder = service_account()
    return bool(os.environ.get("KUBERNETES_SERVICE_HOST")) and (folder / "token").is_file()


def _phrase(status: int | None) -> str:
    """The status's standard phrase (never the server's own text, which may say anything)."""
    import http

    try:
        return http.HTTPStatus(status).phrase
    except ValueError:
        return "an unknown status"


def _retries():
    """urllib3's retries for the Kubernetes client: connection failures only. A 429's Retry-After is not slept by
    the client (it would wait an hour if asked): `call` honours it, bounded, with the other answers it maps."""
    from urllib3.util.retry import Retry

    return Retry(total=2, connect=2, read=0, status=0, respect_retry_after_header=False, raise_on_status=False)


def in_cluster_client():
    """An ApiClient with this pod's service account (in-cluster configuration), and the pod's namespace."""
    from kubernetes import client
    from kubernetes.config.incluster_config import InClusterConfigLoader

    folder = service_account()
    configuration = client.Configuration()
    InClusterConfigLoader(token_filename=str(folder / "token"), cert_filename=str(folder / "ca.crt")).load_and_set(
        configuration
    )
    configuration.retries = _retries()
    namespace = pod.namespace_of_this_pod(folder / "namespace")
    if not namespace:
        raise CoordinationError(f"{folder / 'namespace'}: this pod's namespace cannot be read")
    return client.ApiClient(configuration), namespace


def in_cluster_api():
    """The Leases API (coordination.k8s.io/v1) of this pod's namespace, and the namespace."""
    from kubernetes import client

    api_client, namespace = in_cluster_client()
    return client.CoordinationV1Api(api_client), namespace


@functools.cache
def documents() -> KubernetesDocuments:
    """The documents store of this pod's namespace, through the pod's service account (in-cluster configuration)."""
    api, namespace = in_cluster_api()
    logger.info("coordination: the store cannot compare-and-swap; documents are swapped as Leases in namespace %s "
                "through the Kubernetes API", namespace)  # fmt: skip
    return KubernetesDocuments(api, namespace)


def _micro_time(seconds: float) -> str:
    """A MicroTime as the API writes it."""
    stamp = datetime.datetime.fromtimestamp(seconds, tz=datetime.timezone.utc)
    return stamp.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _claim(content: bytes) -> dict[str, Any]:
    """The Lease's spec for a document: who holds its claim and since when (a writer lease's holder and renewal, a
    pointer's promotion in progress), as `kubectl get leases` shows them; {} for a document with no claim."""
    try:
        document = load(content, "the claim", "claim", yaml_allowed=False)
    except DocumentError:
        return {}
    if not isinstance(document, dict):
        return {}
    claim = document.get("promoting") if isinstance(document.get("promoting"), dict) else document
    holder = claim.get("holder")
    if not isinstance(holder, str) or not holder:
        return {}
    spec: dict[str, Any] = {"holderIdentity": holder[:1024], "leaseDurationSeconds": LEASE_SECONDS}
    for field, name in (("renewed_at", "renewTime"), ("claimed_at", "acquireTime")):
        if isinstance(claim.get(field), int | float):
            spec[name] = _micro_time(claim[field])
    return spec


def call(what: str, function, namespace: str, thing: str = "a Lease", forbidden: str | None = None, check=None):
    """One API call (`what` to `thing`), retried through throttling (429: after its Retry-After, at least a second
    and at most RETRY_AFTER_MOST) and the API server's bad moments (5xx) for at most RETRY_SECONDS; its answer must
    be the API's object (`check(answer)` raises NotTheApiError where not; a Lease's by default). A 403 (`forbidden`:
    its line) and an answer that is not the API's are refused in one line (exit 2); 404 and 409 are the caller's;
    what stays unavailable is retryable (145). No server text is quoted: the status and what was asked."""
    from kubernetes.client.exceptions import ApiException
    from urllib3.exceptions import HTTPError

    deadline = time.monotonic() + RETRY_SECONDS
    delay = 1.0
    while True:
        try:
            answer = function()
        except ValueError:  # the client could not make its model of the answer: a page or another object
            raise NotTheApiError(
                f"the Kubernetes API's answer to {what} {thing} is not the API's object (an HTML page: a proxy's "
                "login, or an address that is not the API server's?); check KUBERNETES_SERVICE_HOST"
            ) from None
        except ApiException as error:
            if error.status in (404, 409):
                raise
            if error.status == 403:
                raise access.AccessError(
                    forbidden
                    or f"the Kubernetes API refused to {what} Leases in namespace {namespace} (403), which the "
                    f"project coordinates through on this store: they are granted by {access.ADMIN_SET}"
                ) from None
            retried = error.status == 429 or (error.status or 0) >= 500
            if retried:
                asked = _retry_after(error) if error.status == 429 else None
                wait = min(max(asked, delay) if asked is not None else delay, RETRY_AFTER_MOST)
                if time.monotonic() + wait < deadline:
                    logger.info("the Kubernetes API answered %s to %s %s: again in %.0f s", error.status, what,
                                thing, wait)  # fmt: skip
                    time.sleep(wait)
                    delay = min(delay * 2, RETRY_AFTER_MOST)
                    continue
            during = f", for {RETRY_SECONDS:.0f} s" if retried else ""
            raise CoordinationError(
                f"the Kubernetes API could not {what} {thing} ({error.status} {_phrase(error.status)}{during})"
            ) from None
        except (HTTPError, OSError) as error:  # refused, closed unanswered, or no answer within REQUEST_SECONDS
            # A write may have been applied before its answer was lost: tried again, it meets itself (a 409),
            # which `swap` and `remove` tell from another writer's by what is there.
            if time.monotonic() + delay < deadline:
                logger.info("the Kubernetes API gave no answer to %s a Lease (%s): again in %.0f s", what,
                            type(error).__name__, delay)  # fmt: skip
                time.sleep(delay)
                delay = min(delay * 2, RETRY_AFTER_MOST)
                continue
            raise CoordinationError(
                f"the Kubernetes API could not {what} {thing} (no answer: {type(error).__name__}, "
                f"for {RETRY_SECONDS:.0f} s)"
            ) from None
        (check or (lambda answered: check_answer(answered, what)))(answer)
        return answer


class KubernetesDocuments:
    """Documents (small texts) swapped as Leases: see the module's description."""

    def __init__(self, api: Any, namespace: str):
        self.api = api
        self.namespace = namespace

    def _call(self, what: str, function):
        return call(what, function, self.namespace)

    def _read(self, uri: str) -> Any | None:
        from kubernetes.client.exceptions import ApiException

        try:
            return self._call(
                "read",
                lambda: self.api.read_namespaced_lease(
                    lease_name(uri), self.namespace, _request_timeout=REQUEST_SECONDS
                ),
            )
        except ApiException as error:
            if error.status == 404:
                return None
            raise

    def read(self, uri: str) -> tuple[bytes | None, str]:
        """The document at `uri` and its version (`k8s:<resourceVersion>`), or (None, ABSENT) without a Lease."""
        lease = self._read(uri)
        if lease is None:
            return None, ABSENT
        annotations = lease.metadata.annotations or {}
        if annotations.get(URI_ANNOTATION) != uri:
            raise PublishConflictError(
                f"Lease {lease.metadata.name} holds {annotations.get(URI_ANNOTATION)}, not {uri}"
            )
        content = annotations.get(CONTENT_ANNOTATION)
        return (None if content is None else content.encode()), VERSION_PREFIX + lease.metadata.resource_version

    def swap(self, uri: str, content: bytes, expected_version: str) -> str:
        """Make `content` the document at `uri` if its version is still `expected_version` (ABSENT, or a version
        this store gave; a version of the store's own copy counts as ABSENT here: the document was never swapped
        here before). Returns the new version; PublishConflictError when another writer moved first."""
        from kubernetes.client.exceptions import ApiException

        text = content.decode("utf-8")
        if len(content) > MAX_CONTENT:
            raise ValueError(
                f"{uri}: {len(content):,} bytes, more than a coordinated document may hold ({MAX_CONTENT:,})"
            )
        body = {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {"name": lease_name(uri), "namespace": self.namespace, "labels": dict(LABELS),
                         "annotations": {URI_ANNOTATION: uri, CONTENT_ANNOTATION: text}},
            "spec": _claim(content),
        }  # fmt: skip
        creating = not expected_version.startswith(VERSION_PREFIX)
        if not creating:
            body["metadata"]["resourceVersion"] = expected_version.removeprefix(VERSION_PREFIX)
        for attempt in range(CREATE_ATTEMPTS):
            try:
                if creating:
                    created = self._call("create", lambda: self.api.create_namespaced_lease(
                        self.namespace, body, _request_timeout=REQUEST_SECONDS))  # fmt: skip
                    return VERSION_PREFIX + created.metadata.resource_version
                replaced = self._call("replace", lambda: self.api.replace_namespaced_lease(
                    lease_name(uri), self.namespace, body, _request_timeout=REQUEST_SECONDS))  # fmt: skip
                return VERSION_PREFIX + replaced.metadata.resource_version
            except ApiException as error:
                if error.status not in (404, 409):
                    raise
                current, version = self.read(uri)
                if current == content:  # another writer made the same document: both succeed, as publishing does
                    return version
                if creating and version == ABSENT and attempt + 1 < CREATE_ATTEMPTS:
                    logger.info("the Kubernetes API answered %s to creating the Lease of %s, yet none is there: "
                                "creating it again", error.status, uri)  # fmt: skip
                    continue
                raise conflict_error(uri) from None
        raise AssertionError("unreachable")

    def still_current(self, uri: str, version: str) -> bool:
        """Whether `version` is still the document's (before writing the store's copy of it)."""
        return self.read(uri)[1] == version

    def remove(self, uri: str, expected_version: str | None = None) -> None:
        """Remove the document's Lease (only over `expected_version` when given); gone already is fine."""
        from kubernetes.client.exceptions import ApiException

        preconditions = {}
        if expected_version and expected_version.startswith(VERSION_PREFIX):
            preconditions = {"preconditions": {"resourceVersion": expected_version.removeprefix(VERSION_PREFIX)}}
        try:
            self._call("delete", lambda: self.api.delete_namespaced_lease(
                lease_name(uri), self.namespace, body=preconditions or None, _request_timeout=REQUEST_SECONDS,
            ))  # fmt: skip
        except ApiException as error:
            if error.status == 409:
                raise conflict_error(uri) from None
            if error.status != 404:
                raise


def service_account_name() -> str:
    """This pod's service account as its token names it (`system:serviceaccount:<namespace>:<name>` -> name)."""
    import base64
    import json

    try:
        payload = (service_account() / "token").read_text().split(".")[1]  # reader: the kubelet's token, one line
        claims = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
        return str(claims["sub"]).rsplit(":", 1)[-1]
    except (OSError, IndexError, KeyError, ValueError):
        return "this step's service account"
