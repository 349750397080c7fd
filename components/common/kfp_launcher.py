"""The artifact store as KFP's own launcher finds it: the namespace's `kfp-launcher` ConfigMap.

KFP's launcher reads `defaultPipelineRoot` and, since KFP 2.2 (kubeflow/pipelines #10625), `providers`: per scheme
(`s3`, `minio`) a `default` endpoint, region and credentials, and ordered `overrides` for a bucket and key prefix,
the first that matches winning (backend/src/v2/config/s3.go, ProvideSessionInfo). Credentials are `fromEnv` or a
`secretRef` (secretName, accessKeyKey, secretKeyKey) in the namespace. A step in a pod takes the same settings for
the location it uses, read by the same rules, so an admin who moved the store configures it once, where KFP reads it:
the provider by the location's scheme (the pipeline root's for its bucket), KFP's refusals (overrides without a
default, no credentials, no secretRef), the `s3.amazonaws.com` endpoint KFP drops, and `fromEnv` as the pod's KFP
release reads it (2.5 to 2.16 ignore the provider's endpoint then; 2.17 keeps it).
"""

from __future__ import annotations

import base64
import functools
import logging
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from components.common import coordination, documents, pod

logger = logging.getLogger(__name__)

CONFIG_MAP = "kfp-launcher"
KFP_DEFAULT_PIPELINE_ROOT = "minio://mlpipeline/v2/artifacts"  # the launcher's own default (config/env.go)
# backend/src/v2/objectstore/object_store.go: an endpoint this matches is dropped (the SDK's own AWS endpoint)
AWS_ENDPOINT = re.compile(r"^(https://)?s3.amazonaws.com")
# From this release on, a provider with fromEnv credentials keeps its endpoint and region (object_store.go 2.17.0:
# HasStructuredS3Settings); 2.5 to 2.16 open the bucket from the environment alone, the provider's endpoint ignored.
FROM_ENV_KEEPS_ENDPOINT = (2, 17)
NEWEST_RELEASE = "2.17.0"  # assumed where this pod's KFP release cannot be read (said)


@dataclass(frozen=True)
class StoreSettings:
    """Where an S3-compatible location is and with which keys, and which part of the ConfigMap said so."""

    endpoint: str | None
    region: str | None
    keys: tuple[str, str] | None  # (access key id, secret key) from the named secret; None: from the environment
    source: str
    secret_ref: tuple[str, str, str] | None = None  # (secret, its access key's key, its secret key's key)


class LauncherConfigError(ValueError):
    """The kfp-launcher ConfigMap cannot be used as written (names the field)."""


def _mapping(value: Any, where: str) -> dict:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise LauncherConfigError(f"kfp-launcher providers: {where} is not a mapping")
    return {str(key).lower(): item for key, item in value.items()}  # the launcher's JSON decoding ignores case


def _text(value: Any, where: str) -> str:
    if value is None:
        return ""
    if not isinstance(value, str | int | float) or isinstance(value, bool):
        raise LauncherConfigError(f"kfp-launcher providers: {where} is not a string")
    return str(value)


def provider_of(bucket: str, pipeline_root: str) -> str:
    """The provider KFP's launcher reads for a location: by its scheme (backend/src/v2/config/env.go,
    GetStoreSessionInfo: `minio://` reads `providers.minio`, `s3://` reads `providers.s3`). KFP names the artifacts
    of its pipeline root with the root's scheme; the project's other locations in that bucket are the same store,
    any other is s3://."""
    scheme, _, rest = pipeline_root.partition("://")
    return "minio" if scheme == "minio" and rest.split("/", 1)[0] == bucket else "s3"


def _credentials(config: dict, where: str) -> dict:
    """The credentials of a provider's default or override, as KFP's launcher refuses them (config/s3.go)."""
    credentials = _mapping(config.get("credentials"), f"{where}.credentials")
    if not credentials:
        raise LauncherConfigError(f"kfp-launcher {where}: no credentials (KFP refuses it: 'invalid provider config')")
    if not credentials.get("fromenv") and not _mapping(credentials.get("secretref"), f"{where}.credentials.secretRef"):
        raise LauncherConfigError(
            f"kfp-launcher {where}.credentials: neither fromEnv: true nor a secretRef (KFP's launcher fails on it)"
        )
    return credentials


def session(providers: dict, provider: str, bucket: str, key: str) -> tuple[dict, str] | None:
    """KFP's session for {provider}://bucket/key (config/s3.go ProvideSessionInfo): the provider's default, its
    first override for the bucket whose keyPrefix begins the key laid over it (non-empty fields), the credentials of
    whichever decides them; with where it came from. None where the provider has no configuration (KFP: `minio`
    takes the release's store with the mlpipeline-minio-artifact secret, `s3` the environment)."""
    config = _mapping(providers.get(provider), provider)
    default = _mapping(config.get("default"), f"{provider}.default")
    overrides = config.get("overrides")
    if not default and not overrides:
        return None
    if overrides is not None and not isinstance(overrides, list):
        raise LauncherConfigError(f"kfp-launcher providers: {provider}.overrides is not a list")
    if not default:
        raise LauncherConfigError(
            f"kfp-launcher providers.{provider}: overrides without a default (KFP refuses it: 'missing default "
            "credentials')"
        )
    chosen = {**default, "credentials": _credentials(default, f"providers.{provider}.default")}
    where = f"providers.{provider}.default"
    for index, override in enumerate(overrides or []):
        override = _mapping(override, f"{provider}.overrides[{index}]")
        here = f"providers.{provider}.overrides[{index}]"
        prefix = _text(override.get("keyprefix"), f"{here}.keyPrefix")
        if _text(override.get("bucketname"), f"{here}.bucketName") == bucket and key.startswith(prefix):
            laid = {name: value for name, value in override.items() if value not in (None, "")}
            chosen = {**chosen, **laid, "credentials": _credentials(override, here)}
            where = here
            break
    return chosen, where


@functools.lru_cache(maxsize=4)
def _parsed(text: str) -> dict:

    try:
        return _mapping(documents.load(text, "the kfp-launcher ConfigMap's providers", "providers"), "providers")
    except documents.DocumentError as error:
        raise LauncherConfigError(str(error)) from None


def endpoint_url(endpoint: str, disable_ssl: Any) -> str:
    """The launcher's endpoint (host[:port], or a URL) as a URL."""
    if "://" in endpoint:
        return endpoint
    return f"{'http' if disable_ssl is True else 'https'}://{endpoint}"


def _release_key(release: str) -> tuple[int, int]:
    match = re.match(r"v?(\d+)\.(\d+)", release)
    return (int(match.group(1)), int(match.group(2))) if match else FROM_ENV_KEEPS_ENDPOINT


def settings_from(
    data: dict[str, str], bucket: str, key: str, read_secret, release: Callable[[], str] | str = NEWEST_RELEASE
) -> StoreSettings | None:
    """The settings a ConfigMap's `data` gives s3://bucket/key as KFP `release`'s launcher reads them (a callable:
    asked only where the release matters); None when it names none (the release's store, or the environment).
    `read_secret(name)` returns a secret's data (decoded)."""
    text = data.get("providers")
    if not text:
        return None
    provider = provider_of(bucket, data.get("defaultPipelineRoot") or KFP_DEFAULT_PIPELINE_ROOT)
    chosen = session(_parsed(text), provider, bucket, key)
    if chosen is None:
        return None
    config, where = chosen
    endpoint = _text(config.get("endpoint"), f"{where}.endpoint")
    region = _text(config.get("region"), f"{where}.region")
    if AWS_ENDPOINT.match(endpoint.lower()):
        endpoint = ""  # KFP drops it: the SDK's own endpoint for the region
    credentials = config["credentials"]
    release = release() if callable(release) else release
    if credentials.get("fromenv") and _release_key(release) < FROM_ENV_KEEPS_ENDPOINT:
        logger.info("kfp-launcher %s: fromEnv on KFP %s opens the bucket from the environment alone (its endpoint "
                    "and region are not read before 2.17)", where, release)  # fmt: skip
        return None
    keys = secret_ref = None
    if not credentials.get("fromenv"):
        reference = _mapping(credentials.get("secretref"), f"{where}.credentials.secretRef")
        names = [_text(reference.get(field), f"{where}.credentials.secretRef.{field}")
                 for field in ("secretname", "accesskeykey", "secretkeykey")]  # fmt: skip
        if not all(names):
            raise LauncherConfigError(
                f"kfp-launcher {where}.credentials.secretRef: secretName, accessKeyKey and secretKeyKey are all needed"
            )
        secret = read_secret(names[0])
        secret_ref = (names[0], names[1], names[2])
        try:
            keys = (secret[names[1]], secret[names[2]])
        except KeyError as missing:
            raise LauncherConfigError(f"kfp-launcher {where}: the secret {names[0]} has no key {missing}") from None
    return StoreSettings(
        endpoint_url(endpoint, config.get("disablessl")) if endpoint else None,
        region or None,
        keys,
        f"the kfp-launcher ConfigMap's {where}",
        secret_ref,
    )


@functools.cache
def _launcher_data() -> tuple[tuple[str, str], ...] | None:
    """This pod's namespace's kfp-launcher data (None where there is none or it may not be read)."""

    if not coordination.available():
        return None
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    from components.common import access

    api_client, namespace = coordination.in_cluster_client()
    api = client.CoreV1Api(api_client)
    try:
        config_map = coordination.call(
            "read",
            lambda: api.read_namespaced_config_map(
                CONFIG_MAP, namespace, _request_timeout=coordination.REQUEST_SECONDS
            ),
            namespace,
            thing=f"the {CONFIG_MAP} ConfigMap",
            check=_answer_of_kind("ConfigMap", f"the {CONFIG_MAP} ConfigMap"),
        )
    except access.AccessError:  # a namespace whose steps may not read it: KFP's own defaults, as its launcher's
        return None
    except ApiException as error:
        if error.status == 404:
            return None
        raise
    data = config_map.data or {}
    if not all(isinstance(value, str) for value in data.values()):
        raise LauncherConfigError(f"the {CONFIG_MAP} ConfigMap's data holds a value that is not a string")
    return tuple(sorted(data.items()))


def _answer_of_kind(kind: str, thing: str):
    """A check of an answer: the API's object of `kind` (an HTML page parses into an object of no fields)."""

    def check(answer) -> None:
        if getattr(answer, "metadata", None) is None or not getattr(answer.metadata, "name", None):
            raise coordination.NotTheApiError(
                f"the Kubernetes API's answer to reading {thing} is not a {kind} (an HTML page: a proxy's login, or an "
                "address that is not the API server's?); check KUBERNETES_SERVICE_HOST"
            )

    return check


@functools.cache
def _read_secret(name: str) -> dict[str, str]:
    """The secret a provider's secretRef names, decoded; each refusal in one line naming the secret and the key
    (never a value of it)."""
    import binascii

    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    api_client, namespace = coordination.in_cluster_client()
    api = client.CoreV1Api(api_client)
    where = f"the secret {name} (named by the {CONFIG_MAP} ConfigMap's providers)"
    try:
        secret = coordination.call(
            "read",
            lambda: api.read_namespaced_secret(name, namespace, _request_timeout=coordination.REQUEST_SECONDS),
            namespace,
            thing=where,
            forbidden=f"this pod may not read {where} in namespace {namespace} (403): grant its service account get "
            "on that secret, or name one it may read",
            check=_answer_of_kind("Secret", where),
        )
    except ApiException as error:
        if error.status == 404:
            raise LauncherConfigError(f"{where} does not exist in namespace {namespace}") from None
        raise
    decoded = {}
    for key, value in (secret.data or {}).items():
        try:
            decoded[key] = base64.b64decode(value, validate=True).decode("utf-8")
        except (binascii.Error, ValueError, UnicodeDecodeError):
            raise LauncherConfigError(f"{where}: its key {key!r} is not base64 of UTF-8 text") from None
    return decoded


@functools.cache
def kfp_release() -> str:
    """This pod's KFP release: the tag of its `kfp-launcher` init container's image, which KFP's backend names
    (backend/src/v2/compiler/argocompiler/container.go; ghcr.io/kubeflow/kfp-launcher:2.15.0), else NEWEST_RELEASE
    (said)."""
    from kubernetes import client

    name, _read_from = pod.name_of_this_pod()
    try:
        api_client, namespace = coordination.in_cluster_client()
        this = client.CoreV1Api(api_client).read_namespaced_pod(name or "", namespace, _request_timeout=30)
        images = [c.image or "" for c in this.spec.init_containers or [] if c.name == "kfp-launcher"]
    except Exception as error:  # any failure to read the pod: the newest rules, said
        logger.info("this pod's KFP release cannot be read (%s): the kfp-launcher rules of KFP %s",
                    type(error).__name__, NEWEST_RELEASE)  # fmt: skip
        return NEWEST_RELEASE
    tag = images[0].rpartition(":")[2] if images else ""
    if not re.match(r"v?\d+\.\d+", tag):
        logger.info("this pod's kfp-launcher image %r names no release: the kfp-launcher rules of KFP %s",
                    images[0] if images else None, NEWEST_RELEASE)  # fmt: skip
        return NEWEST_RELEASE
    return tag


def default_pipeline_root() -> str:
    """The namespace's default pipeline root, as KFP's launcher takes it (KFP 2.15+ multi-user:
    minio://mlpipeline/private-artifacts/<namespace>/v2/artifacts), else the launcher's own default."""
    data = dict(_launcher_data() or ())
    return data.get("defaultPipelineRoot") or KFP_DEFAULT_PIPELINE_ROOT


_said: set[StoreSettings] = set()


def store_settings(bucket: str, key: str) -> StoreSettings | None:
    """What this pod's kfp-launcher ConfigMap gives s3://bucket/key (each setting said once), or None."""
    data = _launcher_data()
    if data is None:
        return None
    settings = settings_from(dict(data), bucket, key, _read_secret, kfp_release)
    if settings is not None and settings not in _said:
        _said.add(settings)
        logger.info("object store for s3://%s/%s: %s (%s%s)", bucket, key, settings.endpoint or "AWS S3",
                    settings.source, ", its secret's keys" if settings.keys else "")  # fmt: skip
    return settings


def forget() -> None:
    _launcher_data.cache_clear()
    kfp_release.cache_clear()
    _read_secret.cache_clear()
    _said.clear()
