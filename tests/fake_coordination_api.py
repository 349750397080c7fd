"""A strict stand-in for the Kubernetes API's `coordination.k8s.io/v1` Leases, on 127.0.0.1 over TLS, for the real
`kubernetes` client configured as a pod configures it (in-cluster: the API's address in KUBERNETES_SERVICE_HOST and
_PORT, the service account's token, CA certificate and namespace in its folder).

No API server can run here, so this one answers the way the real one does where the project relies on it:
- optimistic concurrency: every write gives the object a new `resourceVersion` from one counter; a create of an
  existing name is 409 AlreadyExists; a replace whose `metadata.resourceVersion` is not the current one is 409
  Conflict ("the object has been modified; please apply your changes to the latest version and try again"); a
  delete whose `preconditions.resourceVersion` is stale is 409 Conflict; a missing object is 404 NotFound;
- every body checked against the Lease's schema as the client's generated models give it (kubernetes 30.1.0,
  generated from the Kubernetes v1.30 OpenAPI: no unknown field, each field's type), and as the server validates it:
  a DNS-1123 subdomain name, the URL's namespace, label syntax, annotations at most 256 KiB in all, MicroTimes in
  RFC 3339 with microseconds, int32 numbers, no resourceVersion on a create;
- every request authorized as RBAC would: the caller's token names a service account of the namespace, and only the
  verbs it holds on leases once the cluster admin and the profile owner applied the project's manifests
  (tests/fake_rbac.py) are allowed (403 Forbidden, worded as the API words it, otherwise);
- `down = True` answers 503 to everything (an API server that is unavailable); `stop()` closes the port;
- `faults`, a fault proxy in front: each request takes the next one, either an answer (status, body, headers) given
  instead of the API's, or "close" (the connection closed unanswered, nothing applied), "close-applied" (applied,
  then closed unanswered: the client cannot know), ("hang", seconds) (no answer for that long, then closed).

`pod_environment()` is what a step's pod would have: its environment and, in `folder`, the service account's files.
"""

from __future__ import annotations

import datetime
import http.server
import itertools
import json
import re
import ssl
import subprocess
import threading
import time
import uuid
from pathlib import Path
from typing import Any

REPOSITORY = Path(__file__).resolve().parents[1]
API = "/apis/coordination.k8s.io/v1"
DNS_1123_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
MICRO_TIME = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}(Z|[+-]\d\d:\d\d)$")
MAX_ANNOTATIONS = 256 * 1024  # apimachinery's TotalAnnotationSizeLimitB
VERBS = {("GET", True): "get", ("GET", False): "list", ("POST", False): "create", ("PUT", True): "update",
         ("DELETE", True): "delete"}  # fmt: skip


class Unanswered(Exception):  # noqa: N818 (no HTTP answer: the connection is closed)
    pass


class Refused(Exception):  # noqa: N818 (an HTTP answer)
    def __init__(self, status: int, reason: str, message: str):
        super().__init__(message)
        self.status, self.reason = status, reason


def check_model(value: Any, type_name: str, where: str) -> None:
    """`value` (decoded JSON) must be what the client's generated model `type_name` describes, and nothing else."""
    import kubernetes.client.models as models

    if value is None:
        return
    if type_name.startswith("list["):
        if not isinstance(value, list):
            raise Refused(400, "BadRequest", f"{where}: expected a list")
        for index, item in enumerate(value):
            check_model(item, type_name[5:-1], f"{where}[{index}]")
        return
    if type_name.startswith("dict("):
        if not isinstance(value, dict):
            raise Refused(400, "BadRequest", f"{where}: expected an object")
        for key, item in value.items():
            check_model(item, type_name[5:-1].split(", ", 1)[1], f"{where}.{key}")
        return
    primitives = {"str": str, "int": int, "bool": bool, "datetime": str, "object": object}
    if type_name in primitives:
        if not isinstance(value, primitives[type_name]) or (type_name == "int" and isinstance(value, bool)):
            raise Refused(400, "BadRequest", f"{where}: expected {type_name}, got {value!r}")
        if type_name == "int" and not -(2**31) <= value < 2**31:
            raise Refused(422, "Invalid", f"{where}: {value} is not an int32")
        if type_name == "datetime" and not MICRO_TIME.match(value) and not re.match(r"^\d{4}-\d\d-\d\dT", value):
            raise Refused(400, "BadRequest", f"{where}: {value!r} is not a time")
        return
    model = getattr(models, type_name)
    if not isinstance(value, dict):
        raise Refused(400, "BadRequest", f"{where}: expected a {type_name} object")
    fields = {json_name: model.openapi_types[name] for name, json_name in model.attribute_map.items()}
    for key, item in value.items():
        if key not in fields:
            raise Refused(400, "BadRequest", f'{where}: strict decoding error: unknown field "{key}"')
        check_model(item, fields[key], f"{where}.{key}")


def lease_problems(lease: dict, namespace: str) -> list[str]:
    """What the API server's validation of a Lease refuses (apimachinery's ObjectMeta rules, the Lease's own)."""
    problems = []
    metadata, spec = lease.get("metadata") or {}, lease.get("spec") or {}
    name = metadata.get("name", "")
    if not name or len(name) > 253 or not DNS_1123_SUBDOMAIN.match(name):
        problems.append(f"metadata.name: Invalid value: {name!r}: a lowercase RFC 1123 subdomain")
    if metadata.get("namespace") not in (None, "", namespace):
        problems.append("metadata.namespace: Invalid value: the namespace of the object does not match the request's")
    for key, value in (metadata.get("labels") or {}).items():
        if len(value) > 63 or not LABEL_VALUE.match(value) or len(key.rsplit("/", 1)[-1]) > 63:
            problems.append(f"metadata.labels: Invalid value: {key}={value!r}")
    size = sum(len(key) + len(value) for key, value in (metadata.get("annotations") or {}).items())
    if size > MAX_ANNOTATIONS:
        problems.append(f"metadata.annotations: Too long: must have at most {MAX_ANNOTATIONS} bytes")
    for field in ("acquireTime", "renewTime"):
        if field in spec and not MICRO_TIME.match(spec[field]):
            problems.append(f"spec.{field}: Invalid value: {spec[field]!r}: not a MicroTime")
    if spec.get("leaseDurationSeconds") is not None and spec["leaseDurationSeconds"] <= 0:
        problems.append("spec.leaseDurationSeconds: Invalid value: must be greater than 0")
    if spec.get("leaseTransitions") is not None and spec["leaseTransitions"] < 0:
        problems.append("spec.leaseTransitions: Invalid value: must be greater than or equal to 0")
    return problems


def granted_verbs(service_account: str, namespace: str = "team-a", release: str = "26.03") -> set[str]:
    """The verbs on leases RBAC grants `service_account` on a cluster of `release` where the admin and the profile
    owner applied the project's manifests (tests/fake_rbac.py)."""
    from tests.fake_rbac import NAMESPACE, Rbac

    rbac = Rbac.installed(release)  # every profile is installed alike: asked of the stand-in's own profile
    user = f"system:serviceaccount:{NAMESPACE}:{service_account}"
    return {verb for verb in set(VERBS.values()) if rbac.allows(user, verb, "coordination.k8s.io", "leases", NAMESPACE)}


_REQUIREMENT = re.compile(r"\s*([\w./-]+)\s*(?:(!=|==|=)\s*([\w.-]*)|\s+(in|notin)\s*\(([^)]*)\))?\s*$")


def selects(selector: str, labels: dict[str, str]) -> bool:
    """Whether a label selector (the API server's syntax: `k=v`, `k==v`, `k!=v`, `k in (a,b)`, `k notin (a)`, `k`,
    joined by commas outside parentheses) selects `labels`; a malformed one is refused as the server refuses it."""
    requirements = re.split(r",(?![^()]*\))", selector) if selector.strip() else []
    for requirement in requirements:
        match = _REQUIREMENT.fullmatch(requirement)
        if match is None:
            raise Refused(400, "BadRequest", f"unable to parse requirement: {requirement!r}")
        key, operator, value, set_operator, values = match.groups()
        if operator in ("=", "=="):
            if labels.get(key) != value:
                return False
        elif operator == "!=":
            if labels.get(key) == value:
                return False
        elif set_operator:
            members = {member.strip() for member in values.split(",")}
            if (labels.get(key) in members) != (set_operator == "in") or (set_operator == "in" and key not in labels):
                return False
        elif key not in labels:
            return False
    return True


class LeaseStore:
    """The Leases of an API server: what its handlers do once the caller is known (`verbs`: what RBAC grants the
    caller on leases in `namespace`)."""

    def __init__(self):
        self.leases: dict[tuple[str, str], dict] = {}
        self._versions = itertools.count(1000)
        self._lock = threading.Lock()

    def serve(
        self, method: str, namespace: str, name: str | None, user: str, verbs: set[str], raw: bytes, selector: str = ""
    ):
        verb = VERBS.get((method, name is not None))
        if verb is None:
            raise Refused(405, "MethodNotAllowed", f"{method} is not supported")
        if verb not in verbs:
            target = (
                f'leases.coordination.k8s.io "{name}" is forbidden'
                if name
                else "leases.coordination.k8s.io is forbidden"
            )
            raise Refused(
                403, "Forbidden", f'{target}: User "{user}" cannot {verb} resource "leases" in API group '
                f'"coordination.k8s.io" in the namespace "{namespace}"',
            )  # fmt: skip
        body = json.loads(raw) if raw else None
        with self._lock:
            if verb == "get":
                return 200, self._existing(namespace, name)
            if verb == "list":
                items = [lease for (ns, _n), lease in self.leases.items()
                         if ns == namespace and selects(selector, lease["metadata"].get("labels") or {})]  # fmt: skip
                return 200, {"apiVersion": "coordination.k8s.io/v1", "kind": "LeaseList", "items": items,
                             "metadata": {"resourceVersion": str(next(self._versions))}}  # fmt: skip
            if verb == "delete":
                current = self._existing(namespace, name)
                if body is not None:
                    check_model(body, "V1DeleteOptions", "body")
                    expected = ((body or {}).get("preconditions") or {}).get("resourceVersion")
                    if expected is not None and expected != current["metadata"]["resourceVersion"]:
                        raise self._conflict(name)
                del self.leases[(namespace, name)]
                return 200, {"apiVersion": "v1", "kind": "Status", "status": "Success"}
            check_model(body, "V1Lease", "body")
            if body.get("kind", "Lease") != "Lease" or body.get("apiVersion", API[6:]) != "coordination.k8s.io/v1":
                raise Refused(400, "BadRequest", "the body is not a coordination.k8s.io/v1 Lease")
            problems = lease_problems(body, namespace)
            if problems:
                raise Refused(422, "Invalid", f'Lease.coordination.k8s.io "{name}" is invalid: {"; ".join(problems)}')
            metadata = body["metadata"]
            if verb == "create":
                if metadata.get("resourceVersion"):
                    raise Refused(500, "InternalError", "resourceVersion should not be set on objects to be created")
                if (namespace, metadata["name"]) in self.leases:
                    raise Refused(
                        409, "AlreadyExists", f'leases.coordination.k8s.io "{metadata["name"]}" already exists'
                    )
                stored = self._stored(body, namespace, uid=str(uuid.uuid4()), created=_now())
                self.leases[(namespace, metadata["name"])] = stored
                return 201, stored
            current = self._existing(namespace, name)
            if metadata.get("name") != name:
                raise Refused(400, "BadRequest", "the name of the object does not match the name on the URL")
            given = metadata.get("resourceVersion")
            if given is not None and given != current["metadata"]["resourceVersion"]:
                raise self._conflict(name)
            stored = self._stored(body, namespace, current["metadata"]["uid"], current["metadata"]["creationTimestamp"])
            self.leases[(namespace, name)] = stored
            return 200, stored

    def _existing(self, namespace: str, name: str) -> dict:
        if (namespace, name) not in self.leases:
            raise Refused(404, "NotFound", f'leases.coordination.k8s.io "{name}" not found')
        return self.leases[(namespace, name)]

    @staticmethod
    def _conflict(name: str) -> Refused:
        return Refused(409, "Conflict", f'Operation cannot be fulfilled on leases.coordination.k8s.io "{name}": the '
                                        "object has been modified; please apply your changes to the latest version "
                                        "and try again")  # fmt: skip

    def _stored(self, body: dict, namespace: str, uid: str, created: str) -> dict:
        stored = json.loads(json.dumps(body))
        stored.update(apiVersion="coordination.k8s.io/v1", kind="Lease")
        stored["metadata"].update(namespace=namespace, uid=uid, creationTimestamp=created,
                                  resourceVersion=str(next(self._versions)))  # fmt: skip
        now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
        stored["metadata"]["managedFields"] = [  # the server's own record of each write, on its clock
            {"manager": "python-kubernetes", "operation": "Update", "apiVersion": "coordination.k8s.io/v1",
             "time": now, "fieldsType": "FieldsV1", "fieldsV1": {}}
        ]  # fmt: skip
        stored.setdefault("spec", {})
        return stored


class FakeCoordinationApi:
    def __init__(self, folder: Path, namespace: str = "team-a", service_account: str = "default-editor"):
        self.folder = Path(folder)
        self.namespace = namespace
        self.service_account = service_account
        self.user = f"system:serviceaccount:{namespace}:{service_account}"
        self.token = uuid.uuid4().hex
        self.verbs = granted_verbs(service_account)
        self.store = LeaseStore()
        self.leases = self.store.leases
        self.requests: list[tuple[str, str, int]] = []  # (method, path, status)
        self.down = False
        # answers a proxy in front gives instead of the API's, one per request (not applied): (status, JSON body or
        # bytes of HTML, headers), e.g. (429, {...}, {"Retry-After": "1"}), (200, b"<html>...", {})
        self.faults: list[tuple[int, dict | bytes, dict[str, str]] | tuple[str, float] | str] = []
        self.folder.mkdir(parents=True, exist_ok=True)
        certificate, key = self.folder / "ca.crt", self.folder / "server.key"
        subprocess.run(
            ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=127.0.0.1",
             "-addext", "subjectAltName=IP:127.0.0.1", "-keyout", str(key), "-out", str(certificate)],
            check=True, capture_output=True,
        )  # fmt: skip
        (self.folder / "token").write_text(self.token)
        (self.folder / "namespace").write_text(namespace)
        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(certificate, key)
        self.server.socket = context.wrap_socket(self.server.socket, server_side=True)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def port(self) -> int:
        return self.server.server_address[1]

    def pod_environment(self) -> dict[str, str]:
        """What a pod's containers get: the API's address; the service account's files are in `folder`."""
        return {"KUBERNETES_SERVICE_HOST": "127.0.0.1", "KUBERNETES_SERVICE_PORT": str(self.port),
                "CIFAR10_PIPELINE_SERVICE_ACCOUNT": str(self.folder)}  # fmt: skip

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def __enter__(self) -> FakeCoordinationApi:
        return self

    def __exit__(self, *_exception) -> None:
        self.stop()

    def lease(self, name: str) -> dict | None:
        return self.leases.get((self.namespace, name))

    # -- the API ------------------------------------------------------------------------------------------------

    def handle(self, method: str, path: str, headers: dict, raw: bytes) -> tuple[int, dict]:
        fault = self.faults.pop(0) if self.faults else None  # a fault proxy in front: see the module's description
        if fault == "close":
            raise Unanswered()
        if isinstance(fault, tuple) and fault[0] == "hang":
            time.sleep(fault[1])
            raise Unanswered()
        if fault is not None and fault != "close-applied":
            return fault
        answer = self._serve_api(method, path, headers, raw)
        if fault == "close-applied":
            raise Unanswered()
        return answer

    def _serve_api(self, method: str, path: str, headers: dict, raw: bytes) -> tuple[int, dict]:
        if self.down:
            raise Refused(503, "ServiceUnavailable", "the server is currently unable to handle the request")
        scheme, _, token = {key.lower(): value for key, value in headers.items()}.get("authorization", "").partition(
            " "
        )
        if scheme.lower() != "bearer" or token.strip() != self.token:  # the scheme is case-insensitive (RFC 7235)
            raise Refused(401, "Unauthorized", "Unauthorized")
        match = re.fullmatch(rf"{API}/namespaces/([^/]+)/leases(?:/([^/]+))?", path)
        if match is None:
            raise Refused(404, "NotFound", f"the server could not find the requested resource ({path})")
        namespace, name = match.group(1), match.group(2)
        verbs = self.verbs if namespace == self.namespace else set()
        return self.store.serve(method, namespace, name, self.user, verbs, raw)

    def _handler(self):
        api = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def _serve(self, method: str) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length) if length else b""
                path = self.path.split("?", 1)[0]
                extra: dict[str, str] = {}
                try:
                    answered = api.handle(method, path, dict(self.headers), raw)
                    status, answer = answered[0], answered[1]
                    extra = answered[2] if len(answered) > 2 else {}
                except Unanswered:
                    api.requests.append((method, path, None))
                    self.close_connection = True
                    return
                except Refused as refused:
                    status = refused.status
                    answer = {"apiVersion": "v1", "kind": "Status", "status": "Failure", "message": str(refused),
                              "reason": refused.reason, "code": refused.status}  # fmt: skip
                api.requests.append((method, path, status))
                html = isinstance(answer, bytes)
                content = answer if html else json.dumps(answer).encode()
                self.send_response(status)
                self.send_header("Content-Type", "text/html" if html else "application/json")
                self.send_header("Content-Length", str(len(content)))
                for name, value in extra.items():
                    self.send_header(name, value)
                self.end_headers()
                self.wfile.write(content)

            def do_GET(self):
                self._serve("GET")

            def do_POST(self):
                self._serve("POST")

            def do_PUT(self):
                self._serve("PUT")

            def do_DELETE(self):
                self._serve("DELETE")

            def log_message(self, *_arguments):
                pass

        return Handler


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
