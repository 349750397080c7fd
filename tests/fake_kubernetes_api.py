"""A strict stand-in for the Kubernetes API server with training-operator v1.9, on 127.0.0.1, for the real
`kubernetes` client. No API server can run here, so this one checks what it receives the way the real parts would:

- every TFJob body against the vendored CRD's openAPIV3Schema (tests/vendor/kubeflow.org_tfjobs.yaml), closed:
  an unknown field is refused (the real server would drop it silently, which hides a misspelled setting);
- the TFJob admission webhook's rules (DNS-1035 name, replica specs with containers, an image on every container,
  a container named "tensorflow", at most one Chief/Master, a known runPolicy.managedBy) and the controller's
  restart policies (the CRD has no enum for them);
- the path's namespace against the body's.

It plays a scripted world: each GET of the TFJob advances one tick of `timeline`, which says the job's conditions,
worker 0's pod phase and restart count, or an HTTP error to answer instead (a transient API failure). Worker 0's
log (per container instance) is served with RFC 3339 timestamps, in small chunks that cut lines anywhere, and the
stream stays open while that container runs, as `kubectl logs -f` does; a Pending pod's log is a 400.
"""

from __future__ import annotations

import copy
import datetime
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

CRD = Path(__file__).parent / "vendor" / "kubeflow.org_tfjobs.yaml"
JOBS = re.compile(r"^/apis/kubeflow\.org/v1/namespaces/(?P<namespace>[^/]+)/tfjobs(?:/(?P<name>[^/]+))?$")
POD = re.compile(r"^/api/v1/namespaces/(?P<namespace>[^/]+)/pods/(?P<name>[^/]+)(?P<log>/log)?$")
RESTART_POLICIES = {"Always", "OnFailure", "Never", "ExitCode"}  # pkg/apis/kubeflow.org/v1/common_types.go
MANAGERS = {"kubeflow.org/training-operator", "kueue.x-k8s.io/multikueue"}  # pkg/common/util/webhooks.go
DNS_1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")


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


def tfjob_validator() -> jsonschema.Draft7Validator:
    crd = yaml.safe_load(CRD.read_text())
    (version,) = [v for v in crd["spec"]["versions"] if v["name"] == "v1"]
    return jsonschema.Draft7Validator(closed(version["schema"]["openAPIV3Schema"]))


class Refused(Exception):  # noqa: N818 (an HTTP answer, not a bug)
    def __init__(self, status: int, reason: str, message: str):
        super().__init__(message)
        self.status, self.reason = status, reason


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
    if manager is not None and manager not in MANAGERS:
        problems.append(f"spec.runPolicy.managedBy: Unsupported value: {manager!r}")
    return problems


@dataclass
class Tick:
    """The world at one GET of the TFJob."""

    conditions: list[dict] = field(default_factory=list)
    pod: str | None = "Running"  # worker 0's phase, None while it does not exist
    restarts: int = 0
    error: int | None = None  # answer the TFJob GET with this HTTP status instead


def condition(kind: str, status: str = "True", reason: str = "", message: str = "") -> dict:
    return {"type": kind, "status": status, "reason": reason, "message": message}


RUNNING = [condition("Created"), condition("Running")]
SUCCEEDED = [condition("Created"), condition("Running", "False"), condition("Succeeded", reason="TFJobSucceeded")]
FAILED = [
    condition("Created"),
    condition("Running", "False"),
    condition("Failed", reason="TFJobFailed", message="TFJob has failed because 1 Worker replica(s) failed."),
]


class FakeKubernetesApi:
    def __init__(self, timeline: list[Tick], logs: dict[int, str] | None = None, chunk_bytes: int = 7):
        self.timeline = timeline
        self.logs = logs or {}
        self.chunk_bytes = chunk_bytes
        self.validator = tfjob_validator()
        self.jobs: dict[tuple[str, str], dict] = {}
        self.created: list[dict] = []
        self.deleted: list[tuple[str, str]] = []
        self.refused: list[str] = []
        self.tick = 0
        self.pod_errors: list[int] = []  # HTTP statuses to answer the next pod GETs with
        self.on_job_get = None  # called with the tick number at each TFJob GET (e.g. to send a signal)
        self.lock = threading.Lock()
        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _handler_class(self))
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def __enter__(self) -> FakeKubernetesApi:
        self._thread.start()
        return self

    def __exit__(self, *_exception) -> None:
        self._server.shutdown()
        self._server.server_close()

    def clients(self):
        """The real kubernetes client's CustomObjectsApi and CoreV1Api, pointed at this server."""
        from kubernetes import client

        configuration = client.Configuration()
        configuration.host = self.url
        api_client = client.ApiClient(configuration)
        return client.CustomObjectsApi(api_client), client.CoreV1Api(api_client)

    def kubeconfig(self, path: Path, namespace: str = "team-a") -> Path:
        """A kubeconfig file for this server (for a launcher running in another process)."""
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "fake", "cluster": {"server": self.url}}],
            "users": [{"name": "fake", "user": {"token": "fake"}}],
            "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "fake", "namespace": namespace}}],
            "current-context": "fake",
        }
        path.write_text(yaml.safe_dump(config))
        return path

    def world(self) -> Tick:
        return self.timeline[min(self.tick, len(self.timeline) - 1)]

    # -- requests ----------------------------------------------------------------------------------------------

    def create_job(self, namespace: str, body: dict) -> dict:
        if body.get("apiVersion") != "kubeflow.org/v1" or body.get("kind") != "TFJob":
            raise Refused(
                400, "BadRequest", f"expected kubeflow.org/v1 TFJob, got {body.get('apiVersion')} {body.get('kind')}"
            )
        if body.get("metadata", {}).get("namespace", namespace) != namespace:
            raise Refused(400, "BadRequest", "the namespace of the provided object does not match the request's")
        errors = sorted(self.validator.iter_errors(body), key=lambda error: list(error.absolute_path))
        problems = [f"{'.'.join(map(str, error.absolute_path))}: {error.message}" for error in errors]
        problems += webhook_problems(body)
        if problems:
            self.refused.append("; ".join(problems))
            raise Refused(
                422,
                "Invalid",
                f"TFJob.kubeflow.org {body['metadata'].get('name')!r} is invalid: " + "; ".join(problems),
            )
        key = (namespace, body["metadata"]["name"])
        if key in self.jobs:
            raise Refused(409, "AlreadyExists", f'tfjobs.kubeflow.org "{key[1]}" already exists')
        stored = copy.deepcopy(body)
        stored["metadata"].update(namespace=namespace, uid=f"uid-{len(self.created)}", creationTimestamp=_now())
        self.jobs[key] = stored
        self.created.append(copy.deepcopy(body))
        return stored

    def get_job(self, namespace: str, name: str) -> dict:
        if (namespace, name) not in self.jobs:
            raise Refused(404, "NotFound", f'tfjobs.kubeflow.org "{name}" not found')
        with self.lock:
            if self.on_job_get:
                self.on_job_get(self.tick)
            world = self.world()
            self.tick += 1
        if world.error:
            raise Refused(world.error, "ServiceUnavailable", "the server is currently unable to handle the request")
        job = copy.deepcopy(self.jobs[(namespace, name)])
        job["status"] = {"conditions": world.conditions}
        return job

    def delete_job(self, namespace: str, name: str) -> dict:
        if self.jobs.pop((namespace, name), None) is None:
            raise Refused(404, "NotFound", f'tfjobs.kubeflow.org "{name}" not found')
        self.deleted.append((namespace, name))
        return {"kind": "Status", "apiVersion": "v1", "status": "Success"}

    def get_pod(self, namespace: str, name: str) -> dict:
        if self.pod_errors:
            raise Refused(self.pod_errors.pop(0), "InternalError", "etcdserver: request timed out")
        world = self.world()
        job_name = name.rsplit("-worker-", 1)[0]
        if world.pod is None or (namespace, job_name) not in self.jobs:
            raise Refused(404, "NotFound", f'pods "{name}" not found')
        return {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name, "namespace": namespace},
            "status": {
                "phase": world.pod,
                "containerStatuses": [
                    {"name": "tensorflow", "restartCount": world.restarts, "ready": world.pod == "Running",
                     "image": "i", "imageID": "", "started": world.pod == "Running"}
                ],
            },
        }  # fmt: skip


def _flag(query: dict, name: str) -> bool:
    """A boolean query parameter as the API server parses it (Go's strconv.ParseBool)."""
    return query.get(name, ["false"])[0] in ("1", "t", "T", "true", "TRUE", "True")


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _stamp(instance: int, line: int) -> str:
    start = datetime.datetime(2026, 1, 1, tzinfo=datetime.timezone.utc) + datetime.timedelta(hours=instance)
    return (start + datetime.timedelta(milliseconds=line)).strftime("%Y-%m-%dT%H:%M:%S.%f000Z")


def _status(status: int, reason: str, message: str) -> dict:
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": status,
    }


def _handler_class(api: FakeKubernetesApi):
    class Handler(http.server.BaseHTTPRequestHandler):
        def _reply(self, status: int, body: dict) -> None:
            content = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(content)))
            self.end_headers()
            self.wfile.write(content)

        def _dispatch(self, method: str) -> None:
            url = urlparse(self.path)
            query = parse_qs(url.query)
            length = int(self.headers.get("Content-Length") or 0)
            body = json.loads(self.rfile.read(length)) if length else None
            try:
                if match := JOBS.match(url.path):
                    namespace, name = match["namespace"], match["name"]
                    if method == "POST" and name is None:
                        return self._reply(201, api.create_job(namespace, body))
                    if method == "GET" and name:
                        return self._reply(200, api.get_job(namespace, name))
                    if method == "DELETE" and name:
                        return self._reply(200, api.delete_job(namespace, name))
                if (match := POD.match(url.path)) and method == "GET":
                    if match["log"]:
                        return self._stream_log(match["namespace"], match["name"], query)
                    return self._reply(200, api.get_pod(match["namespace"], match["name"]))
                raise Refused(404, "NotFound", f"{method} {url.path}: not served by this stand-in")
            except Refused as refused:
                self._reply(refused.status, _status(refused.status, refused.reason, str(refused)))

        def _stream_log(self, namespace: str, name: str, query: dict) -> None:
            if query.get("container") != ["tensorflow"]:
                raise Refused(400, "BadRequest", "a container name must be given: the pod has several")
            pod = api.get_pod(namespace, name)
            if pod["status"]["phase"] == "Pending":
                raise Refused(
                    400, "BadRequest", f'container "tensorflow" in pod "{name}" is waiting to start: ContainerCreating'
                )
            instance = pod["status"]["containerStatuses"][0]["restartCount"]
            stamps = _flag(query, "timestamps")
            lines = api.logs.get(instance, "").splitlines(keepends=True)
            text = "".join(f"{_stamp(instance, i)} {line}" if stamps else line for i, line in enumerate(lines))
            self.send_response(200)
            self.send_header("Content-Type", "text/plain")
            self.end_headers()
            content = text.encode()
            for start in range(0, len(content), api.chunk_bytes):
                self.wfile.write(content[start : start + api.chunk_bytes])
                self.wfile.flush()
            follow = _flag(query, "follow")
            while follow:  # the stream stays open while this container instance runs
                world = api.world()
                if world.pod != "Running" or world.restarts != instance or world.conditions[-1:] != RUNNING[-1:]:
                    break
                time.sleep(0.02)

        def do_GET(self):
            self._dispatch("GET")

        def do_POST(self):
            self._dispatch("POST")

        def do_DELETE(self):
            self._dispatch("DELETE")

        def log_message(self, *_arguments):
            pass

    return Handler
