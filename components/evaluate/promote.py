"""Promotion: the evaluated model becomes the next version under the promotion root, in the layout TF Serving and
KServe load, and the pointer `current.json` moves to it only when it is complete.

    current.json        the pointer: the last READY version (version, saved_model, warm_start, metrics, what it
                        was evaluated on, which serving releases load it), and, while a promotion is under way,
                        `promoting` (its version, holder and start)
    1/ 2/ ...           integer versions: saved_model.pb, variables/, and checkpoint/ (what the next run warm-starts
                        from; it outlives the run's model directory, which artifact retention may expire)
    serving.json        optional: the TF Serving release the root is served by (a promotion's serving_version)
    .staging/<token>/   a version being built (ignored by servers: not a number)

A promotion (1) exports the SavedModel locally, checks its graph against the declared serving release's ops and
loads it in a fresh process for canary requests; (2) claims the next number by replacing the pointer with a
compare-and-swap against the version the gate read (its ready fields unchanged, plus `promoting`); (3) stages the
export under `.staging/`; (4) makes the version visible: a rename on a local root, server-side copies on gs:// and
s3:// (saved_model.pb last); (5) swaps the pointer to the new ready version. Readers (the gate, warm starts, servers
through the numbers) only ever see ready versions. A promotion that loses the race reads the new pointer, decides
again against its model (bounded), and either promotes after it or ends not promoted, never failed. The next
promotion removes what a dead one left (a claim it watched unchanged for CLAIM_LEASE_SECONDS, a claim of a process
of this host that is gone, or an earlier attempt of the same promotion): its staged files and its numeric folder.

The claim is a lease by client-go's rules: its holder renews it (the pointer swapped again, its `renewals` counted)
every CLAIM_RENEW_SECONDS while it stages, and gives up a third of the lease before anyone may take over; a waiting
promotion takes it over only after it has watched the pointer unchanged for CLAIM_LEASE_SECONDS on its own clock,
never by comparing a timestamp written by another machine's clock with its own.
"""

from __future__ import annotations

import datetime
import json
import logging
import os
import shutil
import socket
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from components.common import documents, filesystem, storage, stores
from components.common.data_statistics import PROMOTED_STATISTICS
from components.evaluate import canary, serving_ops
from components.evaluate.export import CHECKPOINT_FOLDER, export_saved_model
from components.evaluate.gate import Decision
from components.evaluate.pointer import (  # noqa: F401 (read_pointer, read_ready: this module's callers use them)
    POINTER,
    SERVING_DECLARATION,
    SERVING_SCHEMA,
    parse_pointer,
    read_pointer,
    read_ready,
    ready_version,
    stored,
)
from components.evaluate.registry import Registered

logger = logging.getLogger(__name__)

STAGING = ".staging"
SAVED_MODEL_PROTO = "saved_model.pb"
CLAIM_LEASE_SECONDS = 90.0  # a claim watched unchanged this long (on the watcher's own clock) is a dead promotion's
CLAIM_RENEW_SECONDS = 20.0  # how often a promotion renews its claim while it stages
STALE_CLAIM_SECONDS = 1800.0  # staged files older than this (by their name's start) belong to a dead promotion
WAIT_POLL_SECONDS = 2.0
ATTEMPTS = 4  # pointer compare-and-swaps lost to other promotions before giving up


class PromotionConflictError(RuntimeError):
    """Other promotions kept moving the pointer (or took this one's claim); nothing of this one is visible."""


class IncompatibleServingError(ValueError):
    """The root's serving release cannot load the exported graph."""


@dataclass
class Candidate:
    """What is promoted: the model as evaluated, and what the pointer will say of it."""

    model: object
    label_names: list[str]
    record: dict  # metrics, checkpoint, step, weights, model_dir, label_names, evaluation, synthetic_data, ...
    checkpoint_files: list[Path] = field(default_factory=list)  # copied into <version>/checkpoint/
    test_time_augmentation: str = "none"
    resize: bool = False
    canary: canary.Canary | None = None
    data_statistics: bytes | None = None  # the training data's statistics.json: kept with the version (a reference)


@dataclass(frozen=True)
class Promotion:
    version: int
    saved_model: str
    pointer: str
    warm_start: str | None = None


@dataclass(frozen=True)
class PromotionOutcome:
    promotion: Promotion | None  # None: not promoted (decided again against a newer version, and not better)
    decision: Decision | None = None  # the decision taken again, when the pointer had moved
    pointer: dict | None = None  # the pointer as this promotion wrote it
    registration: Registered | None = None  # in the Model Registry, when one is configured (registry.py)


def _encode(pointer: dict) -> bytes:
    return json.dumps(pointer, indent=2, sort_keys=True).encode()


def _version_of(name: str) -> int | None:
    first = name.split("/", 1)[0]
    return int(first) if first.isdigit() and "/" in name else None


def declared_serving_version(publisher: stores.Publisher, serving_version: str | None) -> str | None:
    """The TF Serving release the root is served by: `serving_version` (recorded in serving.json for the next
    promotions), else what serving.json says, else None (nothing declared: nothing refused)."""
    if serving_version:
        serving_ops.op_definitions(serving_version)  # an unknown release is an error before anything is written
        publisher.publish(SERVING_DECLARATION, _encode({"tensorflow_serving": serving_version}))
        return serving_version
    content = publisher.read(SERVING_DECLARATION)
    if content is None:
        return None
    uri = publisher.uri(SERVING_DECLARATION)
    documents.check_size(content, uri, "serving declaration")
    declared = documents.parse(content, uri, SERVING_SCHEMA, "serving declaration").get("tensorflow_serving")
    if declared is not None and declared not in serving_ops.known_versions():
        raise documents.DocumentError(
            f"{uri}: not a valid serving declaration: tensorflow_serving: {documents.shown(declared)} is not a "
            f"release this code knows ({', '.join(serving_ops.known_versions())})"
        )
    return declared


def check_serving(saved_model_dir: Path, declared: str | None, root_uri: str) -> dict:
    """Which known serving releases load the export; IncompatibleServingError when the declared one does not."""
    problems = serving_ops.loadable_in(saved_model_dir)
    if declared is not None and declared not in problems:
        problems[declared] = [
            item.describe(declared) for item in serving_ops.incompatibilities(saved_model_dir, declared)
        ]
    if declared is not None and problems[declared]:
        raise IncompatibleServingError(
            f"{root_uri}: is served by TensorFlow Serving {declared} (serving.json), which cannot load this model: "
            + "; ".join(problems[declared][:5])
            + ". Serve it with the TensorFlow release that wrote it (KServe: runtimeVersion), or declare that"
        )
    import tensorflow as tf

    return {
        "tensorflow_serving": declared,  # the release the root declares (None: none declared)
        "written_by_tensorflow": tf.__version__,
        "loads_in_tensorflow_serving": [version for version, found in problems.items() if not found],
        "not_in": {version: found[:3] for version, found in problems.items() if found},
    }


# -- making a version visible ---------------------------------------------------------------------------------


def _saved_model_last(path: Path) -> tuple[bool, str]:
    return path.name == SAVED_MODEL_PROTO, str(path)


def stage(root: str, export_dir: Path, token: str) -> list[str]:
    """Put the export under `.staging/<token>/` (a name servers ignore); the staged names, saved_model.pb last."""
    files = sorted((path for path in export_dir.rglob("*") if path.is_file()), key=_saved_model_last)
    relative = [path.relative_to(export_dir).as_posix() for path in files]
    if filesystem.is_remote(root):
        publisher = storage.publisher_for(root)
        for path, name in zip(files, relative, strict=True):
            publisher.publish(
                f"{STAGING}/{token}/{name}", storage.read_bytes(str(path)), expected_version=stores.ABSENT
            )
    else:
        shutil.copytree(export_dir, Path(root, STAGING, token))  # writer: this promotion's own export, staged
    return relative


def make_visible(root: str, token: str, names: list[str], version: int) -> None:
    """The staged version appears as `<version>/`: one rename on a local root; on gs:// and s3:// a server-side copy
    of each object, saved_model.pb last, so a folder without it is never more than a moment old."""
    if not filesystem.is_remote(root):
        os.rename(Path(root, STAGING, token), Path(root, str(version)))
        return
    publisher = storage.publisher_for(root)
    for name in names:
        publisher.copy(f"{STAGING}/{token}/{name}", f"{version}/{name}")


def remove(root: str, prefix: str) -> None:
    """Remove `prefix` (a folder) under the root, on any store."""
    if not filesystem.is_remote(root):
        shutil.rmtree(Path(root, prefix), ignore_errors=True)
        return
    publisher = storage.publisher_for(root)
    for name in publisher.list(prefix.rstrip("/") + "/"):
        publisher.withdraw(name)


def claim_deadline() -> float:
    """How long a promotion may go without renewing its claim before it stops (the writer lease's margin)."""
    from components.common.writer_claim import holder_deadline

    return holder_deadline(CLAIM_LEASE_SECONDS)


def _abandoned(promoting: dict, mine: str | None, watched_seconds: float) -> bool:
    """A claim whose promotion died: an earlier attempt of this very promotion (the same checkpoint: a retried
    promote step); a process of this host that no longer exists; one this promotion has watched unchanged (no
    renewal) for CLAIM_LEASE_SECONDS, a duration on its own clock. No timestamp of another machine's is compared
    with this one's clock."""
    if mine is not None and promoting.get("checkpoint") == mine:
        return True
    pid = promoting.get("pid")
    if promoting.get("host") == socket.gethostname() and pid is not None and not filesystem.process_alive(pid):
        return True
    return watched_seconds >= CLAIM_LEASE_SECONDS


class ClaimRenewal:
    """Keeps this promotion's claim alive while it stages: the pointer swapped again with the claim, its renewals
    counted, every CLAIM_RENEW_SECONDS; `version` is the pointer's latest version (the last write's answer)."""

    def __init__(self, root: str, claim: dict, version: str):
        self.root, self.claim, self.version = root, claim, version
        self.lost = False
        self._renewed = time.monotonic()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._renew, name="promotion-claim", daemon=True)
        self._thread.start()

    def _renew(self) -> None:
        publisher = storage.publisher_for(self.root)
        while not self._stop.wait(CLAIM_RENEW_SECONDS):
            self.claim["promoting"]["renewals"] = self.claim["promoting"].get("renewals", 0) + 1
            try:
                self.version = publisher.swap_document(POINTER, _encode(stored(self.claim, self.root)), self.version)
                self._renewed = time.monotonic()
            except filesystem.PublishConflictError:
                self.lost = True
                return
            except Exception as error:  # a store's bad moment: renewed at the next turn, or the deadline stops it
                logger.warning(
                    "could not renew the claim on version %s (%s)", self.claim["promoting"]["version"], error
                )

    def check(self) -> None:
        """Before each step of the promotion: the claim is still this one's and was renewed in time."""
        if self.lost:
            raise PromotionConflictError(
                f"the claim on version {self.claim['promoting']['version']} under {self.root} was taken over (its "
                "renewal found the pointer changed); nothing of this promotion was made visible"
            )
        silent = time.monotonic() - self._renewed
        if silent > claim_deadline():
            raise PromotionConflictError(
                f"the claim on version {self.claim['promoting']['version']} under {self.root} could not be renewed "
                f"for {silent:.0f} s; another promotion may take it over after {CLAIM_LEASE_SECONDS:.0f} s, so this "
                "one stops first"
            )

    def stop(self) -> str:
        """Stop renewing; the pointer's latest version."""
        self._stop.set()
        self._thread.join()
        return self.version


def clean_up(root: str, pointer: dict | None, names: list[str], mine: str, clock: Callable[[], float]) -> None:
    """Remove what dead promotions left, once this one holds the claim (so nobody else is mid-promotion): numeric
    folders above the last ready version (never made ready, yet a server would serve the highest), and staged files
    (staging happens only under a claim: a dead claim's, or any old enough). Without a ready version nothing
    numeric is removed, only skipped."""
    ready = ready_version(pointer)
    dead = set()
    if ready is not None:
        dead = {v for name in names if (v := _version_of(name)) is not None and v > ready["version"]}
    dead_staging = set()
    if (pointer or {}).get("promoting"):
        dead.add(pointer["promoting"]["version"])  # the dead claim this promotion took over (above any ready one)
        dead_staging.add(pointer["promoting"].get("staging"))
    for version in sorted(dead):
        logger.warning("removing %s/%d: a promotion that never finished left it", root, version)
        remove(root, str(version))
    tokens = {name.split("/")[1] for name in names if name.startswith(f"{STAGING}/") and name.count("/") >= 2}
    for token in sorted(tokens - {mine}):
        started = token.split("-", 1)[0]
        if token in dead_staging or not started.isdigit() or clock() - int(started) > STALE_CLAIM_SECONDS:
            logger.info("removing the staged files of a promotion that never finished (%s)", token)
            remove(root, f"{STAGING}/{token}")


def _list(root: str) -> list[str]:
    if filesystem.is_remote(root):
        return storage.publisher_for(root).list()
    base = Path(root)
    return [p.relative_to(base).as_posix() for p in base.rglob("*") if p.is_file()] if base.exists() else []


# -- the promotion ------------------------------------------------------------------------------------------------


def promote(
    candidate: Candidate,
    root: str,
    expected_pointer_version: str,
    decide_again: Callable[[dict | None], Decision] | None = None,
    serving_version: str | None = None,
    clock: Callable[[], float] = time.time,
) -> PromotionOutcome:
    """Promote `candidate` under `root` if the pointer is still the one the gate read (`expected_pointer_version`);
    when another promotion moved it, `decide_again(the new ready version)` says whether this model still goes first
    (without it, that is a PromotionConflictError)."""
    publisher = storage.publisher_for(root)
    declared = declared_serving_version(publisher, serving_version)
    with filesystem.scratch("promotion") as scratch:  # a killed promotion's is removed by the next
        export_dir = Path(scratch, "export")
        export_saved_model(
            candidate.model, candidate.label_names, export_dir, candidate.test_time_augmentation, candidate.resize,
            candidate.checkpoint_files,
        )  # fmt: skip
        if candidate.data_statistics is not None:  # what the next run's data is checked against
            filesystem.atomic_write_bytes(export_dir / PROMOTED_STATISTICS, candidate.data_statistics)
        serving = check_serving(export_dir, declared, publisher.uri(""))
        validated = canary.validate(export_dir, candidate.canary) if candidate.canary is not None else None
        extra = {"serving": serving, "canary": validated}
        return _claim_and_publish(candidate, root, export_dir, expected_pointer_version, decide_again, clock, extra)


def _claim_and_publish(candidate, root, export_dir, expected, decide_again, clock, extra) -> PromotionOutcome:
    publisher = storage.publisher_for(root)
    mine = candidate.record.get("checkpoint")
    token = f"{int(clock())}-{uuid.uuid4().hex[:12]}"  # when it was started: stale staging is found by its name
    decision = None
    first_seen: dict[str, float] = {}  # a pointer version with a claim: when this promotion first saw it (monotonic)
    attempts = 0
    while attempts < ATTEMPTS:
        pointer, seen = read_pointer(root)
        promoting = (pointer or {}).get("promoting")
        if promoting:  # watched from when this pointer version was first seen: any renewal starts it over
            watched = time.monotonic() - first_seen.setdefault(seen, time.monotonic())
            if not _abandoned(promoting, mine, watched):
                logger.info(
                    "version %s is being promoted by %s: waiting", promoting["version"], promoting.get("holder")
                )
                time.sleep(WAIT_POLL_SECONDS)
                continue
            logger.warning("taking over the claim on version %s of %s", promoting["version"], promoting.get("holder"))
        if seen != expected:
            earlier = _promoted_already(ready_version(pointer), candidate)
            if earlier is not None:  # this step's earlier attempt promoted it, then ended before saying so
                logger.info(
                    "version %d under %s is this model, promoted by an earlier attempt of this step: nothing more to "
                    "do", earlier["version"], root,
                )  # fmt: skip
                promotion = Promotion(earlier["version"], earlier["saved_model"], publisher.uri(POINTER),
                                      earlier.get("warm_start"))  # fmt: skip
                return PromotionOutcome(promotion, decision, earlier)
            if decide_again is None:
                raise PromotionConflictError(
                    f"{publisher.uri(POINTER)} was moved by another promotion after this evaluation read it; nothing "
                    "was promoted (evaluate again against the new model)"
                )
            decision = decide_again(ready_version(pointer))
            logger.info("the pointer moved meanwhile; decided again: %s", decision.summary())
            if not decision.blessed:
                return PromotionOutcome(None, decision)
            expected = seen
        listed = _list(root)
        known = [v for name in listed if (v := _version_of(name)) is not None]
        known += [(pointer or {}).get("version") or 0, (promoting or {}).get("version") or 0]
        version = max(known) + 1
        ready = ready_version(pointer) or {}
        claim = {**ready, "promoting": {"version": version, "holder": f"pid {os.getpid()} on {socket.gethostname()}",
                                        "host": socket.gethostname(), "pid": os.getpid(), "claimed_at": clock(),
                                        "checkpoint": mine, "staging": token}}  # fmt: skip
        try:
            claimed = publisher.swap_document(POINTER, _encode(stored(claim, root)), seen)  # the store's answer
        except filesystem.PublishConflictError:
            attempts += 1
            continue  # another promotion moved first: read it again (and decide again)
        claimed_at = time.monotonic()
        logger.info("claimed version %d under %s", version, root)
        renewal = ClaimRenewal(root, claim, claimed)
        try:
            clean_up(root, pointer, listed, token, clock)
            names = stage(root, export_dir, token)
            renewal.check()  # before anything becomes visible: the claim is still this one's
            make_visible(root, token, names, version)
            renewal.check()
        except BaseException:
            claimed = renewal.stop()
            if not renewal.lost:
                _withdraw_claim(root, version, ready, claimed)
            raise
        finally:
            claimed = renewal.stop()
            remove(root, f"{STAGING}/{token}")
        promoted = {
            **candidate.record,
            **extra,
            "version": version,
            "num_classes": len(candidate.label_names),  # an int, whatever the record became on its way (KFP)
            "state": "ready",
            "saved_model": publisher.uri(str(version)),
            "warm_start": _warm_start_uri(publisher, version, candidate),
            "promoted_at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        }
        try:
            publisher.swap_document(POINTER, _encode(stored(promoted, root)), claimed)
        except filesystem.PublishConflictError as error:
            raise PromotionConflictError(
                f"version {version} was made visible at {publisher.uri(str(version))}, but the pointer was changed "
                f"by someone else {time.monotonic() - claimed_at:.0f} s after this promotion claimed it, before it "
                f"could be marked ready (a claim is taken over only once watched unchanged for "
                f"{CLAIM_LEASE_SECONDS:.0f} s)"
            ) from error
        except BaseException:  # the last write failed (or the step was stopped): the root goes back as it was
            _withdraw_claim(root, version, ready, claimed)
            raise
        logger.info("promoted version %d: %s now points at it", version, publisher.uri(POINTER))
        return PromotionOutcome(
            Promotion(version, promoted["saved_model"], publisher.uri(POINTER), promoted["warm_start"]), decision,
            promoted,
        )  # fmt: skip
    raise PromotionConflictError(
        f"{publisher.uri(POINTER)} kept being moved by other promotions ({ATTEMPTS} attempts); nothing was promoted"
    )


def _promoted_already(ready: dict | None, candidate: Candidate) -> dict | None:
    """`ready` (the pointer's ready version) when it is `candidate` itself: the same checkpoint with the same
    weights, promoted by an earlier attempt of the same step that ended before it could say so."""
    record = candidate.record
    if not ready or not record.get("checkpoint") or ready.get("checkpoint") != record.get("checkpoint"):
        return None
    return ready if ready.get("weights_sha256") == record.get("weights_sha256") else None


def _withdraw_claim(root: str, version: int, ready: dict, claimed: str) -> None:
    """After a failed staging or a failed last write (a full disk, a store that kept answering 503): put the pointer
    back to the last ready version and remove what reached `<version>/`, so that nothing of this promotion is
    left and the next one need not wait for its claim. When the pointer has moved meanwhile (the failed write may
    have landed after all, or another promotion took the claim over), the folder is left to what the pointer
    says. Best effort otherwise: what it cannot undo, the next promotion's clean-up does (a claim of a process
    that is gone is taken over at once)."""
    publisher = storage.publisher_for(root)
    try:
        if ready:
            publisher.swap_document(POINTER, _encode(stored(ready, root)), claimed)
        else:  # nothing was ready before this claim: no pointer, as before it; only this claim's version of it
            publisher.withdraw_document(POINTER, claimed)
    except filesystem.PublishConflictError:
        logger.warning("the pointer moved while version %d failed: its folder is left as the pointer says", version)
        return
    except Exception as error:  # the original error is what the operator needs to see
        logger.warning("could not withdraw the claim on version %d (%s); the next promotion cleans up", version, error)
    try:
        remove(root, str(version))
        logger.warning("promotion of version %d failed: its claim was withdrawn, nothing of it is left", version)
    except Exception as error:
        logger.warning("could not remove version %d (%s); the next promotion cleans up", version, error)


def _warm_start_uri(publisher: stores.Publisher, version: int, candidate: Candidate) -> str | None:
    index = [path for path in candidate.checkpoint_files if path.name.endswith(".index")]
    if not index:
        return None
    return publisher.uri(f"{version}/{CHECKPOINT_FOLDER}/{index[0].name.removesuffix('.index')}")


def warm_start_checkpoint(explicit: str, root: str, from_promoted: bool) -> str:
    """What a (scheduled) training run starts from: an explicit checkpoint, else the last ready promoted version's
    own copy of its checkpoint (it outlives the run that trained it), else ""."""
    if explicit:
        return explicit
    if not (from_promoted and root):
        return ""
    ready = read_ready(root)
    if ready is None:
        logger.info("nothing promoted (and ready) under %s yet: training from scratch", root)
        return ""
    checkpoint = ready.get("warm_start")  # inside the root: the pointer's reader made sure
    if not checkpoint:
        logger.info("the promoted version %s holds no checkpoint to start from: from scratch", ready["version"])
        return ""
    logger.info("warm-starting from the promoted version %s (%s)", ready.get("version"), checkpoint)
    return checkpoint
