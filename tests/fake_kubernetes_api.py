"""A strict stand-in for the Kubernetes API server of a Kubeflow cluster, on 127.0.0.1, for the real `kubernetes`
client. No API server can run here, so this one checks what it receives the way the real parts would, and plays
the clusters users run:

- `release="1.10"`: training-operator v1.9 serves TFJobs (kubeflow.org/v1); `release="1.11"` (and 26.03): Kubeflow
  Trainer v2.1 serves TrainJobs, TrainingRuntimes, ClusterTrainingRuntimes (trainer.kubeflow.org/v1alpha1) and JobSet
  v0.10 its JobSets, and there is no TFJob; `release="trainer-2.2"` and `"trainer-2.3"`: Trainer v2.2.1 (JobSet
  v0.11) and v2.3.0 (JobSet v0.12), as an admin installs them; `release="none"`: neither. The API's discovery says
  what is served, and a request for anything else is the real server's 404.
- Every body against the vendored CRD's openAPIV3Schema (tests/vendor/), closed: an unknown field is refused (the real
  server would drop it silently, which hides a misspelled setting); the CRDs' CEL rules; the admission webhooks (the
  TFJob webhook's rules; Trainer's TrainJob, runtime and JobSet-plugin validation: the runtime must exist, patches
  may only name its jobs and containers and set no env for `node`, the manager is a domain-prefixed path).
- Every request is authorized as RBAC would for the caller (tests/fake_rbac.py): the release's own Kubeflow roles, the
  profile controller's bindings (the owner to kubeflow-admin, `default-editor` to kubeflow-edit), and what the
  cluster admin and then the profile owner applied of the project's manifests, each refused as the API server
  refuses a grant of more than its creator holds (`installed=False`: nothing applied). Anything else gets the real
  API's 403, worded as it words it. `SelfSubjectAccessReview`s are answered from the same rules.
- `release`: also "1.9" (TFJob, as 1.10) and "26.03" (as 1.11), each with its own roles.

The world the launcher sees comes from a scripted `timeline` (each GET of the job advances one tick: its conditions,
worker 0's phase and restarts, or an HTTP error to answer instead) or, with `timeline=None`, from a test playing the
operator: `on_create` is called with each new job, and the test adds pods (`add_pod`, with their logs) and sets the
job's conditions (`set_conditions`). `trainjob_pods` and `job_failure`/`jobset_action` play the Trainer controller,
PlainML and JobSet as the vendored sources do: each pod's env, host name and subdomain, and what the runtime's
failure policies do with the workers' exit codes.

Logs are served with RFC 3339 timestamps, in small chunks that cut lines anywhere, and a followed stream stays open
while its container runs, as `kubectl logs -f` does; a Pending pod's log is a 400.
"""

from __future__ import annotations

import copy
import datetime
import functools
import http.server
import json
import re
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlparse

import jsonschema
import yaml

from tests.fake_coordination_api import LeaseStore
from tests.fake_coordination_api import Refused as LeaseRefused
from tests.fake_rbac import ADMIN, EDITOR, NAMESPACE, OWNER, WORKERS, Forbidden, Rbac, forbidden  # noqa: F401

VENDOR = Path(__file__).parent / "vendor"
REPOSITORY = Path(__file__).resolve().parents[1]


def _service_account_token(user: str) -> str:
    """A token shaped as the kubelet's (a JWT whose subject is the service account; the stand-in signs nothing)."""
    import base64

    payload = base64.urlsafe_b64encode(json.dumps({"sub": user}).encode()).decode().rstrip("=")
    return f"eyJhbGciOiJSUzI1NiJ9.{payload}.stand-in"


EDITOR_POD_TOKEN = _service_account_token(EDITOR)  # a step's pod: the profile's default-editor
TOKENS = {"editor-token": EDITOR, "admin-token": ADMIN, "worker-token": WORKERS, "owner-token": OWNER,
          EDITOR_POD_TOKEN: EDITOR}  # fmt: skip
RESTART_POLICIES = {"Always", "OnFailure", "Never", "ExitCode"}  # training-operator pkg/apis/kubeflow.org/v1
TFJOB_MANAGERS = {"kubeflow.org/training-operator", "kueue.x-k8s.io/multikueue"}  # pkg/common/util/webhooks.go
DNS_1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
DNS_1123_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
HTTP_PATH = re.compile(r"^[A-Za-z0-9/\-._~%!$&'()*+,;=:]+$")  # k8s.io/apimachinery validation: httpPathFmt


@dataclass(frozen=True)
class Resource:
    group: str
    version: str
    kind: str
    plural: str
    namespaced: bool
    crd: str  # the vendored CRD file


TRAINER_VERSIONS = {  # release -> (Kubeflow Trainer, the JobSet it bundles)
    "1.11": ("v2.1.0", "v0.10.1"),  # Kubeflow 1.11.0 and 26.03 install Trainer v2.1.0 by default
    "26.03": ("v2.1.0", "v0.10.1"),
    "trainer-2.2": ("v2.2.1", "v0.11.1"),  # the Trainer release before: runtimePatches, but no grace period in them
    "trainer-2.3": ("v2.3.0", "v0.12.0"),  # the current Trainer, installed by the admin (standalone KFP 2.17...)
}


def release_resources(release: str) -> dict[str, Resource]:
    """What a cluster of `release` serves, each with the CRD of the version it runs."""
    if release in ("1.9", "1.10"):
        return {"tfjobs": Resource("kubeflow.org", "v1", "TFJob", "tfjobs", True, "kubeflow.org_tfjobs-v1.9.0.yaml")}
    if release == "none":
        return {}
    trainer, jobset = TRAINER_VERSIONS[release]
    runtimes = f"trainer.kubeflow.org_clustertrainingruntimes-{trainer}.yaml"  # trainingruntimes: the same schema
    return {
        "trainjobs": Resource(
            "trainer.kubeflow.org",
            "v1alpha1",
            "TrainJob",
            "trainjobs",
            True,
            f"trainer.kubeflow.org_trainjobs-{trainer}.yaml",
        ),
        "clustertrainingruntimes": Resource(
            "trainer.kubeflow.org", "v1alpha1", "ClusterTrainingRuntime", "clustertrainingruntimes", False, runtimes
        ),
        "trainingruntimes": Resource(
            "trainer.kubeflow.org", "v1alpha1", "TrainingRuntime", "trainingruntimes", True, runtimes
        ),
        "jobsets": Resource(
            "jobset.x-k8s.io", "v1alpha2", "JobSet", "jobsets", True, f"jobset.x-k8s.io_jobsets-{jobset}.yaml"
        ),
    }


class Refused(Exception):  # noqa: N818 (an HTTP answer, not a bug)
    def __init__(self, status: int, reason: str, message: str, details: dict | None = None):
        super().__init__(message)
        self.status, self.reason, self.details = status, reason, details


# -- schemas and CEL rules -------------------------------------------------------------------------------------


def closed(schema: Any) -> Any:
    """The schema with `additionalProperties: false` wherever properties are listed and nothing else is allowed."""
    if isinstance(schema, dict):
        result = {key: closed(value) for key, value in schema.items()}
        if (
            "properties" in result
            and "additionalProperties" not in result
            and not result.get("x-kubernetes-preserve-unknown-fields")
        ):
            result["additionalProperties"] = False
        return result
    if isinstance(schema, list):
        return [closed(item) for item in schema]
    return schema


@functools.cache
def crd_schema(crd_file: str) -> dict:
    crd = yaml.load((VENDOR / crd_file).read_text(), Loader=yaml.CSafeLoader)
    (version,) = [v for v in crd["spec"]["versions"] if v.get("served", True) and v.get("storage", True)]
    return version["schema"]["openAPIV3Schema"]


@functools.cache
def validator(crd_file: str) -> jsonschema.Draft7Validator:
    return jsonschema.Draft7Validator(closed(crd_schema(crd_file)))


def unknown_fields(schema: dict, value: Any, path: str = "") -> list[str]:
    """The fields of `value` its schema does not declare (what the API server prunes, or refuses when strict)."""
    found = []
    if isinstance(value, dict) and "properties" in schema and not schema.get("x-kubernetes-preserve-unknown-fields"):
        for key, child in value.items():
            where = f"{path}.{key}" if path else key
            if key not in schema["properties"]:
                if not isinstance(schema.get("additionalProperties"), dict):
                    found.append(where)
                    continue
                found += unknown_fields(schema["additionalProperties"], child, where)
            else:
                found += unknown_fields(schema["properties"][key], child, where)
    elif isinstance(value, dict) and isinstance(schema.get("additionalProperties"), dict):
        for key, child in value.items():
            found += unknown_fields(schema["additionalProperties"], child, f"{path}.{key}" if path else key)
    elif isinstance(value, list) and isinstance(schema.get("items"), dict):
        for index, item in enumerate(value):
            found += unknown_fields(schema["items"], item, f"{path}[{index}]")
    return found


def pruned(value: Any, unknown: list[str]) -> Any:
    """`value` without the fields at the `unknown` paths (dotted, with [i] for list items)."""
    value = copy.deepcopy(value)
    for path in unknown:
        parts = re.findall(r"[^.\[\]]+|\[\d+\]", path)
        node = value
        for part in parts[:-1]:
            node = node[int(part[1:-1])] if part.startswith("[") else node[part]
        node.pop(parts[-1], None)
    return value


def _no_in_order_with_depends_on(spec: dict) -> bool:
    in_order = (spec.get("startupPolicy") or {}).get("startupPolicyOrder") == "InOrder"
    return not (in_order and any("dependsOn" in job for job in spec.get("replicatedJobs", [])))


# The CEL rules of the vendored CRDs, each as what it checks on create ("self == oldSelf" holds on create). A rule
# not in this table makes the stand-in fail loudly, so a newer CRD cannot be half-checked.
CEL_RULES = {
    "self.metadata.name.matches('^[a-z]([-a-z0-9]*[a-z0-9])?$')": lambda o: bool(
        DNS_1035.match(o.get("metadata", {}).get("name", ""))
    ),
    "size(self.metadata.name) <= 63": lambda o: len(o.get("metadata", {}).get("name", "")) <= 63,
    "self == oldSelf": lambda _o: True,
    "self == '' || self.matches('^[A-Za-z][A-Za-z0-9+.-]*://.+$')": lambda o: (
        o == "" or bool(re.match(r"^[A-Za-z][A-Za-z0-9+.-]*://.+$", o))
    ),
    "self in ['trainer.kubeflow.org/trainjob-controller', 'kueue.x-k8s.io/multikueue']": lambda o: (
        o in ("trainer.kubeflow.org/trainjob-controller", "kueue.x-k8s.io/multikueue")
    ),
    "has(self.lastUpdatedTime)": lambda o: "lastUpdatedTime" in o,
    "[has(self.torch), has(self.mpi), has(self.jax), has(self.xgboost),has(self.flux)].filter(x, x).size() <= 1": (
        lambda o: sum(key in o for key in ("torch", "mpi", "jax", "xgboost", "flux")) <= 1
    ),
    "self >= 1": lambda o: o >= 1,
    # Trainer v2.1.0's runtime CRD:
    "self > 0 || self in ['auto', 'cpu', 'gpu']": lambda o: (
        o in ("auto", "cpu", "gpu") or (isinstance(o, int) and o > 0)
    ),
    "!(has(self.torch) && has(self.mpi))": lambda o: not ("torch" in o and "mpi" in o),
    "!(has(self.numNodes) && (has(self.torch) && has(self.torch.elasticPolicy)))": lambda o: (
        not ("numNodes" in o and "elasticPolicy" in (o.get("torch") or {}))
    ),
    "!self.exists(c, c == 'node')": lambda o: "node" not in o,
    "!(has(self.startupPolicy) && self.startupPolicy.startupPolicyOrder == 'InOrder' && "
    "self.replicatedJobs.exists(x, has(x.dependsOn)))": _no_in_order_with_depends_on,
    "self.templates.all(t, !has(t.metadata.namespace) || size(t.metadata.namespace) == 0)": lambda o: all(
        not (t.get("metadata") or {}).get("namespace") for t in o.get("templates", [])
    ),
}


def cel_problems(schema: dict, value: Any, path: str = "") -> list[str]:
    """Evaluate every x-kubernetes-validations rule of `schema` on `value`, where `value` has that field."""
    problems = []
    for rule in schema.get("x-kubernetes-validations") or []:
        check = CEL_RULES.get(rule["rule"])
        if check is None:
            raise AssertionError(f"the stand-in does not know the CEL rule {rule['rule']!r} at {path or '.'}")
        if not check(value):
            problems.append(f"{path or '<root>'}: Invalid value: {rule.get('message') or rule['rule']}")
    if isinstance(value, dict):
        for key, child in (schema.get("properties") or {}).items():
            if key in value:
                problems += cel_problems(child, value[key], f"{path}.{key}" if path else key)
    if isinstance(value, list) and isinstance(schema.get("items"), dict):
        for index, item in enumerate(value):
            problems += cel_problems(schema["items"], item, f"{path}[{index}]")
    return problems


def schema_problems(resource: Resource, body: dict, closed_schema: bool = False) -> list[str]:
    """What the API server's validation refuses (types, enums, patterns, required fields, CEL rules); unknown fields
    are the field validation's business (see `create`) unless `closed_schema`."""
    check = validator(resource.crd) if closed_schema else open_validator(resource.crd)
    errors = sorted(check.iter_errors(body), key=lambda error: list(error.absolute_path))
    problems = [f"{'.'.join(map(str, error.absolute_path))}: {error.message}" for error in errors]
    return problems + cel_problems(crd_schema(resource.crd), body)


@functools.cache
def open_validator(crd_file: str) -> jsonschema.Draft7Validator:
    return jsonschema.Draft7Validator(crd_schema(crd_file))


# -- admission webhooks ----------------------------------------------------------------------------------------


def webhook_problems(job: dict) -> list[str]:
    """training-operator v1.9's validateTFJob, and the controller's restart policies."""
    problems = []
    name = job.get("metadata", {}).get("name", "")
    if not DNS_1035.match(name) or len(name) > 63:
        problems.append(f"metadata.name: Invalid value: {name!r}: should match: a DNS-1035 label")
    specs = job.get("spec", {}).get("tfReplicaSpecs")
    if specs is None:
        problems.append("spec.tfReplicaSpecs: Required value: must be required")
        specs = {}
    masters = 0
    for replica_type, replica in specs.items():
        containers = ((replica or {}).get("template", {}).get("spec", {}) or {}).get("containers") or []
        path = f"spec.tfReplicaSpecs[{replica_type}].template.spec.containers"
        if not containers:
            problems.append(f"{path}: Required value: must be specified")
        masters += replica_type in ("Chief", "Master")
        for index, container in enumerate(containers):
            if not container.get("image"):
                problems.append(f"{path}[{index}].image: Required value: must be required")
        if not any(container.get("name") == "tensorflow" for container in containers):
            problems.append(f"{path}: Required value: must have at least one container with name tensorflow")
        policy = (replica or {}).get("restartPolicy")
        if policy is not None and policy not in RESTART_POLICIES:
            problems.append(f"spec.tfReplicaSpecs[{replica_type}].restartPolicy: Unsupported value: {policy!r}")
    if masters > 1:
        problems.append("spec.tfReplicaSpecs: Forbidden: must not have more than 1 Chief or Master role")
    manager = job.get("spec", {}).get("runPolicy", {}).get("managedBy")
    if manager is not None and manager not in TFJOB_MANAGERS:
        problems.append(f"spec.runPolicy.managedBy: Unsupported value: {manager!r}")
    return problems


def runtime_webhook_problems(runtime: dict) -> list[str]:
    """Trainer v2.3.0 validateReplicatedJobs (pkg/webhooks/trainingruntime_webhook.go)."""
    expected = {
        "trainer": "node",
        "model-initializer": "model-initializer",
        "dataset-initializer": "dataset-initializer",
    }
    problems = []
    for index, job in enumerate(runtime.get("spec", {}).get("template", {}).get("spec", {}).get("replicatedJobs", [])):
        ancestor = ((job.get("template") or {}).get("metadata") or {}).get("labels", {}).get(ANCESTOR_LABEL)
        if ancestor not in expected:
            continue
        path = f"spec.template.spec.replicatedJobs[{index}]"
        if job.get("replicas", 1) != 1:
            problems.append(f"{path}.replicas: Invalid value: {job.get('replicas')}: always must be 1")
        containers = job["template"]["spec"]["template"]["spec"].get("containers", [])
        if not any(container.get("name") == expected[ancestor] for container in containers):
            problems.append(
                f"{path}.template.spec.template.spec.containers: must contain the required container for the "
                f"ancestor: {ancestor}"
            )
    return problems


def _dns_1123_subdomain(name: str) -> bool:
    return bool(DNS_1123_SUBDOMAIN.match(name)) and len(name) <= 253


def trainjob_webhook_problems(job: dict, runtime: dict | None, runtime_name: str) -> list[str]:
    """Trainer v2.3.0's TrainJob validation: the runtime exists (ClusterTrainingRuntime.ValidateObjects) and the
    JobSet plugin's checks of runtime patches (pkg/runtime/framework/plugins/jobset/jobset.go Validate)."""
    if runtime is None:
        return [
            f'spec.runtimeRef: Invalid value: clustertrainingruntimes.trainer.kubeflow.org "{runtime_name}" not '
            "found: specified clusterTrainingRuntime must be created before the TrainJob is created"
        ]
    problems = []
    containers_of = {
        replicated["name"]: {
            container["name"]
            for key in ("containers", "initContainers")
            for container in replicated["template"]["spec"]["template"]["spec"].get(key, [])
        }
        for replicated in runtime["spec"]["template"]["spec"].get("replicatedJobs", [])
    }
    for override in job.get("spec", {}).get("podTemplateOverrides", []):  # Trainer v2.1
        pod = override.get("spec") or {}
        for target in override.get("targetJobs", []):
            known = containers_of.get(target["name"])
            if known is None:
                problems.append(
                    "spec.podTemplateOverrides: must not have targetJob that doesn't exist in the runtime job template"
                )
                continue
            for container in pod.get("containers", []) + pod.get("initContainers", []):
                if container["name"] not in known:
                    problems.append(f"spec.podTemplateOverrides: must not have container that doesn't exist in the "
                                    f"runtime job {target['name']}")  # fmt: skip
                elif container.get("env") and container["name"] in ("node", "dataset-initializer", "model-initializer"):
                    problems.append("spec.podTemplateOverrides: must not have envs for the dataset-initializer, "
                                    "model-initializer, node containers")  # fmt: skip
    for patch in job.get("spec", {}).get("runtimePatches", []):  # Trainer v2.2 and later
        manager = patch.get("manager", "")
        host, _, path = manager.partition("/")
        if not host or not path or not _dns_1123_subdomain(host) or not HTTP_PATH.match(path):
            problems.append(f'spec.runtimePatches.manager: Invalid value: "{manager}": must be a domain-prefixed path')
        replicated_jobs = (((patch.get("trainingRuntimeSpec") or {}).get("template") or {}).get("spec") or {}).get(
            "replicatedJobs", []
        )
        for replicated in replicated_jobs:
            known = containers_of.get(replicated["name"])
            if known is None:
                problems.append(
                    "spec.runtimePatches: must not have replicated job that doesn't exist in the runtime job template"
                )
                continue
            pod = (((replicated.get("template") or {}).get("spec") or {}).get("template") or {}).get("spec") or {}
            for container in pod.get("containers", []) + pod.get("initContainers", []):
                if container["name"] not in known:
                    problems.append(
                        f"spec.runtimePatches: must not have container that doesn't exist in the runtime job "
                        f"{replicated['name']}"
                    )
                elif container.get("env") and container["name"] in ("node", "dataset-initializer", "model-initializer"):
                    problems.append(
                        "spec.runtimePatches: must not have envs for the dataset-initializer, model-initializer, node "
                        "containers"
                    )
    return problems


# -- the Trainer controller, PlainML and JobSet, as far as pods go ------------------------------------------------

ANCESTOR_LABEL = "trainer.kubeflow.org/trainjob-ancestor-step"


@dataclass(frozen=True)
class PodPlan:
    """One pod of a TrainJob as Trainer v2.3 + JobSet v0.12 + Kubernetes would make it."""

    name: str  # `<job>-node-0-<index>` is the host name; the pod's own name gets a random suffix
    hostname: str
    subdomain: str
    index: int
    labels: dict
    annotations: dict
    container: dict  # the `node` container: image, command, args, env (value or valueFrom), resources, ports
    pod_spec: dict  # the rest of the pod spec (service account, tolerations, pull secrets, grace period...)


def _merge_by_name(base: list, patch: list, merge) -> list:
    merged = [copy.deepcopy(item) for item in base]
    for item in patch:
        found = next((existing for existing in merged if existing.get("name") == item.get("name")), None)
        if found is None:
            merged.append(copy.deepcopy(item))
        else:
            merged[merged.index(found)] = merge(found, item)
    return merged


def strategic_merge(base: Any, patch: Any, key: str = "") -> Any:
    """The strategic merge patch of the JobSet spec fields a runtime patch may set: lists of named things (replicated
    jobs, containers, env, volumes, pull secrets) merge by name; tolerations and other lists are replaced."""
    if isinstance(base, dict) and isinstance(patch, dict):
        merged = copy.deepcopy(base)
        for name, value in patch.items():
            merged[name] = strategic_merge(base.get(name), value, name) if name in base else copy.deepcopy(value)
        return merged
    if isinstance(base, list) and isinstance(patch, list) and key in (
        "replicatedJobs", "containers", "initContainers", "env", "volumes", "imagePullSecrets", "volumeMounts"
    ):  # fmt: skip
        return _merge_by_name(base, patch, lambda old, new: strategic_merge(old, new))
    return copy.deepcopy(patch)


def upsert_env(environment: list[dict], additions: list[dict]) -> list[dict]:
    """apply.UpsertEnvVars: replace a variable of the same name, else append."""
    result = [dict(variable) for variable in environment]
    for addition in additions:
        names = [variable["name"] for variable in result]
        if addition["name"] in names:
            result[names.index(addition["name"])] = dict(addition)
        else:
            result.append(dict(addition))
    return result


def jobset_for(trainjob: dict, runtime: dict) -> dict:
    """The JobSet Trainer v2.3 builds from a TrainJob and its runtime (runtime patches merged, PlainML's node count
    and env, resourcesPerNode merged, the trainer's image, command and args; jobset.go Build, builder.go Trainer)."""
    spec = copy.deepcopy(runtime["spec"]["template"]["spec"])
    for patch in trainjob["spec"].get("runtimePatches", []):
        template_patch = ((patch.get("trainingRuntimeSpec") or {}).get("template") or {}).get("spec")
        if template_patch:
            spec = strategic_merge(spec, template_patch)
    for override in trainjob["spec"].get("podTemplateOverrides", []):  # Trainer v2.1: onto each target's pod template
        targets = {target["name"] for target in override.get("targetJobs", [])}
        for replicated in spec["replicatedJobs"]:
            if replicated["name"] in targets:
                pod_template = replicated["template"]["spec"]["template"]
                patch = {key: override[key] for key in ("metadata", "spec") if key in override}
                replicated["template"]["spec"]["template"] = strategic_merge(pod_template, patch)
    trainer = trainjob["spec"].get("trainer") or {}
    nodes = trainer.get("numNodes", runtime["spec"].get("mlPolicy", {}).get("numNodes", 1))
    for replicated in spec["replicatedJobs"]:
        if (replicated["template"].get("metadata") or {}).get("labels", {}).get(ANCESTOR_LABEL) != "trainer":
            continue
        replicated["replicas"] = 1
        job = replicated["template"]["spec"]
        job["parallelism"] = job["completions"] = nodes
        job.setdefault("completionMode", "Indexed")  # JobSet's default
        for container in job["template"]["spec"]["containers"]:
            if container["name"] != "node":
                continue
            for key in ("image", "command", "args"):
                if key in trainer:
                    container[key] = copy.deepcopy(trainer[key])
            container["env"] = upsert_env(container.get("env", []), trainer.get("env", []))
            resources = container.setdefault("resources", {})
            for kind, values in (trainer.get("resourcesPerNode") or {}).items():
                resources[kind] = {**resources.get(kind, {}), **values}
    name, namespace = trainjob["metadata"]["name"], trainjob["metadata"]["namespace"]
    return {"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet",
            "metadata": {"name": name, "namespace": namespace, "labels": dict(trainjob["metadata"].get("labels", {}))},
            "spec": spec}  # fmt: skip


def job_problems(job: dict, where: str) -> list[str]:
    """Kubernetes' Job validation of what the runtime's failure handling relies on (apis/batch/validation)."""
    problems = []
    pod = job["template"]["spec"]
    policy = job.get("podFailurePolicy")
    if policy is None:
        return problems
    if pod.get("restartPolicy") != "Never":
        problems.append(
            f"{where}.template.spec.restartPolicy: Invalid value: only Never is supported with podFailurePolicy"
        )
    names = {container["name"] for container in pod.get("containers", [])}
    for index, rule in enumerate(policy.get("rules", [])):
        path = f"{where}.podFailurePolicy.rules[{index}]"
        if rule.get("action") not in ("FailJob", "FailIndex", "Ignore", "Count"):
            problems.append(f"{path}.action: Unsupported value: {rule.get('action')!r}")
        if ("onExitCodes" in rule) == ("onPodConditions" in rule):
            problems.append(f"{path}: Invalid value: exactly one of onExitCodes and onPodConditions is required")
        codes = rule.get("onExitCodes")
        if codes:
            values = codes.get("values", [])
            if values != sorted(set(values)) or not 0 < len(values) <= 255:
                problems.append(f"{path}.onExitCodes.values: Invalid value: must be unique, ascending, 1 to 255 values")
            if codes.get("operator") == "In" and 0 in values:
                problems.append(f"{path}.onExitCodes.values: Invalid value: 0: must not be 0 for the In operator")
            if codes.get("operator") not in ("In", "NotIn"):
                problems.append(f"{path}.onExitCodes.operator: Unsupported value: {codes.get('operator')!r}")
            if "containerName" in codes and codes["containerName"] not in names:
                problems.append(f"{path}.onExitCodes.containerName: Invalid value: no container of that name")
    return problems


def trainjob_pods(trainjob: dict, runtime: dict, release: str = "trainer-2.3") -> list[PodPlan]:
    """Each trainer pod of the TrainJob: its host name `<job>-node-0-<i>` under the JobSet's subdomain (jobset.go
    IdentifyPodNetwork), the labels and annotations JobSet and Kubernetes give it, its `node` container. The JobSet
    is checked against the vendored JobSet CRD, and its Jobs against Kubernetes' Job rules, first."""
    jobset = jobset_for(trainjob, runtime)
    problems = schema_problems(release_resources(release)["jobsets"], jobset, closed_schema=True)
    for index, replicated in enumerate(jobset["spec"]["replicatedJobs"]):
        problems += job_problems(replicated["template"]["spec"], f"spec.replicatedJobs[{index}].template.spec")
    if problems:
        raise AssertionError("the JobSet built from the TrainJob and its runtime is invalid: " + "; ".join(problems))
    name = trainjob["metadata"]["name"]
    subdomain = (jobset["spec"].get("network") or {}).get("subdomain") or name
    plans = []
    for replicated in jobset["spec"]["replicatedJobs"]:
        if (replicated["template"].get("metadata") or {}).get("labels", {}).get(ANCESTOR_LABEL) != "trainer":
            continue
        job = replicated["template"]["spec"]
        pod_spec = copy.deepcopy(job["template"]["spec"])
        (container,) = [c for c in pod_spec.pop("containers") if c["name"] == "node"]
        for index in range(job["parallelism"]):
            host = f"{name}-{replicated['name']}-0-{index}"
            labels = {
                **((job["template"].get("metadata") or {}).get("labels") or {}),
                "jobset.sigs.k8s.io/jobset-name": name,
                "jobset.sigs.k8s.io/replicatedjob-name": replicated["name"],
                "jobset.sigs.k8s.io/job-index": "0",
                "batch.kubernetes.io/job-completion-index": str(index),
            }
            annotations = {
                **((job["template"].get("metadata") or {}).get("annotations") or {}),
                "batch.kubernetes.io/job-completion-index": str(index),
            }
            plans.append(PodPlan(host, host, subdomain, index, labels, annotations, copy.deepcopy(container), pod_spec))
    return plans


def resolve_env(plan: PodPlan, namespace: str, secrets: dict) -> dict[str, str]:
    """The container's environment as the kubelet gives it: values, field references, secret keys (a missing
    optional secret leaves the variable out), and Kubernetes' JOB_COMPLETION_INDEX for an Indexed Job's pod."""
    environment = {"JOB_COMPLETION_INDEX": str(plan.index)}
    fields = {"metadata.namespace": namespace, "metadata.name": plan.name}
    fields.update({f"metadata.labels['{key}']": value for key, value in plan.labels.items()})
    fields.update({f"metadata.annotations['{key}']": value for key, value in plan.annotations.items()})
    for variable in plan.container.get("env", []):
        if "value" in variable:
            environment[variable["name"]] = variable["value"]
            continue
        source = variable.get("valueFrom", {})
        if "fieldRef" in source:
            environment[variable["name"]] = fields[source["fieldRef"]["fieldPath"]]
        elif "secretKeyRef" in source:
            reference = source["secretKeyRef"]
            value = secrets.get((namespace, reference["name"]), {}).get(reference["key"])
            if value is None and not reference.get("optional"):
                raise AssertionError(f"secret {reference['name']}/{reference['key']} is missing and not optional")
            if value is not None:
                environment[variable["name"]] = value
    return environment


def job_failure(job_spec: dict, pod_name: str, namespace: str, exit_code: int) -> tuple[str, str]:
    """Why the Job of a pod that exited with `exit_code` fails: its podFailurePolicy's first matching FailJob rule
    (reason PodFailurePolicy, the Job controller's message), else backoffLimit (the runtime's is 0)."""
    for index, rule in enumerate((job_spec.get("podFailurePolicy") or {}).get("rules", [])):
        codes = rule.get("onExitCodes")
        if not codes or exit_code == 0:
            continue
        matched = (exit_code in codes["values"]) == (codes["operator"] == "In")
        if matched and rule["action"] == "FailJob":
            return "PodFailurePolicy", (
                f"Container node for pod {namespace}/{pod_name} failed with exit code {exit_code} matching FailJob "
                f"rule at index {index}"
            )
        if matched:
            raise AssertionError(f"the stand-in does not play the {rule['action']} action")
    return "BackoffLimitExceeded", "Job has reached the specified backoff limit"


def jobset_action(jobset_spec: dict, reason: str, message: str) -> tuple[str, str]:
    """The JobSet failure policy's action for a failed Job (failure_policy.go: the first rule whose reasons and
    message patterns both match, else RestartJobSet) and its rule's name."""
    for rule in (jobset_spec.get("failurePolicy") or {}).get("rules", []):
        reasons = rule.get("onJobFailureReasons") or []
        patterns = rule.get("onJobFailureMessagePatterns") or []
        if (not reasons or reason in reasons) and (not patterns or any(re.search(p, message) for p in patterns)):
            return rule["action"], rule["name"]
    return "RestartJobSet", "default"


# -- the scripted world ------------------------------------------------------------------------------------------


@dataclass
class Tick:
    """The world at one GET of the job."""

    conditions: list[dict] = field(default_factory=list)
    pod: str | None = "Running"  # worker 0's phase, None while it does not exist
    restarts: int = 0  # TFJob: container restarts; TrainJob: JobSet restarts (each makes a new pod)
    error: int | None = None  # answer the job GET with this HTTP status instead
    waiting: tuple[str, str] | None = None  # worker 0's container waits: (reason, message), e.g. ErrImagePull
    unschedulable: str | None = None  # worker 0 cannot be scheduled: the scheduler's message
    events: tuple[tuple[str, str, str], ...] = ()  # (type, reason, message) the controller records on the job


def condition(kind: str, status: str = "True", reason: str = "", message: str = "") -> dict:
    return {"type": kind, "status": status, "reason": reason, "message": message}


RUNNING = [condition("Created"), condition("Running")]
SUCCEEDED = [condition("Created"), condition("Running", "False"), condition("Succeeded", reason="TFJobSucceeded")]
FAILED = [
    condition("Created"),
    condition("Running", "False"),
    condition("Failed", reason="TFJobFailed", message="TFJob has failed because 1 Worker replica(s) failed."),
]
# TrainJob conditions: Trainer copies the JobSet's Completed and Failed conditions as Complete and Failed.
TRAINJOB_RUNNING: list[dict] = []
TRAINJOB_SUSPENDED = [condition("Suspended", reason="Suspended", message="TrainJob is suspended")]
TRAINJOB_COMPLETE = [condition("Complete", reason="AllJobsCompleted", message="jobset completed successfully")]
TRAINJOB_FAILED = [
    condition(
        "Failed",
        reason="FailJobSetFailurePolicyAction",
        message="applying FailJobSet failure policy action (first failed job: cifar10-node-0)",
    )
]


@dataclass
class PodRecord:
    """A pod the test's operator made: its phase, restarts and each container instance's log."""

    namespace: str
    name: str
    labels: dict
    annotations: dict
    container: str
    phase: str = "Pending"
    restarts: int = 0
    logs: dict[int, list[str]] = field(default_factory=dict)
    created: str = field(default_factory=lambda: _now())
    attempt: int | None = None  # scripted TrainJob pods: the JobSet restart that made this pod (keys its log)
    waiting: tuple[str, str] | None = None  # the container's waiting (reason, message)
    unschedulable: str | None = None  # the scheduler's message while the pod cannot be placed
    owners: list[dict] = field(default_factory=list)  # ownerReferences (a step's pod: its run's Workflow)
    init_containers: list[dict] = field(default_factory=list)  # a KFP step's: kfp-launcher, with KFP's image

    @property
    def instance(self) -> int:
        """Which log this container instance writes: its restart count, or the JobSet attempt of its pod."""
        return self.restarts if self.attempt is None else self.attempt


class FakeKubernetesApi:
    def __init__(
        self,
        timeline: list[Tick] | None = None,
        logs: dict[int, str] | None = None,
        chunk_bytes: int = 7,
        release: str = "1.10",
        on_create=None,
        installed: bool = True,
        pod_folder: Path | None = None,
    ):
        self.timeline = timeline
        self.logs = logs or {}
        self.chunk_bytes = chunk_bytes
        self.release = release
        self.served = release_resources(release)
        # who may do what: Kubeflow's roles of the release, and, unless `installed` is False, what the cluster admin
        # (manifests/admin/) and then the profile owner (manifests/) applied, each with only their own permissions
        self.rbac = Rbac.installed(release) if installed else Rbac(release)
        self.on_create = on_create
        self.objects: dict[tuple[str, str | None, str], dict] = {}  # (plural, namespace, name) -> object
        self.secrets: dict[tuple[str, str], dict[str, str]] = {}
        self.pods: dict[tuple[str, str], PodRecord] = {}
        self.created: list[dict] = []
        self.deleted: list[tuple[str, str]] = []
        self.collected: list[tuple[str, str]] = []  # jobs the garbage collector deleted (their owner was gone)
        self.refused: list[str] = []
        self.pruned: list[str] = []  # unknown fields dropped from objects created without strict field validation
        self.requests: list[tuple[str, str, str]] = []  # (user, method, path)
        self.access_reviews: list[tuple[str, str, str, str]] = []  # (user, verb, group, resource) asked
        self.tick = 0
        self.pod_errors: list[int] = []  # HTTP statuses to answer the next pod GETs with
        # A fault proxy in front of the API: (path pattern, fault) pairs, each answering the next matching request
        # once: ("status", code, headers, body bytes), ("hang", seconds) then closed, or ("close",).
        self.faults: list[tuple[str, tuple]] = []
        self.on_job_get = None  # called with the tick number at each job GET (e.g. to send a signal)
        self.lock = threading.RLock()
        self.lease_store = LeaseStore()  # coordination.k8s.io/v1, as strict as tests/fake_coordination_api.py's
        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _handler_class(self))
        self._server.daemon_threads = True
        self.pod_folder = pod_folder
        if pod_folder is not None:  # TLS, and a step pod's service-account files, as in-cluster clients expect
            self._serve_as_in_a_pod(pod_folder)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def _serve_as_in_a_pod(self, folder: Path) -> None:
        import ssl
        import subprocess

        folder.mkdir(parents=True, exist_ok=True)
        certificate, key = folder / "ca.crt", folder / "server.key"
        subprocess.run(
            ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=127.0.0.1",
             "-addext", "subjectAltName=IP:127.0.0.1", "-keyout", str(key), "-out", str(certificate)],
            check=True, capture_output=True,
        )  # fmt: skip
        (folder / "token").write_text(EDITOR_POD_TOKEN)
        (folder / "namespace").write_text(NAMESPACE)
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(certificate, key)
        self._server.socket = context.wrap_socket(self._server.socket, server_side=True)

    def pod_environment(self) -> dict[str, str]:
        """What a step's pod has (with `pod_folder`): the API's address, its service account's files there."""
        return {"KUBERNETES_SERVICE_HOST": "127.0.0.1", "KUBERNETES_SERVICE_PORT": str(self._server.server_address[1]),
                "CIFAR10_PIPELINE_SERVICE_ACCOUNT": str(self.pod_folder)}  # fmt: skip

    @property
    def url(self) -> str:
        scheme = "https" if self.pod_folder is not None else "http"
        return f"{scheme}://127.0.0.1:{self._server.server_address[1]}"

    def __enter__(self) -> FakeKubernetesApi:
        self._thread.start()
        return self

    def __exit__(self, *_exception) -> None:
        self._server.shutdown()
        self._server.server_close()

    @property
    def jobs(self) -> dict[tuple[str, str], dict]:
        """The TFJobs and TrainJobs there are now, by (namespace, name)."""
        return {
            (ns, name): job for (plural, ns, name), job in self.objects.items() if plural in ("tfjobs", "trainjobs")
        }

    def clients(self, token: str = "editor-token"):
        """The real kubernetes client's CustomObjectsApi and CoreV1Api, pointed at this server as `token`'s user."""
        from kubernetes import client

        configuration = client.Configuration()
        configuration.host = self.url
        configuration.api_key = {"authorization": f"Bearer {token}"}
        api_client = client.ApiClient(configuration)
        return client.CustomObjectsApi(api_client), client.CoreV1Api(api_client)

    def kubeconfig(self, path: Path, namespace: str = NAMESPACE, token: str = "editor-token") -> Path:
        """A kubeconfig file for this server (for a launcher running in another process)."""
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {
                    "name": "fake",
                    "cluster": {
                        "server": self.url,
                        **({"certificate-authority": str(self.pod_folder / "ca.crt")} if self.pod_folder else {}),
                    },
                }
            ],
            "users": [{"name": "fake", "user": {"token": token}}],
            "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "fake", "namespace": namespace}}],
            "current-context": "fake",
        }
        path.write_text(yaml.safe_dump(config))
        return path

    def world(self) -> Tick:
        return self.timeline[min(self.tick, len(self.timeline) - 1)]

    # -- objects -----------------------------------------------------------------------------------------------

    def resource(self, group: str, version: str, plural: str) -> Resource:
        resource = self.served.get(plural)
        if resource is None or (resource.group, resource.version) != (group, version):
            raise Refused(404, "NotFound", "the server could not find the requested resource")
        return resource

    def create(self, plural: str, namespace: str | None, body: dict, field_validation: str = "Strict") -> dict:
        """Create an object as the API server would. Unknown fields: refused with `Strict` field validation, else
        dropped (the server's default since Kubernetes 1.23 is Warn: a warning header nobody reads)."""
        resource = self.served.get(plural)
        if resource is None:
            raise Refused(404, "NotFound", "the server could not find the requested resource")
        if body.get("apiVersion") != f"{resource.group}/{resource.version}" or body.get("kind") != resource.kind:
            raise Refused(
                400, "BadRequest",
                f"expected {resource.group}/{resource.version} {resource.kind}, got {body.get('apiVersion')} "
                f"{body.get('kind')}",
            )  # fmt: skip
        if resource.namespaced and body.get("metadata", {}).get("namespace", namespace) != namespace:
            raise Refused(400, "BadRequest", "the namespace of the provided object does not match the request's")
        unknown = unknown_fields(crd_schema(resource.crd), body)
        if unknown and field_validation == "Strict":
            raise Refused(
                400, "BadRequest",
                f'{resource.kind} in version "{resource.version}" cannot be handled as a {resource.kind}: strict '
                "decoding error: " + ", ".join(f'unknown field "{field}"' for field in unknown),
            )  # fmt: skip
        if unknown:
            self.pruned += unknown
            body = pruned(body, unknown)
        problems = schema_problems(resource, body)
        if plural == "tfjobs":
            problems += webhook_problems(body)
        elif plural in ("clustertrainingruntimes", "trainingruntimes"):
            problems += runtime_webhook_problems(body)
        elif plural == "trainjobs" and not problems:
            reference = body["spec"]["runtimeRef"]
            if reference.get("kind", "ClusterTrainingRuntime") != "ClusterTrainingRuntime":
                raise AssertionError("the stand-in plays ClusterTrainingRuntime references only")
            runtime = self.objects.get(("clustertrainingruntimes", None, reference["name"]))
            problems += trainjob_webhook_problems(body, runtime, reference["name"])
        name = body.get("metadata", {}).get("name")
        for index, owner in enumerate(body.get("metadata", {}).get("ownerReferences") or []):
            problems += [f"metadata.ownerReferences[{index}].{key}: Required value" for key in
                         ("apiVersion", "kind", "name", "uid") if not owner.get(key)]  # fmt: skip
        if problems:
            self.refused.append("; ".join(problems))
            raise Refused(
                422, "Invalid", f"{resource.kind}.{resource.group} {name!r} is invalid: " + "; ".join(problems)
            )
        key = (plural, namespace if resource.namespaced else None, name)
        with self.lock:
            if key in self.objects:
                raise Refused(409, "AlreadyExists", f'{plural}.{resource.group} "{name}" already exists')
            stored = copy.deepcopy(body)
            stored["metadata"].update(uid=f"uid-{len(self.created)}", creationTimestamp=_now())
            if resource.namespaced:
                stored["metadata"]["namespace"] = namespace
            self.objects[key] = stored
            if plural in ("tfjobs", "trainjobs"):
                self.created.append(copy.deepcopy(body))
        if plural in ("tfjobs", "trainjobs") and self.on_create is not None:
            self.on_create(self, copy.deepcopy(stored))
        self.collect_garbage()
        return stored

    # -- the run's Workflow and the garbage collector ------------------------------------------------------------

    def add_workflow(self, namespace: str, name: str) -> dict:
        """The run's Argo Workflow (KFP made it); returns the owner reference Argo puts on each of its pods."""
        with self.lock:
            uid = f"workflow-uid-{name}"
            self.objects[("workflows", namespace, name)] = {
                "apiVersion": "argoproj.io/v1alpha1", "kind": "Workflow",
                "metadata": {"name": name, "namespace": namespace, "uid": uid},
            }  # fmt: skip
        return {"apiVersion": "argoproj.io/v1alpha1", "kind": "Workflow", "name": name, "uid": uid,
                "controller": True, "blockOwnerDeletion": True}  # fmt: skip

    def delete_workflow(self, namespace: str, name: str) -> None:
        """KFP's garbage collection of a finished run (the persistence agent's TTL, the Workflow's ttlStrategy)."""
        with self.lock:
            del self.objects[("workflows", namespace, name)]
        self.collect_garbage()

    def collect_garbage(self) -> None:
        """Kubernetes' garbage collector (background propagation): an object whose every owner is gone (no object of
        that kind, name and uid in its namespace) is deleted, its own dependents after it."""
        with self.lock:
            while True:
                living = {(key[1], obj["kind"], obj["metadata"]["name"], obj["metadata"].get("uid"))
                          for key, obj in self.objects.items()}  # fmt: skip
                orphans = [
                    key for key, obj in self.objects.items()
                    if obj["metadata"].get("ownerReferences") and not any(
                        (key[1], owner["kind"], owner["name"], owner["uid"]) in living
                        for owner in obj["metadata"]["ownerReferences"]
                    )
                ]  # fmt: skip
                if not orphans:
                    return
                for key in orphans:
                    del self.objects[key]
                    if key[0] in ("tfjobs", "trainjobs"):
                        self.deleted.append((key[1], key[2]))
                        self.collected.append((key[1], key[2]))

    def create_job(self, namespace: str, body: dict) -> dict:
        """Create a TFJob or TrainJob directly (as an earlier attempt of a step would have)."""
        return self.create(body["kind"].lower() + "s", namespace, body)

    def get(self, plural: str, namespace: str | None, name: str) -> dict:
        resource = self.served[plural]
        key = (plural, namespace if resource.namespaced else None, name)
        if key not in self.objects:
            raise Refused(404, "NotFound", f'{plural}.{resource.group} "{name}" not found')
        if plural not in ("tfjobs", "trainjobs"):
            return copy.deepcopy(self.objects[key])
        with self.lock:
            if self.on_job_get:
                self.on_job_get(self.tick)
            job = copy.deepcopy(self.objects[key])
            if self.timeline is None:
                return job
            world = self.world()
            self.tick += 1
        if world.error:
            raise Refused(world.error, "ServiceUnavailable", "the server is currently unable to handle the request")
        job["status"] = {"conditions": world.conditions}
        return job

    def delete(self, plural: str, namespace: str | None, name: str) -> dict:
        resource = self.served[plural]
        with self.lock:
            if self.objects.pop((plural, namespace if resource.namespaced else None, name), None) is None:
                raise Refused(404, "NotFound", f'{plural}.{resource.group} "{name}" not found')
            if plural in ("tfjobs", "trainjobs"):
                self.deleted.append((namespace, name))
        return {"kind": "Status", "apiVersion": "v1", "status": "Success"}

    def set_conditions(self, namespace: str, name: str, conditions: list[dict], plural: str = "trainjobs") -> None:
        with self.lock:
            job = self.objects.get((plural, namespace, name))
            if job is not None:
                job["status"] = {"conditions": copy.deepcopy(conditions)}

    def add_config_map(self, namespace: str, name: str, data: dict[str, str]) -> None:
        """A ConfigMap someone else made (KFP's profile controller's kfp-launcher)."""
        self.rbac.objects[("ConfigMap", namespace, name)] = {
            "kind": "ConfigMap", "metadata": {"name": name, "namespace": namespace}, "data": dict(data)
        }  # fmt: skip

    def add_secret(self, namespace: str, name: str, data: dict[str, str]) -> None:
        self.secrets[(namespace, name)] = dict(data)

    # -- pods --------------------------------------------------------------------------------------------------

    def add_pod(self, record: PodRecord) -> PodRecord:
        with self.lock:
            self.pods[(record.namespace, record.name)] = record
        return record

    def _scripted_pods(self, namespace: str) -> list[PodRecord]:
        """Worker 0 as the timeline has it, for each job there is."""
        world = self.world()
        records = []
        for plural, job_namespace, name in list(self.objects):
            if job_namespace != namespace or plural not in ("tfjobs", "trainjobs") or world.pod is None:
                continue
            if plural == "tfjobs":
                labels = {"training.kubeflow.org/job-name": name, "training.kubeflow.org/replica-type": "worker"}
                record = PodRecord(namespace, f"{name}-worker-0", labels, {}, "tensorflow", world.pod, world.restarts)
            else:
                labels = {"jobset.sigs.k8s.io/jobset-name": name,
                          "jobset.sigs.k8s.io/restart-attempt": str(world.restarts)}  # fmt: skip
                annotations = {"batch.kubernetes.io/job-completion-index": "0"}
                record = PodRecord(namespace, f"{name}-node-0-0-r{world.restarts}", labels, annotations, "node",
                                   world.pod, attempt=world.restarts)  # fmt: skip
            record.waiting, record.unschedulable = world.waiting, world.unschedulable
            records.append(record)
        return records

    def events(self, namespace: str, involved: str) -> list[dict]:
        """The events the controllers recorded on object `involved` (the timeline's, on each job)."""
        if self.timeline is None:
            return []
        world = self.world()
        return [
            {"metadata": {"name": f"{involved}.{index}", "namespace": namespace}, "type": kind, "reason": reason,
             "message": message, "involvedObject": {"name": involved, "namespace": namespace}}
            for index, (kind, reason, message) in enumerate(world.events)
            if any(job_namespace == namespace and job == involved for _plural, job_namespace, job in self.objects)
        ]  # fmt: skip

    def pod_records(self, namespace: str) -> list[PodRecord]:
        with self.lock:
            added = [record for (ns, _name), record in self.pods.items() if ns == namespace]
        return (self._scripted_pods(namespace) if self.timeline is not None else []) + added

    def pod_record(self, namespace: str, name: str) -> PodRecord:
        for record in self.pod_records(namespace):
            if record.name == name:
                return record
        raise Refused(404, "NotFound", f'pods "{name}" not found')

    def pod_log_lines(self, record: PodRecord, instance: int) -> list[str]:
        if self.timeline is not None:
            return self.logs.get(instance, "").splitlines(keepends=True)
        return list(record.logs.get(instance, []))

    def pod_running(self, record: PodRecord, instance: int) -> bool:
        """Whether the container instance whose log is followed still runs (its stream stays open meanwhile)."""
        if self.timeline is not None:
            world = self.world()
            return world.pod == "Running" and world.restarts == instance and world.conditions[-1:] == RUNNING[-1:]
        with self.lock:
            current = self.pods.get((record.namespace, record.name))
            return current is not None and current.phase == "Running" and current.instance == instance


def pod_json(record: PodRecord) -> dict:
    running = record.phase == "Running"
    status = {"name": record.container, "restartCount": record.restarts, "ready": running, "image": "i",
              "imageID": "", "started": running}  # fmt: skip
    if record.waiting is not None:
        status["state"] = {"waiting": {"reason": record.waiting[0], "message": record.waiting[1]}}
    conditions = []
    if record.unschedulable is not None:
        conditions.append({"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                           "message": record.unschedulable})  # fmt: skip
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": record.name, "namespace": record.namespace, "labels": record.labels,
                     "annotations": record.annotations, "creationTimestamp": record.created,
                     **({"ownerReferences": record.owners} if record.owners else {})},
        "spec": {"containers": [{"name": record.container, "image": "i"}], "initContainers": record.init_containers},
        "status": {"phase": record.phase, "conditions": conditions, "containerStatuses": [status]},
    }  # fmt: skip


def _selected(record: PodRecord, selector: str) -> bool:
    for requirement in filter(None, selector.split(",")):
        key, _, value = requirement.partition("=")
        if record.labels.get(key) != value:
            return False
    return True


def _flag(query: dict, name: str) -> bool:
    """A boolean query parameter as the API server parses it (Go's strconv.ParseBool)."""
    return query.get(name, ["false"])[0] in ("1", "t", "T", "true", "TRUE", "True")


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _stamp(instance: int, line: int) -> str:
    start = datetime.datetime(2026, 1, 1, tzinfo=datetime.timezone.utc) + datetime.timedelta(hours=instance)
    return (start + datetime.timedelta(milliseconds=line)).strftime("%Y-%m-%dT%H:%M:%S.%f000Z")


def _status(refused: Refused | Forbidden) -> dict:
    status = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "message": str(refused),
              "reason": refused.reason, "code": refused.status}  # fmt: skip
    if getattr(refused, "details", None):
        status["details"] = refused.details
    return status


CUSTOM = re.compile(
    r"^/apis/(?P<group>[^/]+)/(?P<version>[^/]+)(?:/namespaces/(?P<namespace>[^/]+))?(?:/(?P<plural>[^/]+)"
    r"(?:/(?P<name>[^/]+))?)?$"
)
OPENAPI = re.compile(r"^/openapi/v3/apis/(?P<group>[^/]+)/(?P<version>[^/]+)$")
LEASES = re.compile(r"^/apis/coordination\.k8s\.io/v1/namespaces/(?P<namespace>[^/]+)/leases(?:/(?P<name>[^/]+))?$")
PODS = re.compile(r"^/api/v1/namespaces/(?P<namespace>[^/]+)/pods(?:/(?P<name>[^/]+)(?P<log>/log)?)?$")
EVENTS = re.compile(r"^/api/v1/namespaces/(?P<namespace>[^/]+)/events$")
ACCESS_REVIEWS = "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews"
CONFIG_MAPS = re.compile(r"^/api/v1/namespaces/(?P<namespace>[^/]+)/configmaps/(?P<name>[^/]+)$")
SECRETS = re.compile(r"^/api/v1/namespaces/(?P<namespace>[^/]+)/secrets/(?P<name>[^/]+)$")


def _handler_class(api: FakeKubernetesApi):
    class Handler(http.server.BaseHTTPRequestHandler):
        def _reply(self, status: int, body: dict) -> None:
            content = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(content)))
            self.end_headers()
            self.wfile.write(content)

        def _user(self) -> str:
            scheme, _, token = (self.headers.get("Authorization") or "").partition(" ")
            token = token.strip()
            if scheme.lower() != "bearer" or token not in TOKENS:  # the scheme is case-insensitive (RFC 7235)
                raise Refused(401, "Unauthorized", "Unauthorized")
            return TOKENS[token]

        def _authorize(self, user, verb, group, resource, namespace):
            api.rbac.authorize(user, verb, group, resource, namespace)

        def _fault(self, path: str) -> bool:
            """Answer from the fault proxy when a fault waits for this path (True: answered)."""
            for index, (pattern, fault) in enumerate(api.faults):
                if re.search(pattern, path):
                    del api.faults[index]
                    api.requests.append(("fault", fault[0], path))
                    if fault[0] == "hang":
                        time.sleep(fault[1])
                        self.close_connection = True
                        return True
                    if fault[0] == "close":
                        self.close_connection = True
                        return True
                    _kind, status, headers, content = fault
                    self.send_response(status)
                    for name, value in {"Content-Type": "application/json", **headers}.items():
                        self.send_header(name, value)
                    self.send_header("Content-Length", str(len(content)))
                    self.end_headers()
                    self.wfile.write(content)
                    return True
            return False

        def _dispatch(self, method: str) -> None:
            url = urlparse(self.path)
            if self._fault(url.path):
                return
            query = self.query = parse_qs(url.query)
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length) if length else b""
            body = json.loads(raw) if raw else None
            try:
                user = self._user()
                api.requests.append((user, method, url.path))
                if match := LEASES.match(url.path):
                    verbs = {
                        verb
                        for verb in ("get", "list", "create", "update", "delete")
                        if api.rbac.allows(user, verb, "coordination.k8s.io", "leases", match["namespace"])
                    }
                    try:
                        answer = api.lease_store.serve(method, match["namespace"], match["name"], user, verbs, raw,
                                                       parse_qs(url.query).get("labelSelector", [""])[0])  # fmt: skip
                    except LeaseRefused as refused:
                        raise Refused(refused.status, refused.reason, str(refused)) from None
                    return self._reply(*answer)
                if url.path == ACCESS_REVIEWS and method == "POST":
                    return self._reply(201, self._access_review(user, body))
                if (match := CONFIG_MAPS.match(url.path)) and method == "GET":
                    self._authorize(user, "get", "", "configmaps", match["namespace"])
                    found = api.rbac.objects.get(("ConfigMap", match["namespace"], match["name"]))
                    if found is None:
                        raise Refused(404, "NotFound", f'configmaps "{match["name"]}" not found')
                    return self._reply(200, {"apiVersion": "v1", **found})
                if (match := SECRETS.match(url.path)) and method == "GET":
                    import base64

                    self._authorize(user, "get", "", "secrets", match["namespace"])
                    data = api.secrets.get((match["namespace"], match["name"]))
                    if data is None:
                        raise Refused(404, "NotFound", f'secrets "{match["name"]}" not found')
                    encoded = {key: base64.b64encode(value.encode()).decode() for key, value in data.items()}
                    return self._reply(
                        200,
                        {
                            "apiVersion": "v1",
                            "kind": "Secret",
                            "type": "Opaque",
                            "data": encoded,
                            "metadata": {"name": match["name"], "namespace": match["namespace"]},
                        },
                    )
                if (match := OPENAPI.match(url.path)) and method == "GET":
                    return self._reply(200, self._openapi(match["group"], match["version"]))
                if (match := CUSTOM.match(url.path)) and match["plural"] is None and method == "GET":
                    return self._reply(200, self._discovery(match["group"], match["version"]))
                if match := CUSTOM.match(url.path):
                    return self._custom(user, method, match, body)
                if (match := PODS.match(url.path)) and method == "GET":
                    return self._pods(user, match, query)
                if (match := EVENTS.match(url.path)) and method == "GET":
                    self._authorize(user, "list", "", "events", match["namespace"])
                    selector = query.get("fieldSelector", [""])[0]
                    if not selector.startswith("involvedObject.name="):
                        raise Refused(400, "BadRequest", f"this stand-in answers one field selector, not {selector!r}")
                    items = api.events(match["namespace"], selector.removeprefix("involvedObject.name="))
                    return self._reply(200, {"kind": "EventList", "apiVersion": "v1", "metadata": {}, "items": items})
                raise Refused(404, "NotFound", f"{method} {url.path}: not served by this stand-in")
            except (Refused, Forbidden) as refused:
                self._reply(refused.status, _status(refused))

        def _access_review(self, user: str, body: dict) -> dict:
            """A SelfSubjectAccessReview answered from the caller's rules (the client's model checked, closed)."""
            from tests.fake_coordination_api import check_model

            try:
                check_model(body, "V1SelfSubjectAccessReview", "body")
            except LeaseRefused as refused:
                raise Refused(refused.status, refused.reason, str(refused)) from None
            attributes = (body.get("spec") or {}).get("resourceAttributes")
            if not attributes or not attributes.get("verb") or not attributes.get("resource"):
                raise Refused(400, "BadRequest", "spec.resourceAttributes: a verb and a resource are required")
            resource = attributes["resource"] + (
                f"/{attributes['subresource']}" if attributes.get("subresource") else ""
            )
            allowed = api.rbac.allows(user, attributes["verb"], attributes.get("group", ""), resource,
                                      attributes.get("namespace") or None, attributes.get("name", ""))  # fmt: skip
            api.access_reviews.append((user, attributes["verb"], attributes.get("group", ""), resource))
            reason = "RBAC: allowed by a RoleBinding" if allowed else ""
            return {**body, "status": {"allowed": allowed, "reason": reason}}

        def _discovery(self, group: str, version: str) -> dict:
            resources = [r for r in api.served.values() if (r.group, r.version) == (group, version)]
            if not resources:
                raise Refused(404, "NotFound", "the server could not find the requested resource")
            return {"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": f"{group}/{version}",
                    "resources": [{"name": r.plural, "singularName": r.kind.lower(), "namespaced": r.namespaced,
                                   "kind": r.kind, "verbs": ["create", "delete", "get", "list", "watch"]}
                                  for r in resources]}  # fmt: skip

        def _openapi(self, group: str, version: str) -> dict:
            """The OpenAPI v3 document of a group version: every served kind's schema, as the API server publishes a
            CRD's structural schema (for every authenticated user: system:discovery)."""
            resources = [r for r in api.served.values() if (r.group, r.version) == (group, version)]
            if not resources:
                raise Refused(404, "NotFound", "the server could not find the requested resource")
            prefix = ".".join(reversed(group.split(".")))
            schemas = {
                f"{prefix}.{version}.{r.kind}": {
                    **crd_schema(r.crd),
                    "x-kubernetes-group-version-kind": [{"group": group, "version": version, "kind": r.kind}],
                }
                for r in resources
            }
            return {"openapi": "3.0.0", "info": {"title": "Kubernetes", "version": "v1.33.0"},
                    "components": {"schemas": schemas}}  # fmt: skip

        def _custom(self, user, method, match, body) -> None:
            namespace, plural, name = match["namespace"], match["plural"], match["name"]
            resource = api.resource(match["group"], match["version"], plural)
            if resource.namespaced != (namespace is not None):
                raise Refused(404, "NotFound", "the server could not find the requested resource")
            verb = {"POST": "create", "DELETE": "delete", "GET": "get" if name else "list"}[method]
            self._authorize(user, verb, resource.group, plural, namespace)
            if method == "POST" and name is None:
                validation = self.query.get("fieldValidation", ["Warn"])[0]
                return self._reply(201, api.create(plural, namespace, body, field_validation=validation))
            if method == "GET" and name:
                return self._reply(200, api.get(plural, namespace, name))
            if method == "DELETE" and name:
                return self._reply(200, api.delete(plural, namespace, name))
            raise Refused(405, "MethodNotAllowed", f"{method} is not supported here by this stand-in")

        def _pods(self, user, match, query) -> None:
            namespace, name = match["namespace"], match["name"]
            if api.pod_errors:  # a flaky API server: the next pod reads (get, list or log) fail
                raise Refused(api.pod_errors.pop(0), "InternalError", "etcdserver: request timed out")
            if name is None:
                self._authorize(user, "list", "", "pods", namespace)
                selector = query.get("labelSelector", [""])[0]
                items = [pod_json(r) for r in api.pod_records(namespace) if _selected(r, selector)]
                return self._reply(200, {"kind": "PodList", "apiVersion": "v1", "metadata": {}, "items": items})
            if match["log"]:
                self._authorize(user, "get", "", "pods/log", namespace)
                return self._stream_log(namespace, name, query)
            self._authorize(user, "get", "", "pods", namespace)
            return self._reply(200, pod_json(api.pod_record(namespace, name)))

        def _stream_log(self, namespace: str, name: str, query: dict) -> None:
            record = api.pod_record(namespace, name)
            if query.get("container") != [record.container]:
                raise Refused(400, "BadRequest", "a container name must be given: the pod has several")
            if record.phase == "Pending":
                raise Refused(
                    400, "BadRequest",
                    f'container "{record.container}" in pod "{name}" is waiting to start: ContainerCreating',
                )  # fmt: skip
            instance = record.instance
            stamps = _flag(query, "timestamps")
            self.send_response(200)
            self.send_header("Content-Type", "text/plain")
            self.end_headers()
            sent, follow = 0, _flag(query, "follow")
            while True:
                lines = api.pod_log_lines(record, instance)
                text = "".join(f"{_stamp(instance, i)} {line}" if stamps else line for i, line in enumerate(lines))
                content = text.encode()[sent:]
                for start in range(0, len(content), api.chunk_bytes):
                    self.wfile.write(content[start : start + api.chunk_bytes])
                    self.wfile.flush()
                sent += len(content)
                if not follow or not api.pod_running(record, instance):
                    if not content:
                        break  # the container ended and its whole log was sent
                    continue
                time.sleep(0.02)

        def do_GET(self):
            self._dispatch("GET")

        def do_POST(self):
            self._dispatch("POST")

        def do_DELETE(self):
            self._dispatch("DELETE")

        def do_PUT(self):
            self._dispatch("PUT")

        def log_message(self, *_arguments):
            pass

    return Handler
