"""The object stores behind `storage.publisher_for`: Cloud Storage (gs://) and S3-compatible stores (s3://,
KFP's minio://), their clients, and one-line explanations of their connection and credential errors.

The publishing rules are those of `components.common.stores`, which this module implements for the two remote
back ends; nothing else imports it directly but tests (for the clients).

It owns the two back ends, each with its preconditions, its client and the explanation of its errors.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from components.common import access, coordination, kfp_launcher, pod, secrets
from components.common.causes import causes
from components.common.filesystem import (
    CRC32C_METADATA,
    GCS_SCHEME,
    S3_SCHEME,
    ClientUnavailableError,
    StorageError,
    StoreUnavailableError,
    UnsafeStoreError,
    assume_single_writer,
    can_connect,
    crc32c_base64,
    normalize_uri,
    split_gcs_uri,
    split_uri,
)
from components.common.stores import ABSENT, conflict_error

logger = logging.getLogger(__name__)

GCS_ENDPOINT = "https://storage.googleapis.com"
# What a KFP 2.15+ profile's S3 keys may use (kubeflow/pipelines pipelines-profile-controller sync.py).
PROFILE_PREFIXES = (
    "mlpipeline/private/<namespace>/ (kept), mlpipeline/private-artifacts/<namespace>/ (pipeline roots; expired by "
    "artifact retention when the admin sets it), mlpipeline/shared/ and mlpipeline/artifacts/"
)
_PROBE_ATTEMPTS, _PROBE_TIMEOUT_SECONDS = 3, 5.0
# A document's store copy, swapped through a namespace's Leases, names that namespace (user metadata).
COORDINATED_BY_METADATA = "coordinated-by"


def gcs_endpoint() -> str:
    return os.environ.get("STORAGE_EMULATOR_HOST") or GCS_ENDPOINT


def _reachable(endpoint: str) -> bool:
    """Whether a TCP connection to the endpoint opens, tried a few times (the client library would instead retry
    silently for two minutes before failing with a traceback)."""
    from urllib.parse import urlsplit

    parts = urlsplit(endpoint if "://" in endpoint else f"http://{endpoint}")
    port = parts.port or (443 if parts.scheme == "https" else 80)
    for attempt in range(_PROBE_ATTEMPTS):
        if can_connect(parts.hostname, port, _PROBE_TIMEOUT_SECONDS):
            return True
        if attempt + 1 < _PROBE_ATTEMPTS:
            time.sleep(1.0)
    return False


@functools.lru_cache(maxsize=1)
def gcs_client():
    """A Cloud Storage client (the emulator's when `STORAGE_EMULATOR_HOST` is set); StorageError, in seconds, when
    the endpoint cannot be reached (checked directly unless a proxy is configured) or no credentials are found."""
    from google.auth.exceptions import DefaultCredentialsError
    from google.cloud import storage

    endpoint = gcs_endpoint()
    proxied = any(os.environ.get(name) for name in ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy"))
    if (endpoint != GCS_ENDPOINT or not proxied) and not _reachable(endpoint):
        reason = f"cannot reach Cloud Storage at {endpoint} (no connection); check the network"
        raise ClientUnavailableError(GCS_SCHEME, reason)
    try:
        return storage.Client()
    except DefaultCredentialsError as error:
        raise ClientUnavailableError(
            GCS_SCHEME,
            f"no usable Google Cloud credentials ({str(error).splitlines()[0][:200]}): set "
            "GOOGLE_APPLICATION_CREDENTIALS to a service-account key file, or run under Workload Identity",
        ) from error


# The S3-compatible store each Kubeflow release installs, as its pods reach it (kubeflow/manifests; KFP's own
# SeaweedFS service, `manifests/kustomize/third-party/seaweedfs`): found by name where no endpoint is set.
KUBEFLOW_STORES = (
    ("seaweedfs.kubeflow", "http://seaweedfs.kubeflow:8333", "SeaweedFS (Kubeflow 1.11 and later, KFP 2.15 and later)"),
    ("minio-service.kubeflow", "http://minio-service.kubeflow:9000", "MinIO (Kubeflow 1.10 and older)"),
)


def s3_endpoint(bucket: str | None = None, key: str = "") -> str | None:
    """The S3 endpoint for s3://bucket/key: AWS_ENDPOINT_URL_S3 or AWS_ENDPOINT_URL when set; else, in a Kubernetes
    pod, what the namespace's kfp-launcher ConfigMap gives the location (components/common/kfp_launcher.py), else the
    store the Kubeflow release installed (SeaweedFS or MinIO, whichever service name resolves); else None (AWS S3)."""

    given = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
    if given:
        variable = "AWS_ENDPOINT_URL_S3" if os.environ.get("AWS_ENDPOINT_URL_S3") else "AWS_ENDPOINT_URL"
        secrets.refuse_user_info(given, variable, "give the keys as AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY")
    if given or not pod.in_kubernetes_pod():
        return given or None
    settings = launcher_settings(bucket, key)
    if settings is not None:
        return settings.endpoint
    return kubeflow_store()


def launcher_settings(bucket: str | None, key: str):
    """The kfp-launcher ConfigMap's settings for the location, where no endpoint is given and this is a pod."""

    if bucket is None or os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL"):
        return None
    return kfp_launcher.store_settings(bucket, key)


@functools.lru_cache(maxsize=1)
def kubeflow_store() -> str | None:
    """The endpoint of the Kubeflow release's store, found by its service's name (said once), or None."""
    import socket

    for name, endpoint, what in KUBEFLOW_STORES:
        try:
            socket.getaddrinfo(name, None)
        except OSError:
            continue
        logger.info("object store: %s, %s (found in the cluster; AWS_ENDPOINT_URL names another)", endpoint, what)
        return endpoint
    return None


@functools.lru_cache(maxsize=8)
def _s3_client(endpoint: str | None, region: str, keys: tuple[str, str] | None = None):
    import boto3
    from botocore.config import Config

    config = Config(
        # Third-party S3 stores (MinIO, SeaweedFS) reject or mishandle the checksum headers newer botocore sends
        # by default; checksums are ours (CRC32C metadata) and verified on read.
        request_checksum_calculation="when_required",
        response_checksum_validation="when_required",
        retries={"max_attempts": 4, "mode": "standard"},
        connect_timeout=10,
        read_timeout=120,
        s3={"addressing_style": "path"} if endpoint else {},
    )
    credentials = {"aws_access_key_id": keys[0], "aws_secret_access_key": keys[1]} if keys else {}
    return boto3.session.Session().client("s3", endpoint_url=endpoint, region_name=region, config=config, **credentials)


def s3_client(bucket: str | None = None, key: str = ""):
    """A boto3 S3 client for s3://bucket/key: the endpoint, region and keys the environment names now, or the
    kfp-launcher ConfigMap gives the location (one client per endpoint, region and keys, reused)."""
    region = os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION")
    settings = launcher_settings(bucket, key)
    if settings is not None:
        return _s3_client(settings.endpoint, settings.region or region or "us-east-1", settings.keys)
    return _s3_client(s3_endpoint(), region or "us-east-1")  # the settings asked: the environment's, or the guess


def reset_clients() -> None:
    """Forget the cached clients and checked stores (after the environment that configures them changed, e.g. in
    tests)."""

    gcs_client.cache_clear()
    _s3_client.cache_clear()
    kubeflow_store.cache_clear()
    kfp_launcher.forget()
    coordination.documents.cache_clear()
    forget_checked_stores()


class GcsPublisher:
    """A gs:// prefix. Every write carries a generation precondition, so a lost race is detected, never silent."""

    def __init__(self, root_uri: str):
        self.root = root_uri.rstrip("/")
        self.bucket_name, self.prefix = split_gcs_uri(self.root)

    def _bucket(self):
        return gcs_client().bucket(self.bucket_name)

    def _object_name(self, name: str) -> str:
        return f"{self.prefix}/{name}" if self.prefix else name

    def uri(self, name: str) -> str:
        return f"{GCS_SCHEME}{self.bucket_name}/{self._object_name(name)}"

    def read(self, name: str) -> bytes | None:
        return self.read_versioned(name)[0]

    def read_versioned(self, name: str) -> tuple[bytes | None, str]:
        """The content and generation of an object, read together (the download is pinned to the generation)."""
        from google.api_core import exceptions

        blob = self._get(name)
        if blob is None:
            return None, ABSENT
        try:
            with _gcs_errors(self.uri(name)):
                content = retried_read(
                    self.uri(name), lambda: blob.download_as_bytes(if_generation_match=blob.generation)
                )
                return content, str(blob.generation)
        except (exceptions.NotFound, exceptions.PreconditionFailed):
            return self.read_versioned(name)  # replaced between the two calls: read the new version

    def _get(self, name: str):
        with _gcs_errors(self.uri(name)):
            return self._bucket().get_blob(self._object_name(name))

    def version(self, name: str) -> str:
        blob = self._get(name)
        return ABSENT if blob is None else str(blob.generation)

    def checksum(self, name: str) -> tuple[int, str] | None:
        blob = self._get(name)
        return None if blob is None else (blob.size, blob.crc32c)

    def download(self, name: str, destination: Path) -> None:
        from google.api_core import exceptions

        try:
            with _gcs_errors(self.uri(name)):
                self._bucket().blob(self._object_name(name)).download_to_filename(str(destination))
        except exceptions.NotFound as error:
            raise FileNotFoundError(f"{self.uri(name)} does not exist") from error

    def publish(self, name: str, data: bytes, expected_version: str | None = None) -> str:
        """Upload `data`; with `expected_version` only over that generation (ABSENT: only if nothing is there).
        Returns the generation the upload's answer names."""
        from google.api_core import exceptions

        wanted = (len(data), crc32c_base64(data))
        if expected_version is None:
            blob = self._get(name)
            if blob is not None and (blob.size, blob.crc32c) == wanted:
                return str(blob.generation)
            generation = blob.generation if blob is not None else 0
        else:
            generation = 0 if expected_version == ABSENT else int(expected_version)
        blob = self._bucket().blob(self._object_name(name))
        try:
            with _gcs_errors(self.uri(name)):
                blob.upload_from_string(data, if_generation_match=generation, checksum="crc32c")
        except exceptions.PreconditionFailed:
            current = self._get(name)
            if current is not None and (current.size, current.crc32c) == wanted:
                return str(current.generation)  # another writer published the same bytes
            raise conflict_error(self.uri(name)) from None
        return str(blob.generation)  # set from the upload's answer

    def withdraw(self, name: str) -> None:
        from google.api_core import exceptions

        blob = self._get(name)
        if blob is None:
            return
        try:
            with _gcs_errors(self.uri(name)):
                blob.delete(if_generation_match=blob.generation)
        except (exceptions.NotFound, exceptions.PreconditionFailed):
            logger.info("%s was already removed or replaced by another writer", self.uri(name))

    def copy(self, source: str, destination: str, replace: bool = False) -> None:
        """A server-side copy; to a name that must not exist yet unless `replace`."""
        bucket = self._bucket()
        with _gcs_errors(self.uri(destination)):
            bucket.copy_blob(bucket.blob(self._object_name(source)), bucket, self._object_name(destination),
                             if_generation_match=None if replace else 0)  # fmt: skip

    def list(self, prefix: str = "") -> list[str]:
        start = f"{self.prefix}/" if self.prefix else ""
        with _gcs_errors(self.root):
            blobs = list(gcs_client().list_blobs(self.bucket_name, prefix=start + prefix))
        names = (blob.name[len(start) :] for blob in blobs)
        return sorted(name for name in names if name and not name.rsplit("/", 1)[-1].startswith("."))

    def read_document(self, name: str) -> tuple[bytes | None, str]:
        return self.read_versioned(name)  # generation preconditions: the store's own compare-and-swap

    def swap_document(self, name: str, data: bytes, expected_version: str) -> str:
        return self.publish(name, data, expected_version)

    def withdraw_document(self, name: str, expected_version: str | None = None) -> None:
        """Remove the document; with `expected_version`, only that generation (the store's own precondition)."""
        from google.api_core import exceptions

        if expected_version is None:
            self.withdraw(name)
            return
        if expected_version == ABSENT:
            if self._get(name) is not None:
                raise conflict_error(self.uri(name))
            return
        blob = self._bucket().blob(self._object_name(name))
        try:
            with _gcs_errors(self.uri(name)):
                blob.delete(if_generation_match=int(expected_version))
        except exceptions.NotFound:
            return
        except exceptions.PreconditionFailed:
            raise conflict_error(self.uri(name)) from None


class S3Publisher:
    """An s3:// prefix on AWS S3 or an S3-compatible store (MinIO, SeaweedFS). Writes are conditional
    (`If-None-Match: *` to create, `If-Match: <ETag>` to replace), so a lost race is detected, never silent.
    Every object carries its CRC32C as user metadata, so checksums do not depend on how the store forms ETags."""

    def __init__(self, root_uri: str):
        self.root = normalize_uri(root_uri).rstrip("/")
        _scheme, self.bucket_name, self.prefix = split_uri(self.root)

    def _client(self):
        """The client for this prefix's store (the kfp-launcher ConfigMap may name one per bucket and prefix)."""
        return s3_client(self.bucket_name, self.prefix)

    def _key(self, name: str) -> str:
        return f"{self.prefix}/{name}" if self.prefix else name

    def uri(self, name: str) -> str:
        return f"{S3_SCHEME}{self.bucket_name}/{self._key(name)}"

    def _head(self, name: str) -> dict | None:
        with _s3_errors(self.uri(name)):
            try:
                return self._client().head_object(Bucket=self.bucket_name, Key=self._key(name))
            except _s3_client_error() as error:
                if _s3_status(error) == 404:
                    return None
                raise

    def read(self, name: str) -> bytes | None:
        return self.read_versioned(name)[0]

    def read_versioned(self, name: str) -> tuple[bytes | None, str]:
        """The content and ETag of an object, read together (one GET returns both; read again when cut short)."""
        with _s3_errors(self.uri(name)):
            return retried_read(self.uri(name), lambda: self._get(name))

    def _get(self, name: str) -> tuple[bytes | None, str]:
        try:
            response = self._client().get_object(Bucket=self.bucket_name, Key=self._key(name))
        except _s3_client_error() as error:
            if _s3_status(error) == 404:
                return None, ABSENT
            raise
        body = response["Body"].read()
        length = response.get("ContentLength")
        if length is not None and len(body) != length:
            import http.client

            raise http.client.IncompleteRead(body, length - len(body))
        return body, response["ETag"]

    def version(self, name: str) -> str:
        head = self._head(name)
        return ABSENT if head is None else head["ETag"]

    def checksum(self, name: str) -> tuple[int, str] | None:
        head = self._head(name)
        if head is None:
            return None
        return head["ContentLength"], head.get("Metadata", {}).get(CRC32C_METADATA, "")

    def download(self, name: str, destination: Path) -> None:
        with _s3_errors(self.uri(name)):
            try:
                self._client().download_file(self.bucket_name, self._key(name), str(destination))
            except _s3_client_error() as error:
                if _s3_status(error) == 404:
                    raise FileNotFoundError(f"{self.uri(name)} does not exist") from error
                raise

    def publish(self, name: str, data: bytes, expected_version: str | None = None) -> str:
        """Upload `data`; with `expected_version` only over that ETag (ABSENT: only if nothing is there). Returns
        the ETag the PUT's answer names. On a store that does not honour conditional writes (used with the
        Kubernetes API's coordination, or a single writer assumed) the condition is checked, then the object
        written: only documents need the compare-and-swap, and they go through `swap_document`."""
        wanted = (len(data), crc32c_base64(data))
        conditional = store_mode(self) == CONDITIONAL
        if expected_version is None or not conditional:
            head = self._head(name)
            if head is not None and (head["ContentLength"], head.get("Metadata", {}).get(CRC32C_METADATA)) == wanted:
                return head["ETag"]
            present = ABSENT if head is None else head["ETag"]
            if not conditional:
                if expected_version is not None and expected_version != present:
                    raise conflict_error(self.uri(name))
                return self._put(name, data, wanted[1])
            expected_version = present
        condition = {"IfNoneMatch": "*"} if expected_version == ABSENT else {"IfMatch": expected_version}
        with _s3_errors(self.uri(name)):
            try:
                return self._put(name, data, wanted[1], **condition)
            except _s3_client_error() as error:
                # 412: the precondition failed; 409: a concurrent conditional write to the same key won.
                if _s3_status(error) not in (409, 412):
                    raise
                head = self._head(name)
                if (
                    head is not None
                    and (head["ContentLength"], head.get("Metadata", {}).get(CRC32C_METADATA)) == wanted
                ):
                    return head["ETag"]  # another writer published the same bytes
                raise conflict_error(self.uri(name)) from None

    def _put(self, name: str, data: bytes, crc32c: str, coordinated_by: str = "", **condition) -> str:
        metadata = {CRC32C_METADATA: crc32c, **({COORDINATED_BY_METADATA: coordinated_by} if coordinated_by else {})}
        with _s3_errors(self.uri(name)):
            answer = self._client().put_object(
                Bucket=self.bucket_name, Key=self._key(name), Body=data, Metadata=metadata, **condition
            )
        return answer["ETag"]

    def _check_coordinated_here(self, name: str, namespace: str) -> None:
        """A document whose copy was swapped through another namespace's Leases is not written from this one: its
        Leases are not seen here, so the two would not exclude each other."""
        head = self._head(name)
        other = (head or {}).get("Metadata", {}).get(COORDINATED_BY_METADATA, "")
        if other and other != namespace:
            raise ValueError(
                f"{self.uri(name)}: its writers coordinate through the Leases of namespace {other}, which a step of "
                f"namespace {namespace} does not see (two profiles writing one prefix would not exclude each other): "
                "give each profile a prefix of its own (mlpipeline/private/<namespace>/...), or write it from "
                f"{other}'s runs only"
            )

    def read_document(self, name: str) -> tuple[bytes | None, str]:
        """The document and its version: in a pod, its Lease when it has one (the authority), else the store's
        object. Reading never probes the store (a reader may only read it)."""

        if not coordination.available() or known_mode(self) == CONDITIONAL:
            return self.read_versioned(name)
        try:
            content, version = coordination.documents().read(self.uri(name))
        except access.AccessError:  # not allowed to read Leases here: none was made by this namespace's steps either
            return self.read_versioned(name)
        if version == ABSENT:  # never swapped through the API (written before it was used, or removed): the copy
            return self.read_versioned(name)
        return content, version

    def swap_document(self, name: str, data: bytes, expected_version: str) -> str:
        if store_mode(self) != KUBERNETES:
            return self.publish(name, data, expected_version)

        documents = coordination.documents()
        if not expected_version.startswith(coordination.VERSION_PREFIX):  # the first swap of a store's document
            self._check_coordinated_here(name, documents.namespace)
            current, present = self.read_versioned(name)
            if present != expected_version and current != data:
                raise conflict_error(self.uri(name))
        version = documents.swap(self.uri(name), data, expected_version)
        if documents.still_current(self.uri(name), version):  # the copy, for readers outside the cluster
            self._put(name, data, crc32c_base64(data), coordinated_by=documents.namespace)
        return version

    def withdraw_document(self, name: str, expected_version: str | None = None) -> None:
        """Remove the document; only over `expected_version` when given (a document another writer swapped
        meanwhile is theirs: PublishConflictError): its ETag on the store, its Lease through the Kubernetes API."""
        if store_mode(self) != KUBERNETES:
            if expected_version is None:
                self.withdraw(name)
            else:
                self._withdraw_version(name, expected_version)
            return

        documents = coordination.documents()
        if expected_version is not None and documents.read(self.uri(name))[1] != expected_version:
            raise conflict_error(self.uri(name))
        self.withdraw(name)  # the copy first: a stop in between leaves the document (the truth) standing
        documents.remove(self.uri(name), expected_version)

    def _withdraw_version(self, name: str, expected_version: str) -> None:
        """Delete only `expected_version` (its ETag) of `name`: `If-Match` where the store honours it; checked,
        then deleted, where a single writer is assumed."""
        head = self._head(name)
        if head is None:
            return  # already gone
        if head["ETag"] != expected_version:
            raise conflict_error(self.uri(name))
        with _s3_errors(self.uri(name)):
            try:
                condition = {"IfMatch": expected_version} if store_mode(self) == CONDITIONAL else {}
                self._client().delete_object(Bucket=self.bucket_name, Key=self._key(name), **condition)
            except _s3_client_error() as error:
                if _s3_status(error) == 404:
                    return
                if _s3_status(error) in (409, 412):
                    raise conflict_error(self.uri(name)) from None
                raise

    def withdraw(self, name: str) -> None:
        head = self._head(name)
        if head is None:
            return
        if store_mode(self) != CONDITIONAL:
            with _s3_errors(self.uri(name)):
                self._client().delete_object(Bucket=self.bucket_name, Key=self._key(name))
            return
        with _s3_errors(self.uri(name)):
            try:
                self._client().delete_object(Bucket=self.bucket_name, Key=self._key(name), IfMatch=head["ETag"])
            except _s3_client_error() as error:
                if _s3_status(error) in (404, 409, 412):
                    logger.info("%s was already removed or replaced by another writer", self.uri(name))
                elif _s3_status(error) == 501:  # a store without conditional deletes
                    self._client().delete_object(Bucket=self.bucket_name, Key=self._key(name))
                else:
                    raise

    def copy(self, source: str, destination: str, replace: bool = False) -> None:
        """A server-side copy (the object's CRC32C metadata with it), replacing the destination either way."""
        with _s3_errors(self.uri(destination)):
            self._client().copy_object(
                Bucket=self.bucket_name, Key=self._key(destination), MetadataDirective="COPY",
                CopySource={"Bucket": self.bucket_name, "Key": self._key(source)},
            )  # fmt: skip

    def list(self, prefix: str = "") -> list[str]:
        start = f"{self.prefix}/" if self.prefix else ""
        names = []
        with _s3_errors(self.root):
            pages = (
                self._client().get_paginator("list_objects_v2").paginate(Bucket=self.bucket_name, Prefix=start + prefix)
            )
            for page in pages:
                names.extend(item["Key"][len(start) :] for item in page.get("Contents", []))
        return sorted(name for name in names if name and not name.rsplit("/", 1)[-1].startswith("."))


# -- knowing the store before trusting it ---------------------------------------------------------------------------
# Publishing, the model directory's writer lease and promotion are correct only if the store refuses a second
# create-if-absent and a replace with a stale ETag, and lets exactly one of several concurrent creates win. MinIO
# before 2024 (Kubeflow 1.10 ships RELEASE.2019-08-14) ignores the headers; SeaweedFS 4.00 to 4.16 (Kubeflow 1.11 and
# 26.03) checks, then writes, so concurrent creates all succeed (seaweedfs#8800). So before the first conditional
# write to a bucket, a process tries exactly that, once, on probe objects under the prefix it is about to write.

WORKING_STORES = (
    "AWS S3, MinIO releases from 2024 on, SeaweedFS 4.17 or newer (standalone KFP 2.17 ships 4.34), Ceph RGW; "
    "Kubeflow 1.10's MinIO RELEASE.2019-08-14 and Kubeflow 1.11 and 26.03's SeaweedFS 4.00 are not among them"
)
RACE_WRITERS = 6  # concurrent create-if-absent attempts of the race probe
PROBE_FOLDER = ".store-check"  # hidden: never listed as data
_checked: dict[tuple[str | None, str], str | None] = {}  # (endpoint, bucket) -> what is wrong, or None
_checked_lock = threading.Lock()


CONDITIONAL, KUBERNETES, SINGLE_WRITER = "conditional writes", "the Kubernetes API", "a single writer assumed"


def store_mode(publisher: S3Publisher) -> str:
    """How documents are swapped on this store (checked once per process and bucket, said once): by its conditional
    writes when it honours them; else, chosen by the user, with a single writer assumed; else, in a pod, through the
    Kubernetes API (components/common/coordination.py); else UnsafeStoreError."""
    key = (s3_endpoint(publisher.bucket_name, publisher.prefix), publisher.bucket_name)
    with _checked_lock:
        if key not in _checked:
            started = time.monotonic()
            _checked[key] = conditional_write_problem(publisher)
            logger.debug("checked the conditional writes of %s in %.2f s", publisher.root, time.monotonic() - started)
            problem = _checked[key]
            mode = _mode_for(problem)
            if problem is not None and mode == SINGLE_WRITER:
                logger.warning(
                    "the S3 store at %s does not honour conditional writes (%s); going on because a single writer is "
                    "assumed (%s): concurrent publishers, "
                    "writers of one model directory and promotions are NOT detected and can overwrite each other",
                    key[0] or "AWS S3", problem, "CIFAR10_PIPELINE_ASSUME_SINGLE_WRITER",
                )  # fmt: skip
            elif problem is None:
                logger.info("the S3 store at %s honours conditional writes: documents are swapped by them",
                            key[0] or "AWS S3")  # fmt: skip
            elif mode == KUBERNETES:
                logger.info(
                    "the S3 store at %s does not honour conditional writes (%s): datasets, writer leases and "
                    "promotions are swapped through the Kubernetes API instead", key[0] or "AWS S3", problem,
                )  # fmt: skip
        problem = _checked[key]
    mode = _mode_for(problem)
    if mode is None:
        raise UnsafeStoreError(
            f"{publisher.root}: the S3 store at {key[0] or 'AWS S3'} does not honour conditional writes: "
            f"{problem}. Publishing datasets, the model directory's writer lease and promotion rely on them (a "
            f"concurrent writer would overwrite silently). Stores that honour them: {WORKING_STORES}. In a Kubeflow "
            "step this is no problem: steps in a pod swap them through the Kubernetes API instead. Here, outside a "
            "pod: upgrade the store, or, if you make sure that only one writer at a time uses each dataset, model "
            "directory and promotion root, set CIFAR10_PIPELINE_ASSUME_SINGLE_WRITER=1 (or --assume-single-writer)"
        )
    return mode


def known_mode(publisher: S3Publisher) -> str | None:
    """The store's mode when this process has checked it already, else None (nothing is probed)."""
    key = (s3_endpoint(publisher.bucket_name, publisher.prefix), publisher.bucket_name)
    with _checked_lock:
        if key not in _checked:
            return None
    return _mode_for(_checked[key])


def _mode_for(problem: str | None) -> str | None:

    if problem is None:
        return CONDITIONAL
    if assume_single_writer():
        return SINGLE_WRITER
    return KUBERNETES if coordination.available() else None


def conditional_write_problem(publisher: S3Publisher) -> str | None:
    """What the store does wrong with conditional PUTs, tried on probe objects (removed after), or None."""
    client, bucket = s3_client(publisher.bucket_name, publisher.prefix), publisher.bucket_name
    folder = publisher._key(f"{PROBE_FOLDER}/{uuid.uuid4().hex}")
    created, raced = f"{folder}/create", f"{folder}/race"

    def put(key: str, body: bytes, **condition) -> bool:
        """Whether the PUT was accepted (False: refused by its precondition)."""
        try:
            client.put_object(Bucket=bucket, Key=key, Body=body, **condition)
            return True
        except _s3_client_error() as error:
            if _s3_status(error) in (409, 412):
                return False
            raise

    with _s3_errors(publisher.uri(PROBE_FOLDER)):
        try:
            put(created, b"first", IfNoneMatch="*")
            if put(created, b"second", IfNoneMatch="*"):
                return "a second create-if-absent PUT (If-None-Match: *) of an existing object succeeded"
            if put(created, b"third", IfMatch='"0123456789abcdef0123456789abcdef"'):
                return "a replace with a stale ETag (If-Match) succeeded"
            barrier = threading.Barrier(RACE_WRITERS)

            def create(index: int) -> bool:
                barrier.wait(timeout=30)
                return put(raced, f"writer {index}".encode(), IfNoneMatch="*")

            with ThreadPoolExecutor(RACE_WRITERS) as pool:
                winners = sum(pool.map(create, range(RACE_WRITERS)))
            if winners != 1:
                return (
                    f"{winners} of {RACE_WRITERS} concurrent create-if-absent PUTs of one object succeeded (a "
                    "check-then-write race)"
                )
            return None
        finally:
            for key in (created, raced):
                with contextlib.suppress(Exception):
                    client.delete_object(Bucket=bucket, Key=key)


def forget_checked_stores() -> None:
    with _checked_lock:
        _checked.clear()


def _s3_client_error():
    from botocore.exceptions import ClientError

    return ClientError


def _s3_status(error) -> int:
    return int(error.response.get("ResponseMetadata", {}).get("HTTPStatusCode") or 0)


@contextlib.contextmanager
def _store_errors(uri: str, explain: Callable[[Exception], str | None], endpoint: str) -> Iterator[None]:
    """Turn what `explain` recognises (an unreachable store, missing or refused credentials) into one clear
    StorageError naming the object; anything else passes unchanged."""
    try:
        yield
    except ClientUnavailableError as error:
        raise StorageError(f"{uri}: {error.reason}") from error
    except StorageError:
        raise
    except Exception as error:
        transient = _transient(error)
        if transient is not None:
            raise StoreUnavailableError(
                f"{uri}: the store at {endpoint} kept failing through its retries ({transient}); nothing "
                "half-written is kept, run again later"
            ) from error
        explanation = explain(error)
        if explanation is None:
            raise
        raise StorageError(f"{uri}: {explanation}") from error


TRANSIENT_CODES = frozenset(
    {"SlowDown", "Throttling", "ThrottlingException", "RequestTimeout", "ServiceUnavailable", "InternalError",
     "RequestLimitExceeded", "TooManyRequests", "BandwidthLimitExceeded"}
)  # fmt: skip
RETRIES = 4  # attempts of a read whose body was cut short (the clients retry their own calls: max_attempts)
RETRY_BASE_SECONDS = 0.5


def _transient(error: BaseException) -> str | None:
    """What makes `error` (or an error it came from) a transient store failure, as a few words; None otherwise.
    The one rule for every call to every store: 5xx and throttling answers, connections reset or cut short,
    timeouts."""
    import http.client

    for link in causes(error):
        name = type(link).__name__
        response = getattr(link, "response", None)
        if isinstance(response, dict):  # botocore's ClientError
            code = response.get("Error", {}).get("Code", "")
            status = int(response.get("ResponseMetadata", {}).get("HTTPStatusCode") or 0)
            if code in TRANSIENT_CODES or status >= 500 or status == 429:
                return f"{status} {code}".strip()
        code = getattr(link, "code", None)
        if isinstance(code, int) and (code >= 500 or code == 429) and "google" in type(link).__module__:
            return f"{code} {name}"
        if isinstance(link, http.client.IncompleteRead | ConnectionResetError | TimeoutError):
            return name
        if name in ("ReadTimeoutError", "ConnectionClosedError", "ResponseStreamingError", "IncompleteReadError",
                    "ProtocolError", "ChunkedEncodingError", "ReadTimeout", "RetryError"):  # fmt: skip
            return name
    return None


_CUT_SHORT = frozenset({"IncompleteRead", "ResponseStreamingError", "IncompleteReadError", "ChunkedEncodingError",
                        "ProtocolError", "ConnectionResetError", "ReadTimeoutError", "ReadTimeout"})  # fmt: skip


def _cut_short(error: BaseException) -> bool:
    """Whether `error` (or its cause) is a body cut short after the store had answered: what the clients do not
    retry, since the call itself succeeded."""
    return any(type(link).__name__ in _CUT_SHORT for link in causes(error))


def retried_read(uri: str, read: Callable[[], Any]) -> Any:
    """`read()` again, with backoff, when a transient failure cut it short (a body that ended early, a reset):
    the clients retry their calls, not the reading of a body already answered."""
    for attempt in range(RETRIES):
        try:
            return read()
        except Exception as error:
            if not _cut_short(error) or attempt == RETRIES - 1:
                raise  # the client already retried the call itself (5xx, throttling): not again on top of it
            delay = RETRY_BASE_SECONDS * 2**attempt
            logger.warning("%s: %s; reading it again in %.1f s", uri, _transient(error), delay)
            time.sleep(delay)
    raise AssertionError("unreachable")


def _explain_s3_error(error: Exception, uri: str = "") -> str | None:
    from botocore import exceptions

    endpoint = _endpoint_of(uri) or "AWS S3 (no AWS_ENDPOINT_URL set)"
    if isinstance(error, exceptions.NoCredentialsError):
        return f"no S3 credentials: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (endpoint {endpoint})"
    if isinstance(error, exceptions.EndpointConnectionError | exceptions.ConnectTimeoutError):
        return f"cannot reach the S3 endpoint {endpoint}: {error}"
    if isinstance(error, exceptions.ClientError):
        code = error.response.get("Error", {}).get("Code", "")
        if code in ("InvalidAccessKeyId", "SignatureDoesNotMatch"):
            return (
                f"the S3 store at {endpoint} refused the credentials ({code}); check AWS_ACCESS_KEY_ID and "
                "AWS_SECRET_ACCESS_KEY"
            )
        if code in ("AccessDenied", "403", "Forbidden"):
            return (
                f"access denied at {endpoint}: the credentials are valid but may not use this object. In a "
                f"multi-user Kubeflow (KFP 2.15 and later) a profile's keys reach only {PROFILE_PREFIXES}; put data, "
                "models and logs there"
            )
        if code == "NoSuchBucket":
            return f"the bucket does not exist at {endpoint}"
    return None


def _explain_gcs_error(error: Exception) -> str | None:
    import requests
    from google.api_core import exceptions
    from google.auth.exceptions import RefreshError, TransportError

    endpoint = gcs_endpoint()
    if isinstance(error, RefreshError | exceptions.Unauthorized | exceptions.Forbidden):
        return (
            f"Cloud Storage at {endpoint} refused the credentials ({type(error).__name__}: "
            f"{str(error).splitlines()[0][:200]}); check GOOGLE_APPLICATION_CREDENTIALS or the service account"
        )
    if isinstance(error, requests.ConnectionError | TransportError | exceptions.RetryError):
        return f"lost the connection to Cloud Storage at {endpoint} ({error})"
    return None


def _endpoint_of(uri: str) -> str | None:
    if not uri:
        return s3_endpoint()
    _scheme, bucket, key = split_uri(normalize_uri(uri))
    return s3_endpoint(bucket, key)


def _s3_errors(uri: str):
    return _store_errors(uri, lambda error: _explain_s3_error(error, uri), _endpoint_of(uri) or "AWS S3")


def _gcs_errors(uri: str):
    return _store_errors(uri, _explain_gcs_error, gcs_endpoint())
