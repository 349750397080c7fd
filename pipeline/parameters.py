"""The pipelines' parameters, checked before anything runs: what the steps would refuse after the data was prepared
is refused in seconds, by the stages' own config checks. Shared by the commands (pipeline/commands.py) and local-run
(pipeline/local_run.py)."""

from __future__ import annotations

from typing import Any

LOCAL_RUN_SOURCE = "synthetic"  # local-run is a demo unless told otherwise (make local-run SOURCE=...)


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


def check_parameters(pipeline, parameters: dict[str, Any]):
    """Refuse, in seconds and before any step runs, run parameters that the train step would refuse after the
    data was prepared: an unknown launcher, both epochs and train_steps, an option the train stage does not know
    or a value it refuses, a train option that repeats a named parameter, a bad worker setting. (Only the training
    pipeline's: another pipeline's parameters are checked by its step.)"""
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
    _check_values(given)  # as given: its messages quote what the user wrote
    # and as the steps will see them (a dict parameter's numbers all doubles), so that nothing passes here and fails
    # there
    return _check_values({name: as_delivered(value) for name, value in given.items()})


def _check_values(values: dict[str, Any]):
    from components.common.kfp_parameters import config_from_parameters
    from components.train.config import TrainConfig
    from components.train.kfp_run import launch_options
    from components.train.launch_config import LaunchConfig

    if values["launcher"] not in LAUNCHERS:
        raise CommandError(f"launcher: {values['launcher']!r} is not one of {', '.join(LAUNCHERS)}")
    check_data_parameters(values)
    check_registry_parameters(values)
    check_sweep_parameters(values)
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
    return config


def check_data_parameters(values: dict[str, Any]) -> None:
    """The data check's and the leakage's parameters, as their steps would refuse them after the data was prepared."""
    from components.evaluate.data_check import CheckDataConfig
    from components.prepare_data.config import PrepareDataConfig

    try:
        PrepareDataConfig(output="/check", leakage=values["leakage"])
    except ValueError as error:
        raise CommandError(str(error)) from error
    try:
        CheckDataConfig(data="/check", mode=values["data_check"], thresholds=dict(values["data_thresholds"] or {}))
    except ValueError as error:
        message = str(error)  # the step's field names, as the pipeline's parameters call them
        for field_name, parameter in (("mode:", "data_check:"), ("thresholds:", "data_thresholds:")):
            message = parameter + message.removeprefix(field_name) if message.startswith(field_name) else message
        raise CommandError(message) from error


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
