"""A hyperparameter search whose trials the project's own train stage trains, and which hands the best to it.

An Optuna study (TPE or random sampling; median or successive-halving pruning on each trial's validation curve)
asks for settings from the search space; each trial is `python -m components.train` with the sweep's train options
and the trial's settings, launched as the train stage launches (local processes, or a TrainJob / TFJob on a
cluster), on the dataset's training split, measured on its validation split, never on the test set. Up to
`parallelism` trials train at once; the driver reads each running trial's validation curve (`validation.json` in its
model directory) every few seconds, reports it to the study, and stops (SIGTERM: the trial saves a checkpoint and
ends) a trial the pruner says is behind.

The sweep's folder:

    study.journal   Optuna's journal: the whole study, so that a sweep started again continues it (a trial that
                    was training when the sweep was stopped is trained on from its checkpoints, as a new trial)
    trials.jsonl    one line per finished trial: its settings, state (complete, pruned, failed), validation accuracy
                    (the mean over its repeats, and their spread), curve, time and model directories
    best.json       the best complete trial, and the train options that reproduce it
    report.html     trials sorted by validation accuracy, the search's progress, each setting's importance
    tensorboard/    one run per trial (its validation curve) with its settings in TensorBoard's HParams dashboard
    trials/NNNN/    each trial's model directory (NNNN-K for its repeats)

Budgets: `trials` finished trials, and `max_minutes` of wall time over all attempts (running trials are then
stopped and recorded as failed: out of time). A failed trial (an exit code other than 0, non-finite numbers, no
validation measured, a validation curve that cannot be read, no new measure for `stall_minutes`) is recorded with its
reason and the search goes on: a trial's output is the trial's outcome, never the sweep's.

A step of a KFP run ends abruptly when its run is cancelled or its pod evicted (docs/cluster.md), so nothing here
waits for a stop to make its state durable: the journal reaches the sweep's folder after every change of the study
(a trial asked, a measure reported, a trial told), and a retried step continues the same trials, with their own
settings, in their own folders (`trials/NNNN-<token>`, named when asked, each holding the settings it trains with in
`trial.json`, and refusing others). A study has one driver at a time (the folder's writer claim: a lock, and on an
object store the writer lease); a journal cut short by an abrupt end is read up to its last whole line; a study is
continued only with the search space it was started with. Everything the folder records names its trials' folders
relative to it, so the folder can be moved or copied.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import signal
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from components.common import documents, exit_codes, filesystem, processes, storage, writer_claim
from components.common.config import config_from_mapping
from components.common.dataset import default_cache_dir, read_manifest
from components.common.model_directory import VALIDATION_CURVE, VALIDATION_CURVE_SCHEMA
from components.common.progress import format_duration
from components.sweep.config import SweepConfig
from components.sweep.space import SearchSpace, parse_space, read_space, refused_trial

logger = logging.getLogger(__name__)

STUDY = "study.journal"
TRIALS = "trials.jsonl"
BEST = "best.json"
REPORT = "report.html"
TENSORBOARD = "tensorboard"
TRIALS_FOLDER = "trials"
TRIAL_RECORD = "trial.json"  # in a trial's model directory: the settings it trains with
STUDY_NAME = "cifar10-sweep"
STOP_WAIT_SECONDS = 120.0  # a stopped trial saves its checkpoint; then it is killed
MAX_JOURNAL_BYTES = 256 << 20
MAX_LOG_TAIL_BYTES = 256 << 10  # where a failed trial's last error line is looked for
STALL_FACTOR = 5.0
SWEEP_FOLDER = writer_claim.Folder(
    "sweep_dir", "a sweep folder has one driver at a time (wait for it to end, stop it, or give another sweep folder)"
)


class SweepError(ValueError):
    """A sweep that cannot run as asked: one line naming the setting."""


@dataclass
class RunningTrial:
    trial: Any  # optuna.Trial
    params: dict[str, Any]
    model_dirs: list[str]
    process: Any = None
    repeat: int = 0
    started: float = field(default_factory=time.time)
    reported: set[int] = field(default_factory=set)
    accuracies: list[float] = field(default_factory=list)
    curve: list[tuple[int, float]] = field(default_factory=list)
    stopping: str | None = None  # "pruned", "out of time", or why its output failed it: why it was asked to stop
    stop_asked_at: float | None = None
    log_path: Path | None = None
    last_progress: float = field(default_factory=time.monotonic)  # a new measure, or its start
    longest_wait: float = 0.0  # between its measures so far (seconds)


class SweepFolder:
    """The sweep's folder: local, or a gs:// / s3:// prefix with a local working copy of the sweep's own files
    (the trials' model directories are written by the train stage, wherever the folder is)."""

    def __init__(self, uri: str, cache_dir: str | None):
        self.uri = uri.rstrip("/")
        self.remote = filesystem.is_remote(uri)
        if self.remote:
            import hashlib

            base = Path(cache_dir) if cache_dir else default_cache_dir()  # where the dataset is mirrored too
            self.local = base / "sweeps" / hashlib.sha256(self.uri.encode()).hexdigest()[:16]
            self.publisher = storage.publisher_for(self.uri)
        else:
            self.local = Path(uri)
        self.local.mkdir(parents=True, exist_ok=True)

    def location(self, name: str) -> str:
        return f"{self.uri}/{name}"

    def relative(self, location: str) -> str:
        """A trial's folder as the sweep records it: relative to the sweep folder (an absolute one, recorded by an
        earlier release, is taken relative to its own `trials/`, so a moved folder still reads)."""
        base = self.uri + "/"
        if location.startswith(base):
            return location[len(base) :]
        marker = f"/{TRIALS_FOLDER}/"
        if marker in location:
            return TRIALS_FOLDER + "/" + location.rsplit(marker, 1)[1]
        return location

    def claim(self) -> None:
        """Be the study's one driver (see the module's description); WriterClaimError naming the holder."""
        self._claim = writer_claim.DirectoryClaim(self.local, self.uri, SWEEP_FOLDER)
        self._claim.acquire()
        self._lease = None
        if self.remote:
            self._lease = writer_claim.WriterLease(self.uri, writer_claim.holder_description(), SWEEP_FOLDER)
            try:
                self._lease.acquire()
            except BaseException:
                self._claim.release()
                raise

    def check_claim(self) -> None:
        for held in (self._claim, self._lease):
            if held is not None:
                held.check()

    def release(self) -> None:
        if getattr(self, "_lease", None) is not None:
            self._lease.release()
        if getattr(self, "_claim", None) is not None:
            self._claim.release()

    def save_journal(self) -> None:
        """The journal, where a retried step finds it: on an object store, published whole after each change."""
        if self.remote and (self.local / STUDY).exists():
            self.check_claim()
            self.publisher.publish(STUDY, storage.read_bytes(str(self.local / STUDY)))

    def pull(self, name: str, max_bytes: int = MAX_JOURNAL_BYTES) -> None:
        if self.remote:
            try:
                content = storage.read_bounded(self.publisher.uri(name), max_bytes)
            except FileNotFoundError:
                return
            except filesystem.FileReadError as error:
                raise SweepError(f"{error}: not a study journal of this project; give another sweep folder") from None
            filesystem.atomic_write_bytes(self.local / name, content)

    def write(self, name: str, content: bytes) -> None:
        filesystem.atomic_write_bytes(self.local / name, content)
        if self.remote:
            self.publisher.publish(name, content)

    def publish_tree(self, folder: str) -> None:
        if self.remote:
            for path in sorted((self.local / folder).rglob("*")):
                if path.is_file():
                    self.publisher.publish(path.relative_to(self.local).as_posix(), storage.read_bytes(str(path)))


def _study(folder: SweepFolder, config: SweepConfig):
    import optuna
    from optuna.storages import JournalStorage
    from optuna.storages.journal import JournalFileBackend

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    folder.pull(STUDY)
    folder.pull(TRIALS)
    recover_journal(folder.local / STUDY, folder.location(STUDY), (folder.local / TRIALS).is_file())
    journal = JournalStorage(JournalFileBackend(str(folder.local / STUDY)))
    startup = config.startup_trials

    def sampler(seed: int):
        if config.sampler == "tpe":
            return optuna.samplers.TPESampler(seed=seed, n_startup_trials=startup, constant_liar=config.parallelism > 1)
        return optuna.samplers.RandomSampler(seed=seed)

    pruner = {
        "median": lambda: optuna.pruners.MedianPruner(n_startup_trials=max(startup, 1), n_warmup_steps=0),
        "asha": lambda: optuna.pruners.SuccessiveHalvingPruner(),
        "none": lambda: optuna.pruners.NopPruner(),
    }[config.pruner]()
    study = optuna.create_study(
        study_name=STUDY_NAME, storage=journal, sampler=sampler(config.seed), pruner=pruner, direction="maximize",
        load_if_exists=True,
    )  # fmt: skip
    asked = len(study.get_trials(deepcopy=False))
    if asked:  # a continued study: the sampler's draws go on from the trials already asked, not from trial 0's
        study.sampler = sampler(config.seed + asked)
    return study


def recover_journal(path: Path, uri: str, trials_recorded: bool = False) -> None:
    """The study's journal as Optuna will read it: a regular file of bounded size, one JSON object per line. A last
    line cut short (an abrupt end mid-write) is dropped, saying so; a line damaged before it is one line naming the
    file and the remedy, and so is a journal emptied where trials were recorded (`trials_recorded`: trials.jsonl
    is there), which would otherwise start a new study over the first one's records."""
    if not path.exists() and not path.is_symlink():
        return
    try:
        content = filesystem.read_regular_file(path, MAX_JOURNAL_BYTES)
    except (filesystem.FileReadError, OSError) as error:
        raise SweepError(f"{uri}: {error}; not a study journal: give another sweep folder") from None
    if trials_recorded and b"\n" not in content:
        raise SweepError(
            f"{uri}: the study journal is empty, yet {TRIALS} beside it records finished trials: the journal was "
            "emptied or replaced; restore it (a copy of the folder), or give another sweep folder to start a new "
            "study; nothing was changed"
        )
    whole = content.rfind(b"\n") + 1
    lines = content[:whole].split(b"\n")[:-1]
    for number, line in enumerate(lines, start=1):
        try:
            valid = isinstance(documents.load_foreign(line, f"{uri} line {number}", "journal line"), dict)
        except documents.DocumentError:
            valid = False
        if not valid:
            if number == len(lines) and whole == len(content):  # the last whole line, damaged: cut with it
                whole = content.rfind(b"\n", 0, whole - 1) + 1
                break
            raise SweepError(
                f"{uri}: the study journal is damaged at line {number} of {len(lines)}: restore it (a copy of the "
                "folder), or give another sweep folder to start a new study; nothing was changed"
            )
    if whole < len(content):
        logger.warning("%s: its last line was cut short (an abrupt end): the study continues up to the line before",
                       uri)  # fmt: skip
        filesystem.cut_to_whole_lines(path, keep=whole)


def trial_settings(config: SweepConfig, params: dict, model_dir: str, seed: int) -> dict[str, Any]:
    """Every setting of one training of a trial: the sweep's train options, the trial's settings, where it goes;
    numbers typed as the train stage's fields are (a KFP dict parameter's 2 arrives as 2.0)."""
    from components.common.config import with_field_types
    from components.train.config import TrainConfig
    from components.train.launch_config import LaunchConfig
    from components.train.launcher import check_launch_used, choose_launcher

    settings = {**config.train_options, **params, "data": config.data, "model_dir": model_dir}
    settings |= {"launcher": config.launcher, "workers": config.workers, "seed": seed}
    if config.cache_dir:
        settings["cache_dir"] = config.cache_dir
    settings = with_field_types(LaunchConfig, with_field_types(TrainConfig, settings))
    launch_names = {item.name for item in dataclasses.fields(LaunchConfig)}
    try:  # as the trial will check them: a mistake in train_options is one line now, not a failed trial per trial
        train = config_from_mapping(
            TrainConfig, {k: v for k, v in settings.items() if k not in launch_names}, "train_options"
        )
        launch = config_from_mapping(
            LaunchConfig, {k: v for k, v in settings.items() if k in launch_names}, "train_options"
        )
        check_launch_used(choose_launcher(train), train.launcher, launch)
    except ValueError as error:
        raise SweepError(str(error)) from None
    return json.loads(json.dumps(settings, default=list))  # reader: a round trip of the settings just built


def check_trials_fit(config: SweepConfig) -> None:
    """Trials that train on this machine or in this pod (each trial a process, and a local launcher's trial one per
    worker), `parallelism` at once, fit its memory (launch_local.processes_problem); a cluster job's do not run here.
    Which launcher a trial takes is the train stage's choice (launcher.choose_launcher): a cluster job only if named,
    or for several workers from a pod."""
    from components.train.cluster_job import in_kubernetes_pod
    from components.train.config import CLUSTER_LAUNCHERS
    from components.train.launch_local import processes_problem

    several_workers = config.workers > 1
    if config.launcher in CLUSTER_LAUNCHERS or (config.launcher == "auto" and several_workers and in_kubernetes_pod()):
        return
    each = config.workers if several_workers and config.launcher in ("auto", "local") else 1
    problem = processes_problem(config.parallelism * each, f"parallelism {config.parallelism} x workers {each}")
    if problem:
        raise SweepError(problem)


def read_curve(model_dir: str) -> list[tuple[int, float]]:
    """A trial's validation curve so far ([] before its first measure)."""
    location = f"{model_dir.rstrip('/')}/{VALIDATION_CURVE}"
    try:
        document = storage.document(location, VALIDATION_CURVE_SCHEMA, "validation curve")
    except FileNotFoundError:
        return []
    return [(point["step"], point["accuracy"]) for point in document["curve"]]


class Sweep:
    def __init__(self, config: SweepConfig):
        self.config = config
        check_trials_fit(config)
        self.space: SearchSpace = read_space(config.space)
        manifest, _digest = read_manifest(config.data)
        validation = manifest.splits.get("validation")
        if validation is None or not validation.num_examples:
            raise SweepError(
                f"data: {config.data} has no validation split: a search is measured on one (prepare the data with "
                "--validation-fraction, e.g. 0.1); the test split is kept for the final model"
            )
        first, *others = self.space.corners()
        trial_settings(config, first, config.sweep_dir, config.seed)  # train_options as a trial checks them
        for corner in others:  # and with each choice and bound of the space: a trial must not fail on its draw
            try:
                trial_settings(config, corner, config.sweep_dir, config.seed)
            except SweepError as error:
                raise SweepError(refused_trial(corner, error)) from None
        self.folder = SweepFolder(config.sweep_dir, config.cache_dir)
        self.folder.claim()
        try:
            self.study = _study(self.folder, config)
            self._check_space()
        except BaseException:
            self.folder.release()
            raise
        self.session_start = time.time()
        self.spent_before = float(self.study.user_attrs.get("seconds_spent", 0.0))
        self.running: list[RunningTrial] = []
        self.stop_signal: int | None = None

    def _check_space(self) -> None:
        """A study continues only with the space it was started with (else its trials would be ranked across two
        searches)."""
        described = self.space.as_dict()
        recorded = self.study.user_attrs.get("space")
        if recorded is None:
            if self.study.trials:  # a study of an earlier release: it did not record its space
                return
            self.study.set_user_attr("space", described)
            self.folder.save_journal()
            return
        if parse_space(recorded, "recorded").as_dict() != described:
            raise SweepError(
                f"{self.folder.location(STUDY)}: this study searched {json.dumps(recorded, sort_keys=True)}; the space "
                f"given now is {json.dumps(described, sort_keys=True)}: give the same space to continue it, or another "
                "sweep folder for a new search"
            )

    # -- the budget ----------------------------------------------------------------------------------------------

    def seconds_spent(self) -> float:
        return self.spent_before + time.time() - self.session_start

    def out_of_time(self) -> bool:
        return bool(self.config.max_minutes) and self.seconds_spent() >= self.config.max_minutes * 60

    def finished(self) -> list:
        """The study's finished trials, without those a stopped sweep left (continued as new trials)."""
        from optuna.trial import TrialState

        continued = {t.user_attrs.get("continues") for t in self.study.trials}
        done = (TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL)
        return [t for t in self.study.trials if t.state in done and t.number not in continued]

    # -- the loop ------------------------------------------------------------------------------------------------

    def run(self) -> int:
        self._continue_interrupted()
        previous = {sig: signal.signal(sig, self._on_signal) for sig in (signal.SIGTERM, signal.SIGINT)}
        try:
            while True:
                while self._may_start():
                    self._start(self.study.ask())
                if not self.running:
                    break
                time.sleep(self.config.poll_seconds)
                self._watch()
                if self.stop_signal is not None:
                    return self._stop_all()
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            try:
                self._save_state()
            finally:
                self.folder.release()
        finished = self.finished()
        if self.out_of_time():
            logger.info("the sweep's time budget (%.0f min) is spent", self.config.max_minutes)
        logger.info("sweep done: %d trials finished in %s", len(finished), format_duration(self.seconds_spent()))
        return exit_codes.SUCCESS

    def _may_start(self) -> bool:
        if self.stop_signal is not None or self.out_of_time():
            return False
        if len(self.running) >= self.config.parallelism:
            return False
        return len(self.finished()) + len(self.running) < self.config.trials

    def _on_signal(self, number: int, _frame) -> None:
        self.stop_signal = number

    def _continue_interrupted(self) -> None:
        """Trials a stopped sweep left training: recorded as failed (interrupted) and asked again with the same
        settings and model directories, so that they train on from their checkpoints."""
        from optuna.trial import TrialState

        for trial in self.study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
            self.study.tell(trial.number, state=TrialState.FAIL)
            model_dirs = trial.user_attrs.get("model_dirs")
            self.study.enqueue_trial(trial.params, user_attrs={"continues": trial.number, "model_dirs": model_dirs})
            logger.info("trial %d was stopped with the sweep: it continues as a new trial", trial.number)
            self.folder.save_journal()

    def _start(self, trial) -> None:
        import uuid

        params = self.space.suggest(trial)
        token = uuid.uuid4().hex[:6]  # a trial's folder is its own, whatever a lost journal numbered again
        relative = [self.folder.relative(location) for location in trial.user_attrs.get("model_dirs") or []] or [
            f"{TRIALS_FOLDER}/{trial.number:04d}-{token}" + (f"-{k}" if self.config.repeats > 1 else "")
            for k in range(self.config.repeats)
        ]
        trial.set_user_attr("model_dirs", relative)
        self.folder.save_journal()  # the trial asked, its settings and folders: durable before it trains
        running = RunningTrial(trial, params, [self.folder.location(name) for name in relative])
        self.running.append(running)
        self._launch(running)
        shown = ", ".join(f"{name}={_short(value)}" for name, value in params.items())
        logger.info("trial %d started: %s", trial.number, shown)

    def _launch(self, running: RunningTrial) -> None:
        seed = self.config.seed + 1000 * running.trial.number + running.repeat
        model_dir = running.model_dirs[running.repeat]
        settings = trial_settings(self.config, running.params, model_dir, seed)
        record_trial(model_dir, running.params)
        logs = self.folder.local / "logs"
        logs.mkdir(exist_ok=True)
        running.log_path = logs / f"{running.trial.number:04d}-{running.repeat}.log"
        with filesystem.open_for_append(running.log_path) as log:
            running.process = processes.start(
                [sys.executable, "-m", "components.train", "--config", json.dumps(settings)],
                stdout=log, stderr=subprocess.STDOUT,
            )  # fmt: skip

    def _watch(self) -> None:
        self.folder.check_claim()  # still this study's driver
        for running in list(self.running):
            try:
                self._report(running)
            except (ValueError, OSError, filesystem.StorageError) as error:  # the trial's own files: its outcome
                self._fail(running, f"its validation curve cannot be read ({str(error).splitlines()[0][:200]})")
            code = running.process.poll()
            if code is None:
                self._maybe_stop(running)
                continue
            self._ended(running, code)

    def _fail(self, running: RunningTrial, reason: str) -> None:
        """Stop a trial whose output failed it (it saves a checkpoint); it is recorded as failed when it ends."""
        if running.stopping is None:
            running.stopping = reason
            logger.info("trial %d: %s; stopping it", running.trial.number, reason)
            running.process.send_signal(signal.SIGTERM)
            running.stop_asked_at = time.monotonic()

    def _report(self, running: RunningTrial) -> None:
        """The running training's new validation measures, to the study (the first repeat's: what pruning reads)."""
        curve = read_curve(running.model_dirs[running.repeat])
        if len(curve) > len(running.curve) or not curve:
            now = time.monotonic()
            if len(curve) > len(running.curve):
                running.longest_wait = max(running.longest_wait, now - running.last_progress)
                running.last_progress = now
        running.curve = curve
        if running.repeat:
            return
        reported = False
        for step, accuracy in curve:
            if step not in running.reported:
                running.reported.add(step)
                running.trial.report(accuracy, step)
                reported = True
                logger.info(
                    "trial %d step %d: validation accuracy %.4f (%s)", running.trial.number, step, accuracy,
                    self._progress(),
                )  # fmt: skip
        if reported:
            self.folder.save_journal()

    def _maybe_stop(self, running: RunningTrial) -> None:
        if running.stopping is None:
            allowed = max(self.config.stall_minutes * 60, STALL_FACTOR * running.longest_wait)
            if time.monotonic() - running.last_progress > allowed:
                waited = (time.monotonic() - running.last_progress) / 60
                self._fail(
                    running, f"stopped reporting: no new validation measure for {waited:.0f} min (stall_minutes)"
                )
                return
            minutes = (time.time() - running.started) / 60
            if self.out_of_time():
                running.stopping = "out of time"
            elif self.config.trial_max_minutes and minutes > self.config.trial_max_minutes:
                running.stopping = f"over its own time limit ({self.config.trial_max_minutes:g} min, trial_max_minutes)"
            elif running.repeat == 0 and running.reported and running.trial.should_prune():
                running.stopping = "pruned"
            if running.stopping:
                logger.info("trial %d: %s; stopping it", running.trial.number, running.stopping)
                running.process.send_signal(signal.SIGTERM)
                running.stop_asked_at = time.monotonic()
        elif time.monotonic() - running.stop_asked_at > STOP_WAIT_SECONDS:
            running.process.kill()

    def _ended(self, running: RunningTrial, code: int) -> None:
        from optuna.trial import TrialState

        trial = running.trial
        if self.stop_signal is not None and running.stopping is None:  # Ctrl-C reached the trial with the sweep
            logger.info("trial %d stopped with the sweep (exit %d): it continues when the sweep runs again",
                        trial.number, code)  # fmt: skip
            self.running.remove(running)  # left running in the study: continued, and not counted, on resume
            return
        if running.stopping == "pruned":
            self._record(running, TrialState.PRUNED, "behind on its validation curve")
            return
        if running.stopping is None and code == 0:
            try:  # what it measured at the end (it may have ended before the last poll)
                self._report(running)
            except (ValueError, OSError, filesystem.StorageError) as error:
                self._record(running, TrialState.FAIL, f"its validation curve cannot be read ({str(error)[:200]})")
                return
        if running.stopping:
            self._record(running, TrialState.FAIL, running.stopping)
            return
        if code != 0:
            self._record(running, TrialState.FAIL, f"training ended with exit {code}{_last_error(running.log_path)}")
            return
        if not running.curve:
            self._record(running, TrialState.FAIL, "no validation measured")
            return
        accuracy = running.curve[-1][1]
        if not math.isfinite(accuracy):
            self._record(running, TrialState.FAIL, "non-finite validation accuracy")
            return
        running.accuracies.append(accuracy)
        if running.repeat + 1 < len(running.model_dirs):
            running.repeat += 1
            self._launch(running)
            return
        mean = statistics.fmean(running.accuracies)
        trial.set_user_attr("accuracies", running.accuracies)
        trial.set_user_attr("std", statistics.pstdev(running.accuracies) if len(running.accuracies) > 1 else 0.0)
        self._record(running, TrialState.COMPLETE, "", mean)

    def _record(self, running: RunningTrial, state, reason: str, value: float | None = None) -> None:
        trial = running.trial
        trial.set_user_attr("reason", reason)
        trial.set_user_attr("curve", [list(point) for point in running.curve])
        trial.set_user_attr("seconds", time.time() - running.started)
        if running.curve:
            trial.set_user_attr("last_accuracy", running.curve[-1][1])
        self.study.tell(trial, value if state.name == "COMPLETE" else None, state=state)
        self.folder.save_journal()
        self.running.remove(running)
        word = {"PRUNED": "pruned", "FAIL": "failed"}.get(state.name, "")
        outcome = f"validation accuracy {value:.4f}" if value is not None else f"{word}: {reason}"
        logger.info("trial %d %s (%s)", trial.number, outcome, self._progress())
        self._save_state()

    def _stop_all(self) -> int:
        """A signal to the sweep: its running trials stop (saving checkpoints) and stay running in the study, so
        that the sweep started again trains them on."""
        logger.warning(
            "stopping %d running trial(s): they save a checkpoint, and the study (in %s) continues them when the sweep "
            "runs again on that folder", len(self.running), self.config.sweep_dir
        )  # fmt: skip
        for running in self.running:
            running.process.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + STOP_WAIT_SECONDS
        for running in self.running:
            try:
                running.process.wait(max(deadline - time.monotonic(), 0.1))
            except subprocess.TimeoutExpired:  # it had its time
                running.process.kill()
        return exit_codes.INTERRUPTED if self.stop_signal == signal.SIGINT else exit_codes.PREEMPTED

    # -- what the sweep leaves -----------------------------------------------------------------------------------

    def _progress(self) -> str:
        finished = self.finished()
        complete = [t for t in finished if t.state.name == "COMPLETE"]
        best = f", best {max(t.value for t in complete):.4f}" if complete else ""
        rate = self.seconds_spent() / max(len(finished), 1)
        left = max(self.config.trials - len(finished), 0)
        eta = f", about {format_duration(rate * left / self.config.parallelism)} left" if finished and left else ""
        if self.out_of_time():  # no more trials start: the time budget, not the trials, ends the sweep
            eta = f", the time budget ({self.config.max_minutes:g} min) spent"
        return f"{len(finished)} of {self.config.trials} trials finished{best}{eta}"

    def _save_state(self) -> None:
        from components.sweep import report

        self.study.set_user_attr("seconds_spent", self.seconds_spent())
        self.spent_before, self.session_start = self.seconds_spent(), time.time()
        self.folder.save_journal()
        records = [trial_record(trial, self.folder) for trial in self.finished()]
        self.folder.write(TRIALS, "".join(json.dumps(record, sort_keys=True) + "\n" for record in records).encode())
        best = best_of(records, self.config)
        if best is not None:
            self.folder.write(BEST, json.dumps(best, indent=2, sort_keys=True).encode())
        self.folder.write(REPORT, report.render(records, best, self.space, importances(self.study)).encode())
        report.write_tensorboard(self.folder.local / TENSORBOARD, records, self.space)
        self.folder.publish_tree(TENSORBOARD)


def _short(value: Any) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def _last_error(log_path: Path | None) -> str:
    """The last ERROR line of a trial's log (what the train stage said), shortened."""
    if log_path is None or not log_path.exists():
        return ""
    tail = filesystem.read_tail(log_path, MAX_LOG_TAIL_BYTES).decode(errors="replace")
    lines = [line for line in tail.splitlines() if " ERROR " in line or "Error" in line]
    return f": {lines[-1].strip()[-200:]}" if lines else ""


def record_trial(model_dir: str, params: dict) -> None:
    """A trial's folder holds the settings it trains with (`trial.json`); a folder holding another trial's (a lost
    journal numbered a new trial as an old one) is refused: two trials never train in one folder."""
    location = f"{model_dir.rstrip('/')}/{TRIAL_RECORD}"
    schema = documents.Fields({"params": documents.Fields()}, ("params",))
    try:
        recorded = storage.document(location, schema, "trial record")
    except FileNotFoundError:
        recorded = None
    except documents.DocumentError as error:
        raise SweepError(f"{error}; the trial's folder is not this sweep's") from None
    if recorded is not None and recorded["params"] != params:
        raise SweepError(
            f"{model_dir}: holds the training of other settings ({json.dumps(recorded['params'], sort_keys=True)}); "
            f"this trial's are {json.dumps(params, sort_keys=True)}: the folder is not this trial's (was the study's "
            "journal replaced?); give another sweep folder"
        )
    if recorded is None:
        content = json.dumps({"params": params}, indent=2, sort_keys=True).encode()
        if filesystem.is_remote(model_dir):
            storage.publisher_for(model_dir).publish(TRIAL_RECORD, content)
        else:
            filesystem.atomic_write_bytes(Path(model_dir, TRIAL_RECORD), content)


def trial_record(trial, folder: SweepFolder | None = None) -> dict:
    """One finished trial, as trials.jsonl has it (its folders relative to the sweep's)."""
    state = {"COMPLETE": "complete", "PRUNED": "pruned", "FAIL": "failed"}[trial.state.name]
    attrs = trial.user_attrs
    accuracy = trial.value if trial.state.name == "COMPLETE" else attrs.get("last_accuracy")
    return {
        "trial": trial.number,
        "state": state,
        "params": trial.params,
        "validation_accuracy": accuracy,
        "validation_accuracy_std": attrs.get("std"),
        "accuracies": attrs.get("accuracies"),
        "curve": attrs.get("curve", []),
        "seconds": round(attrs.get("seconds", 0.0), 1),
        "finished_at": trial.datetime_complete.isoformat(timespec="seconds") if trial.datetime_complete else None,
        "reason": attrs.get("reason", ""),
        "model_dirs": [folder.relative(name) if folder else name for name in attrs.get("model_dirs", [])],
        **({"continues": attrs["continues"]} if "continues" in attrs else {}),
    }


def best_of(records: list[dict], config: SweepConfig) -> dict | None:
    """The complete trial with the highest validation accuracy (ties: the smaller spread, then the earlier)."""
    complete = [record for record in records if record["state"] == "complete"]
    if not complete:
        return None
    best = max(complete, key=lambda r: (r["validation_accuracy"], -(r["validation_accuracy_std"] or 0.0), -r["trial"]))
    return {
        "trial": best["trial"],
        "params": best["params"],
        "validation_accuracy": best["validation_accuracy"],
        "validation_accuracy_std": best["validation_accuracy_std"],
        "repeats": len(best["accuracies"] or [1]),
        "train_options": {**config.train_options, **best["params"]},
        "model_dirs": best["model_dirs"],
    }


def importances(study) -> dict[str, float]:
    """Each setting's share of the variation in validation accuracy (Optuna's fANOVA over complete trials); {}
    while there are too few complete trials to say."""
    from optuna.trial import TrialState

    complete = study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
    if len(complete) < 3:
        return {}
    try:
        import optuna

        return dict(optuna.importance.get_param_importances(study))
    except (RuntimeError, ValueError, ZeroDivisionError) as error:  # e.g. a setting that never varied
        logger.info("setting importance not computed: %s", error)
        return {}


def sweep(config: SweepConfig) -> int:
    return Sweep(config).run()


def read_best(sweep_dir: str) -> dict:
    """The best trial a sweep recorded (best.json), as the final training reads it."""
    location = f"{sweep_dir.rstrip('/')}/{BEST}"
    try:
        return storage.document(location, documents.ANY_OBJECT, "sweep's best trial")
    except FileNotFoundError:
        raise SweepError(
            f"{sweep_dir.rstrip('/')}: no trial of the sweep completed, so there is no best one to train (a failed or "
            f"pruned trial is not chosen): its trials.jsonl says how each ended; more max_minutes or trials may help"
        ) from None
