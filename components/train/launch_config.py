"""Configuration of launching training as a Kubernetes job (a Kubeflow Trainer v2 TrainJob or a training-operator
TFJob): where the job runs, what its pods get, and how long it may take. Training itself is `TrainConfig`; this is
only what the launching step needs, so it never reaches the workers."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from components.common.config import check_fields

GPU_RESOURCE = "nvidia.com/gpu"
DEFAULT_RUNTIME = "cifar10-pipeline-tensorflow"  # manifests/admin/trainer/trainjob-runtime.yaml
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


DNS_1123_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
# An image reference as the kubelet parses it (github.com/distribution/reference): [host[:port]/]path[:tag][@digest].
_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_HOST = r"(?:[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?(?:\.[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?)*|\[[0-9a-fA-F:]+\])"
IMAGE_REFERENCE = re.compile(
    rf"^(?:{_HOST}(?::[0-9]+)?/)?{_COMPONENT}(?:/{_COMPONENT})*(?::[A-Za-z0-9_][A-Za-z0-9_.-]{{0,127}})?"
    r"(?:@[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9a-fA-F]{32,})?$"
)


def _check(value: str, field_name: str, pattern: re.Pattern, longest: int, what: str) -> str:
    """`value` if it matches `pattern` and has at most `longest` characters; else one line saying `what` it must be."""
    if not pattern.fullmatch(value) or len(value) > longest:
        raise ValueError(f"{field_name}: {value[:120]!r} is not {what}")
    return value


def check_namespace(name: str, field_name: str) -> str:
    """A namespace name: a DNS-1123 label (no dots, at most 63 characters), as the API server requires."""
    return _check(name, field_name, DNS_1123_LABEL, 63, "a namespace name (at most 63 lowercase letters, digits and "
                  "'-', starting and ending with a letter or digit; no dots)")  # fmt: skip


def check_label_value(value: str, field_name: str) -> str:
    """A label value (the job carries it as one): at most 63 characters, alphanumerics, '-', '_' and '.' inside."""
    return _check(value, field_name, LABEL_VALUE, 63, "a Kubernetes label value (at most 63 characters: letters, "
                  "digits, '-', '_' and '.', starting and ending with a letter or digit)")  # fmt: skip


def check_image_reference(reference: str, field_name: str) -> str:
    """An image reference the kubelet can parse (a lowercase repository, an optional tag and digest; the name before
    the tag at most 255 characters)."""
    without_digest = reference.split("@", 1)[0]
    last = without_digest.rsplit("/", 1)[-1]
    tag = last.partition(":")[2]
    longest = 255 + (len(reference) - len(without_digest)) + (len(tag) + 1 if tag else 0)
    return _check(reference, field_name, IMAGE_REFERENCE, longest, "an image reference the kubelet can pull "
                  "([registry[:port]/]repository[:tag][@sha256:digest], the repository in lowercase)")  # fmt: skip


def check_object_name(name: str, field_name: str) -> str:
    """A Kubernetes object name (secret, service account, runtime, namespace): a DNS-1123 subdomain."""
    return _check(name, field_name, DNS_1123_SUBDOMAIN, 253, "a Kubernetes name (lowercase letters, digits, '-' and "
                  "'.', starting and ending with a letter or digit)")  # fmt: skip


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
    step_lease_seconds: float = field(
        default=90.0,
        metadata={
            "range": "[5, 86400]",
            "help": "the job deletes itself when the step that launched it has not renewed its lease for this long "
            "(the run was cancelled or the step's pod ended; docs/cluster.md)",
        },
    )
    start_timeout_seconds: float = field(
        default=300.0,
        metadata={
            "range": "(0, inf)",
            "help": "the step fails when a worker cannot pull its image or create its container, or the controller "
            "warns and makes no pods, for this long (an invalid image name fails at once)",
        },
    )
    unschedulable_timeout_seconds: float = field(
        default=1800.0,
        metadata={"range": "(0, inf)", "help": "the step fails when a worker pod stays unschedulable this long"},
    )
    runtime: str = field(
        default=DEFAULT_RUNTIME,
        metadata={"help": "TrainJob: the ClusterTrainingRuntime the admin installed (manifests/admin/trainer/)"},
    )

    def __post_init__(self) -> None:
        check_fields(self)
        for name in ("worker_cpu", "worker_memory"):
            if not QUANTITY.match(getattr(self, name)):
                raise ValueError(f"{name}: {getattr(self, name)!r} is not a Kubernetes quantity (e.g. 4, 500m, 16Gi)")
        for name in ("service_account", "object_store_secret", "runtime", "queue_name"):
            if getattr(self, name) is not None:
                check_object_name(getattr(self, name), name)
        if self.job_namespace is not None:
            check_namespace(self.job_namespace, "job_namespace")
        if self.queue_name is not None:
            check_label_value(self.queue_name, "queue_name")  # the job carries it as kueue.x-k8s.io/queue-name
        if self.worker_image is not None:
            check_image_reference(self.worker_image, "worker_image")
        for secret in self.image_pull_secrets:
            check_object_name(secret, "image_pull_secrets")
        if self.job_name is not None:
            check_dns_1035_label(self.job_name, "job_name", reserve=JOB_NAME_RESERVE)


# The longest suffix either operator appends to a job's name for its pods' host names: TFJob `-worker-<i>`,
# TrainJob (JobSet) `-node-0-<i>`, with up to 4 digits of worker index.
JOB_NAME_RESERVE = len("-worker-") + 4
