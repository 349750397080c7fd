"""The model directory: the one place every stage reads and writes a trained model through, and where it lives.

    <model_dir>/config.json            the resolved train config (written by train)
    <model_dir>/train_metrics.json     the final step, metrics and checkpoint (written by train when it ends)
    <model_dir>/ckpt-N.*, checkpoint   checkpoints (train)
    <model_dir>/train/, validation/    TensorBoard summaries of training and its held-out curve (train)
    <model_dir>/eval/                  TensorBoard summaries, per-checkpoint metrics and report.html (evaluate)
    <model_dir>/eval_metrics.json      the evaluation's summary (evaluate)

It is a local folder or a gs:// / s3:// prefix. In a KFP pipeline it is placed so that it outlives the step's
pod (see `pipeline_model_directory`): every TFJob worker and every retried attempt of the step reach it.
Its one writer is claimed by `ModelDirectory.claim_writer` (writer_claim.py: the folder and its path locked on
this machine and, for a remote directory, a lease object in the store). This module imports no TensorFlow, so the
job launching step can run in a small image.
"""

from __future__ import annotations

import hashlib
import logging
import re
from pathlib import Path
from typing import Any

from components.common import documents, filesystem, storage
from components.common.dataset import default_cache_dir
from components.common.writer_claim import DirectoryClaim, WriterLease, holder_description

logger = logging.getLogger(__name__)

RESOLVED_CONFIG = "config.json"
TRAIN_METRICS = "train_metrics.json"
EVAL_METRICS = "eval_metrics.json"
VALIDATION_CURVE = "validation.json"  # the validation split's measures so far: what a search prunes on
CHECKPOINT_PREFIX = "ckpt"
TRAIN_LOGS = "train"
VALIDATION_LOGS = "validation"
EVAL_LOGS = "eval"
STAGING = ".staging"  # <token>/<name>: a writer's upload before it is given its name (see `_publish_fenced`)
VALUE_SUFFIX = "/.ATTRIBUTES/VARIABLE_VALUE"  # how TensorFlow names a variable's value inside a checkpoint
RUN_MODEL_DIRECTORY = "model-directory"  # under `<pipeline root>/<pipeline>/<run id>/`, shared by the run's attempts
CHECKPOINT_INDEX = re.compile(rf"{CHECKPOINT_PREFIX}-(0|[1-9]\d*)\.index")  # the one rule for what is a checkpoint


# -- the documents a model directory holds, as read back (components/common/documents.py) -----------------------

_IMAGE_SHAPE = documents.Items(documents.Number("[1, 4096]", integer=True), length=3)
_DIGEST = documents.Text(max_length=64)
RESOLVED_CONFIG_SCHEMA = documents.Fields(
    {
        "model_spec": documents.Fields(),  # each value checked by ModelSpec itself (model.model_spec_of)
        "model_dir": documents.Text(),
        "resolved": documents.Fields(
            {
                "num_classes": documents.Number("[1, 100000]", integer=True),
                "label_names": documents.Items(documents.Text(), max_items=100_000),
                "image_shape": _IMAGE_SHAPE,
                "resize_images": documents.Flag(),
                "synthetic_data": documents.Flag(),
                "total_steps": documents.Number("[0, 1e12]", integer=True),
                "dataset_manifest_sha256": _DIGEST,
                "dataset_history": documents.Items(_DIGEST, max_items=10_000),
            },
            required=("num_classes", "label_names", "image_shape"),
        ),
    },
    required=("resolved",),
)
_STEP = documents.Number("[0, 1e12]", integer=True)
TRAIN_METRICS_SCHEMA = documents.Fields(
    {
        "step": _STEP,
        "total_steps": _STEP,
        "checkpoint": documents.Text(),
        "metrics": documents.Fields(),
        "preempted": documents.Flag(),
    },
    required=("step", "checkpoint", "metrics"),
)
VALIDATION_CURVE_SCHEMA = documents.Fields(
    {
        "curve": documents.Items(
            documents.Fields(
                {"step": _STEP, "loss": documents.Number("[0, inf)"), "accuracy": documents.Number("[0, 1]")},
                required=("step", "accuracy"),
            ),
            max_items=1_000_000,
        )
    },
    required=("curve",),
)
EVAL_METRICS_SCHEMA = documents.Fields(
    {
        "blessed": documents.Flag(),
        "reasons": documents.Items(documents.Text()),
        "metrics": documents.Fields({"accuracy": documents.Number("[0, 1]")}, required=("accuracy",)),
    },
    required=("blessed", "metrics"),
)


def read_document(local_dir: str | Path, name: str, schema: documents.Fields, shown_as: str | None = None) -> dict:
    """A document of a (pulled) model directory, read back as every document is: inside the directory, bounded,
    checked against `schema`; errors name `shown_as/name` (the directory as the user gave it)."""
    location = Path(local_dir, name)
    try:
        document = storage.document(location, schema, f"model directory's {name}", root=local_dir)
    except documents.DocumentError as error:
        if shown_as is None or str(shown_as) == str(local_dir):
            raise
        raise documents.DocumentError(str(error).replace(str(location), f"{shown_as}/{name}", 1)) from error
    return document


# -- checkpoints: names, finding them, their files, the keys of their values ------------------------------------------


def checkpoint_name(step: int) -> str:
    """The prefix name of step `step`'s checkpoint: `ckpt-N` (its files are `ckpt-N.index`, `ckpt-N.data-*`)."""
    return f"{CHECKPOINT_PREFIX}-{step}"


def checkpoint_step_of_file(file_name: str) -> int | None:
    """The step of a checkpoint's `.index` file name (`ckpt-40.index` -> 40); None for any other name (a save's
    `ckpt-40_temp`, a data file, the `checkpoint` state file, a stranger's file)."""
    match = CHECKPOINT_INDEX.fullmatch(file_name)
    return int(match.group(1)) if match else None


def checkpoint_step(prefix: str | Path) -> int:
    """The step of a checkpoint prefix found by `list_checkpoints` (`.../ckpt-40` -> 40)."""
    step = checkpoint_step_of_file(f"{Path(prefix).name}.index")
    if step is None:
        raise ValueError(f"{prefix}: not a checkpoint prefix ({CHECKPOINT_PREFIX}-<step>)")
    return step


def checkpoint_steps(file_names) -> list[int]:
    """The checkpoint steps among a folder's file names, in increasing order (the listing of a store's prefix)."""
    return sorted(step for name in file_names if (step := checkpoint_step_of_file(name)) is not None)


def list_checkpoints(directory: str | Path) -> list[str]:
    """The checkpoint prefixes in `directory`, oldest step first, found from their own `.index` files (the
    `checkpoint` state file may be missing, damaged or out of date: the checkpoints themselves are what counts).
    What train resumes from and what evaluate evaluates are both this list."""
    directory = Path(directory)
    steps = checkpoint_steps(path.name for path in directory.glob(f"{CHECKPOINT_PREFIX}-*.index"))
    return [str(directory / checkpoint_name(step)) for step in steps]


def checkpoint_files(prefix: str | Path) -> list[Path]:
    """The files of a checkpoint: `ckpt-N.index` and its `ckpt-N.data-*`."""
    prefix = Path(prefix)
    return [prefix.with_name(f"{prefix.name}.index"), *sorted(prefix.parent.glob(f"{prefix.name}.data-*"))]


def checkpoint_key(collection: str, name: str) -> str:
    """The key of variable `name` (`<layer>/<weight>`) of `collection` (weights, ema, ...) inside a checkpoint:
    tf.train.Checkpoint escapes `.` as `..` and `/` as `.S` in object names."""
    return f"{collection}/{name.replace('.', '..').replace('/', '.S')}{VALUE_SUFFIX}"


def unescape_object_name(name: str) -> str:
    """Undo tf.train.Checkpoint's escaping of an object name: `.S` is `/`, `..` is `.`."""
    return re.sub(r"\.(S|\.)", lambda match: "/" if match.group(1) == "S" else ".", name)


class CheckpointError(RuntimeError):
    """No usable checkpoint where one was expected, or a warm start that matched nothing."""


class DamagedCheckpointError(CheckpointError):
    """A checkpoint that cannot be read whole (a data file cut short or damaged)."""


def artifact_location(artifact: Any, shared: bool = False) -> str:
    """Where to read a KFP input artifact: its pod-local copy, or (`shared`: for other pods) its object-store URI.

    On a cluster the launcher downloads inputs to `artifact.path`, which only this pod sees; other pods (TFJob
    workers) need `artifact.uri` (`minio://...` in KFP's default store, mapped to s3://; or gs://, s3://)."""
    uri = filesystem.normalize_uri(artifact.uri or "")
    if shared:
        if not filesystem.is_remote(uri):
            raise ValueError(
                f"{artifact.name or 'artifact'}: {artifact.path} is pod-local ({artifact.uri!r}); the TFJob's workers "
                "run in other pods and cannot read it. Run the pipeline with its default object store (KFP's "
                "MinIO/SeaweedFS) or a pipeline_root on gs:// or s3://"
            )
        return uri
    return artifact.path


def pipeline_model_directory(
    model_artifact: Any, run_id: str, explicit: str | None, shared: bool, folder: str = RUN_MODEL_DIRECTORY
) -> str:
    """The train step's model directory in a pipeline run.

    `explicit` wins. Otherwise, when the artifact lives in an object store, a folder of the run itself
    (`<pipeline root>/<pipeline>/<run id>/model-directory`): the artifact's own URI may change from one attempt of
    the step to the next (newer KFP backends salt it per pod), and checkpoints must survive into the retry (the
    sweep step's folder is found the same way, under `folder`).
    Otherwise (kfp.local, or no run id) the artifact's own folder. `shared` (a TFJob) requires an object store."""
    if explicit:
        location = filesystem.normalize_uri(explicit)
    else:
        uri = filesystem.normalize_uri(model_artifact.uri or "")
        if filesystem.is_remote(uri):
            marker = f"/{run_id}/" if run_id else None
            location = uri[: uri.index(marker) + len(marker)] + folder if marker and marker in uri else uri
        else:
            location = model_artifact.path
    if shared and not filesystem.is_remote(location):
        raise ValueError(
            f"model_dir: {location} is pod-local; the TFJob's workers run in other pods and cannot write it. Run "
            "the pipeline with its default object store (KFP's MinIO/SeaweedFS) or a pipeline_root on gs:// or "
            "s3://, or give the train step a model_dir on gs:// or s3://"
        )
    return location


class ModelDirectory:
    """The model directory as a local path TensorFlow writes to, mirrored to gs:// or s3:// when it is remote."""

    def __init__(self, uri: str, cache_dir: str | Path | None = None, create: bool = True):
        """`create=False` (for readers): a local directory must already exist."""
        self.uri = filesystem.normalize_uri(uri).rstrip("/")
        self.remote = filesystem.is_remote(uri)
        if self.remote:
            key = hashlib.sha256(self.uri.encode()).hexdigest()[:16]
            self.local = Path(cache_dir or default_cache_dir()) / "model_dirs" / key
        else:
            self.local = Path(uri)
            if not create and not self.local.is_dir():
                raise CheckpointError(f"model_dir: {uri} is not a directory (nothing was trained there)")
        self.local.mkdir(parents=True, exist_ok=True)
        self._pushed: dict[str, tuple[int, int]] = {}
        self._claim: DirectoryClaim | None = None  # while this process is the writer
        self._lease: WriterLease | None = None  # and, for a remote directory, the lease in the store

    def claim_writer(self) -> None:
        """Be the only writer of this model directory while this process lives (see writer_claim.py): the local
        folder (or mirror) is locked on this machine and, when remote, leased in the store. A second writer fails
        at once; a claim left by a dead process is taken over."""
        claim = DirectoryClaim(self.local, self.uri)
        claim.acquire()
        self._claim = claim
        if self.remote:
            lease = WriterLease(self.uri, holder_description())
            try:
                lease.acquire()
            except BaseException:
                self.release_writer()
                raise
            self._lease = lease
            self._remove_staged()
        filesystem.remove_stale_temporaries(self.local)  # the only writer now: what a killed one left is garbage

    def check_writer(self) -> None:
        """Before writing: this process still holds the directory (the folder at its path is the one it claimed,
        its lease was not taken over); WriterClaimError otherwise."""
        if self._claim is not None:
            self._claim.check()
        if self._lease is not None:
            self._lease.check()

    def release_writer(self) -> None:
        if self._lease is not None:
            self._lease.release()
            self._lease = None
        if self._claim is not None:
            self._claim.release()
            self._claim = None

    def pull(self) -> None:
        """Bring the remote directory's files down (resume needs its checkpoints)."""
        if not self.remote:
            return
        publisher = storage.publisher_for(self.uri)
        names = [name for name in publisher.list() if not name.startswith(f"{STAGING}/")]
        held = set(names)
        forgotten = [path for path in sorted(self.local.rglob("*")) if path.is_file() and not path.name.startswith(".")
                     and path.relative_to(self.local).as_posix() not in held]  # fmt: skip
        for path in forgotten:  # the store is the truth: what it no longer holds (started over) is not resumed from
            path.unlink()
        if forgotten:
            logger.info("removed %d file(s) of the local mirror %s that %s no longer holds", len(forgotten),
                        self.local, self.uri)  # fmt: skip
        for name in names:
            target = self.local / name
            checksum = publisher.checksum(name)
            local_content = storage.read_bytes(str(target)) if target.exists() else None
            if local_content is not None and checksum == (len(local_content), filesystem.crc32c_base64(local_content)):
                continue
            storage.download_file(publisher.uri(name), target)
        logger.info("pulled %d file(s) of %s into %s", len(names), self.uri, self.local)
        self._remember_all()

    def push(self, remove_deleted_checkpoints: bool = False) -> None:
        """Upload files that are new or changed since the last push; the checkpoint index goes last.

        `remove_deleted_checkpoints` (the trainer's max_to_keep) also removes remote checkpoints that are
        gone locally; a reader such as the evaluator never does, or it could remove ones it has not pulled.
        """
        if not self.remote:
            return
        self.check_writer()
        publisher = storage.publisher_for(self.uri)
        changed = [
            path
            for path in sorted(self.local.rglob("*"))
            if path.is_file() and not path.name.startswith(".") and self._pushed.get(str(path)) != self._signature(path)
        ]
        changed.sort(key=lambda path: path.name == "checkpoint")  # the index that names the latest, last
        for path in changed:
            self._publish_fenced(publisher, path.relative_to(self.local).as_posix(), storage.read_bytes(str(path)))
            self._pushed[str(path)] = self._signature(path)
        if not remove_deleted_checkpoints:
            return
        remote_files = set(publisher.list())
        local_files = {path.relative_to(self.local).as_posix() for path in self.local.rglob("*") if path.is_file()}
        for stale in sorted(remote_files - local_files):
            if stale.startswith(f"{CHECKPOINT_PREFIX}-"):  # removed locally by max_to_keep
                publisher.withdraw(stale)

    def _publish_fenced(self, publisher, name: str, data: bytes) -> None:
        """Publish `name` as the writer: the upload lands under this writer's staging name, and only when it has
        landed and the writer still holds the directory (checked then: an upload that ran past the holder's deadline,
        a process stopped with SIGSTOP or a network that stalled, is caught there) does one server-side copy give it
        its name. So an upload that outlived its lease never lands where a newcomer writes; what is left is the one
        copy request after the check. Without a lease (a reader such as the evaluator) it is published directly."""
        self.check_writer()  # before: none starts once the holder's deadline passed
        if self._lease is None:
            publisher.publish(name, data)
            return
        staged = f"{STAGING}/{self._lease.token}/{name}"
        publisher.publish(staged, data)
        try:
            self.check_writer()  # after: the upload may have outlived the lease
            publisher.copy(staged, name, replace=True)
        finally:
            publisher.withdraw(staged)

    def _remove_staged(self) -> None:
        """What writers killed mid-upload left under the staging prefix: garbage once this one holds the lease."""
        publisher = storage.publisher_for(self.uri)
        for name in publisher.list(f"{STAGING}/"):
            publisher.withdraw(name)

    @staticmethod
    def _signature(path: Path) -> tuple[int, int]:
        status = path.stat()
        return status.st_size, status.st_mtime_ns

    def _remember_all(self) -> None:
        for path in self.local.rglob("*"):
            if path.is_file():
                self._pushed[str(path)] = self._signature(path)
