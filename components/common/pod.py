"""What a process learns of the Kubernetes pod it runs in (nothing, outside one): one reading for every stage."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

SERVICE_ACCOUNT_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")


def namespace_of_this_pod(path: Path = SERVICE_ACCOUNT_NAMESPACE) -> str | None:
    """The namespace this pod runs in (a KFP profile's namespace in multi-user Kubeflow): its service account's
    namespace file, else $POD_NAMESPACE (the downward API's usual name), else None (not in a pod)."""
    with contextlib.suppress(OSError, UnicodeDecodeError):
        namespace = path.read_text(encoding="utf-8").strip()  # reader: the kubelet's one-line namespace file
        if namespace:
            return namespace
    return os.environ.get("POD_NAMESPACE") or None


HOST_NAME_LIMIT = 63  # the kubelet cuts a pod's host name to this many characters; a pod's name may have 253


def name_of_this_pod(environment: dict[str, str] | None = None) -> tuple[str | None, str]:
    """(this pod's name, where it was read), as KFP's own launcher finds it: $KFP_POD_NAME (KFP's backend puts the
    downward API's metadata.name there on every step's container: backend/src/v2/compiler/argocompiler/common.go,
    2.3.0 to 2.17.0), else $POD_NAME (the downward API's usual name), else $HOSTNAME, which the kubelet cuts to 63
    characters while Argo names pods of up to 253 (kubeflow/pipelines #13124). (None, ...) outside a pod."""
    environment = os.environ if environment is None else environment
    for variable in ("KFP_POD_NAME", "POD_NAME"):
        if environment.get(variable):
            return environment[variable], variable
    name = environment.get("HOSTNAME") or None
    if name and len(name) >= HOST_NAME_LIMIT:
        return name, f"HOSTNAME (cut to {HOST_NAME_LIMIT} characters by the kubelet if the pod's name is longer)"
    return name, "HOSTNAME"


def in_kubernetes_pod() -> bool:
    """Whether this process runs in a Kubernetes pod (every pod gets the API server's address)."""
    return bool(os.environ.get("KUBERNETES_SERVICE_HOST"))
