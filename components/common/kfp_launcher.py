"""The artifact store as KFP's own launcher finds it: the namespace's `kfp-launcher` ConfigMap.

KFP's launcher reads `defaultPipelineRoot` and, since KFP 2.2 (kubeflow/pipelines #10625), `providers`: per scheme
(`s3`, `minio`) a `default` endpoint, region and credentials, and ordered `overrides` for a bucket and key prefix,
the first that matches winning (backend/src/v2/config/s3.go, ProvideSessionInfo). Credentials are `fromEnv` or a
`secretRef` (secretName, accessKeyKey, secretKeyKey) in the namespace. A step in a pod takes the same settings for
the location it uses, so an admin who moved the store configures it once, where KFP reads it.
"""

from __future__ import annotations

import base64
import functools
import logging
from dataclasses import dataclass
from typing import Any

from components.common import coordination, documents

logger = logging.getLogger(__name__)

CONFIG_MAP = "kfp-launcher"
KFP_DEFAULT_PIPELINE_ROOT = "minio://mlpipeline/v2/artifacts"  # the launcher's own default (config/env.go)
PROVIDERS = ("s3", "minio")  # the schemes whose providers describe an S3-compatible store


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


def matching(providers: dict, bucket: str, key: str) -> tuple[dict, str] | None:
    """The launcher's choice for s3://bucket/key: the first override of the bucket whose keyPrefix begins the key,
    over its provider's default; with where it came from. None when the providers name no S3-compatible store."""
    for scheme in PROVIDERS:
        config = _mapping(providers.get(scheme), scheme)
        if not config:
            continue
        default = _mapping(config.get("default"), f"{scheme}.default")
        for index, override in enumerate(config.get("overrides") or []):
            override = _mapping(override, f"{scheme}.overrides[{index}]")
            if override.get("bucketname") == bucket and key.startswith(str(override.get("keyprefix") or "")):
                merged = {**default, **{name: value for name, value in override.items() if value not in (None, "")}}
                return merged, f"providers.{scheme}.overrides[{index}]"
        if default:
            return default, f"providers.{scheme}.default"
    return None


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


def settings_from(data: dict[str, str], bucket: str, key: str, read_secret) -> StoreSettings | None:
    """The settings a ConfigMap's `data` gives s3://bucket/key; None when it names none. `read_secret(name)` returns
    a secret's data (decoded)."""
    text = data.get("providers")
    if not text:
        return None
    chosen = matching(_parsed(text), bucket, key)
    if chosen is None:
        return None
    config, where = chosen
    endpoint = config.get("endpoint")
    credentials = _mapping(config.get("credentials"), f"{where}.credentials")
    keys = None
    if credentials and not credentials.get("fromenv"):
        reference = _mapping(credentials.get("secretref"), f"{where}.credentials.secretRef")
        name = reference.get("secretname")
        if not name:
            raise LauncherConfigError(f"kfp-launcher {where}.credentials: neither fromEnv nor a secretRef.secretName")
        secret = read_secret(name)
        secret_ref = (name, reference.get("accesskeykey"), reference.get("secretkeykey"))
        try:
            keys = (secret[secret_ref[1]], secret[secret_ref[2]])
        except KeyError as missing:
            raise LauncherConfigError(f"kfp-launcher {where}: the secret {name} has no key {missing}") from None
    return StoreSettings(
        endpoint_url(str(endpoint), config.get("disablessl")) if endpoint else None,
        str(config["region"]) if config.get("region") else None,
        keys,
        f"the kfp-launcher ConfigMap's {where}",
        secret_ref if keys else None,
    )


@functools.cache
def _launcher_data() -> tuple[tuple[str, str], ...] | None:
    """This pod's namespace's kfp-launcher data (None where there is none or it may not be read)."""

    if not coordination.available():
        return None
    from kubernetes import client

    api_client, namespace = coordination.in_cluster_client()
    try:
        config_map = client.CoreV1Api(api_client).read_namespaced_config_map(CONFIG_MAP, namespace, _request_timeout=30)
    except Exception as error:
        status = getattr(error, "status", None)
        if status in (403, 404):
            return None
        raise
    return tuple(sorted((config_map.data or {}).items()))


@functools.cache
def _read_secret(name: str) -> dict[str, str]:
    from kubernetes import client

    api_client, namespace = coordination.in_cluster_client()
    secret = client.CoreV1Api(api_client).read_namespaced_secret(name, namespace, _request_timeout=30)
    return {key: base64.b64decode(value).decode() for key, value in (secret.data or {}).items()}


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
    settings = settings_from(dict(data), bucket, key, _read_secret)
    if settings is not None and settings not in _said:
        _said.add(settings)
        logger.info("object store for s3://%s/%s: %s (%s%s)", bucket, key, settings.endpoint or "AWS S3",
                    settings.source, ", its secret's keys" if settings.keys else "")  # fmt: skip
    return settings


def forget() -> None:
    _launcher_data.cache_clear()
    _read_secret.cache_clear()
    _said.clear()
