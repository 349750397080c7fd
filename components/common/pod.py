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


def in_kubernetes_pod() -> bool:
    """Whether this process runs in a Kubernetes pod (every pod gets the API server's address)."""
    return bool(os.environ.get("KUBERNETES_SERVICE_HOST"))
