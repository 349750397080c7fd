"""A strict stand-in for the KFP REST API (v2beta1) on 127.0.0.1, for tests that submit through the real kfp.Client.

No KFP backend can run here, so this server checks what it receives the way the backend would and refuses
anything else with the status the backend uses:
- every request body against the API's own models (the swagger-generated `kfp_server_api` models: no
  unknown field, the declared type for every field, nested models recursively);
- an inline `pipeline_spec` against the PipelineSpec and PlatformSpec protos (strict: unknown fields fail);
- runtime parameters against the pipeline's root input definitions (unknown names and wrong types fail);
- a recurring run's trigger: six-field cron (seconds first) or one of robfig/cron's descriptors (`@daily`,
  `@every 6h`), and `max_concurrency` between 1 and 10.

`multi_user=True` plays a Kubeflow installed from its manifests: the API under `prefix` (Kubeflow serves it under
/pipeline); a request without a bearer token or session cookie redirected (302) to an HTML login page as Kubeflow
1.9.0's oauth2-proxy does (`release="1.9.0"`), or, from Kubeflow 1.9.1 on (kubeflow/manifests #2864; `release="1.9.1"`,
`"1.10"`, the default, and later), refused as its
oauth2-proxy refuses one on its api_routes (`/apis/`): 401, `application/json`, `{}` (oauth2-proxy's errorJSON); an
unknown bearer token refused by Istio's RequestAuthentication (401, text/plain, "Jwt verification fails"); the health
check saying `multi_user`, and experiments, runs, recurring runs
and pipeline uploads refused without a namespace (400) or in a namespace the caller may not use (403), as the
multi-user API server's SubjectAccessReview does. A run's state changes as it is read (PENDING, RUNNING, then
`run_outcome`), with the failed task's error on a failure.

It records every accepted request body in `requests` as (method, path, body), and every request's headers in
`headers_seen`.
"""

from __future__ import annotations

import datetime
import http.server
import json
import re
import threading
import time
import uuid
from typing import Any
from urllib.parse import parse_qs, urlparse

import kfp_server_api
from google.protobuf import json_format
from kfp.pipeline_spec import pipeline_spec_pb2

API = "/apis/v2beta1"
PRIMITIVES = {"str": str, "bool": bool, "int": int, "float": (int, float), "object": object, "datetime": str}
# int64 fields: the generated models type them "str" (proto3 JSON), and the backend's JSON parser takes numbers too.
INT64_FIELDS = {"max_concurrency", "interval_second"}
PARAMETER_TYPES = {
    "STRING": str,
    "NUMBER_INTEGER": int,
    "NUMBER_DOUBLE": (int, float),
    "BOOLEAN": bool,
    "STRUCT": dict,
    "LIST": list,
}


class RefusedError(Exception):
    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


class RedirectedError(Exception):
    """What Kubeflow 1.9's oauth2-proxy answers to a request without a session or a bearer token."""

    def __init__(self, location: str):
        super().__init__(location)
        self.location = location


class GatewayError(Exception):
    """An answer of the gateway in front of the API (oauth2-proxy, Istio), not of the API server: its own body."""

    def __init__(self, status: int, body: bytes, content_type: str):
        super().__init__(body.decode())
        self.status, self.body, self.content_type = status, body, content_type


# robfig/cron v1's descriptors, which the KFP API server's `cron.Parse` takes beside six fields
ROBFIG_DESCRIPTORS = ("@yearly", "@annually", "@monthly", "@weekly", "@daily", "@midnight", "@hourly")
LOGIN_PATH = "/oauth2/start"
LOGIN_PAGE = b"<!DOCTYPE html><html><head><title>Log in to Kubeflow</title></head><body><form>...</form></body></html>"


def check_model(value: Any, type_name: str, where: str) -> None:
    """`value` (decoded JSON) must be what the generated client model `type_name` describes, with nothing else."""
    if value is None:
        return
    if type_name.startswith("list["):
        if not isinstance(value, list):
            raise RefusedError(400, f"{where}: expected a list, got {type(value).__name__}")
        for index, item in enumerate(value):
            check_model(item, type_name[5:-1], f"{where}[{index}]")
        return
    if type_name.startswith("dict("):
        if not isinstance(value, dict):
            raise RefusedError(400, f"{where}: expected an object, got {type(value).__name__}")
        inner = type_name[5:-1].split(", ", 1)[1]
        for key, item in value.items():
            check_model(item, inner, f"{where}.{key}")
        return
    if type_name in PRIMITIVES:
        expected = PRIMITIVES[type_name]
        if type_name == "int" and isinstance(value, str) and re.fullmatch(r"-?\d+", value):
            return  # int64 fields travel as strings in proto3 JSON
        if not isinstance(value, expected) or (expected is int and isinstance(value, bool)):
            raise RefusedError(400, f"{where}: expected {type_name}, got {value!r}")
        return
    model = getattr(kfp_server_api.models, type_name)
    if not model.openapi_types:  # an enum: a string among its allowed values
        allowed = [v for k, v in vars(model).items() if k.isupper() and isinstance(v, str)]
        if value not in allowed:
            raise RefusedError(400, f"{where}: {value!r} is not one of {allowed}")
        return
    if not isinstance(value, dict):
        raise RefusedError(400, f"{where}: expected a {type_name} object, got {type(value).__name__}")
    fields = {json_name: model.openapi_types[python_name] for python_name, json_name in model.attribute_map.items()}
    for key, item in value.items():
        if key not in fields:
            raise RefusedError(400, f"{where}: unknown field {key!r} for {type_name} (known: {sorted(fields)})")
        if key in INT64_FIELDS and isinstance(item, int) and not isinstance(item, bool):
            continue
        check_model(item, fields[key], f"{where}.{key}")


def check_pipeline_spec(document: dict) -> dict:
    """The inline spec the client sends ({pipeline_spec, platform_spec} or a bare PipelineSpec); returns the former."""
    if "pipeline_spec" in document:
        pipeline, platform = document["pipeline_spec"], document.get("platform_spec", {})
        extra = set(document) - {"pipeline_spec", "platform_spec"}
        if extra:
            raise RefusedError(400, f"pipeline_spec: unknown top-level fields {sorted(extra)}")
    else:
        pipeline, platform = document, {}
    try:
        json_format.ParseDict(pipeline, pipeline_spec_pb2.PipelineSpec())
        json_format.ParseDict(platform, pipeline_spec_pb2.PlatformSpec())
    except json_format.ParseError as error:
        raise RefusedError(400, f"pipeline_spec is not a valid PipelineSpec: {error}") from None
    return pipeline


def check_parameters(pipeline: dict, parameters: dict) -> None:
    declared = pipeline.get("root", {}).get("inputDefinitions", {}).get("parameters", {})
    for name, value in parameters.items():
        if name not in declared:
            raise RefusedError(400, f"runtime_config.parameters: {name!r} is not a parameter of the pipeline")
        kind = declared[name]["parameterType"]
        expected = PARAMETER_TYPES[kind]
        if not isinstance(value, expected) or (kind != "BOOLEAN" and isinstance(value, bool)):
            raise RefusedError(400, f"runtime_config.parameters.{name}: {value!r} is not a {kind}")
    for name, spec in declared.items():
        if name not in parameters and not spec.get("isOptional") and "defaultValue" not in spec:
            raise RefusedError(400, f"runtime_config.parameters: the required parameter {name!r} is missing")


class FakeKfpApi:
    def __init__(
        self,
        multi_user: bool = False,
        port: int = 0,
        prefix: str = "",
        tokens: dict[str, set[str]] | None = None,
        cookies: dict[str, set[str]] | None = None,
        run_outcome: str = "SUCCEEDED",
        instant: bool = False,
        release: str = "1.10",
        backend_version: str = "2.17.0",
    ):
        self.multi_user = multi_user
        self.prefix = prefix
        self.tokens = tokens or {}  # bearer token -> the namespaces its identity may use
        self.cookies = cookies or {}  # session cookie (NAME=VALUE) -> the namespaces
        self.run_outcome = run_outcome
        self.release = release  # "1.9.0": a 302 to the login page without credentials; "1.9.1" and later: 401
        self.backend_version = backend_version  # the health check's tag_name, as the API server names its release
        self.instant = instant  # a run reads as ended at once (for examples that follow a run to its end)
        self.requests: list[tuple[str, str, Any]] = []
        self.headers_seen: list[dict[str, str]] = []
        self.experiments: dict[str, dict] = {}
        self.runs: dict[str, dict] = {}
        self.recurring_runs: dict[str, dict] = {}
        self._reads: dict[str, int] = {}
        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", port), self._handler())
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def __enter__(self) -> FakeKfpApi:
        self._thread.start()
        return self

    def __exit__(self, *_exception) -> None:
        self._server.shutdown()
        self._server.server_close()

    def bodies(self, method: str, path: str) -> list[Any]:
        return [body for m, p, body in self.requests if m == method and p == path]

    # -- the endpoints the kfp client uses ---------------------------------------------------------------------

    def allowed_namespaces(self, headers: dict[str, str], url: str) -> set[str] | None:
        """The namespaces the caller may use; None on a single-user endpoint. Raises what the gateway answers."""
        if not self.multi_user:
            return None
        authorization = headers.get("Authorization", "")
        if authorization.startswith("Bearer "):
            token = authorization[len("Bearer ") :]
            if token not in self.tokens:
                raise GatewayError(401, b"Jwt verification fails", "text/plain")  # Istio's RequestAuthentication
            return self.tokens[token]
        for cookie in headers.get("Cookie", "").split(";"):
            if cookie.strip() in self.cookies:
                return self.cookies[cookie.strip()]
        if self.release != "1.9.0" and "/apis/" in url:  # oauth2-proxy's api_routes from Kubeflow 1.9.1 on
            raise GatewayError(401, b"{}", "application/json")
        raise RedirectedError(f"{LOGIN_PATH}?rd={url}")

    def _namespace_of(self, namespace: str | None, allowed: set[str] | None, where: str) -> None:
        if allowed is None:
            return
        if not namespace:
            raise RefusedError(400, f"Invalid input error: {where}: namespace is empty; multi-user mode requires one")
        if namespace not in allowed:
            raise RefusedError(403, f"PermissionDenied: the caller may not use namespace {namespace!r} ({where})")

    def handle(self, method: str, path: str, query: dict, body: Any, allowed: set[str] | None = None) -> Any:
        if not path.startswith(self.prefix + API):
            raise RefusedError(404, f"{method} {path} is not under {self.prefix + API}")
        path = path[len(self.prefix) :]
        if method == "GET" and path == f"{API}/healthz":
            return {"commit_sha": "unknown", "tag_name": self.backend_version, "multi_user": self.multi_user}
        if method == "GET" and path == f"{API}/experiments":
            self._namespace_of((query.get("namespace") or [None])[0], allowed, "experiments")
            predicates = json.loads(query["filter"][0])["predicates"]
            names = [p.get("stringValue", p.get("string_value")) for p in predicates if p["key"] == "display_name"]
            namespace = (query.get("namespace") or [None])[0]
            found = [
                e
                for e in self.experiments.values()
                if e["display_name"] in names and (allowed is None or e.get("namespace") == namespace)
            ]
            return {"experiments": found, "total_size": len(found)}
        if method == "POST" and path == f"{API}/experiments":
            check_model(body, "V2beta1Experiment", "experiment")
            if not body.get("display_name"):
                raise RefusedError(400, "experiment.display_name is required")
            self._namespace_of(body.get("namespace"), allowed, "experiment")
            experiment = {**body, "experiment_id": str(uuid.uuid4()), "storage_state": "AVAILABLE"}
            self.experiments[experiment["experiment_id"]] = experiment
            return experiment
        if method == "POST" and path == f"{API}/runs":
            check_model(body, "V2beta1Run", "run")
            self._check_submission(body, "run", allowed)
            run = {**body, "run_id": str(uuid.uuid4()), "state": "PENDING", "created_at": _now()}
            self.runs[run["run_id"]] = run
            return run
        if method == "GET" and path.startswith(f"{API}/runs/"):
            return self._read_run(path.rsplit("/", 1)[1], allowed)
        if method == "POST" and path == f"{API}/recurringruns":
            check_model(body, "V2beta1RecurringRun", "recurring_run")
            self._check_submission(body, "recurring_run", allowed)
            self._check_trigger(body)
            status = "ENABLED" if body.get("mode") == "ENABLE" else "DISABLED"
            recurring = {**body, "recurring_run_id": str(uuid.uuid4()), "status": status, "created_at": _now()}
            recurring["namespace"] = self.experiments.get(body.get("experiment_id") or "", {}).get("namespace", "")
            self.recurring_runs[recurring["recurring_run_id"]] = recurring
            return recurring
        if method == "GET" and path == f"{API}/recurringruns":
            return self._list_recurring_runs(query, allowed)
        match = re.fullmatch(rf"{API}/recurringruns/([^/:]+)(:enable|:disable)?", path)
        if match and method in ("DELETE", "POST", "GET"):
            recurring = self.recurring_runs.get(match.group(1))
            if recurring is None:
                raise RefusedError(404, f"recurring run {match.group(1)} not found")
            self._namespace_of(recurring.get("namespace"), allowed, "recurring run")
            if method == "DELETE" and not match.group(2):
                del self.recurring_runs[match.group(1)]
                return {}
            if method == "POST" and match.group(2):
                enabled = match.group(2) == ":enable"
                recurring.update(status="ENABLED" if enabled else "DISABLED", mode="ENABLE" if enabled else "DISABLE")
                return {}
            if method == "GET" and not match.group(2):
                return recurring
        if method == "POST" and path == f"{API}/pipelines/upload":
            self._namespace_of((query.get("namespace") or [None])[0], allowed, "pipeline upload")
            name = (query.get("name") or ["pipeline"])[0]
            return {"pipeline_id": str(uuid.uuid4()), "display_name": name, "created_at": _now()}
        raise RefusedError(404, f"{method} {path} is not an endpoint of this stand-in")

    def _list_recurring_runs(self, query: dict, allowed: set[str] | None) -> dict:
        """GET /recurringruns: in a namespace (multi-user: one, or an experiment, is required), filtered by
        display_name, `page_size` to a page with a next_page_token, as the backend pages."""
        namespace = (query.get("namespace") or [None])[0]
        experiment = (query.get("experiment_id") or [None])[0]
        if allowed is not None and not experiment:
            self._namespace_of(namespace, allowed, "recurring runs")
        found = [r for r in self.recurring_runs.values() if allowed is None or r.get("namespace") == namespace]
        found = [r for r in found if not experiment or r.get("experiment_id") == experiment]
        if query.get("filter"):
            predicates = json.loads(query["filter"][0])["predicates"]
            for predicate in predicates:
                if predicate.get("key") != "display_name" or predicate.get("operation") != "EQUALS":
                    raise RefusedError(400, f"filter: this stand-in knows display_name EQUALS, not {predicate}")
                name = predicate.get("string_value", predicate.get("stringValue"))
                found = [r for r in found if r["display_name"] == name]
        found.sort(key=lambda r: r["created_at"])
        start = int((query.get("page_token") or ["0"])[0] or 0)
        size = int((query.get("page_size") or ["10"])[0])
        page = found[start : start + size]
        answer = {"recurringRuns": page, "total_size": len(found)}  # the proto field is named so (recurring_run.proto)
        if start + size < len(found):
            answer["next_page_token"] = str(start + size)
        check_model(answer, "V2beta1ListRecurringRunsResponse", "recurring runs (as answered)")
        return answer

    def _read_run(self, run_id: str, allowed: set[str] | None) -> dict:
        """A run advances a state each time it is read: PENDING, RUNNING, then the stand-in's `run_outcome`."""
        if run_id not in self.runs:
            raise RefusedError(404, f"run {run_id} not found")
        run = self.runs[run_id]
        self._namespace_of(self.experiments[run["experiment_id"]].get("namespace"), allowed, "run")
        reads = self._reads[run_id] = self._reads.get(run_id, 0) + 1
        state = ("PENDING", "RUNNING")[reads - 1] if reads <= 2 and not self.instant else self.run_outcome
        run = {**run, "state": state}
        if state == "FAILED":
            error = {"code": 2, "message": "train: the workers' step failed: loss is NaN at step 12"}
            root = {"task_id": "t-root", "display_name": "cifar10-pipeline", "state": "FAILED", "error": error}
            failed = {
                "task_id": "t-train",
                "parent_task_id": "t-root",
                "display_name": "launch-training-job-component",
                "state": "FAILED",
                "error": error,
                "end_time": _now(),
            }
            done = {"task_id": "t-prepare", "parent_task_id": "t-root", "display_name": "prepare-data-component"}
            run["run_details"] = {"task_details": [root, {**done, "state": "SUCCEEDED"}, failed]}
            run["error"] = {"code": 2, "message": "the run failed"}
        if state in ("SUCCEEDED", "FAILED", "CANCELED"):
            run["finished_at"] = _now()
        check_model(run, "V2beta1Run", "run (as answered)")
        return run

    def _check_submission(self, body: dict, where: str, allowed: set[str] | None = None) -> None:
        if not body.get("display_name"):
            raise RefusedError(400, f"{where}.display_name is required")
        if body.get("experiment_id") and body["experiment_id"] not in self.experiments:
            raise RefusedError(404, f"{where}.experiment_id {body['experiment_id']!r} does not exist")
        if allowed is not None:
            experiment = self.experiments.get(body.get("experiment_id") or "")
            self._namespace_of(experiment and experiment.get("namespace"), allowed, where)
        if ("pipeline_spec" in body) == ("pipeline_version_reference" in body):
            raise RefusedError(400, f"{where}: give exactly one of pipeline_spec and pipeline_version_reference")
        pipeline = check_pipeline_spec(body["pipeline_spec"])
        check_parameters(pipeline, (body.get("runtime_config") or {}).get("parameters") or {})
        numbers = re.match(r"(\d+)\.(\d+)", self.backend_version)  # "unknown": a build that names no release
        older = bool(numbers) and tuple(map(int, numbers.groups())) < (2, 14)
        # as 2.5.0 refuses it: backend/src/v2/compiler/argocompiler/dag.go:629
        if older and "taskFinalStatus" in json.dumps(pipeline):
            raise RefusedError(400, "Failed to compile job: task final status not supported yet")

    @staticmethod
    def _check_trigger(body: dict) -> None:
        cron = ((body.get("trigger") or {}).get("cron_schedule") or {}).get("cron")
        if cron is None:
            raise RefusedError(400, "recurring_run.trigger.cron_schedule.cron is required by this stand-in")
        descriptor = cron in ROBFIG_DESCRIPTORS or re.fullmatch(r"@every (?:[0-9.]+(?:ns|us|ms|s|m|h))+", cron)
        if not descriptor and len(cron.split()) != 6:
            raise RefusedError(400, f"recurring_run.trigger.cron_schedule.cron {cron!r}: KFP's cron has six fields")
        concurrency = int(body.get("max_concurrency") or 0)
        if not 1 <= concurrency <= 10:
            raise RefusedError(400, f"recurring_run.max_concurrency {concurrency} must be between 1 and 10")
        if body.get("mode") not in ("ENABLE", "DISABLE"):
            raise RefusedError(400, f"recurring_run.mode {body.get('mode')!r} must be ENABLE or DISABLE")

    def _handler(self):
        api = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def _serve(self, method: str) -> None:
                url = urlparse(self.path)
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length) if length else b""
                headers = {name.title(): value for name, value in self.headers.items()}  # HTTP names: any case
                api.headers_seen.append(headers)
                if url.path == LOGIN_PATH:
                    return self._send(200, LOGIN_PAGE, "text/html")
                try:
                    allowed = api.allowed_namespaces(headers, self.path)
                    is_json = raw and "json" in (self.headers.get("Content-Type") or "application/json")
                    body = json.loads(raw) if is_json else None
                    response, status = api.handle(method, url.path, parse_qs(url.query), body, allowed), 200
                    api.requests.append((method, url.path[len(api.prefix) :], body))
                except GatewayError as refusal:
                    return self._send(refusal.status, refusal.body, refusal.content_type)
                except RedirectedError as redirect:
                    self.send_response(302)
                    self.send_header("Location", redirect.location)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return None
                except RefusedError as error:
                    response, status = {"error": str(error), "code": 3, "message": str(error)}, error.status
                return self._send(status, json.dumps(response).encode(), "application/json")

            def _send(self, status: int, content: bytes, content_type: str) -> None:
                self.send_response(status)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(content)))
                self.end_headers()
                self.wfile.write(content)

            def do_GET(self):
                self._serve("GET")

            def do_POST(self):
                self._serve("POST")

            def do_DELETE(self):
                self._serve("DELETE")

            def log_message(self, *_arguments):
                pass

        return Handler


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat()


def describe(method: str, path: str, body: Any) -> str:
    """One readable paragraph of what the backend received."""
    if not isinstance(body, dict) or "pipeline_spec" not in body:
        return f"{method} {path} {json.dumps(body, sort_keys=True) if body else ''}".rstrip()
    spec = body["pipeline_spec"]["pipeline_spec"]
    dags = [spec["root"]["dag"]] + [c["dag"] for c in spec.get("components", {}).values() if "dag" in c]
    cached = sorted(
        name for dag in dags for name, task in dag["tasks"].items() if task.get("cachingOptions", {}).get("enableCache")
    )
    settings = {
        key: body[key] for key in ("display_name", "max_concurrency", "no_catchup", "trigger", "mode") if key in body
    }
    return (
        f"{method} {path} {json.dumps(settings, sort_keys=True)}\n"
        f"  parameters: {json.dumps(body.get('runtime_config', {}).get('parameters', {}), sort_keys=True)}\n"
        f"  tasks that may come from the cache: {cached}"
    )


def main() -> None:
    """Serve on 127.0.0.1 and print every accepted request: `python -m tests.fake_kfp_api [--port 8888]`."""
    import argparse

    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("--port", type=int, default=8888)
    port = parser.parse_args().port
    api = FakeKfpApi(port=port)
    seen = 0
    with api:
        print(f"KFP API stand-in on {api.url}", flush=True)
        while True:
            time.sleep(0.2)
            for method, path, body in api.requests[seen:]:
                print(describe(method, path, body), flush=True)
            seen = len(api.requests)


if __name__ == "__main__":
    main()
