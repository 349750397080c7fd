"""`make leases [NAMESPACE=...] [REMOVE=1]`: the pipeline's Leases in a namespace, and which of them are stale: those
that stand for documents the store no longer holds, and the step Leases of steps that are gone; with REMOVE=1 those
are removed.

Where the store cannot compare-and-swap, each dataset manifest, writer lease and promotion pointer lives in a Lease
of the namespace (components/common/coordination.py), and its copy in the store. When the store's copy is gone (KFP's
artifact retention expired a run's folder, a promotion root or a run was removed) its Lease is left behind, one per
dataset and run. A Lease is stale when the store holds no copy at its URI and the API server's clock says it has not
changed for `--min-age-hours` (1 by default: a swap writes its copy right after the Lease).

A step's Lease (components/train/step_lease.py: the launching step renews it while its training job runs) is stale
when it has not been renewed for its own duration and for `--min-age-hours`: its step ended without deleting it
(SIGKILL, a lost node). Either kind is removed only over the `resourceVersion` read, so a Lease changed meanwhile is
kept. Each run reaches the cluster through your kubeconfig (or in a pod, its service account) and the store through
the usual settings (AWS_*; docs/cluster.md).
"""

from __future__ import annotations

import argparse
import datetime
import email.utils
import logging
import sys
from collections.abc import Callable
from dataclasses import dataclass

from components.common import exit_codes, filesystem, stores

logger = logging.getLogger("pipeline.leases")

SELECTOR = "app.kubernetes.io/part-of=cifar10-pipeline,app.kubernetes.io/component in (coordination,step-lease)"
STEP_LEASE = "step-lease"
MIN_AGE_HOURS = 1.0


@dataclass(frozen=True)
class LeaseRow:
    name: str
    uri: str  # a document's URI; a step's Lease: "step of <job>"
    holder: str
    resource_version: str
    idle_seconds: float  # since its last change, on the API server's clock
    in_store: bool  # a step's Lease: whether it is still within its duration (its step renews it)
    step: bool = False

    def stale(self, min_age_seconds: float) -> bool:
        return not self.in_store and self.idle_seconds >= min_age_seconds

    def state(self, min_age_seconds: float) -> str:
        if self.stale(min_age_seconds):
            return "stale: its step is gone" if self.step else "stale: the store no longer holds it"
        if self.in_store:
            return "kept: its step renews it" if self.step else "kept: the store holds it"
        return "kept: changed within --min-age-hours"


def last_change(lease) -> datetime.datetime:
    """When the API server last wrote the Lease (its managedFields' times, else its creation), on its clock."""
    times = [entry.time for entry in (lease.metadata.managed_fields or []) if entry.time]
    return max(times) if times else lease.metadata.creation_timestamp


def rows(api, namespace: str, in_store: Callable[[str], bool]) -> list[LeaseRow]:
    """The namespace's Leases (documents' and steps'), each with whether the store holds its document (a step's:
    whether it is within its duration) and how long it has been
    unchanged by the API server's clock (its Date header: no clock of this machine is compared with the server's)."""
    from components.common.coordination import URI_ANNOTATION
    from components.train.step_lease import JOB_ANNOTATION

    listed, _status, headers = api.list_namespaced_lease_with_http_info(namespace, label_selector=SELECTOR)
    now = email.utils.parsedate_to_datetime(headers["Date"])
    found = []
    for lease in listed.items:
        annotations = lease.metadata.annotations or {}
        idle = (now - last_change(lease)).total_seconds()
        holder = (lease.spec.holder_identity or "") if lease.spec else ""
        if (lease.metadata.labels or {}).get("app.kubernetes.io/component") == STEP_LEASE:
            duration = (lease.spec.lease_duration_seconds if lease.spec else None) or 0
            job = annotations.get(JOB_ANNOTATION) or lease.metadata.name
            found.append(LeaseRow(lease.metadata.name, f"step of {job}", holder, lease.metadata.resource_version,
                                  idle, idle < duration, step=True))  # fmt: skip
            continue
        uri = annotations.get(URI_ANNOTATION, "")
        found.append(LeaseRow(
            lease.metadata.name, uri, holder, lease.metadata.resource_version, idle, bool(uri) and in_store(uri),
        ))  # fmt: skip
    return sorted(found, key=lambda row: row.uri)


def store_holds(uri: str) -> bool:
    """Whether the store has an object at `uri`."""
    from components.common import storage

    parent, name = filesystem.parent_and_name(uri)
    return storage.publisher_for(parent).version(name) != stores.ABSENT


def remove(api, namespace: str, stale: list[LeaseRow]) -> int:
    """Delete each stale Lease over the resourceVersion listed (a Lease changed since is kept, said); the count."""
    from kubernetes.client.exceptions import ApiException

    removed = 0
    for row in stale:
        try:
            preconditions = {"preconditions": {"resourceVersion": row.resource_version}}
            api.delete_namespaced_lease(row.name, namespace, body=preconditions)
        except ApiException as error:
            if error.status in (404, 409):
                logger.info("kept %s: it changed or went meanwhile", row.name)
                continue
            raise
        removed += 1
    return removed


def coordination_api(namespace: str | None):
    """The Leases API through the kubeconfig (or this pod's service account), and the namespace to look in."""
    from kubernetes import client
    from kubernetes import config as kubernetes_config

    try:
        kubernetes_config.load_kube_config()
        _contexts, current = kubernetes_config.list_kube_config_contexts()
        namespace = namespace or (current or {}).get("context", {}).get("namespace")
    except (kubernetes_config.ConfigException, OSError, TypeError):
        kubernetes_config.load_incluster_config()
        from components.common.pod import namespace_of_this_pod

        namespace = namespace or namespace_of_this_pod()
    if not namespace:
        raise ValueError("NAMESPACE: give the profile namespace whose Leases to look at (your kubeconfig names none)")
    return client.CoordinationV1Api(), namespace


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m pipeline.leases", description=__doc__.splitlines()[0])
    parser.add_argument("--namespace", help="the profile namespace (default: the kubeconfig context's)")
    parser.add_argument("--remove", action="store_true", help="remove the stale Leases")
    parser.add_argument("--min-age-hours", type=float, default=MIN_AGE_HOURS,
                        help="a Lease changed more recently is never stale (default 1)")  # fmt: skip
    return parser


def main(argv: list[str] | None = None) -> int:
    from components.common.logs import setup_logging

    arguments = build_parser().parse_args(argv)
    setup_logging()
    from kubernetes.client.exceptions import ApiException
    from urllib3.exceptions import HTTPError

    try:
        if arguments.min_age_hours < 0:
            raise ValueError(f"--min-age-hours: {arguments.min_age_hours} is negative")
        api, namespace = coordination_api(arguments.namespace)
        found = rows(api, namespace, store_holds)
    except ValueError as error:
        logger.error("%s", error)
        return exit_codes.BAD_INPUT
    except ApiException as error:
        advice = ": the cluster admin applies manifests/admin/ (docs/cluster.md)" if error.status == 403 else ""
        logger.error("the Kubernetes API refused to list the Leases (%s %s)%s", error.status, error.reason, advice)
        return exit_codes.BAD_INPUT if error.status in (401, 403) else exit_codes.STORE_UNAVAILABLE
    except (HTTPError, OSError) as error:
        logger.error("the Kubernetes API cannot be reached (%s)", type(error).__name__)
        return exit_codes.STORE_UNAVAILABLE
    stale = [row for row in found if row.stale(arguments.min_age_hours * 3600)]
    for row in found:
        state = row.state(arguments.min_age_hours * 3600)
        print(f"{row.name}  {row.uri}  {state}" + (f"  (held by {row.holder})" if row.holder else ""))
    if arguments.remove:
        removed = remove(api, namespace, stale)
        print(f"{len(found)} Leases in {namespace}; removed {removed} stale")
    else:
        print(f"{len(found)} Leases in {namespace}, {len(stale)} stale" + (": REMOVE=1 removes them" if stale else ""))
    return exit_codes.SUCCESS


if __name__ == "__main__":
    sys.exit(main())
