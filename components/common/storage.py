"""Any location, local or remote: the publisher for it, and its bounded reads (an object's size checked before it is
read, from its metadata), a document at a location read and checked against its schema. The storage layer's top
floor: it stands on filesystem.py, documents.py and the stores, and none of them imports it.

gs:// goes through google-cloud-storage (which honours `STORAGE_EMULATOR_HOST`, so tests use a real
fake-gcs-server), never through TensorFlow's own GCS filesystem. s3:// goes through boto3, configured the
standard AWS way: the endpoint from `AWS_ENDPOINT_URL_S3` or `AWS_ENDPOINT_URL` (path-style addressing when
one is set, as MinIO and SeaweedFS need), credentials from `AWS_ACCESS_KEY_ID`/`AWS_SECRET_ACCESS_KEY` (or any
other source boto3 knows), the region from `AWS_REGION`/`AWS_DEFAULT_REGION` (default us-east-1).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from components.common import documents
from components.common.filesystem import (
    FileReadError,
    is_gcs_uri,
    is_remote,
    is_s3_uri,
    parent_and_name,
    read_regular_file,
    temporary_path,
)
from components.common.stores import LocalPublisher, Publisher


def publisher_for(root: str) -> Publisher:
    """The publisher for a local folder, a gs:// prefix or an s3:// (or KFP minio://) prefix."""
    if is_gcs_uri(root) or is_s3_uri(root):
        from components.common import object_stores  # imports the store's client library only when needed

        return object_stores.GcsPublisher(root) if is_gcs_uri(root) else object_stores.S3Publisher(root)
    return LocalPublisher(root)


def read_bounded(uri: str, max_bytes: int) -> bytes:
    """A local regular file or a remote object of at most `max_bytes`, its size checked before it is read (a remote
    object's from its metadata): FileReadError (with the size, when known) otherwise; FileNotFoundError when absent.
    The one bounded read of the documents' and the datasets' readers."""
    if not is_remote(uri):
        return read_regular_file(uri, max_bytes)
    parent, name = parent_and_name(uri)
    publisher = publisher_for(parent)
    found = publisher.checksum(name)
    if found is None:
        raise FileNotFoundError(uri)
    if found[0] > max_bytes:
        raise FileReadError(f"{uri}: {found[0]:,} bytes, more than the {max_bytes:,} it may have", found[0])
    content = publisher.read(name)
    if content is None:
        raise FileNotFoundError(uri)
    if len(content) > max_bytes:
        raise FileReadError(f"{uri}: more than the {max_bytes:,} bytes it may have", len(content))
    return content


def read_bytes(uri: str) -> bytes:
    """The whole content of a local file or remote object; FileNotFoundError names it when absent."""
    if is_remote(uri):
        parent, name = parent_and_name(uri)
        content = publisher_for(parent).read(name)
        if content is None:
            raise FileNotFoundError(f"{uri} does not exist")
        return content
    return read_regular_file(uri, sys.maxsize)


def download_file(uri: str, destination: str | Path) -> None:
    """Copy a remote object to a local file atomically (temporary name, then rename)."""
    destination = Path(destination)
    destination.parent.mkdir(parents=True, exist_ok=True)
    parent, name = parent_and_name(uri)
    temporary = temporary_path(destination)
    try:
        publisher_for(parent).download(name, temporary)
        os.replace(temporary, destination)
    finally:
        temporary.unlink(missing_ok=True)


def document(
    location: str | Path,
    schema: documents.Fields,
    kind: str,
    root: str | Path | None = None,
    max_bytes: int = documents.MAX_DOCUMENT_BYTES,
) -> dict:
    """The document at `location` (a local path or a gs:// / s3:// URI) checked against `schema`; `kind` names what
    it should be ("promotion pointer"). FileNotFoundError when it does not exist; DocumentError otherwise."""
    location = str(location)
    if root is not None and not documents.confined(location, str(root)):
        raise documents.DocumentError(f"{location}: not inside {root}, where the {kind} must be")
    return documents.parse(document_bytes(location, kind, max_bytes, root), location, schema, kind, root)


def document_bytes(
    location: str, kind: str, max_bytes: int = documents.MAX_DOCUMENT_BYTES, root: str | Path | None = None
) -> bytes:
    """The bytes of a document, bounded, from a regular file (whose real path stays inside `root`) or an object."""
    local = not is_remote(location)
    if local and root is not None and not documents.confined(os.path.realpath(location), os.path.realpath(root)):
        raise documents.DocumentError(f"{location}: a link leading out of {root}; a {kind} is read only from inside it")
    try:
        return read_bounded(location, max_bytes)
    except FileReadError as error:
        raise documents.DocumentError(f"{error}; expected a {kind}") from error
    except IsADirectoryError as error:
        raise documents.DocumentError(f"{location}: a folder, not a {kind}") from error
    except PermissionError as error:
        raise documents.DocumentError(f"{location}: permission denied reading the {kind}") from error
