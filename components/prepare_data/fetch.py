"""Bringing a remote source (http(s)://, gs:// or s3://) to a local, verified, cached file."""

from __future__ import annotations

import hashlib
import http.client
import logging
import os
import urllib.error
import urllib.request
from pathlib import Path

from components.common import filesystem, storage
from components.common.progress import Progress
from components.prepare_data.safe_io import RAISE_THE_LIMIT, SourceError

logger = logging.getLogger(__name__)

DOWNLOAD_TIMEOUT_SECONDS = 60
_CHUNK_BYTES = 1024 * 1024


def is_url(source: str) -> bool:
    return source.startswith(("http://", "https://"))


def _offline_hint(source: str) -> str:
    return (
        f"If this machine cannot reach {source}, download the archive elsewhere and pass the local file "
        "instead: --source /path/to/cifar-10-python.tar.gz (or use --source synthetic for an offline demo)."
    )


def _cache_path(cache_dir: Path, source: str) -> Path:
    key = hashlib.sha256(source.encode()).hexdigest()[:16]
    return cache_dir / "downloads" / f"{key}-{Path(source.split('?')[0]).name or 'download'}"


def cached_download(cache_dir: Path, url: str) -> Path | None:
    """The cached download of `url`, when an earlier run made one (so that no network is needed)."""
    path = _cache_path(cache_dir, url)
    return path if path.is_file() else None


def _check_sha256(path: Path, digest: str, expected: str | None, source: str) -> None:
    if expected is not None and digest != expected.lower():
        raise SourceError(
            f"{source}: SHA-256 is {digest}, expected {expected.lower()}; the file is damaged or not the "
            f"expected archive (checked copy: {path})"
        )


def _too_large(source: str, size: int, max_bytes: int) -> SourceError:
    return SourceError(f"{source}: {size:,} bytes or more, above the limit of {max_bytes:,} ({RAISE_THE_LIMIT})")


def download_url(url: str, cache_dir: Path, expected_sha256: str | None, max_bytes: int) -> tuple[Path, str]:
    """Download `url` into the cache (once, at most `max_bytes`), verify its SHA-256, and return (path, sha256)."""
    target = _cache_path(cache_dir, url)
    if target.exists():
        digest = filesystem.sha256_file(target)
        if expected_sha256 is None or digest == expected_sha256.lower():
            logger.info("using cached download %s of %s", target, url)
            return target, digest
        logger.warning("cached %s does not match the expected SHA-256; downloading again", target)
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = filesystem.temporary_path(target)
    digest = hashlib.sha256()
    logger.info("downloading %s", url)
    try:
        # reader: an archive streamed to a file, its size bounded by max_bytes and its SHA-256 checked
        with urllib.request.urlopen(url, timeout=DOWNLOAD_TIMEOUT_SECONDS) as response, open(partial, "wb") as out:
            total = _content_length(response.headers.get("Content-Length"), url)
            if total > max_bytes:
                raise _too_large(url, total, max_bytes)
            progress = Progress(f"download {Path(url).name}", total, unit="bytes", logger=logger)
            written = 0
            while chunk := response.read(_CHUNK_BYTES):
                written += len(chunk)
                if written > max_bytes:
                    raise _too_large(url, written, max_bytes)
                out.write(chunk)
                digest.update(chunk)
                progress.advance(len(chunk))
            if total and written != total:  # urllib accepts a body cut short when the server closes early
                raise SourceError(
                    f"could not download {url}: the body ended after {written:,} of the {total:,} bytes its "
                    f"Content-Length announced (the connection was cut); try again"
                )
        _check_sha256(partial, digest.hexdigest(), expected_sha256, url)
        os.replace(partial, target)
    except (urllib.error.URLError, OSError, http.client.HTTPException) as error:
        reason = getattr(error, "reason", None) or f"{type(error).__name__} {error}".strip()
        raise SourceError(f"could not download {url}: {reason}. {_offline_hint(url)}") from error
    finally:
        partial.unlink(missing_ok=True)
    return target, digest.hexdigest()


def _content_length(header: str | None, url: str) -> int:
    """The announced body size (0: not announced); a header that is not a size is refused, not guessed at."""
    if header is None or not header.strip():
        return 0
    if not header.strip().isdigit():
        raise SourceError(f"could not download {url}: its Content-Length {header[:40]!r} is not a size")
    return int(header)


def download_object(uri: str, cache_dir: Path, expected_sha256: str | None, max_bytes: int) -> tuple[Path, str]:
    """Copy a gs:// or s3:// object into the cache (reused while its size and CRC32C match) and verify it."""
    parent, name = filesystem.parent_and_name(uri)
    publisher = storage.publisher_for(parent)
    checksum = publisher.checksum(name)
    if checksum is None:
        raise SourceError(f"{uri}: object does not exist")
    if checksum[0] > max_bytes:
        raise _too_large(uri, checksum[0], max_bytes)
    target = _cache_path(cache_dir, uri)
    if target.exists():
        content = filesystem.read_regular_file(target, max_bytes)
        if (len(content), filesystem.crc32c_base64(content)) == checksum:
            digest = hashlib.sha256(content).hexdigest()
            _check_sha256(target, digest, expected_sha256, uri)
            logger.info("using cached copy %s of %s", target, uri)
            return target, digest
    logger.info("downloading %s (%d bytes)", uri, checksum[0])
    storage.download_file(uri, target)
    digest = filesystem.sha256_file(target)
    try:
        _check_sha256(target, digest, expected_sha256, uri)
    except SourceError:
        target.unlink(missing_ok=True)
        raise
    return target, digest
