"""TensorBoard on training logs that live in an object store (gs:// or s3://, e.g. KFP's MinIO) or a folder.

TensorFlow 2 reads neither s3:// nor an emulated gs:// itself, so a remote log folder is mirrored into a local
cache (event files and profiler traces: each object is downloaded once, since event files are written whole, see
train's summaries) and re-mirrored every `--refresh-seconds` while TensorBoard serves the copy. Credentials are
the usual ones: Workload Identity or GOOGLE_APPLICATION_CREDENTIALS for gs://, the AWS_* variables for s3://.

    python -m components.common.tensorboard --logdir s3://mlpipeline/v2/artifacts/cifar10-pipeline/RUN/model-directory
"""

from __future__ import annotations

import hashlib
import logging
import sys
import time
from pathlib import Path

from components.common import exit_codes, filesystem, processes, storage
from components.common.config import ArgumentParser
from components.common.dataset import default_cache_dir
from components.common.logs import setup_logging

logger = logging.getLogger(__name__)

LOG_FILE_MARKERS = ("tfevents", "/plugins/", "plugins/")


def is_log_file(name: str) -> bool:
    return any(marker in name for marker in LOG_FILE_MARKERS)


def mirror(remote: str, local: Path) -> int:
    """Download the log files under `remote` that `local` does not hold yet (or holds in another version)."""
    publisher = storage.publisher_for(remote)
    downloaded = 0
    for name in publisher.list():
        if not is_log_file(name):
            continue
        target = local / name
        if target.exists():
            checksum = publisher.checksum(name)
            content = storage.read_bytes(str(target))
            if checksum == (len(content), filesystem.crc32c_base64(content)):
                continue
        storage.download_file(publisher.uri(name), target)
        downloaded += 1
    return downloaded


def local_copy(logdir: str, cache_dir: Path | None = None) -> Path:
    key = hashlib.sha256(filesystem.normalize_uri(logdir).encode()).hexdigest()[:16]
    return Path(cache_dir or default_cache_dir()) / "tensorboard" / key


def check_port_free(port: int, bind_all: bool = False) -> None:
    """TensorBoard's port can be listened on (else TensorBoard fails with its own two lines and exit 255)."""
    import errno
    import socket

    if not 1 <= port <= 65535:
        raise ValueError(f"port: {port} is not a port (1 to 65535)")
    with socket.socket() as probe:
        try:
            probe.bind(("" if bind_all else "127.0.0.1", port))
        except OSError as error:
            if error.errno != errno.EADDRINUSE:
                raise
            raise ValueError(f"port {port} is in use (another TensorBoard?); choose another: PORT=... (make)") from None


def serve(logdir: str, port: int, refresh_seconds: float, bind_all: bool = False) -> int:
    """Run TensorBoard on `logdir`; for a remote one, on a local mirror refreshed every `refresh_seconds`. It listens
    on localhost only, unless `bind_all` (in a pod, behind a Service)."""
    folder = Path(logdir)
    if not filesystem.is_remote(logdir) and not folder.is_dir():
        if not folder.absolute().parent.is_dir():  # a typo, not a run's folder still to come
            raise ValueError(f"{logdir}: no such folder (give a model directory, a parent of one, gs:// or s3://)")
        logger.warning("%s does not exist yet: TensorBoard shows its logs once a run writes them", logdir)
    check_port_free(port, bind_all)
    if filesystem.is_remote(logdir):
        folder = local_copy(logdir)
        logger.info("mirroring %s into %s: %d file(s)", logdir, folder, mirror(logdir, folder))
    command = [sys.executable, "-m", "tensorboard.main", "--logdir", str(folder), "--port", str(port)]
    process = processes.start([*command, "--bind_all"] if bind_all else command)  # ends with this process
    try:
        while process.poll() is None:
            time.sleep(refresh_seconds)
            if filesystem.is_remote(logdir):
                new = mirror(logdir, folder)
                if new:
                    logger.info("mirrored %d new file(s) of %s", new, logdir)
    finally:
        if process.poll() is None:
            process.terminate()
    return process.wait()


def main(argv: list[str] | None = None) -> int:
    parser = ArgumentParser(
        prog="python -m components.common.tensorboard", description=__doc__.splitlines()[0], allow_abbrev=False
    )
    parser.add_argument("--logdir", required=True, help="a model directory (or a parent): folder, gs:// or s3://")
    parser.add_argument("--port", type=int, default=6006)
    parser.add_argument("--refresh-seconds", type=float, default=30.0, help="how often a remote logdir is mirrored")
    parser.add_argument("--bind-all", action="store_true", help="listen on every interface, not only localhost")
    arguments = parser.parse_args(argv)
    setup_logging()
    try:
        return serve(arguments.logdir, arguments.port, arguments.refresh_seconds, arguments.bind_all)
    except (ValueError, OSError) as error:
        logger.error("%s", error)
        return exit_codes.BAD_INPUT


if __name__ == "__main__":
    sys.exit(main())
