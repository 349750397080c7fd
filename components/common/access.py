"""Before a run's work: whether the step's service account may do what the run will need, asked of the Kubernetes
API server itself (SelfSubjectAccessReview, which every authenticated user may create), and refused in one line that
names the missing permission, the manifest that grants it and who applies it.

What a run needs: Leases of its namespace where its object store cannot compare-and-swap (the documents are swapped
there: components/common/coordination.py); the job kind the training launches (TrainJob or TFJob), with its pods,
their logs and events, where training runs as a cluster job. Outside a pod there is nothing to ask.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

logger = logging.getLogger(__name__)

ADMIN_SET = "manifests/admin/, which the cluster admin applies once (kubectl apply -k manifests/admin/)"
JOB_ROLES = (
    "the release's kubeflow-edit role (every profile's default-editor holds the job kind its release installs: TFJob "
    "on Kubeflow 1.9 and 1.10, TrainJob on 1.11 and 26.03); on a standalone KFP, manifests/single-user/, which the "
    "cluster admin applies"
)
REVIEW_FORBIDDEN = (
    "the Kubernetes API refused this pod's access review (403): every authenticated user may create "
    "SelfSubjectAccessReviews (system:basic-user); ask the cluster admin"
)
JOB_RESOURCES = {"trainjob": ("trainer.kubeflow.org", "trainjobs"), "tfjob": ("kubeflow.org", "tfjobs")}


class NotTheApiError(ValueError):
    """What answered is not the Kubernetes API (a proxy's login page, another server): final, exit 2."""


class AccessError(ValueError):
    """The step's service account lacks a permission the run needs (final: a retry lacks it too)."""


@dataclass(frozen=True)
class Permission:
    verb: str
    group: str
    resource: str  # with its subresource: "pods/log"
    purpose: str
    granted_by: str
    name: str = ""  # one object of the resource ("": any)

    def describe(self) -> str:
        named = f" {self.name}" if self.name else ""
        return f"{self.verb} {self.resource}{named}" + (f" ({self.group})" if self.group else "")


def lease_permissions() -> list[Permission]:
    purpose = "to swap datasets, writer leases and pointers on a store without conditional writes"
    return [Permission(verb, "coordination.k8s.io", "leases", purpose, ADMIN_SET) for verb in
            ("get", "create", "update", "delete")]  # fmt: skip


def step_lease_permissions() -> list[Permission]:
    """What the launching step does with its own Lease (components/train/step_lease.py), whatever the store."""
    purpose = "to hold the lease that stops the training job when this step ends"
    return [Permission(verb, "coordination.k8s.io", "leases", purpose, ADMIN_SET) for verb in
            ("get", "create", "update", "delete")]  # fmt: skip


def worker_permissions(lease: str, job: str) -> list[Permission]:
    """What a training worker does on its own (components/train/step_lease.py): read the step's Lease, and delete
    its own job (group/version/plural/name) when that Lease lapses."""
    group, _version, plural, name = job.split("/")
    granted = "manifests/rbac.yaml's binding of cifar10-pipeline-workers, which the profile owner applies"
    return [
        Permission("get", "coordination.k8s.io", "leases", "to watch the step that launched this job", granted, lease),
        Permission("delete", group, plural, "to stop this job when the step that launched it is gone", granted, name),
    ]


def job_permissions(kind: str) -> list[Permission]:
    """What launching, following and removing a training job of `kind` (trainjob or tfjob) takes."""
    group, resource = JOB_RESOURCES[kind]
    purpose = f"to launch and follow the training as a {kind}"
    permissions = [Permission(verb, group, resource, purpose, JOB_ROLES) for verb in
                   ("create", "get", "list", "watch", "delete")]  # fmt: skip
    permissions += [
        Permission(verb, "", resource, purpose, JOB_ROLES)
        for verb, resource in (("get", "pods"), ("list", "pods"), ("get", "pods/log"), ("list", "events"))
    ]
    return permissions


def allowed_in(answer) -> bool:
    """`status.allowed` of the API's SelfSubjectAccessReview as it was sent (the raw answer: the client's model would
    take the string "false" for true), which must be a JSON boolean; NotTheApiError for anything else."""
    import json

    try:
        document = json.loads(answer.data)  # reader: the API's JSON answer, checked here
    except (ValueError, AttributeError, TypeError):
        document = None
    status = document.get("status") if isinstance(document, dict) else None
    allowed = status.get("allowed") if isinstance(status, dict) else None
    if (
        not isinstance(document, dict)
        or document.get("kind") != "SelfSubjectAccessReview"
        or not isinstance(allowed, bool)
    ):
        raise NotTheApiError(
            "the Kubernetes API's answer to an access review is not a SelfSubjectAccessReview whose status.allowed is "
            "true or false (an HTML page: a proxy's login, or an address that is not the API server's?); check "
            "KUBERNETES_SERVICE_HOST and what stands in front of the API server"
        )
    return allowed


REQUEST_SECONDS = 30


def missing(api_client, namespace: str, permissions: list[Permission], call) -> list[Permission]:
    """The permissions the API server says this service account lacks in `namespace`: each asked through `call`, the
    coordination layer's one mapping of the API's answers (components/common/coordination.py `call`, handed in: that
    module imports this one)."""
    from kubernetes import client

    authorization = client.AuthorizationV1Api(api_client)
    lacking = []
    for permission in permissions:
        resource, _, subresource = permission.resource.partition("/")
        attributes = {"namespace": namespace, "verb": permission.verb, "group": permission.group,
                      "resource": resource}  # fmt: skip
        if subresource:
            attributes["subresource"] = subresource
        if permission.name:
            attributes["name"] = permission.name
        body = {"apiVersion": "authorization.k8s.io/v1", "kind": "SelfSubjectAccessReview",
                "spec": {"resourceAttributes": attributes}}  # fmt: skip
        review = call(
            "ask",
            lambda body=body: authorization.create_self_subject_access_review(
                body, _request_timeout=REQUEST_SECONDS, _preload_content=False
            ),
            namespace,
            thing=f"whether it may {permission.describe()} (an access review)",
            forbidden=REVIEW_FORBIDDEN,
            check=allowed_in,
        )
        if not allowed_in(review):
            lacking.append(permission)
    return lacking


def refusal(account: str, namespace: str, lacking: list[Permission]) -> str:
    """One line: what is missing, what for, which manifest grants it and who applies it."""
    first = lacking[0]
    same = [permission.describe() for permission in lacking if permission.granted_by == first.granted_by]
    return (
        f"the service account {account} may not {', '.join(same)} in namespace {namespace}, which this run needs "
        f"{first.purpose}: granted by {first.granted_by} (docs/cluster.md, 'Who applies what')"
    )


def check(api_client, namespace: str, account: str, permissions: list[Permission], call) -> None:
    """AccessError naming what is missing, before anything else happens; said in one line when all is held. `call`:
    components/common/coordination.py's."""
    lacking = missing(api_client, namespace, permissions, call)
    if lacking:
        raise AccessError(refusal(account, namespace, lacking))
    if permissions:
        held = sorted({f"{permission.resource}" for permission in permissions})
        logger.info("access: %s may use %s in namespace %s, as this run needs", account, ", ".join(held), namespace)
