"""The pipelines' parameters, checked before anything runs: what the steps would refuse after the data was prepared
is refused in seconds, by the stages' own config checks. Shared by the commands (pipeline/commands.py) and local-run
(pipeline/local_run.py)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

LOCAL_RUN_SOURCE = "synthetic"  # local-run is a demo unless told otherwise (make local-run SOURCE=...)
DEFAULT_OUTPUT_ROOT = Path("outputs")  # local runs' folders, relative to where they are started (make's OUTPUT)


class CommandError(RuntimeError):
    """A command cannot do what was asked (no Docker engine, a bad cron expression...)."""


def parameter_types(pipeline) -> dict[str, tuple[str, Any]]:
    """{name: (KFP type, default)} of the pipeline's inputs."""
    return {name: (spec.type, spec.default) for name, spec in pipeline.component_spec.inputs.items()}


def trains(pipeline) -> bool:
    """Whether `pipeline` is the training pipeline (whose parameters the train stage's checks apply to)."""
    return "launcher" in parameter_types(pipeline)


# -- checking parameters before anything runs ------------------------------------------------------------------

LAUNCHERS = ("auto", "trainjob", "tfjob", "pod")
# Pipeline parameters that become TrainConfig fields (and LaunchConfig fields) of the same name.
TRAIN_PARAMETERS = ("workers", "depth", "batch_size", "learning_rate", "train_steps", "epochs", "preset")
LAUNCH_PARAMETERS = ("gpus_per_worker", "worker_cpu", "worker_memory", "worker_image", "queue_name")
LAUNCH_PARAMETERS += ("object_store_secret",)


def check_parameters(pipeline, parameters: dict[str, Any], resumed: bool = False, on_cluster: bool = True):
    """Refuse, in seconds and before any step runs, run parameters that a step would refuse after the data was
    prepared or the model trained: for every pipeline, a value its parameter's type cannot carry; for the training
    pipelines, what each stage's own config checks refuse (the data's preparation and check, training and its
    launch, the training pod's resources, the evaluation's gate, the promotion's serving release and registry),
    both epochs and train_steps, a train option that repeats a named parameter, and a setting given that the search
    space also searches, a synthetic dataset's size with another source or a setting another makes the run ignore
    (check_used) (these three not in a `resumed` run's own record, which an earlier release may have written);
    `on_cluster`, a prepare step's pod with less memory than its bound on the source needs. (Another pipeline's
    values are checked by its step, its first.)"""
    check_parameter_types(pipeline, parameters)
    check_locations(parameters)  # every pipeline's, by one rule
    if on_cluster:
        check_cluster_locations(parameters)
    if not trains(pipeline):
        return None
    for name in ("epochs", "train_steps"):
        if name in parameters and not parameters[name] > 0:
            raise CommandError(
                f"{name}: {parameters[name]} is not a length; give a positive number, or leave it out for the "
                "recipe's own length"
            )
    from components.common.kfp_parameters import as_delivered

    defaults = {name: default for name, (_kind, default) in parameter_types(pipeline).items()}
    given = {**defaults, **parameters}
    if not resumed:  # a run's own record, which an earlier release may have written with either
        check_not_searched(parameters, given.get("space"))
    if not resumed and "synthetic_train_per_class" in parameters and given.get("source") != "synthetic":
        raise CommandError(
            f"synthetic_train_per_class: it sizes the synthetic dataset, and the source is {given.get('source')}: "
            "leave it out, or give source synthetic"
        )
    _check_values(given)  # as given: its messages quote what the user wrote
    if not resumed:
        check_used(parameters, given, on_cluster)
    if on_cluster:  # a local run's steps have the machine's memory
        check_prepare_memory(given)
        check_train_step_memory(given)
    else:
        check_machine_holds(given)
        check_sweep_folder_free(given)
    # and as the steps will see them (a dict parameter's numbers all doubles), so that nothing passes here and fails
    # there
    return _check_values({name: as_delivered(value) for name, value in given.items()})


# What a value of each KFP parameter type must be. KFP carries numbers as protobuf doubles through JSON, which has
# no infinity or NaN, and a Dict parameter as a protobuf Struct (a JSON object).
PARAMETER_KINDS = {
    "Float": ("a finite number", lambda value: _is_number(value) and math.isfinite(value)),
    "Integer": ("a whole number", lambda value: isinstance(value, int) and not isinstance(value, bool)),
    "Boolean": ("true or false", lambda value: isinstance(value, bool)),
    "String": ("text", lambda value: isinstance(value, str)),
    "Dict": ("a JSON object ({...})", lambda value: isinstance(value, dict)),
    "List": ("a JSON list ([...])", lambda value: isinstance(value, list)),
}


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _not_carried(value: Any, path: str = "") -> str | None:
    """Where inside a JSON value is something a run cannot carry, and what: infinity or NaN (JSON has neither), null
    (kfp builds a parameter's value without it, and refuses it once the run has started), or an integer a double
    cannot hold (it would reach the step as another); None if nowhere."""
    where = path.lstrip(".") or "the value"
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return f"{where} is {'null' if value is None else repr(value)}"
    if _is_number(value) and isinstance(value, int) and abs(value) > 2**53:  # the step would get another number
        return f"{where} is {value}, more than a double (KFP's every number) holds exactly (2**53)"
    children = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for key, child in children:
        found = _not_carried(child, f"{path}.{key}" if isinstance(value, dict) else f"{path}[{key}]")
        if found is not None:
            return found
    return None


def check_parameter_types(pipeline, parameters: dict[str, Any]) -> None:
    """Each given parameter's value is one its KFP type carries (PARAMETER_KINDS), else one line naming it."""
    kinds = parameter_types(pipeline)
    for name, value in parameters.items():
        if name not in kinds or kinds[name][0] not in PARAMETER_KINDS:
            continue
        description, fits = PARAMETER_KINDS[kinds[name][0]]
        if not fits(value):
            raise CommandError(f"{name}: {value!r} is not {description}")
        found = _not_carried(value)
        if found is not None:
            raise CommandError(
                f"{name}: {found}, which a run cannot carry (JSON has no infinity or NaN, a KFP parameter no null: "
                "leave a setting out for its default; its numbers are doubles)"
            )


# Parameters that name a folder or an object-store prefix (a source may also be a download: the configs check it).
LOCATION_PARAMETERS = ("promotion_root", "model_dir", "warm_start", "sweep_dir", "data_reference")


def check_locations(parameters: dict[str, Any]) -> None:
    """Every location parameter by one rule (components/common/config.py scheme_problem): a folder, gs:// or s3://
    (a source also http(s)://: an ftp:// one would be taken for a folder), with a bucket, no '..' or '.' in an
    object's key, no control character."""
    from components.common.filesystem import STORE_SCHEMES, URL_SCHEMES, scheme_problem

    for name in (*LOCATION_PARAMETERS, "source", "model", "images"):
        schemes = STORE_SCHEMES + URL_SCHEMES if name == "source" else STORE_SCHEMES
        problem = scheme_problem(name, str(parameters.get(name) or ""), schemes)
        if problem:
            raise CommandError(problem)


# What a cluster run's steps read or write, by parameter: none of it may be a path of the submitting machine.
CLUSTER_LOCATIONS = {
    **{name: "gs:// or s3:// prefix" for name in LOCATION_PARAMETERS},
    "source": "gs:// or s3:// URI, an http(s):// URL, or synthetic (copy your file to the object store)",
    "model": "gs:// or s3:// prefix (a promotion root, a version, a SavedModel)",
    "images": "gs:// or s3:// prefix (copy your images to the object store)",
}


def check_cluster_locations(parameters: dict[str, Any]) -> None:
    """A run on a cluster reads and writes where its steps' pods can: a path of this machine is not in them, and
    what a step writes to its own disk is gone with its pod (a promotion root there would promote every run's model
    as the first, and lose it), so a path is refused, naming the parameter and what it may be."""
    from components.common.filesystem import SCHEME

    source = parameters.get("source")
    if isinstance(source, str) and source.startswith(("http://", "https://")) and ("?" in source or "#" in source):
        raise CommandError(
            "source: a URL with a query (a presigned URL's signature, a ?token=) would travel in the run's "
            "parameters, which everyone who may see the run reads: copy the archive into the store (s3://, gs://) "
            "and give that location"
        )
    for name, expected in CLUSTER_LOCATIONS.items():
        value = parameters.get(name)
        if (
            not isinstance(value, str)
            or not value
            or SCHEME.match(value)
            or (name == "source" and value == "synthetic")
        ):
            continue
        raise CommandError(
            f"{name}: {value!r} is a path of this machine, and a cluster run's steps run in pods, which have none of "
            f"its files and keep nothing they write to their own disk: give a {expected}"
        )


def _check_values(values: dict[str, Any]):
    from components.common.kfp_parameters import config_from_parameters
    from components.train.config import TrainConfig
    from components.train.kfp_run import launch_options
    from components.train.launch_config import LaunchConfig

    if values["launcher"] not in LAUNCHERS:
        raise CommandError(f"launcher: {values['launcher']!r} is not one of {', '.join(LAUNCHERS)}")
    check_data_parameters(values)
    check_registry_parameters(values)
    check_gate_parameters(values)
    check_sweep_parameters(values)
    check_pod_parameters(values)
    options = dict(values.get("train_options") or {})
    named = {*TRAIN_PARAMETERS, *LAUNCH_PARAMETERS, "warm_start", "model_dir", "data", "launcher"}
    repeated = sorted(set(options) & named)
    if repeated:
        raise CommandError(f"train_options: {repeated} are pipeline parameters; set them as such, not in train_options")
    train = {name: values[name] for name in TRAIN_PARAMETERS}
    job = values["launcher"] in ("trainjob", "tfjob")
    location = "s3://check/" if job else "/check/"
    train.update(data=location + "data", model_dir=location + "model", launcher="auto" if not job else "trainjob")
    launch = {name: values[name] for name in LAUNCH_PARAMETERS}
    launch.update(launch_options(options))  # the workers' pod settings the train options may set
    train.update(options)
    secret = values.get("image_pull_secret") or ""
    launch["image_pull_secrets"] = (secret,) if secret else ()
    try:
        config = config_from_parameters(TrainConfig, train, "pipeline parameters")
        config_from_parameters(LaunchConfig, launch, "pipeline parameters")
    except ValueError as error:
        raise CommandError(str(error)) from error
    _check_trials(values, train)
    return config


def _check_trials(values: dict[str, Any], train: dict[str, Any]) -> None:
    """A search's trials as the sweep step checks them before its first: the training settings with each choice
    and bound of the space (a setting the space draws may be one the training given would not use)."""
    if not values.get("space"):
        return
    from components.common.kfp_parameters import config_from_parameters
    from components.sweep.space import parse_space, refused_trial
    from components.train.config import TrainConfig

    for corner in parse_space(values["space"], "space").corners():
        try:
            config_from_parameters(TrainConfig, {**train, **corner}, "pipeline parameters")
        except ValueError as error:
            raise CommandError(refused_trial(corner, error)) from error


PREPARE_PARAMETERS = (
    "source",
    "source_sha256",
    "validation_fraction",
    "synthetic_train_per_class",
    "resize",
    "leakage",
    "max_source_megabytes",
    "prepare_workers",
)


def check_data_parameters(values: dict[str, Any]) -> None:
    """The data's preparation (leakage, and the source's digest, hold-out, size...) and the data check's parameters,
    as their steps would refuse them."""
    from components.common.kfp_parameters import config_from_parameters
    from components.evaluate.data_check import CheckDataConfig
    from components.prepare_data.config import PrepareDataConfig

    try:
        preparation = {name: values[name] for name in PREPARE_PARAMETERS if name in values}
        config_from_parameters(PrepareDataConfig, {"output": "/check", **preparation}, "pipeline parameters")
    except ValueError as error:
        raise CommandError(str(error)) from error
    try:
        CheckDataConfig(data="/check", mode=values["data_check"], thresholds=dict(values["data_thresholds"] or {}))
    except ValueError as error:
        message = str(error)  # the step's field names, as the pipeline's parameters call them
        for field_name, parameter in (("mode:", "data_check:"), ("thresholds:", "data_thresholds:")):
            message = parameter + message.removeprefix(field_name) if message.startswith(field_name) else message
        raise CommandError(message) from error


def check_not_searched(parameters: dict[str, Any], space: Any) -> None:
    """A setting given (a parameter, or a key of train_options) that the search space also searches: the search's
    choice would replace it in every trial and in the final training, so it is refused rather than ignored."""
    if not isinstance(space, dict):
        return  # none (not the sweep pipeline), or not a mapping: check_sweep_parameters says so
    options = parameters.get("train_options")
    given = {**(options if isinstance(options, dict) else {}), **parameters}
    for name in space:
        if name in given:
            origin = name if name in parameters else f"train_options' {name}"
            raise CommandError(
                f"{origin}: {json.dumps(given[name])} is given, and the search space searches {name} "
                f"({json.dumps(space[name])}): the search's choice would replace it; leave it out, or take {name} out "
                "of the space"
            )


def check_sweep_parameters(values: dict[str, Any]) -> None:
    """The sweep pipeline's search space and budget, as its sweep step would refuse them after the data was
    prepared (nothing for a pipeline without a search)."""
    if "space" not in values:
        return
    from components.sweep.config import SweepConfig
    from components.sweep.space import parse_space

    names = ("trials", "max_minutes", "sampler", "pruner", "startup_trials", "parallelism", "repeats")
    try:
        parse_space(values["space"], "space")
        SweepConfig(data="/check", sweep_dir="/check", space="{}", workers=values["trial_workers"],
                    train_options=dict(values.get("train_options") or {}),  # what the sweep sets itself, refused
                    **{name: values[name] for name in names})  # fmt: skip
    except ValueError as error:
        raise CommandError(str(error)) from error


def check_registry_parameters(values: dict[str, Any]) -> None:
    """The Model Registry's address and model name, as the promote step would refuse them after training."""
    from components.evaluate.registry import check_address, check_model_name

    try:
        if values.get("model_registry"):
            check_address(values["model_registry"])
        check_model_name(values.get("registered_model_name", "cifar10"))
    except ValueError as error:
        raise CommandError(str(error)) from error


def check_gate_parameters(values: dict[str, Any]) -> None:
    """The evaluation's gate and the promotion's TF Serving release, as the evaluate step would refuse the one after
    training and the promote step the other after evaluation."""
    from components.common.kfp_parameters import config_from_parameters
    from components.evaluate.config import EvaluateConfig
    from components.evaluate.serving_ops import op_definitions

    gate = {name: values[name] for name in ("accuracy_threshold", "baseline_tolerance") if name in values}
    try:
        # the evaluate step compares with the promotion root (whether one is given, check_used says)
        where = {"data": "/check", "model_dir": "/check", "compare_with": "/check"}
        config_from_parameters(EvaluateConfig, {**where, **gate}, "pipeline parameters")
        if values.get("serving_version"):
            op_definitions(values["serving_version"])  # a release whose op definitions this project lacks
    except ValueError as error:
        raise CommandError(str(error)) from error


# Settings that one kind of training alone uses: a training job's worker pods (launcher auto, trainjob or tfjob on a
# cluster), or the training step's own pod (launcher pod).
JOB_WORKER_SETTINGS = ("gpus_per_worker", "worker_cpu", "worker_memory", "worker_image", "queue_name")
STEP_POD_SETTINGS = ("train_step_gpus", "train_step_cpus", "train_step_memory")
PROMOTION_SETTINGS = ("baseline_tolerance", "serving_version", "model_registry", "warm_start_from_promoted")


def check_used(parameters: dict[str, Any], given: dict[str, Any], on_cluster: bool) -> None:
    """A setting given that the run would not use, because of another setting (or its default), is refused rather
    than ignored (the stages' own such checks run with their configs): a registered model's name without a registry
    and, on a cluster, a training job's worker settings with launcher pod, the training step's pod
    settings with a training job, and a promotion's settings without a promotion root (a local run has one of its
    own)."""
    from components.common.config import setting_words
    from components.train.kfp_run import launch_options

    if "registered_model_name" in parameters and not given.get("model_registry"):
        raise CommandError(
            "registered_model_name: names the model in a Model Registry, and no model_registry is given: give "
            "model_registry too, or leave it out"
        )
    if not on_cluster:  # a local run refuses a cluster's pod settings of its own (local_run.check_cluster_only)
        return
    options = given.get("train_options")
    job = [name for name in JOB_WORKER_SETTINGS if name in parameters]
    job += [f"train_options' {name}" for name in launch_options(dict(options if isinstance(options, dict) else {}))]
    if given["launcher"] == "pod" and job:
        setting, them = setting_words(job)
        raise CommandError(
            f"{', '.join(job)}: {setting} of a training job's worker pods, and launcher pod trains in the training "
            f"step's own pod: leave {them} out, or set that pod with {', '.join(STEP_POD_SETTINGS)}"
        )
    step = [name for name in STEP_POD_SETTINGS if name in parameters]
    if given["launcher"] != "pod" and step:
        raise CommandError(
            f"{', '.join(step)}: {setting_words(step)[0]} of the training step's own pod, where only launcher pod "
            f"trains; launcher {given['launcher']} trains in a training job: set its workers with "
            f"{', '.join(JOB_WORKER_SETTINGS[:4])}, or give launcher pod"
        )
    promotion = [name for name in PROMOTION_SETTINGS if parameters.get(name) not in (None, False, "")]
    if promotion and not given.get("promotion_root"):
        setting, them = setting_words(promotion)
        raise CommandError(
            f"{', '.join(promotion)}: {setting} of the promotion, and no promotion_root is given (nothing is "
            f"promoted): give promotion_root too, or leave {them} out"
        )


def check_prepare_memory(values: dict[str, Any]) -> None:
    """The prepare step's pod has the memory its bound on the source (max_source_megabytes) needs: else a source
    within the bound ends the pod (OOMKilled, retried, then failed) instead of being prepared or refused."""
    from kubernetes.utils import parse_quantity

    from components.prepare_data.config import (
        MEMORY_PER_SOURCE_MEGABYTE,
        MINIMUM_STEP_MEMORY,
        step_memory_needed,
        step_memory_quantity,
    )

    if parse_quantity(values["prepare_step_memory"]) < step_memory_needed(values["max_source_megabytes"]):
        quantity = step_memory_quantity(values["max_source_megabytes"])
        raise CommandError(
            f"prepare_step_memory: {values['prepare_step_memory']} is less than a source of up to "
            f"{values['max_source_megabytes']:,} MB (max_source_megabytes) needs, {quantity} ("
            f"{MEMORY_PER_SOURCE_MEGABYTE} MB for each MB, {MINIMUM_STEP_MEMORY >> 30}Gi at least): give "
            f"prepare_step_memory {quantity} or more, "
            "or a smaller max_source_megabytes"
        )


def check_sweep_folder_free(values: dict[str, Any]) -> None:
    """A local sweep folder another sweep drives is refused before the run, naming its driver (the sweep step would
    refuse it only after the data was prepared)."""
    from components.common import writer_claim
    from components.sweep.sweep import SWEEP_FOLDER

    folder = str(values.get("sweep_dir") or "")
    if not folder or "://" in folder or not Path(folder).is_dir():
        return
    claim = writer_claim.DirectoryClaim(Path(folder), folder, SWEEP_FOLDER)
    try:
        claim.acquire()
    except writer_claim.WriterClaimError as error:
        raise CommandError(str(error)) from None
    claim.release()


def check_machine_holds(values: dict[str, Any]) -> None:
    """The training processes a local run starts at once fit this machine's memory: its workers, and a sweep's trials
    at once with each trial's workers (launch_local.processes_problem, which the train and sweep steps check again)."""
    from components.train.launch_local import processes_problem

    at_once = [(int(values["workers"]), "workers")]
    if "parallelism" in values:
        parallelism, trial_workers = int(values["parallelism"]), int(values["trial_workers"])
        at_once.append((parallelism * trial_workers, f"parallelism {parallelism} x trial_workers {trial_workers}"))
    problem = processes_problem(*max(at_once))
    if problem:
        raise CommandError(problem)


def check_train_step_memory(values: dict[str, Any]) -> None:
    """With launcher pod the workers are processes of the training step's own pod: its memory holds them all
    (launch_local.processes_problem, which the step checks again against its cgroup)."""
    if values.get("launcher") != "pod" or not values.get("train_step_memory"):
        return
    from kubernetes.utils import parse_quantity

    from components.train.launch_local import processes_problem

    memory = int(parse_quantity(values["train_step_memory"]))
    where = f"the training step's pod (launcher pod; train_step_memory {values['train_step_memory']})"
    problem = processes_problem(int(values["workers"]), "workers", available=memory, where=where)
    if problem:
        raise CommandError(problem)


def check_pod_parameters(values: dict[str, Any]) -> None:
    """The prepare step's and (launcher=pod) the training step's own pod's resources, which the cluster would refuse
    when the step starts."""
    from components.train.launch_config import QUANTITY

    for name in ("train_step_cpus", "train_step_memory", "prepare_step_memory"):
        if name in values and not QUANTITY.match(values[name]):
            raise CommandError(f"{name}: {values[name]!r} is not a Kubernetes quantity (e.g. 4, 500m, 16Gi)")
    if values.get("train_step_gpus", 0) < 0:
        raise CommandError(f"train_step_gpus: {values['train_step_gpus']} is not a number of GPUs (0: none)")


def describe_length(config) -> str:
    """How long training is, as a person reads it before a long run."""
    recipe = f"the {config.preset} recipe" if config.preset else "no preset"
    if config.train_steps is not None:
        return f"{config.train_steps} steps of batch {config.batch_size} ({recipe})"
    if config.epochs is not None:
        return f"{config.epochs:g} epochs of batch {config.batch_size} ({recipe})"
    return (
        f"80000 steps of batch {config.batch_size}, the stage's default ({recipe}; --epochs or --train-steps to set it)"
    )
