"""make local-run: the whole pipeline on this machine through kfp.local, as one command a person can follow.

- Checks before anything runs: the parameters (as the train stage would), and that a local source exists and is
  readable, or that a URL's host answers (unless the download is cached): mistakes fail in seconds, not minutes.
- No retries: a cluster retries a step on a new node; here a retry would fail the same way, minutes later.
- The prepared dataset is reused while the source and its parameters are unchanged (kfp.local's cache).
- The terminal shows a few lines per step (terminal.py); the run's `local-run.log` has everything.
- Ctrl-C stops training at a checkpoint; `--resume RUN` (make local-run RESUME=...) continues that run's training.
- Runs of one output folder may go at once: each knows its own folder; promotions into the shared root are safe.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shlex
import shutil
import signal
import socket
import tempfile
import time
import urllib.parse
from pathlib import Path
from typing import Any

from pipeline import run_record, terminal
from pipeline.parameters import (
    DEFAULT_OUTPUT_ROOT,
    LOCAL_RUN_SOURCE,
    CommandError,
    check_parameters,
    describe_length,
    trains,
)
from pipeline.step_processes import StepProcesses
from pipeline.step_user import StepUser, engine_is_rootless, step_user_for

logger = logging.getLogger("pipeline")

RUN_LOG = "local-run.log"
CACHE = ".kfp_cache"  # kfp.local's cache of step outputs (the prepared dataset), under the output folder
MODELS = "models"  # the promotion root of local runs, under the output folder
TRAINING_TASKS = "*train*-component*"  # train-component (in the pod), launch-training-job-component (a job)
SOURCE_PROBE_SECONDS = 5.0


class RunFailedError(RuntimeError):
    """A step of the run failed (its reason was shown); `exit_code` is the run's (StepProcesses.failure_exit_code)."""

    def __init__(self, message: str, exit_code: int = 1):
        super().__init__(message)
        self.exit_code = exit_code


class RunInterruptedError(RuntimeError):
    """Ctrl-C or SIGTERM: the run stopped; training saved a checkpoint when it had taken a step. `exit_code` is
    130 after SIGINT, 143 after SIGTERM (128 + the signal)."""

    def __init__(self, message: str, signal_number: int = signal.SIGINT):
        super().__init__(message)
        self.exit_code = 128 + int(signal_number)


# -- checks that take seconds -------------------------------------------------------------------------------------


def make_output_root(output_root: Path) -> None:
    """OUTPUT as a folder this user can write in, made if need be; else one line naming it."""
    try:
        output_root.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=output_root, prefix=".write-check-"):
            pass
    except OSError as error:
        what = "is a file, not a folder" if output_root.is_file() else f"cannot be written ({error.strerror})"
        raise CommandError(f"OUTPUT {output_root} {what}: give a folder this user can write") from None


# Parameters of the pods a cluster runs (the training job's workers, the training step's pod, the store's and the
# registry's Kubernetes secrets, the Kueue queue): a local run's steps and workers are processes (or containers) of
# this machine, and kfp.local's runners set no resources, so none of them would have an effect.
CLUSTER_ONLY_PARAMETERS = (
    "gpus_per_worker", "worker_cpu", "worker_memory", "worker_image", "image_pull_secret", "queue_name",
    "train_step_gpus", "train_step_cpus", "train_step_memory", "object_store_secret", "prepare_step_memory",
)  # fmt: skip


def check_cluster_only(parameters: dict[str, Any]) -> None:
    """A cluster's pod setting given to a local run is refused, not ignored."""
    given = [name for name in CLUSTER_ONLY_PARAMETERS if name in parameters]
    if given:
        options = ", ".join(f"--{name.replace('_', '-')}" for name in given)
        raise CommandError(
            f"{options}: a setting of the pods a cluster runs; a local run's steps and workers are processes of this "
            "machine, where it would have no effect: leave it out here, or give it to make run on a cluster"
        )


def check_local_inputs(parameters: dict[str, Any], cache_dir: Path | None = None) -> None:
    """Before any step: a local source exists and is readable; a URL's host answers (unless its download is in the
    cache); a local warm start or model directory named exists."""
    source = str(parameters.get("source") or "")
    if source and source != "synthetic" and "://" not in source:
        path = Path(source).expanduser()
        if not path.exists():
            raise CommandError(f"source: {source} does not exist (give an archive, a folder of class folders, a URL, "
                               "a gs:// or s3:// URI, or synthetic)")  # fmt: skip
        if not os.access(path, os.R_OK) or (path.is_dir() and not os.access(path, os.X_OK)):
            raise CommandError(f"source: {source} cannot be read by this user")
    elif source.startswith(("http://", "https://")) and not _download_cached(source, cache_dir):
        _check_reachable(source)
    for name in ("warm_start", "model_dir"):
        value = str(parameters.get(name) or "")
        if (
            value
            and "://" not in value
            and name == "warm_start"
            and not list(Path(value).parent.glob(Path(value).name + "*"))
        ):
            raise CommandError(f"{name}: {value} does not exist")


def _download_cached(url: str, cache_dir: Path | None) -> bool:
    from components.common.dataset import default_cache_dir
    from components.prepare_data.fetch import cached_download

    return cached_download(cache_dir or default_cache_dir(), url) is not None


def _check_reachable(url: str) -> None:
    parsed = urllib.parse.urlsplit(url)
    host, port = parsed.hostname or "", parsed.port or (443 if parsed.scheme == "https" else 80)
    try:
        socket.getaddrinfo(host, port)
        with socket.create_connection((host, port), timeout=SOURCE_PROBE_SECONDS):
            pass
    except OSError as error:
        raise CommandError(
            f"source: cannot reach {host} ({error.strerror or error}); on a machine without network, download "
            f"{url} elsewhere and give its path: make local-run SOURCE=/path/to/{Path(parsed.path).name}"
        ) from None


# -- resuming ---------------------------------------------------------------------------------------------------


def run_folders(pipeline_name: str, output_root: Path) -> list[Path]:
    """kfp.local's folders of this pipeline's runs (<pipeline name>-<timestamp>), oldest first."""
    return sorted(path for path in output_root.glob(f"{pipeline_name}-*") if path.is_dir())


def model_directory_of(run_folder: Path) -> Path | None:
    """Where the run trained: the local model directory it was given (a resumed run trains on in the earlier run's,
    as its record says), else its training step's own."""
    try:
        record = run_record.read(run_folder)
    except ValueError:
        record = None  # a damaged record is said where the run is resumed; here, the step's folder
    given = str((record.parameters if record else {}).get("model_dir") or "")
    if given and "://" not in given and Path(given).is_dir():
        return Path(given)
    found = sorted(run_folder.glob(f"{TRAINING_TASKS}/model"))
    return found[0] if found else None


SWEEP_TASK_FOLDER = "sweep-component/sweep"  # the sweep pipeline's search, under a run's folder


def sweep_directory_of(run_folder: Path) -> Path | None:
    """Where the run's search kept its study (the sweep pipeline's): the folder it was given (a resumed run searches
    on in the earlier run's), else its sweep step's own; None when it has no study."""
    from components.sweep.sweep import STUDY

    try:
        record = run_record.read(run_folder)
    except ValueError:
        record = None
    given = str((record.parameters if record else {}).get("sweep_dir") or "")
    candidates = ([Path(given)] if given and "://" not in given else []) + [run_folder / SWEEP_TASK_FOLDER]
    return next((folder for folder in candidates if (folder / STUDY).is_file()), None)


def _has_checkpoint(run_folder: Path) -> bool:
    from components.common.model_directory import list_checkpoints

    model_dir = model_directory_of(run_folder)
    return bool(model_dir and list_checkpoints(model_dir))


def _resumable(run_folder: Path) -> bool:
    return _has_checkpoint(run_folder) or sweep_directory_of(run_folder) is not None


# Options a resumed run may change: its length (to train on for longer), a search's budget.
CHANGEABLE_ON_RESUME = ("train_steps", "epochs", "trials", "max_minutes")


def resumable_run(pipeline_name: str, output_root: Path, resume: str) -> Path:
    """The folder of the run `resume` names (a folder, its name, or "last": the newest interrupted run that is not
    running), refused in one line when it is still running or has nothing to resume."""
    if resume == "last":
        candidates = []
        for folder in reversed(run_folders(pipeline_name, output_root)):
            record = run_record.read(folder)
            if (record is None or record.resumable()) and _resumable(folder):
                candidates.append(folder)
        if not candidates:
            raise CommandError(
                f"--resume last: no interrupted run in {output_root} has a checkpoint or a search to continue"
            )
        folder = candidates[0]
    else:
        folder = Path(resume) if Path(resume).is_dir() else output_root / resume
    record = run_record.read(folder) if folder.is_dir() else None
    if record is not None and record.still_running():
        raise CommandError(
            f"--resume {resume}: {folder.name} is still running (pid {record.pid}); stop it first (Ctrl-C in its "
            "terminal, or kill -TERM it), then resume it"
        )
    return folder


def resumed(
    pipeline_name: str, parameters: dict[str, Any], output_root: Path, resume: str, searches: bool = False
) -> tuple[dict, Path]:
    """The parameters that continue run `resume`: that run's own options (from its record), with its model
    directory, where training resumes from the latest checkpoint, and (`searches`: the sweep pipeline) its sweep's
    folder, whose study the search continues without training a finished trial again; options given again must
    agree, but for the length and the search's budget. Returns them and the run's folder."""
    for name in ("model_dir", "sweep_dir"):
        if parameters.get(name):
            raise CommandError(
                f"give --resume or --{name.replace('_', '-')}, not both: resuming continues in the earlier run's "
                "folders"
            )
    folder = resumable_run(pipeline_name, output_root, resume)
    from components.common.model_directory import checkpoint_step, list_checkpoints

    model_dir = model_directory_of(folder) if folder.is_dir() else None
    found = list_checkpoints(model_dir) if model_dir else []
    searched = sweep_directory_of(folder) if folder.is_dir() and searches else None
    if not found and searched is None:
        what = "a checkpoint or a search" if searches else "a checkpoint"
        raise CommandError(f"--resume {resume}: {folder} is not a run with {what} to continue from")
    record = run_record.read(folder)
    own = dict(record.parameters) if record is not None else {}
    for name, value in parameters.items():
        if name in own and own[name] != value and name not in CHANGEABLE_ON_RESUME:
            raise CommandError(
                f"--resume {folder.name}: {name} was {json.dumps(own[name])} in that run, {json.dumps(value)} now; "
                "leave it out to continue with the run's own (only the length may change)"
            )
    continued = {**own, **parameters}
    changed = [f"{name} {json.dumps(value)}" for name, value in parameters.items() if own.get(name) != value]
    options = "with its own options" + (f" but {', '.join(changed)}" if changed else "")  # the length, the budget
    if searched is not None:
        continued["sweep_dir"] = str(searched)
        logger.info("continuing %s's search (%s), %s", folder.name, searched, options)
    if found:
        continued["model_dir"] = str(model_dir)
        logger.info("resuming %s's training from its checkpoint at step %d, %s", folder.name,
                    checkpoint_step(found[-1]), options)  # fmt: skip
    return continued, folder


# -- the run ----------------------------------------------------------------------------------------------------


def local_run(
    pipeline,
    parameters: dict[str, Any],
    output_root: Path,
    runner: str = "subprocess",
    verbose: bool = False,
    resume: str | None = None,
) -> Path:
    """Run the whole pipeline on this machine through kfp.local; returns the run's folder (OUTPUT/<pipeline>-<time>;
    promoted models go to OUTPUT/models). RunFailedError or RunInterruptedError when it did not finish."""
    from kfp import local
    from kfp.local import executor_input_utils, pipeline_orchestrator

    train_config = check_parameters(pipeline, {"source": LOCAL_RUN_SOURCE, **parameters}, on_cluster=False)
    if parameters.get("launcher") in ("trainjob", "tfjob"):
        raise CommandError(
            f"launcher {parameters['launcher']} needs a Kubernetes cluster (make run); on this machine the workers are "
            "processes (launcher auto or pod)"
        )
    output_root = output_root.resolve()
    check_cluster_only(parameters)
    continued = None
    if resume:  # before OUTPUT is made: a run to resume is found there or the command ends, leaving nothing
        searches = "sweep_dir" in pipeline.component_spec.inputs
        parameters, continued = resumed(pipeline.name, parameters, output_root, resume, searches)
        train_config = check_parameters(
            pipeline, {"source": LOCAL_RUN_SOURCE, **parameters}, resumed=True, on_cluster=False
        )
    make_output_root(output_root)
    training = trains(pipeline)
    if training:  # the predict pipeline has neither
        parameters = {"source": LOCAL_RUN_SOURCE, "promotion_root": str(output_root / MODELS), **parameters}
    check_local_inputs(parameters)
    if runner == "docker":
        problem = docker_engine_problem()
        if problem:
            raise CommandError(
                f"RUNNER=docker needs a running Docker engine, and here {problem}. With podman: podman system service "
                "and DOCKER_HOST=unix://<its socket>. Or run without containers: make local-run (the subprocess "
                "runner, same code and parameters)."
            )
        check_paths_are_mounted(parameters, output_root)
        check_images_are_built()
        user = docker_step_user()
        chosen_runner = docker_runner(user)
    elif runner == "subprocess":
        user = StepUser(os.getuid(), os.getgid())
        chosen_runner = local.SubprocessRunner(use_venv=False)
    else:
        raise CommandError(f"runner {runner!r} is not subprocess or docker")
    local.init(runner=chosen_runner, pipeline_root=str(output_root), enable_caching=True,
               cache_root=str(output_root / CACHE))  # fmt: skip

    run_name = executor_input_utils.get_local_pipeline_resource_name(pipeline.name)
    run_folder = output_root / run_name
    prepare_step_folders(user, output_root, run_folder, parameters)
    record = run_record.started(run_folder, parameters, runner, continued.name if continued else None)
    log_path = run_folder / RUN_LOG
    logger.info("running %s locally (%s runner); everything is logged in %s", pipeline.name, runner, log_path)
    if training:
        logger.info("training: %s, on %s; promoting into %s", describe_length(train_config), parameters["source"],
                    parameters["promotion_root"])  # fmt: skip
    started = time.monotonic()
    steps = StepProcesses()
    named = _run_named(executor_input_utils, run_name)
    with terminal.steps_shown(log_path, verbose) as view, named, steps.supervised():
        view.log.write(f"parameters: {json.dumps(parameters, sort_keys=True)}\n")
        if continued is not None:
            view.log.write(f"continues the training of {continued}\n")
        view.stopping = lambda: steps.stopped_by is not None
        try:
            pipeline_orchestrator.run_local_pipeline(pipeline_spec=_without_retries(pipeline), arguments=parameters)
        except KeyboardInterrupt:
            run_record.ended(run_folder, record, "interrupted")
            raise RunInterruptedError(_interrupted(run_folder, training), steps.stopped_by or signal.SIGINT) from None
        except RuntimeError as error:
            stopped = steps.stopped_by is not None
            run_record.ended(run_folder, record, "interrupted" if stopped else "failed")
            if "finished with status" not in str(error):
                raise
            if stopped:  # decided now that the steps have ended, from what they left
                raise RunInterruptedError(_interrupted(run_folder, training), steps.stopped_by) from None
            inner = re.findall(r"Inner task failed: '([^']+)'", terminal._ANSI.sub("", str(error)))
            failed = view.failed_steps or inner
            step = terminal.step_name(failed[0]) if failed else "a step"
            raise RunFailedError(
                f"the run failed at {step}; the lines above say why, {log_path} has everything",
                steps.failure_exit_code(),
            ) from None
    if steps.stopped_by is not None:  # stopped after the last step had ended
        run_record.ended(run_folder, record, "interrupted")
        raise RunInterruptedError(_interrupted(run_folder, training), steps.stopped_by)
    run_record.ended(run_folder, record, "finished")
    logger.info("finished in %.0f s: %s", time.monotonic() - started, run_folder)
    if training:
        described = describe_run(run_folder, Path(parameters["promotion_root"]), log_path)
    else:
        described = describe_predictions(run_folder, log_path)
    for line in described:
        logger.info("%s", line)
    return run_folder


class _run_named:  # noqa: N801 (a context manager read as a phrase)
    """kfp.local names the run's folder <pipeline>-<timestamp> inside; this run's name is chosen before it starts, so
    that it knows its own folder even when other runs of the same output folder start at the same moment."""

    def __init__(self, module, name: str):
        self.module, self.name = module, name

    def __enter__(self):
        self.original = self.module.get_local_pipeline_resource_name
        self.module.get_local_pipeline_resource_name = lambda _pipeline_name: self.name

    def __exit__(self, *_exception):
        self.module.get_local_pipeline_resource_name = self.original


def _without_retries(pipeline):
    """The pipeline's spec with every task's retry policy removed: a local step that fails fails the same way again."""
    from kfp.pipeline_spec import pipeline_spec_pb2

    spec = pipeline_spec_pb2.PipelineSpec()
    spec.CopyFrom(pipeline.component_spec.implementation.graph)
    dags = [spec.root.dag] + [component.dag for component in spec.components.values() if component.HasField("dag")]
    for dag in dags:
        for task in dag.tasks.values():
            task.ClearField("retry_policy")
    return spec


def shell_word(path: Path) -> str:
    """A path as one word of a shell command a person copies (quoted if it holds spaces or the like)."""
    return shlex.quote(str(path))


def _output_words(output_root: Path, option: str) -> str:
    """` OPTION=<root>` (make's OUTPUT) or ` OPTION <root>` (the CLI's --output-root) when the runs are not in the
    default folder, so that a printed command finds them; "" when they are."""
    if output_root.resolve() == DEFAULT_OUTPUT_ROOT.resolve():
        return ""
    return f" {option}{'=' if option.isupper() else ' '}{shell_word(output_root.resolve())}"


def _make_command(target: str, output_root: Path) -> str:
    return f"make {target}{_output_words(output_root, 'OUTPUT')}"


def _interrupted(run_folder: Path, training: bool = True) -> str:
    """What a stopped run leaves to continue, and the command that continues it (make sweep for a search's run)."""
    if not training:  # a prediction run's output is its own folder's
        return "interrupted; a prediction run is not resumed (run it again: it scores every image again)"
    from components.common.model_directory import checkpoint_step, list_checkpoints

    model_dir = model_directory_of(run_folder)
    steps = [checkpoint_step(prefix) for prefix in list_checkpoints(model_dir)] if model_dir else []
    searched = sweep_directory_of(run_folder)
    target, word = ("sweep", "sweep ") if searched is not None else ("local-run", "")
    output_root = run_folder.parent
    again = (f"continue with: {_make_command(target, output_root)} RESUME={run_folder.name} (the same options), or "
             f"python -m pipeline.pipeline {word}local-run{_output_words(output_root, '--output-root')} --resume "
             f"{run_folder.name}")  # fmt: skip
    if steps:
        return f"interrupted at step {steps[-1]} (its checkpoint is saved); {again}"
    if searched is not None:
        return f"interrupted during the search (its study is saved in {searched}); {again}"
    return "interrupted before training saved a checkpoint; nothing to resume (run again to start over)"


def describe_predictions(run_folder: Path, log_path: Path) -> list[str]:
    """Where a prediction run's outputs are (the predict pipeline's step writes them into the run's folder)."""
    lines = [f"{name}: {path}" for name, pattern in (("predictions", "predict-component*/predictions"),
                                                    ("report", "predict-component*/report"))
             for path in sorted(run_folder.glob(pattern))]  # fmt: skip
    return [*lines, f"full log: {log_path}"]


def describe_run(run_folder: Path, promotion_root: Path, log_path: Path) -> list[str]:
    """Where the run's main outputs are, for a person reading the terminal."""
    from components.common import storage
    from components.common.model_directory import EVAL_METRICS, EVAL_METRICS_SCHEMA, read_document
    from components.evaluate.pointer import POINTER, parse_pointer

    lines = []
    model_dir = model_directory_of(run_folder)
    if model_dir and (model_dir / EVAL_METRICS).exists():
        summary = read_document(model_dir, EVAL_METRICS, EVAL_METRICS_SCHEMA)
        decision = "BLESSED" if summary["blessed"] else "NOT BLESSED"
        reasons = "; ".join(summary.get("reasons", []))
        lines.append(
            f"accuracy {summary['metrics']['accuracy']:.4f}: {decision}" + (f" ({reasons})" if reasons else "")
        )
    sweep_dir = sweep_directory_of(run_folder)
    if sweep_dir is not None:  # the sweep pipeline's search
        from components.sweep.sweep import BEST, REPORT, read_best

        if (sweep_dir / BEST).exists():
            best = read_best(str(sweep_dir))
            lines.append(
                f"search: best trial {best['trial']} of {sweep_dir}, validation accuracy "
                f"{best['validation_accuracy']:.4f} (the final model's test accuracy is the line above): "
                + ", ".join(f"{name}={value}" for name, value in best["params"].items())
            )
            lines.append(
                f"search report: {sweep_dir / REPORT}; TensorBoard: make tensorboard LOGDIR={shell_word(sweep_dir)}"
            )
    lines += _data_lines(run_folder, model_dir)
    pointer = promotion_root / POINTER
    if pointer.exists():
        current = parse_pointer(storage.document_bytes(str(pointer), "promotion pointer"), str(promotion_root))
        if current.get("state") == "ready":
            where = f"version {current['version']} at {current['saved_model']}"
            promoted_here = any(run_folder.glob("promote-component*/executor_output.json"))
            lines.append(f"promoted model: {where}" if promoted_here else
                         f"still promoted: {where} (this run's model was not promoted)")  # fmt: skip
    report = sorted(run_folder.glob(f"{TRAINING_TASKS}/model/eval/report.html"))
    if report:
        lines.append(f"report: {report[0]} (open it in a browser)")
    if model_dir:
        lines.append(f"model directory: {model_dir}")
        lines.append(f"TensorBoard: make tensorboard LOGDIR={shell_word(model_dir)}")
    lines.append(f"full log: {log_path}")
    return lines


def _data_lines(run_folder: Path, model_dir: Path | None) -> list[str]:
    """What the data check found (by severity, whether it blocked the promotion, where its findings are) and what
    the leakage option removed."""
    from components.common import documents, storage
    from components.common.data_statistics import Finding, read_statistics, summary_line
    from components.evaluate.report import leakage_removed_line

    lines = []
    for findings_file in sorted(run_folder.glob("check-data-component*/findings")):
        found = storage.document(findings_file, documents.ANY_OBJECT, "data check findings")
        fields = set(Finding.__dataclass_fields__)
        findings = [Finding(**{"kind": "finding", "message": "", **{key: value for key, value in finding.items()
                                                                     if key in fields}})
                    for finding in found.get("findings", []) if isinstance(finding, dict)]  # fmt: skip
        blocked = f"; it blocked the promotion ({found['blocking']})" if found.get("blocking") else ""
        lines.append(f"data check against {found.get('reference', '?')}: {summary_line(findings)}"
                     f"{blocked}; the findings (JSON): {findings_file}")  # fmt: skip
    config_file = model_dir / "config.json" if model_dir else None
    if config_file is not None and config_file.is_file():
        data = str(storage.document(config_file, documents.ANY_OBJECT, "training config").get("data") or "")
        statistics_file = Path(data) / "statistics.json"
        if data and "://" not in data and statistics_file.is_file():
            removed = read_statistics(str(statistics_file)).get("leakage_removed")
            if removed:
                lines.append(leakage_removed_line(removed))
    return lines


# -- cleaning up ------------------------------------------------------------------------------------------------


PREPARE_TASK = "prepare-data-component"  # a run's folder of its prepared dataset (kfp.local's task folder)


def clean_runs(pipeline_name: str, output_root: Path, keep: int = 0, interrupted_too: bool = False) -> list[Path]:
    """Remove the run folders under `output_root` but the newest `keep`, a run that is still running, and (unless
    `interrupted_too`) an interrupted run, which can be resumed; promoted models (models/) stay, and so does a run's
    dataset while a kept run uses it (kfp.local's cache then prepares it again when needed). Says what it removed
    and what it kept, and why."""
    runs = run_folders(pipeline_name, output_root.resolve())
    records = {folder: run_record.read(folder) for folder in runs}
    live = [folder.name for folder, record in records.items() if record is not None and record.still_running()]
    removed = []
    for index, folder in enumerate(runs):
        record = records[folder]
        if index >= len(runs) - keep:
            why = "one of the newest kept"
        elif record is not None and record.still_running():
            why = "still running"
        elif record is not None and record.resumable() and not interrupted_too:
            removes = f"{_make_command('clean-runs', output_root)} ALL=1"
            why = f"{record.standing()}, can be resumed ({removes} removes it too)"
        elif live and (folder / PREPARE_TASK).is_dir():
            # A live run may be reading this run's prepared dataset (kfp.local's cache hands it the earlier run's):
            # everything else goes; the dataset when no run is live.
            for child in folder.iterdir():
                if child.name != PREPARE_TASK:
                    shutil.rmtree(child) if child.is_dir() and not child.is_symlink() else child.unlink()
            removed.append(folder)
            logger.info("removed %s but its prepared dataset, which the running %s may be reading (a clean-runs "
                        "after it ends removes it)", folder.name, live[0])  # fmt: skip
            continue
        else:
            shutil.rmtree(folder)
            removed.append(folder)
            logger.info("removed %s (%s)", folder.name, record.standing() if record else "from before run records")
            continue
        logger.info("kept %s: %s", folder.name, why)
    logger.info("removed %d run(s); the promoted models stay in %s", len(removed), output_root / MODELS)
    return removed


# -- RUNNER=docker ----------------------------------------------------------------------------------------------


def docker_engine_problem() -> str | None:
    """Why a DockerRunner cannot work here, or None when a Docker API answers (Docker's, or podman's
    `podman system service` with DOCKER_HOST pointing at its socket)."""
    try:
        import docker

        docker.from_env(timeout=20).ping()
    except ImportError:
        return "the docker Python package is not installed"
    except Exception as error:  # the SDK raises many kinds; all mean: no engine
        reason = str(error).strip().splitlines()
        return f"no Docker API answers ({reason[-1] if reason else type(error).__name__})"
    return None


def docker_step_user() -> StepUser:
    """Who the steps run as with the engine that answers (pipeline/step_user.py)."""
    import docker

    client = docker.from_env(timeout=60)
    return step_user_for(engine_is_rootless(client.info()))


def prepare_step_folders(user: StepUser, output_root: Path, run_folder: Path, parameters: dict[str, Any]) -> None:
    """Every host folder a step writes into, made or taken over for the steps' user, here and only here: the output
    root (steps make their folders in the run's folder, and the promotion root when it is new), the run's folder, a
    local promotion root that exists, and a resumed run's model directory; then the steps' access to each, checked."""
    given = [(output_root, False), (run_folder, False)]
    for name in ("promotion_root", "model_dir"):
        value = str(parameters.get(name) or "")
        if value and "://" not in value and Path(value).exists():
            given.append((Path(value).resolve(), True))
    for folder, recursive in given:
        user.give(folder, recursive)
    problems = [problem for folder, recursive in given for problem in user.problems(folder, recursive)]
    if problems:
        raise CommandError(
            f"{problems[0]}{f' (and {len(problems) - 1} more)' if len(problems) > 1 else ''}: the steps could not "
            "write there; run as the folder's owner, or give OUTPUT a folder of your own"
        )


def docker_runner(user: StepUser):
    """kfp.local's DockerRunner, running each step as KFP does on a cluster: a non-root user (pipeline/step_user.py),
    a read-only root file system, a writable /tmp; the pipeline root (OUTPUT) is mounted at its own path."""
    from kfp import local

    return local.DockerRunner(
        **user.run_arguments(), read_only=True, tmpfs={"/tmp": "rw,exec,size=4g"}, network_mode="host"
    )


def check_images_are_built() -> None:
    """Every image the pipeline names is on the engine (a missing one would be pulled from a registry that does not
    have this content's tag)."""
    import docker

    from components.images import IMAGE_OF_STAGE, image

    client = docker.from_env(timeout=60)
    for reference in sorted({image(stage) for stage in IMAGE_OF_STAGE}):
        try:
            client.images.get(reference)
        except docker.errors.ImageNotFound:
            tag = os.environ.get("CIFAR10_PIPELINE_TAG")
            raise CommandError(
                f"{reference}: not built; make images TAG={tag} builds it" if tag else
                f"{reference}: not built (the image tag follows the code); run make images first, or give the TAG "
                "the images were built with (make images TAG=...)"
            ) from None  # fmt: skip


def check_paths_are_mounted(parameters: dict[str, Any], output_root: Path) -> None:
    """RUNNER=docker mounts only OUTPUT: a local path elsewhere would not exist inside the containers."""
    for name in ("source", "promotion_root", "warm_start", "model_dir"):
        value = str(parameters.get(name) or "")
        if not value or "://" in value or value == "synthetic":
            continue
        path = Path(value).expanduser().resolve()
        if output_root != path and output_root not in path.parents:
            raise CommandError(
                f"{name}: {value} is outside {output_root}, the only folder RUNNER=docker mounts into the steps; "
                f"copy it under {output_root} or give a gs:// or s3:// URI"
            )
