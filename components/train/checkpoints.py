"""Checkpoints: where they live, what they hold, restoring with a fallback, and warm starts.

A checkpoint holds `weights/<layer>/<weight>` for every model variable (names that survive a change of
architecture, so warm starts can select by name), `ema/<layer>/<weight>` when an exponential moving
average is kept, the optimizer, and the global `step`.

A gs:// or s3:// model directory is worked on through a local mirror (TensorFlow's own GCS client cannot be
pointed at an emulator, and TensorFlow 2 has no S3 file system): `pull` before restoring, `push` after each save.
"""

from __future__ import annotations

import hashlib
import logging
import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path

import tensorflow as tf

from components.common import filesystem, storage
from components.common.checkpoint_reader import UnreadableCheckpointError, open_whole
from components.common.dataset import default_cache_dir
from components.common.model import variable_name
from components.common.model_directory import (
    VALUE_SUFFIX,
    CheckpointError,
    DamagedCheckpointError,
    checkpoint_name,
    checkpoint_step_of_file,
    checkpoint_steps,
    list_checkpoints,
    unescape_object_name,
)

logger = logging.getLogger(__name__)


@dataclass
class TrainingState:
    """Everything a checkpoint holds; `objects` is what tf.train.Checkpoint tracks."""

    model: object
    optimizer: object
    step: tf.Variable
    ema: dict[str, tf.Variable] = field(default_factory=dict)
    lookahead: dict[str, tf.Variable] = field(default_factory=dict)
    lookahead_started: tf.Variable | None = None
    muon: dict[str, tf.Variable] = field(default_factory=dict)  # Muon's momentum of each convolution kernel

    def checkpoint(self) -> tf.train.Checkpoint:
        objects = {
            "weights": {variable_name(variable): variable for variable in self.model.variables},
            "optimizer": self.optimizer,
            "step": self.step,
        }
        if self.ema:
            objects["ema"] = dict(self.ema)
        if self.lookahead:
            objects["lookahead"] = {**self.lookahead, "started": self.lookahead_started}
        if self.muon:
            objects["muon"] = dict(self.muon)
        return tf.train.Checkpoint(**objects)


STATE_FILE = "checkpoint"
MAX_STATE_BYTES = 1 << 20  # the checkpoint index: a line per kept checkpoint


def remove_partial_checkpoint(directory: str | Path, step: int) -> None:
    """Remove what an interrupted save of `step` left: TensorFlow's `ckpt-N_temp/` folder and any of `ckpt-N.*`
    (the state file is only rewritten after a save succeeds, so it never names them)."""
    directory = Path(directory)
    shutil.rmtree(directory / f"{checkpoint_name(step)}_temp", ignore_errors=True)
    for path in directory.glob(f"{checkpoint_name(step)}.*"):
        path.unlink(missing_ok=True)


def remove_abandoned_saves(directory: str | Path) -> None:
    """Remove the `ckpt-N_temp/` folders saves of killed writers left (call as the only writer)."""
    for path in Path(directory).glob(f"{checkpoint_name('*')}_temp"):
        if path.is_dir():
            logger.info("removing %s, left by an interrupted save", path)
            shutil.rmtree(path, ignore_errors=True)


def reconcile_state_file(directory: str | Path) -> None:
    """Rewrite the `checkpoint` state file from the checkpoints on disk when it is missing, unreadable or lists
    others (so the checkpoint manager's bookkeeping covers them all), and say so."""
    directory = Path(directory)
    paths = list_checkpoints(directory)
    if not paths:
        return
    state_path = directory / STATE_FILE
    names = [Path(path).name for path in paths]
    wanted = f'model_checkpoint_path: "{names[-1]}"\n' + "".join(f'all_model_checkpoint_paths: "{n}"\n' for n in names)
    try:
        current = filesystem.read_regular_file(state_path, MAX_STATE_BYTES).decode()
    except (OSError, ValueError):
        current = None
    if current == wanted:
        return
    listed = re.findall(r'^all_model_checkpoint_paths: "([^"]+)"$', current or "", flags=re.MULTILINE)
    if [Path(name).name for name in listed] == names and f'model_checkpoint_path: "{names[-1]}"' in (current or ""):
        return  # the same checkpoints, written with absolute paths or another layout: fine as it is
    problem = "is missing" if current is None else "does not list the checkpoints on disk (damaged or out of date)"
    logger.warning("%s %s; rewrote it from the checkpoint files: %s", state_path, problem, ", ".join(names))
    filesystem.atomic_write_bytes(state_path, wanted.encode())


def restore_latest(checkpoint: tf.train.Checkpoint, directory: str | Path) -> str | None:
    """Restore the newest readable checkpoint in `directory`, found from its files; fall back to older ones when the
    newest is damaged.

    Returns the restored path, or None when the directory holds no checkpoint at all. When every
    checkpoint is damaged this fails: training never silently restarts from step 0.
    """
    candidates = list(reversed(list_checkpoints(directory)))
    if not candidates:
        return None
    problems = []
    for path in candidates:
        try:
            checkpoint.restore(path).assert_existing_objects_matched()
        except Exception as error:  # damage surfaces as OpError, IndexError, ValueError, AssertionError...
            text = getattr(error, "message", None) or str(error) or type(error).__name__
            message = f"{type(error).__name__}: {text.splitlines()[0]}"
            logger.warning("checkpoint %s is damaged or incompatible (%s); trying the one before", path, message)
            problems.append(f"{path}: {message}")
            continue
        if problems:
            logger.warning("resumed from %s instead of the damaged newest checkpoint(s)", path)
        return path
    raise CheckpointError(
        "every checkpoint in the model directory is damaged or incompatible, refusing to start over from step 0 "
        "(move the model directory aside to train from scratch): " + "; ".join(problems)
    )


def checkpoint_variable_names(path: str) -> dict[str, str]:
    """{model-style variable name: checkpoint key} for the `weights/...` of a checkpoint (or every key)."""
    names = {}
    for key, _shape in tf.train.list_variables(path):
        if not key.endswith(VALUE_SUFFIX):
            continue
        name = key[: -len(VALUE_SUFFIX)]
        if name.startswith("weights/"):
            names[unescape_object_name(name[len("weights/") :])] = key
        elif not name.startswith(("optimizer/", "ema/", "step", "save_counter")):
            names.setdefault(name, key)
    return names


@dataclass(frozen=True)
class WarmStartReport:
    source: str
    restored: list[str]
    skipped: dict[str, str]  # variable name -> why


def local_checkpoint(source: str, cache_dir: str | Path | None = None) -> str:
    """A gs:// or s3:// checkpoint (a prefix such as `.../ckpt-40`, or a model directory: its newest checkpoint)
    copied into the cache; a local source as it is."""
    if not filesystem.is_remote(source):
        return source
    source = filesystem.normalize_uri(source).rstrip("/")
    folder, name = filesystem.parent_and_name(source)
    if checkpoint_step_of_file(f"{name}.index") is None:  # a folder: take its newest checkpoint
        steps = checkpoint_steps(storage.publisher_for(source).list())
        if not steps:
            raise CheckpointError(f"warm start: {source} holds no checkpoint")
        folder, name = source, checkpoint_name(steps[-1])
    publisher = storage.publisher_for(folder)
    files = [n for n in publisher.list() if n == f"{name}.index" or n.startswith(f"{name}.data-")]
    if f"{name}.index" not in files:
        raise CheckpointError(f"warm start: {folder}/{name} is not a checkpoint ({name}.index is missing)")
    local = Path(cache_dir or default_cache_dir()) / "warm_start" / hashlib.sha256(folder.encode()).hexdigest()[:16]
    for file_name in files:
        storage.download_file(publisher.uri(file_name), local / file_name)
    logger.info("warm start: copied %s/%s (%d files) into %s", folder, name, len(files), local)
    return str(local / name)


def resolve_checkpoint_path(source: str) -> str:
    if tf.io.gfile.isdir(source):
        latest = tf.train.latest_checkpoint(source)
        if latest is None:
            raise CheckpointError(f"warm start: {source} holds no checkpoint")
        return latest
    if not tf.io.gfile.exists(f"{source}.index"):
        raise CheckpointError(f"warm start: {source} is neither a checkpoint folder nor a checkpoint prefix")
    return source


def warm_start(
    variables,
    source: str,
    include: tuple[str, ...],
    exclude: tuple[str, ...],
    mapping: list[tuple[str, str]],
    cache_dir: str | Path | None = None,
) -> WarmStartReport:
    """Assign checkpoint values to the variables selected by name; report what was and was not restored."""
    path = resolve_checkpoint_path(local_checkpoint(source, cache_dir))
    try:
        reader = open_whole(path)
    except UnreadableCheckpointError as error:
        raise DamagedCheckpointError(f"warm start: {error}; give another checkpoint, or none") from error
    return _warm_start_from(reader, variables, path, include, exclude, mapping)


def _warm_start_from(reader, variables, path: str, include, exclude, mapping) -> WarmStartReport:
    available = checkpoint_variable_names(path)
    shapes = reader.get_variable_to_shape_map()
    restored, skipped = [], {}
    for variable in variables:
        name = variable_name(variable)
        if not any(re.search(pattern, name) for pattern in include) or any(re.search(p, name) for p in exclude):
            skipped[name] = "excluded"
            continue
        source_name = name
        for pattern, replacement in mapping:
            source_name = re.sub(pattern, replacement, source_name)
        key = available.get(source_name)
        if key is None:
            skipped[name] = f"{source_name!r} is not in the checkpoint"
            continue
        if list(shapes[key]) != list(variable.shape):
            skipped[name] = f"shape {list(variable.shape)} differs from the checkpoint's {list(shapes[key])}"
            continue
        variable.assign(reader.get_tensor(key))
        restored.append(name)
    if not restored:
        raise CheckpointError(
            f"warm start from {path}: no variable matched (include {include}, exclude {exclude}, "
            f"map {mapping}); the checkpoint holds e.g. {sorted(available)[:5]}"
        )
    logger.info("warm start from %s: restored %d variable(s): %s", path, len(restored), ", ".join(restored))
    for name, reason in skipped.items():
        logger.info("warm start: kept %s as initialized (%s)", name, reason)
    return WarmStartReport(path, restored, skipped)
