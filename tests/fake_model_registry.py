"""A strict stand-in for Kubeflow's Model Registry REST API on 127.0.0.1, for tests that register through the real
`model-registry` client.

No Model Registry server can run here, so this one serves the API as its published OpenAPI document defines it
(`tests/vendor/model-registry-v0.3.8-openapi.yaml`, the document of the client's release) and checks everything it
receives against that document, the way the server's generated routes do:
- the path and method must be an operation of the document (anything else: 404 / 405);
- every query parameter must be one the operation declares, of its declared type and enum;
- every request body is validated against the operation's schema, closed (the server decodes with
  DisallowUnknownFields): an unknown field, a missing required one, a wrong type, an enum value not listed, a
  read-only field sent by the client, or a `oneOf` whose discriminator names no alternative is a 400;
- with `token`, a request without `Authorization: Bearer <token>` is a 401 (the document's Bearer scheme).
Every answer it gives is validated against the response schema the document declares for that status, and a
mismatch is recorded in `problems` (a test asserts there is none): the stand-in cannot drift from the document
without a test noticing.

Registered models, versions and model artifacts live in memory, with the server's uniqueness rules (a registered
model's name; a version's name within its model; an artifact's name within its version: 409), its "find"
semantics (404 when nothing matches; a version or an artifact found by name needs `parentResourceId`: 400 without
it, as the server refuses), and Go's router for a path it does not serve (404, text/plain, "404 page not found": a
server of another API version, `api_version="v1"`, answers so to every v1alpha3 path). `unavailable = True` answers
503 to everything; `garbled = True` answers 200 with a body that is not the document's (what another service behind
the address would say); `racing` (operation ids) plays a concurrent registration that creates the same entity just
before this client does (its create then gets 409); `tls` (a certificate and key file) serves https; `stop()`
closes the port.
Operations the project's client calls are implemented; any other answers 501, naming it.
"""

from __future__ import annotations

import http.server
import itertools
import json
import re
import threading
import time
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlparse

import yaml

DOCUMENT = Path(__file__).parent / "vendor" / "model-registry-v0.3.8-openapi.yaml"


class RefusedError(Exception):
    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


class NotServedError(RefusedError):
    """A path no route serves: Go's router answers it itself."""


class SchemaChecker:
    """Validates values against the document's schemas (OpenAPI 3.0 subset the document uses: $ref, allOf, oneOf
    with a discriminator, type, format, enum, required, readOnly, additionalProperties, items), closed objects."""

    def __init__(self, document: dict):
        self.document = document

    def resolve(self, schema: dict) -> dict:
        while "$ref" in schema:
            node: Any = self.document
            for part in schema["$ref"].removeprefix("#/").split("/"):
                node = node[part]
            schema = node
        return schema

    def flattened(self, schema: dict) -> dict:
        """allOf merged into one schema (properties, required, the rest of the keys)."""
        schema = self.resolve(schema)
        if "allOf" not in schema:
            return schema
        merged: dict = {"properties": {}, "required": []}
        for part in [*schema["allOf"], {k: v for k, v in schema.items() if k != "allOf"}]:
            part = self.flattened(part)
            merged["properties"].update(part.get("properties", {}))
            merged["required"] += part.get("required", [])
            merged.update({k: v for k, v in part.items() if k not in ("properties", "required")})
        if merged["properties"] or "type" not in merged:
            merged.setdefault("type", "object")
        return merged

    def errors(self, value: Any, schema: dict, where: str, writing: bool) -> list[str]:
        schema = self.flattened(schema)
        if "oneOf" in schema:
            return self._one_of(value, schema, where, writing)
        if value is None:
            return [] if schema.get("nullable") else [f"{where}: null"]
        kind = schema.get("type")
        checks = {
            "object": lambda v: isinstance(v, dict),
            "array": lambda v: isinstance(v, list),
            "string": lambda v: isinstance(v, str),
            "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
            "number": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
            "boolean": lambda v: isinstance(v, bool),
        }
        if kind in checks and not checks[kind](value):
            return [f"{where}: expected {kind}, got {type(value).__name__} {value!r}"]
        if "enum" in schema and value not in schema["enum"]:
            return [f"{where}: {value!r} is not one of {schema['enum']}"]
        if kind == "string" and schema.get("format") == "int64" and not re.fullmatch(r"-?\d+", value):
            return [f"{where}: {value!r} is not an int64 string"]
        if kind == "array":
            return [
                e for i, item in enumerate(value) for e in self.errors(item, schema["items"], f"{where}[{i}]", writing)
            ]
        if kind != "object":
            return []
        properties = schema.get("properties", {})
        found = [
            f"{where}: required field {name!r} missing" for name in schema.get("required", []) if name not in value
        ]
        extra = schema.get("additionalProperties")
        for name, item in value.items():
            if name in properties:
                declared = self.resolve(properties[name])
                if writing and declared.get("readOnly"):
                    found.append(f"{where}.{name}: read-only, set by the server")
                found += self.errors(item, properties[name], f"{where}.{name}", writing)
            elif isinstance(extra, dict):
                found += self.errors(item, extra, f"{where}.{name}", writing)
            elif extra is not True:
                found.append(f"{where}: unknown field {name!r}")
        return found

    def _one_of(self, value: Any, schema: dict, where: str, writing: bool) -> list[str]:
        discriminator = schema.get("discriminator")
        if discriminator and isinstance(value, dict):
            name = value.get(discriminator["propertyName"])
            target = discriminator.get("mapping", {}).get(name)
            if target is None:
                return [
                    f"{where}: {discriminator['propertyName']}={name!r} names none of {list(discriminator['mapping'])}"
                ]
            return self.errors(value, {"$ref": target}, where, writing)
        matching = [option for option in schema["oneOf"] if not self.errors(value, option, where, writing)]
        return [] if len(matching) == 1 else [f"{where}: matches {len(matching)} of the oneOf alternatives"]


class FakeModelRegistry:
    """The server; `address` is http://127.0.0.1:PORT. Records every accepted request as (method, path, query,
    body) in `requests`."""

    def __init__(self, token: str | None = None, api_version: str = "v1alpha3", tls: tuple[str, str] | None = None):
        self.document = yaml.safe_load(DOCUMENT.read_text())
        served = "/api/model_registry/v1alpha3"
        self.document["paths"] = {
            path.replace(served, f"/api/model_registry/{api_version}"): item
            for path, item in self.document["paths"].items()
        }
        self.racing: set[str] = set()
        self.checker = SchemaChecker(self.document)
        self.token = token
        self.unavailable = False
        self.retirement: dict[str, str] = {}  # Deprecation and Sunset headers on every answer (kubeflow/hub #3218)
        self.garbled = False
        self.requests: list[tuple[str, str, dict, Any]] = []
        self.refusals: list[str] = []  # what was refused (status and why): a test shows them when it fails
        self.problems: list[str] = []  # answers of the stand-in that its document does not allow
        self.registered_models: dict[str, dict] = {}
        self.model_versions: dict[str, dict] = {}
        self.artifacts: dict[str, dict] = {}
        self.version_artifacts: dict[str, list[str]] = {}
        self._ids = itertools.count(1)
        self.handlers = {
            "getRegisteredModels": self._list_registered_models,
            "createRegisteredModel": self._create_registered_model,
            "findRegisteredModel": self._find_registered_model,
            "getRegisteredModel": self._get_registered_model,
            "getRegisteredModelVersions": self._list_registered_model_versions,
            "createModelVersion": self._create_model_version,
            "findModelVersion": self._find_model_version,
            "getModelVersion": self._get_model_version,
            "upsertModelVersionArtifact": self._upsert_model_version_artifact,
            "getModelVersionArtifacts": self._list_model_version_artifacts,
            "findModelArtifact": self._find_model_artifact,
        }
        self._lock = threading.Lock()
        self._routes = [
            (re.compile("^" + re.sub(r"\{(\w+)\}", r"(?P<\1>[^/]+)", path) + "$"), path)
            for path in self.document["paths"]
        ]
        registry = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args):  # quiet
                pass

            def _handle(self, method: str):
                status, body = registry.answer(method, self.path, dict(self.headers), self._body())
                plain = isinstance(body, str)  # Go's router's own answer
                data = body.encode() if plain else json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "text/plain; charset=utf-8" if plain else "application/json")
                self.send_header("Content-Length", str(len(data)))
                for name, value in registry.retirement.items():  # a newer server keeping v1alpha3 for a while
                    self.send_header(name, value)
                self.end_headers()
                self.wfile.write(data)

            def _body(self) -> bytes:
                length = int(self.headers.get("Content-Length") or 0)
                return self.rfile.read(length) if length else b""

            def do_GET(self):
                self._handle("get")

            def do_POST(self):
                self._handle("post")

            def do_PATCH(self):
                self._handle("patch")

            def do_DELETE(self):
                self._handle("delete")

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        scheme = "http"
        if tls is not None:
            import ssl

            context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            context.load_cert_chain(*tls)
            self.server.socket = context.wrap_socket(self.server.socket, server_side=True)
            scheme = "https"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()
        self.address = f"{scheme}://127.0.0.1:{self.server.server_address[1]}"

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    # -- the request's way through the document ------------------------------------------------------------------

    def answer(self, method: str, raw_path: str, headers: dict, raw_body: bytes) -> tuple[int, Any]:
        try:
            return self._answer(method, raw_path, headers, raw_body)
        except NotServedError:
            self.refusals.append(f"404 {method.upper()} {raw_path}: not a path this server serves")
            return 404, "404 page not found\n"
        except RefusedError as refused:
            self.refusals.append(f"{refused.status} {method.upper()} {raw_path}: {refused}")
            return refused.status, self._checked_error(refused.status, str(refused))

    def _answer(self, method: str, raw_path: str, headers: dict, raw_body: bytes) -> tuple[int, Any]:
        if self.unavailable:
            raise RefusedError(503, "the registry is unavailable")
        if self.garbled:  # a proxy's page, or another API behind the address: 200, and not the document's answer
            return 200, {"kind": "Status", "message": "not the Model Registry"}
        url = urlparse(raw_path)
        path, operation, path_values = self._operation(method, url.path)
        authorization = {k.lower(): v for k, v in headers.items()}.get("authorization")
        if self.token is not None and authorization != f"Bearer {self.token}":
            raise RefusedError(401, "missing or unknown bearer token")
        query = {name: values[-1] for name, values in parse_qs(url.query, keep_blank_values=True).items()}
        self._check_parameters(path, operation, query)
        body = None
        if "requestBody" in operation:
            try:
                body = json.loads(raw_body or b"null")
            except ValueError as error:
                raise RefusedError(400, f"body is not JSON: {error}") from None
            schema = operation["requestBody"]["content"]["application/json"]["schema"]
            problems = self.checker.errors(body, schema, "body", writing=True)
            if problems:
                raise RefusedError(400, "; ".join(problems))
        elif raw_body:
            raise RefusedError(400, f"{operation['operationId']} takes no body")
        handler = self.handlers.get(operation["operationId"])
        by_name_in_parent = operation["operationId"] in ("findModelVersion", "findModelArtifact")
        if by_name_in_parent and query.get("name") and not query.get("parentResourceId"):
            raise RefusedError(400, "parentResourceId is required when searching by name")
        if operation["operationId"] in self.racing and body is not None:
            self.racing.discard(operation["operationId"])
            with self._lock:  # another registration made the same entity just before this one
                handler(dict(body), dict(query), *path_values.values())
        if handler is None:
            raise RefusedError(501, f"{operation['operationId']} is not implemented by the stand-in")
        with self._lock:
            self.requests.append((method.upper(), url.path, query, body))
            status, answer = handler(body, query, *path_values.values())
        self._check_answer(operation, status, answer)
        return status, answer

    def _operation(self, method: str, path: str) -> tuple[str, dict, dict]:
        for pattern, template in self._routes:
            matched = pattern.match(path)
            if matched:
                item = self.document["paths"][template]
                if method not in item:
                    raise RefusedError(405, f"{template} has no {method.upper()}")
                return template, item[method], matched.groupdict()
        raise NotServedError(404, f"no such path {path}")

    def _check_parameters(self, template: str, operation: dict, query: dict) -> None:
        declared = {}
        for parameter in [*self.document["paths"][template].get("parameters", []), *operation.get("parameters", [])]:
            parameter = self.checker.resolve(parameter)
            declared[parameter["name"]] = parameter
        for name, value in query.items():
            parameter = declared.get(name)
            if parameter is None or parameter["in"] != "query":
                raise RefusedError(400, f"unknown query parameter {name!r} for {operation['operationId']}")
            schema = self.checker.flattened(parameter["schema"])
            if schema.get("type") == "integer" and not re.fullmatch(r"-?\d+", value):
                raise RefusedError(400, f"query parameter {name}={value!r} is not an integer")
            if "enum" in schema and value not in schema["enum"]:
                raise RefusedError(400, f"query parameter {name}={value!r} is not one of {schema['enum']}")

    def _check_answer(self, operation: dict, status: int, answer: Any) -> None:
        response = operation["responses"].get(str(status))
        if response is None:
            self.problems.append(f"{operation['operationId']}: status {status} is not a declared response")
            return
        schema = self.checker.resolve(response)["content"]["application/json"]["schema"]
        self.problems += self.checker.errors(answer, schema, f"{operation['operationId']} answer", writing=False)

    def _checked_error(self, status: int, message: str) -> dict:
        answer = {"code": str(status), "message": message}
        self.problems += self.checker.errors(answer, {"$ref": "#/components/schemas/Error"}, "error", writing=False)
        return answer

    # -- the registry ----------------------------------------------------------------------------------------------

    def _new(self, body: dict, **server_fields) -> dict:
        now = str(int(time.time() * 1000))
        entity = {"customProperties": {}, **body, **server_fields}
        entity.update(id=str(next(self._ids)), createTimeSinceEpoch=now, lastUpdateTimeSinceEpoch=now)
        return entity

    @staticmethod
    def _page(items: list[dict], query: dict) -> dict:
        size = int(query.get("pageSize") or 100)
        return {"items": items[:size], "size": min(size, len(items)), "pageSize": size, "nextPageToken": ""}

    def _find(self, table: dict, query: dict, parent_field: str | None = None) -> tuple[int, dict]:
        for entity in table.values():
            if query.get("name") and entity.get("name") != query["name"]:
                continue
            if query.get("externalId") and entity.get("externalId") != query["externalId"]:
                continue
            if parent_field and query.get("parentResourceId") and entity.get(parent_field) != query["parentResourceId"]:
                continue
            if not (query.get("name") or query.get("externalId")):
                continue
            return 200, entity
        raise RefusedError(404, f"no entity matches {query}")

    def _list_registered_models(self, body, query):
        return 200, self._page(list(self.registered_models.values()), query)

    def _create_registered_model(self, body, query):
        if any(model["name"] == body["name"] for model in self.registered_models.values()):
            raise RefusedError(409, f"a registered model named {body['name']!r} exists")
        model = self._new(body, state=body.get("state", "LIVE"))
        self.registered_models[model["id"]] = model
        return 201, model

    def _find_registered_model(self, body, query):
        return self._find(self.registered_models, query)

    def _get_registered_model(self, body, query, path):
        if path not in self.registered_models:
            raise RefusedError(404, f"no registered model {path}")
        return 200, self.registered_models[path]

    def _list_registered_model_versions(self, body, query, path):
        self._get_registered_model(body, query, path)
        versions = [v for v in self.model_versions.values() if v["registeredModelId"] == path]
        return 200, self._page(versions, query)

    def _create_model_version(self, body, query):
        parent = body["registeredModelId"]
        if parent not in self.registered_models:
            raise RefusedError(404, f"no registered model {parent}")
        siblings = [v for v in self.model_versions.values() if v["registeredModelId"] == parent]
        if any(version["name"] == body["name"] for version in siblings):
            raise RefusedError(409, f"registered model {parent} has a version named {body['name']!r}")
        version = self._new(body, state=body.get("state", "LIVE"))
        self.model_versions[version["id"]] = version
        self.version_artifacts[version["id"]] = []
        return 201, version

    def _find_model_version(self, body, query):
        return self._find(self.model_versions, query, "registeredModelId")

    def _get_model_version(self, body, query, path):
        if path not in self.model_versions:
            raise RefusedError(404, f"no model version {path}")
        return 200, self.model_versions[path]

    def _upsert_model_version_artifact(self, body, query, path):
        self._get_model_version(body, query, path)
        names = {self.artifacts[a].get("name") for a in self.version_artifacts[path]}
        if body.get("name") in names:
            raise RefusedError(409, f"model version {path} has an artifact named {body['name']!r}")
        artifact = self._new(body, state=body.get("state", "UNKNOWN"))
        self.artifacts[artifact["id"]] = {**artifact, "_version": path}
        self.version_artifacts[path].append(artifact["id"])
        return 201, artifact

    def _list_model_version_artifacts(self, body, query, path):
        self._get_model_version(body, query, path)
        return 200, self._page([self.artifact(a) for a in self.version_artifacts[path]], query)

    def _find_model_artifact(self, body, query):
        status, found = self._find(self.artifacts, query, "_version")
        return status, self.artifact(found["id"])

    def artifact(self, artifact_id: str) -> dict:
        return {k: v for k, v in self.artifacts[artifact_id].items() if not k.startswith("_")}

    # -- what a test reads -------------------------------------------------------------------------------------------

    def registered(self, model_name: str, version_name: str) -> tuple[dict, dict, list[dict]]:
        """The registered model, its version and the version's artifacts (KeyError when absent)."""
        model = next(m for m in self.registered_models.values() if m["name"] == model_name)
        version = next(
            v
            for v in self.model_versions.values()
            if v["registeredModelId"] == model["id"] and v["name"] == version_name
        )
        return model, version, [self.artifact(a) for a in self.version_artifacts[version["id"]]]
