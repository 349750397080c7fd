"""A cheap fingerprint of a source's content, so that pipeline caching reuses prepared data only when the
source itself is unchanged (KFP's cache keys on parameters, not on what a URL or object holds)."""

from __future__ import annotations

import hashlib
import logging
import time
import urllib.request
from pathlib import Path

from components.common import filesystem, storage
from components.prepare_data import fetch
from components.prepare_data.config import OFFICIAL_SHA256, OFFICIAL_URL
from components.prepare_data.safe_io import DirTree

logger = logging.getLogger(__name__)


def source_fingerprint(source: str) -> str:
    """gs:// and s3://: the object's generation or ETag, CRC32C and size; http(s): the ETag/Last-Modified/length
    the server reports; a local file: its SHA-256; a folder: its tree digest. When the source cannot be looked
    at, a value that never repeats, so nothing stale is reused (preparation then reports the real problem)."""
    try:
        if source == "synthetic":
            return "synthetic"
        if source == OFFICIAL_URL:
            return f"sha256:{OFFICIAL_SHA256}"  # the release never changes
        if filesystem.is_remote(source):
            parent, name = filesystem.parent_and_name(source)
            publisher = storage.publisher_for(parent)
            checksum, version = publisher.checksum(name), publisher.version(name)
            if checksum is None:
                raise FileNotFoundError(source)
            return f"object:{version}:{checksum[1]}:{checksum[0]}"
        if fetch.is_url(source):
            request = urllib.request.Request(source, method="HEAD")
            # reader: a HEAD request: its headers only, no body is read
            with urllib.request.urlopen(request, timeout=fetch.DOWNLOAD_TIMEOUT_SECONDS) as response:
                headers = response.headers
                described = [headers.get(key, "") for key in ("ETag", "Last-Modified", "Content-Length")]
            return "http:" + hashlib.sha256("|".join(described).encode()).hexdigest()
        path = Path(source)
        if path.is_dir():
            return f"tree:{DirTree(path).sha256()}"
        return f"sha256:{filesystem.sha256_file(path)}"
    except Exception as error:  # any failure: never reuse; preparation will report the real problem
        logger.warning("cannot fingerprint %s (%s); prepared data will not be reused", source, error)
        return f"unavailable:{time.time_ns()}"
