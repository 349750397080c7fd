"""Registration of a promoted version in Kubeflow's Model Registry (optional: on when a registry address is given).

After a promotion has moved the pointer, the version is recorded where the rest of the platform looks for models:
a registered model (`registered_model_name`), its version (the promotion's integer version, as text), and the
version's model artifact: the version folder's URI (what KServe copies: docs/serving.md), format `tensorflow` at
the TensorFlow Serving release the root declares (else the TensorFlow that wrote it), and where it came from (the
KFP run, as the artifact's model source). The version's custom properties hold the lineage a reader asks for:
accuracy and the gate's decision, the dataset's manifest digest and source, the train settings, the image, the
promotion root.

The registry is reached through its Python client (`model-registry`, pinned to the release whose OpenAPI document
the tests' stand-in serves), registration by registration, idempotent: a rerun of the step finds what an earlier
attempt made (the model, the version, the artifact) and completes it, and a version already registered with
another URI is refused in one line, never overwritten.

The artifact's URI is the version's own serving folder, `<parent>/registered-<root name>/<N>/`, whose only child is
the version folder `<N>/` (a server-side copy of the promoted `ROOT/<N>/`): TensorFlow Serving loads integer version
folders under its base path, and KServe's storage initializer (v0.15, v0.16) copies what a `storageUri` prefix holds
into that base path, so a plain `storageUri` (or the registry's `model-registry://` initializer, which resolves to
this URI) serves exactly version N. It lies beside the root, not in it: a service of the whole root does not copy it.

A registry that cannot be reached, or refuses, does not undo the promotion: `register_promotion` returns an
outcome that says so in one line (the step logs it and records it among its outputs), and
`python -m components.evaluate.registry` registers the promoted version later.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlparse

from components.common import exit_codes, filesystem, replies, secrets
from components.common.cli import run_stage
from components.common.config import check_fields
from components.common.values import shown

logger = logging.getLogger(__name__)

MODEL_FORMAT = "tensorflow"
TOKEN_PATH_VARIABLE = "KF_PIPELINES_SA_TOKEN_PATH"  # the client's convention: a file holding the bearer token
CA_BUNDLE_VARIABLE = "MODEL_REGISTRY_CA_BUNDLE"  # the CA certificates of an https registry with a private CA
API_PATH = "/api/model_registry/v1alpha3"  # the API of model-registry 0.3.x servers, which the pinned client speaks
MAX_PROBE_BYTES = 64 * 1024
SERVICE_ACCOUNT_TOKEN = Path("/var/run/secrets/kubernetes.io/serviceaccount/token")
ATTEMPTS = 3
RETRY_SECONDS = 1.0
TIMEOUT_SECONDS = 30.0
MAX_NAME = 255
MAX_PROPERTY = 16384  # characters of one text property (the train settings are cut to it, marked)
TRAIN_SETTINGS_SHOWN = ("preset", "epochs", "batch_size", "learning_rate", "weight_decay", "depth", "workers")


class RegistrationError(Exception):
    """The registry refused, or could not be reached (`transient`): the line says which and what to do."""

    def __init__(self, message: str, transient: bool = False):
        super().__init__(message)
        self.transient = transient


def check_address(address: str, field_name: str = "model_registry") -> str:
    """The registry's REST address, http(s)://host[:port], or a ValueError naming the field (an address with
    user:password@ is refused: credentials go in a token file)."""
    secrets.refuse_user_info(address, field_name, f"give the registry's bearer token in a file ({TOKEN_PATH_VARIABLE})")
    parsed = urlparse(address)
    if parsed.scheme not in ("http", "https") or not parsed.hostname or parsed.path not in ("", "/"):
        raise ValueError(
            f"{field_name}: {shown(secrets.without_user_info(address))} is not a Model Registry address: give "
            "http(s)://HOST[:PORT], e.g. "
            "http://model-registry-service.kubeflow.svc.cluster.local:8080"
        )
    try:
        parsed.port  # noqa: B018 (raises on a port that is not a number, or not in 0-65535)
    except ValueError:
        raise ValueError(f"{field_name}: {shown(address)} has a port that is not a port (1 to 65535)") from None
    return address.rstrip("/")


def check_model_name(name: str, field_name: str = "registered_model_name") -> str:
    if not name.strip() or len(name) > MAX_NAME or name != name.strip():
        raise ValueError(f"{field_name}: {shown(name)} is not a registered model name (1 to {MAX_NAME} characters)")
    return name


@dataclass(frozen=True)
class Lineage:
    """Where the promoted model came from, beyond what the pointer says: the KFP run and the image."""

    run_id: str = ""
    run_name: str = ""
    namespace: str = ""
    image: str = ""


@dataclass(frozen=True)
class Registration:
    """What is registered: one version of one model, with its artifact."""

    model_name: str
    version: str
    uri: str
    format_version: str
    description: str
    properties: dict[str, str | int | float | bool] = field(default_factory=dict)
    source: dict[str, str] = field(default_factory=dict)  # model_source_kind, _class, _group, _id, _name


@dataclass(frozen=True)
class Registered:
    """The registration's outcome: registered (or found registered), or not, with the one line that says it."""

    registered: bool
    line: str
    address: str
    model_name: str
    version: str
    model_id: str | None = None
    version_id: str | None = None
    artifact_id: str | None = None

    def summary(self) -> dict:
        return {key: value for key, value in self.__dict__.items() if value is not None}


def _text(value: object) -> str:
    text = value if isinstance(value, str) else json.dumps(value, sort_keys=True)
    return text if len(text) <= MAX_PROPERTY else text[: MAX_PROPERTY - 14] + " ...(shortened)"


def registration_of(model_name: str, pointer: dict, root_uri: str, lineage: Lineage) -> Registration:
    """The registration of the ready version `pointer` (the promotion root's pointer as written: it carries the
    gate's decision, the dataset and the train settings since this release)."""
    serving = pointer.get("serving") or {}
    format_version = serving.get("tensorflow_serving") or serving.get("written_by_tensorflow") or ""
    accuracy = pointer["metrics"]["accuracy"]
    dataset = pointer.get("dataset") or {}
    train_settings = pointer.get("train_settings") or {}
    properties: dict[str, str | int | float | bool] = {
        "accuracy": float(accuracy),
        "gate_decision": pointer.get("gate_decision") or "",
        "promotion_root": root_uri,
        "weights_sha256": pointer.get("weights_sha256") or "",
        "checkpoint": pointer.get("checkpoint") or "",
        "model_dir": pointer.get("model_dir") or "",
        "dataset_manifest_sha256": pointer.get("dataset_manifest_sha256") or "",
        "dataset": dataset.get("uri") or "",
        "dataset_source": _text(dataset.get("source") or ""),
        "synthetic_data": bool(pointer.get("synthetic_data")),
        "num_classes": int(pointer.get("num_classes") or len(pointer.get("label_names") or [])),
        "evaluated_on": _text(pointer.get("evaluation") or {}),
        "train_settings": _text(train_settings),
        "image": lineage.image,
        "kfp_run_id": lineage.run_id,
        "kfp_run_name": lineage.run_name,
        "promoted_at": pointer.get("promoted_at") or "",
    }
    for name in TRAIN_SETTINGS_SHOWN:
        value = train_settings.get(name)
        if isinstance(value, (str, int, float, bool)):
            properties[f"train_{name}"] = value
    source = {
        "model_source_kind": "kfp",
        "model_source_class": "pipelinerun",
        "model_source_group": lineage.namespace,
        "model_source_id": lineage.run_id,
        "model_source_name": lineage.run_name or lineage.run_id,
    }
    description = f"version {pointer['version']} of {root_uri}: test accuracy {accuracy:.4f}"
    return Registration(
        model_name, str(pointer["version"]), serving_folder(root_uri, pointer["version"]), format_version, description,
        properties,
        {key: value for key, value in source.items() if value} if lineage.run_id else {},
    )  # fmt: skip


def serving_folder(root_uri: str, version: int) -> str:
    """Where version `version` of a promotion root is served alone: `<parent>/registered-<root name>/<version>/` (the
    trailing slash: KServe's initializer matches a prefix, and 7 must not match 70)."""

    parent, name = filesystem.parent_and_name(root_uri.rstrip("/"))
    return filesystem.join(parent, f"registered-{name}", str(version)).rstrip("/") + "/"


def publish_serving_folder(root_uri: str, version: int) -> str:
    """Copy `ROOT/<version>/` into its serving folder as `<version>/` (server-side on an object store; objects already
    there with the same checksum are left); returns the folder's URI."""
    from components.common import storage

    root = root_uri.rstrip("/")
    parent, name = filesystem.parent_and_name(root)
    source = storage.publisher_for(filesystem.join(root, str(version)))
    shared = storage.publisher_for(parent)
    target = f"registered-{name}/{version}/{version}"
    names = source.list()
    if not names:
        raise RegistrationError(f"{filesystem.join(root, str(version))}: no SavedModel there to register")
    for relative in names:
        destination = f"{target}/{relative}"
        if shared.checksum(destination) != source.checksum(relative):
            shared.copy(f"{name}/{version}/{relative}", destination)
    return serving_folder(root_uri, version)


def _version_folder(registration: Registration) -> str:
    """The promotion root's own version folder (what releases before the serving folder registered)."""

    return filesystem.join(str(registration.properties.get("promotion_root", "")), registration.version)


def bearer_token() -> str | None:
    """The token the client would send: the file $KF_PIPELINES_SA_TOKEN_PATH names (read as the KFP side reads it:
    components/common/secrets.py), else the pod's service account token, else none."""
    from components.common.secrets import TokenFileError, read_token_file

    path = os.environ.get(TOKEN_PATH_VARIABLE)
    how_to = f"give {TOKEN_PATH_VARIABLE} a file holding the registry's bearer token"
    try:
        if path:
            return read_token_file(Path(path), TOKEN_PATH_VARIABLE, how_to)
        if SERVICE_ACCOUNT_TOKEN.exists():
            return read_token_file(SERVICE_ACCOUNT_TOKEN, "the pod's service account", how_to)
    except TokenFileError as error:
        raise RegistrationError(str(error)) from None
    return None


def ca_bundle() -> str | None:
    """The CA certificates $MODEL_REGISTRY_CA_BUNDLE names, for an https registry whose certificate a private CA
    signed (None: the system's)."""
    path = os.environ.get(CA_BUNDLE_VARIABLE) or None
    if path is not None and not Path(path).is_file():
        raise RegistrationError(f"{CA_BUNDLE_VARIABLE}={path}: no such file (the registry's CA certificates)")
    return path


def _client(address: str, token: str | None, custom_ca: str | None):
    """The registry's client, every answer of which is read bounded and checked to be the registry's JSON."""
    from model_registry.core import ModelRegistryAPIClient
    from mr_openapi import ApiClient, ModelRegistryServiceApi

    parsed = urlparse(address)
    port = parsed.port or (443 if parsed.scheme == "https" else 80)
    server = f"{parsed.scheme}://{parsed.hostname}"
    if parsed.scheme == "https":
        if not token:
            raise RegistrationError(f"{address}: an https registry needs a bearer token ({TOKEN_PATH_VARIABLE})")
        client = ModelRegistryAPIClient.secure_connection(server, port, user_token=token, custom_ca=custom_ca)
    else:
        client = ModelRegistryAPIClient.insecure_connection(server, port, token)

    @contextlib.asynccontextmanager
    async def bounded_client():
        api_client = ApiClient(client.config)
        replies.bound_aiohttp_client(api_client.rest_client, f"the Model Registry at {address}", "the Model Registry")
        try:
            yield ModelRegistryServiceApi(api_client)
        finally:
            await api_client.close()

    client.get_client = bounded_client
    return client


def probe(address: str, token: str | None, custom_ca: str | None) -> None:
    """One bounded request to the API this client speaks, before any registration: says in one line a registry that
    serves another API version (404 from its router), an address that is not the Model Registry (a page, or not
    its JSON), a refused token, a certificate not trusted; RegistrationError (transient for 5xx and no answer)."""
    import requests

    url = f"{address}{API_PATH}/registered_models?pageSize=1"
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    where = f"the Model Registry at {address}"
    try:
        answer = replies.get(url, where, "the Model Registry", headers, (5, TIMEOUT_SECONDS), custom_ca or True,
                             MAX_PROBE_BYTES)  # fmt: skip
    except replies.ReplyError as error:
        raise RegistrationError(str(error)) from None
    except requests.exceptions.SSLError:
        raise RegistrationError(
            f"{where}: its TLS certificate is not trusted; give its CA certificates with {CA_BUNDLE_VARIABLE}=FILE"
        ) from None
    except requests.exceptions.RequestException as error:
        reason = type(error).__name__
        raise RegistrationError(f"{where}: cannot be reached ({reason})", transient=True) from None
    status, kind = answer.status, answer.content_type or "no content type"
    if answer.retirement and 200 <= status < 300:
        logger.warning(
            "%s says the API this client speaks, %s, is being retired (%s): registrations go on; install a "
            "model-registry client that speaks its successor before then", where, API_PATH, answer.retirement,
        )  # fmt: skip
    if status == 404 and not replies.is_json(kind):
        raise RegistrationError(
            f"{where} does not serve {API_PATH} (404 from its router): it runs another API version than this client's "
            "(model-registry 0.3.x servers, as Kubeflow 1.10 to 26.03 install, serve v1alpha3; newer ones only v1)"
        )
    if status in (401, 403):
        raise RegistrationError(
            f"{where} refused the bearer token ({status} {_phrase(status)}); give one it accepts "
            f"({TOKEN_PATH_VARIABLE})"
        )
    if status >= 500 or status == 429:
        raise RegistrationError(f"{where}: HTTP {status} {_phrase(status)}", transient=True)
    if 300 <= status < 400 or not replies.is_json(kind):
        raise RegistrationError(
            f"{where}: the answer to {API_PATH} is not the Model Registry's (HTTP {status}, {kind}): this is not the "
            "Model Registry's REST API; check the address"
        )


async def _get_or_create(find, create):
    """The entity `find()` finds, else the one `create()` makes; a create that loses a race to a concurrent
    registration (409) finds the winner's."""
    from mr_openapi import exceptions as api_errors

    found = await find()
    if found is not None:
        return found, False
    try:
        return await create(), True
    except api_errors.ApiException as error:
        if error.status != 409:
            raise
    found = await find()
    if found is None:
        raise RegistrationError("the registry answered 409 (exists) to a create, then did not find it")
    return found, False


async def _register(api, registration: Registration, author: str) -> tuple[str, str, str, bool]:
    """Get or create the model, the version and its artifact; returns their ids and whether anything was made."""
    from model_registry.types import ModelArtifact, ModelVersion, RegisteredModel

    model, made_model = await _get_or_create(
        lambda: api.get_registered_model_by_params(registration.model_name),
        lambda: api.upsert_registered_model(
            RegisteredModel(name=registration.model_name, owner=author, description="promoted by cifar10-pipeline")
        ),
    )
    version, made_version = await _get_or_create(
        lambda: api.get_model_version_by_params(model.id, registration.version),
        lambda: api.upsert_model_version(
            ModelVersion(
                name=registration.version, author=author, description=registration.description,
                custom_properties=registration.properties,
            ),
            model.id,
        ),
    )  # fmt: skip
    artifact, made_artifact = await _get_or_create(
        lambda: api.get_model_artifact_by_params(name=registration.model_name, model_version_id=version.id),
        lambda: api.upsert_model_version_artifact(
            ModelArtifact(
                name=registration.model_name, uri=registration.uri, model_format_name=MODEL_FORMAT,
                model_format_version=registration.format_version, description=registration.description,
                **registration.source,
            ),
            version.id,
        ),
    )  # fmt: skip
    made = made_model or made_version or made_artifact
    if artifact.uri not in (
        registration.uri,
        _version_folder(registration),
    ):  # the latter: registered by 0.1's releases
        raise RegistrationError(
            f"version {registration.version} of {registration.model_name!r} is registered with {artifact.uri}, not "
            f"{registration.uri}: another promotion root registers under this name (give this one a "
            "registered_model_name of its own)"
        )
    return model.id, version.id, artifact.id, made


def _cause(error: BaseException) -> tuple[str, bool]:
    """What went wrong in one phrase, and whether trying again may help."""
    from mr_openapi import exceptions as api_errors

    if isinstance(error, replies.ReplyError):
        return str(error), False
    if isinstance(error, api_errors.ApiException):
        status = error.status or 0  # the registry's own words are never quoted: it may echo the token it was sent
        return f"HTTP {status} {_phrase(status)}", status >= 500 or status == 429
    if isinstance(error, (OSError, asyncio.TimeoutError)):
        return (f"{type(error).__name__}: {error}" if str(error) else type(error).__name__)[:300], True
    import aiohttp

    if isinstance(error, aiohttp.ClientError):
        return f"{type(error).__name__}: {error}"[:300], True
    raise error


def register(
    address: str, registration: Registration, author: str = "cifar10-pipeline", timeout_seconds: float = TIMEOUT_SECONDS
) -> Registered:
    """Register `registration` at `address` (bounded: ATTEMPTS tries, each within `timeout_seconds`); a
    RegistrationError says in one line why it was not."""
    token, custom_ca = bearer_token(), ca_bundle()
    last, transient = "", False
    for attempt in range(1, ATTEMPTS + 1):
        try:
            probe(address, token, custom_ca)
            api = _client(address, token, custom_ca)
            ids = asyncio.run(asyncio.wait_for(_register(api, registration, author), timeout_seconds))
        except RegistrationError as error:
            if not error.transient:
                raise
            last, transient = str(error).removeprefix(f"the Model Registry at {address}: "), True
            if attempt < ATTEMPTS:
                time.sleep(RETRY_SECONDS * attempt)
            continue
        except Exception as error:
            last, transient = _cause(error)
            if not transient:
                break
            logger.info("the Model Registry at %s: %s (attempt %d of %d)", address, last, attempt, ATTEMPTS)
            if attempt < ATTEMPTS:
                time.sleep(RETRY_SECONDS * attempt)
            continue
        model_id, version_id, artifact_id, made = ids
        how = "registered" if made else "already registered"
        line = (
            f"{how} version {registration.version} of {registration.model_name!r} in the Model Registry at {address} "
            f"(model {model_id}, version {version_id}): {registration.uri}"
        )
        return Registered(True, line, address, registration.model_name, registration.version, model_id, version_id,
                          artifact_id)  # fmt: skip
    raise RegistrationError(f"the Model Registry at {address}: {last}", transient=transient)


def register_promotion(address: str, registration: Registration) -> Registered:
    """Register a promotion that has already happened: whatever the registry does, the promotion stands, and the
    outcome says so in one line (never an exception for the registry's sake)."""
    try:
        publish_serving_folder(str(registration.properties["promotion_root"]), int(registration.version))
        registered = register(address, registration)
    except Exception as error:  # any failure of the registration, the client's own included, is said
        if not isinstance(error, RegistrationError):
            logger.debug("registration failed", exc_info=True)
            first = (str(error).splitlines() or [""])[0][:300]
            error = f"the Model Registry at {address}: {type(error).__name__}: {first}"
        line = secrets.mask(
            f"version {registration.version} was promoted, but not registered in the Model Registry: {error}. The "
            "promotion stands; register it later with: python -m components.evaluate.registry "
            f"--promotion-root {registration.properties.get('promotion_root')} --model-registry {address} "
            f"--registered-model-name {registration.model_name}"
        )
        logger.warning("%s", line)
        return Registered(False, line, address, registration.model_name, registration.version)
    logger.info("%s", registered.line)
    return registered


# -- registering the promoted version later ----------------------------------------------------------------------


def register_current(config: RegisterConfig) -> Registered:
    """Register the version the promotion root's pointer names (what a failed registration left to do)."""
    from components.evaluate.pointer import read_pointer, ready_version

    pointer = ready_version(read_pointer(config.promotion_root)[0])
    if pointer is None:
        raise RegistrationError(f"{config.promotion_root}: nothing is promoted there yet")
    registration = registration_of(config.registered_model_name, pointer, config.promotion_root, Lineage())
    publish_serving_folder(config.promotion_root, pointer["version"])
    return register(config.model_registry, registration)


@dataclass(frozen=True)
class RegisterConfig:
    promotion_root: str = field(metadata={"help": "folder, gs:// or s3:// prefix holding current.json"})
    model_registry: str = field(metadata={"help": "http(s)://HOST[:PORT] of the Model Registry's REST API"})
    registered_model_name: str = field(default="cifar10", metadata={"help": "the registered model"})

    def __post_init__(self) -> None:
        check_fields(self)
        object.__setattr__(self, "model_registry", check_address(self.model_registry))
        check_model_name(self.registered_model_name)


def run(config: RegisterConfig) -> int:
    """Exit 0 registered; 145 when the registry kept failing (try again later); 2 for what to fix first."""
    try:
        print(secrets.mask(register_current(config).line))
    except RegistrationError as error:
        if not error.transient:
            raise
        logger.error("%s (exit %d)", error, exit_codes.STORE_UNAVAILABLE)
        return exit_codes.STORE_UNAVAILABLE
    return 0


def main(argv: list[str] | None = None) -> int:
    return run_stage(
        RegisterConfig,
        run,
        argv,
        "Register the promotion root's current version in Kubeflow's Model Registry.",
        "python -m components.evaluate.registry",
        expected_errors=(ValueError, RegistrationError),
    )


if __name__ == "__main__":
    sys.exit(main())


def _phrase(status: int) -> str:
    """The status's standard phrase: what a request that carried a token may say of the server's answer (its own
    text may echo the token, in any encoding)."""
    import http

    try:
        return http.HTTPStatus(status).phrase
    except ValueError:
        return "(an unknown status)"
