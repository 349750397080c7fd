"""Configuration of launching training as a Kubernetes job (a Kubeflow Trainer v2 TrainJob or a training-operator
TFJob): where the job runs, what its pods get, and how long it may take. Training itself is `TrainConfig`; this is
only what the launching step needs, so it never reaches the workers."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from components.common.config import check_fields

GPU_RESOURCE = "nvidia.com/gpu"
DEFAULT_RUNTIME = "cifar10-pipeline-tensorflow"  # manifests/admin/trainjob-runtime.yaml
# Kubernetes quantities (resource.Quantity's syntax): 4, 500m, 1.5, 16Gi, 1e3.
QUANTITY = re.compile(r"^[+]?(\d+(\.\d*)?|\.\d+)([eE][-+]?\d+|[KMGTPE]i|[numkMGTPE])?$")
DNS_1123_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")


def check_dns_1035_label(name: str, field_name: str, reserve: int = 0) -> str:
    """A Kubernetes DNS-1035 label (what the TFJob webhook and the TrainJob CRD require of a job's name): lowercase
    letters, digits and '-', starting with a letter, ending with a letter or digit, at most 63 characters less
    `reserve` (the operators append `-worker-<i>` or `-node-0-<i>` to name pods and hosts)."""
    limit = 63 - reserve
    if not re.fullmatch(r"[a-z]([-a-z0-9]*[a-z0-9])?", name) or len(name) > limit:
        raise ValueError(
            f"{field_name}: {name!r} is not a DNS-1035 label of at most {limit} characters (lowercase letters, "
            "digits and '-', starting with a letter, ending with a letter or digit)"
        )
    return name


def check_object_name(name: str, field_name: str) -> str:
    """A Kubernetes object name (secret, service account, runtime, namespace): a DNS-1123 subdomain."""
    if not DNS_1123_SUBDOMAIN.fullmatch(name) or len(name) > 253:
        raise ValueError(
            f"{field_name}: {name!r} is not a Kubernetes name (lowercase letters, digits, '-' and '.', starting and "
            "ending with a letter or digit)"
        )
    return name


@dataclass(frozen=True)
class LaunchConfig:
    job_namespace: str | None = field(
        default=None, metadata={"help": "namespace of the job (default: this pod's own, e.g. the KFP profile's)"}
    )
    job_name: str | None = field(
        default=None, metadata={"help": "the job's name, a DNS-1035 label (default: unique per run)"}
    )
    worker_image: str | None = field(
        default=None, metadata={"help": "the workers' image (default: the train image of this release)"}
    )
    gpus_per_worker: int = field(
        default=0, metadata={"range": "[0, 64]", "help": "GPUs of each worker pod (nvidia.com/gpu)"}
    )
    worker_cpu: str = field(default="4", metadata={"help": "CPU request of each worker pod (a Kubernetes quantity)"})
    worker_memory: str = field(
        default="16Gi", metadata={"help": "memory request and limit of each worker pod (a Kubernetes quantity)"}
    )
    service_account: str = field(default="cifar10-pipeline", metadata={"help": "service account of the workers"})
    object_store_secret: str | None = field(
        default="mlpipeline-minio-artifact",
        metadata={
            "help": "the secret whose accesskey/secretkey become the workers' AWS_ACCESS_KEY_ID and "
            "AWS_SECRET_ACCESS_KEY (optional; the default is KFP's own object-store secret)"
        },
    )
    image_pull_secrets: tuple[str, ...] = field(
        default=(), metadata={"help": "secrets for pulling the workers' image from a private registry"}
    )
    queue_name: str | None = field(
        default=None, metadata={"help": "Kueue: the LocalQueue the job is submitted to (kueue.x-k8s.io/queue-name)"}
    )
    termination_grace_seconds: int = field(
        default=300,
        metadata={
            "range": "[0, 86400]",
            "help": "how long a worker has after SIGTERM to save and push a checkpoint before it is killed",
        },
    )
    job_timeout_seconds: float = field(
        default=7 * 24 * 3600.0,
        metadata={"range": "(0, inf)", "help": "the job is deleted and the step fails after this long"},
    )
    runtime: str = field(
        default=DEFAULT_RUNTIME,
        metadata={"help": "TrainJob: the ClusterTrainingRuntime the admin installed (manifests/admin/)"},
    )

    def __post_init__(self) -> None:
        check_fields(self)
        for name in ("worker_cpu", "worker_memory"):
            if not QUANTITY.match(getattr(self, name)):
                raise ValueError(f"{name}: {getattr(self, name)!r} is not a Kubernetes quantity (e.g. 4, 500m, 16Gi)")
        for name in ("job_namespace", "service_account", "object_store_secret", "runtime", "queue_name"):
            if getattr(self, name) is not None:
                check_object_name(getattr(self, name), name)
        for secret in self.image_pull_secrets:
            check_object_name(secret, "image_pull_secrets")
        if self.job_name is not None:
            check_dns_1035_label(self.job_name, "job_name", reserve=JOB_NAME_RESERVE)


# The longest suffix either operator appends to a job's name for its pods' host names: TFJob `-worker-<i>`,
# TrainJob (JobSet) `-node-0-<i>`, with up to 4 digits of worker index.
JOB_NAME_RESERVE = len("-worker-") + 4
