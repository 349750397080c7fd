"""The sweep pipeline (`cifar10-sweep`): the training pipeline with a hyperparameter search before its training.

Prepare the data once (with a validation split: `validation_fraction`, 0.1 by default), check it, search the train
settings over `space` (components/sweep: an Optuna study whose trials the train stage trains on the training split
and measures on the validation split), then train the best trial's settings on all the training data (train +
validation), evaluate on the test split and promote through the same gate as every run.

    python -m pipeline.pipeline sweep local-run --space space.yaml --trials 8     (make sweep SPACE=... TRIALS=...)
    python -m pipeline.pipeline sweep run --host $KFP_HOST --space '{"learning_rate": {...}}' ...
"""

from __future__ import annotations

import inspect

from kfp import dsl

from components.sweep.component import sweep_component
from components.sweep.config import SweepConfig
from pipeline.parameters import LAUNCH_PARAMETERS, TRAIN_PARAMETERS
from pipeline.training_pipeline import cifar10_pipeline, retrain, with_pod_settings

SWEEP_PIPELINE_NAME = "cifar10-sweep"
SWEEP = SweepConfig(data="", sweep_dir="", space="")
# The sweep's own parameters: (annotation, default, description).
SWEEP_PARAMETERS = {
    "space": (dict, {"learning_rate": {"low": 0.02, "high": 0.5, "log": True}}, "The search space: train settings "
              'to ranges or choices, e.g. {"learning_rate": {"low": 0.01, "high": 0.3, "log": true}, '
              '"weight_decay": {"choices": [0, 0.0005]}} (an integer setting\'s range is searched over integers).'),
    "trials": (int, SWEEP.trials, "The search's budget in finished trials."),
    "max_minutes": (float, SWEEP.max_minutes, "The search's budget in wall-time minutes (0: none)."),
    "sampler": (str, SWEEP.sampler, "tpe (Optuna's TPE after random start-up trials) or random."),
    "pruner": (str, SWEEP.pruner, "Stop trials behind on their validation curve: median, asha, or none."),
    "startup_trials": (int, SWEEP.startup_trials, "Trials sampled at random, never pruned against, before TPE and "
                       "the pruner act."),
    "parallelism": (int, SWEEP.parallelism, "Trials trained at once (each a TrainJob or TFJob on a cluster)."),
    "repeats": (int, SWEEP.repeats, "Trainings per trial with different seeds (its accuracy: their mean)."),
    "trial_workers": (int, SWEEP.workers, "Workers of each trial."),
    "sweep_dir": (str, "", "The sweep's folder (\"\": the run's own); an earlier run's folder continues its study "
                  "(make sweep RESUME=...)."),
}  # fmt: skip
# The training step's launch settings and named train settings, which every trial uses too (workers: trial_workers).
NAMED_TRAIN_SETTINGS = tuple(name for name in TRAIN_PARAMETERS if name != "workers")
VALIDATION_FRACTION = 0.1  # the sweep pipeline's default: trials are measured on a tenth of the training data


def _search(dataset, check, parameters: dict) -> dsl.PipelineChannel:
    task = sweep_component(
        dataset=dataset,
        space=parameters["space"],
        trials=parameters["trials"],
        max_minutes=parameters["max_minutes"],
        sampler=parameters["sampler"],
        pruner=parameters["pruner"],
        startup_trials=parameters["startup_trials"],
        parallelism=parameters["parallelism"],
        repeats=parameters["repeats"],
        train_options=parameters["train_options"],
        **{name: parameters[name] for name in LAUNCH_PARAMETERS},
        **{name: parameters[name] for name in NAMED_TRAIN_SETTINGS},
        launcher=parameters["launcher"],
        workers=parameters["trial_workers"],
        sweep_dir=parameters["sweep_dir"],
        run_id=dsl.PIPELINE_JOB_ID_PLACEHOLDER,
    )
    task.set_caching_options(False).after(check)
    task.set_retry(num_retries=2, backoff_duration="60s", backoff_factor=2.0)  # a retry continues the study
    task.set_cpu_request("2").set_memory_request("4Gi")
    with_pod_settings(task, parameters["object_store_secret"], parameters["image_pull_secret"])
    return task.outputs["Output"]


def _sweep_pipeline():
    """The sweep pipeline's function: the training pipeline's parameters and the sweep's, in one signature (KFP
    reads a pipeline's inputs from its signature and its descriptions from its docstring)."""
    training = inspect.signature(cifar10_pipeline.pipeline_func).parameters
    parameter = inspect.Parameter.POSITIONAL_OR_KEYWORD
    inputs = [
        inspect.Parameter(name, parameter, annotation=value.annotation,
                          default=VALIDATION_FRACTION if name == "validation_fraction" else value.default)
        for name, value in training.items()
    ] + [
        inspect.Parameter(name, parameter, annotation=kind, default=default)
        for name, (kind, default, _description) in SWEEP_PARAMETERS.items()
    ]  # fmt: skip
    names = [item.name for item in inputs]

    def cifar10_sweep(*values):  # KFP calls a pipeline function with its inputs in the order of its signature
        retrain(dict(zip(names, values, strict=True)), search=_search)

    cifar10_sweep.__signature__ = inspect.Signature(inputs)
    described = "\n".join(f"        {name}: {description}" for name, (_k, _d, description) in SWEEP_PARAMETERS.items())
    training_doc = inspect.getdoc(cifar10_pipeline.pipeline_func) or ""
    arguments = training_doc[training_doc.index("Args:") :].replace("\n", "\n    ")
    cifar10_sweep.__doc__ = (
        "Search the train settings on a validation split, then train the best on all the training data, evaluate "
        f"it on the test split and promote it when it is good enough.\n\n    {arguments}\n{described}\n"
    )
    return dsl.pipeline(
        name=SWEEP_PIPELINE_NAME,
        description="CIFAR-10: prepare, search the train settings, train the best, evaluate, promote.",
    )(cifar10_sweep)


cifar10_sweep = _sweep_pipeline()
