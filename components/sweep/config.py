"""Configuration of a sweep: the search, its budget, and how each trial trains."""

from __future__ import annotations

from dataclasses import dataclass, field

from components.common.config import changed_fields, check_fields

SAMPLERS = ("tpe", "random")
PRUNERS = ("median", "asha", "none")


@dataclass(frozen=True)
class SweepConfig:
    data: str = field(
        metadata={
            "help": "prepared dataset with a validation split (prepare_data --validation-fraction): folder or URI"
        }
    )
    sweep_dir: str = field(
        metadata={
            "help": "the sweep's folder (or gs:// / s3:// prefix): the study, trials.jsonl, best.json, the "
            "report, each trial's model directory; a sweep started again there continues"
        }
    )
    space: str = field(
        metadata={
            "help": "the search space: a JSON or YAML file, or inline JSON, e.g. "
            '\'{"learning_rate": {"low": 0.01, "high": 0.3, "log": true}, "weight_decay": {"choices": [0, 5e-4]}}\''
        }
    )
    trials: int = field(default=12, metadata={"range": "[1, 10000]", "help": "finished trials to run (the budget)"})
    max_minutes: float = field(
        default=0.0,
        metadata={
            "range": "[0, inf)",
            "help": "wall-time budget over all attempts of the sweep (0: none); running "
            "trials are stopped when it is spent",
        },
    )
    sampler: str = field(
        default="tpe", metadata={"choices": SAMPLERS, "help": "Optuna's TPE (after random start-up trials) or random"}
    )
    pruner: str = field(
        default="median",
        metadata={
            "choices": PRUNERS,
            "help": "stop trials behind on their validation curve: median (Optuna's "
            "MedianPruner), asha (successive halving), none",
        },
    )
    startup_trials: int = field(
        default=4,
        metadata={
            "range": "[0, 10000]",
            "help": "trials sampled at random (and never pruned against) before TPE and the pruner act",
        },
    )
    parallelism: int = field(
        default=1, metadata={"range": "[1, 64]", "help": "trials trained at once (TrainJobs/TFJobs on a cluster)"}
    )
    repeats: int = field(
        default=1,
        metadata={
            "range": "[1, 20]",
            "help": "trainings per trial with different seeds: its accuracy is their mean, "
            "its spread their standard deviation",
        },
    )
    seed: int = field(default=0, metadata={"range": "[0, 2147483647]", "help": "the sampler's and the trials' seed"})
    train_options: dict = field(
        default_factory=dict,
        metadata={"help": 'train settings every trial uses (JSON), e.g. {"preset": "fast", "epochs": 2}'},
    )
    launcher: str = field(
        default="auto",
        metadata={
            "choices": ("auto", "inprocess", "local", "trainjob", "tfjob"),
            "help": "how each trial trains (the train stage's --launcher)",
        },
    )
    workers: int = field(default=1, metadata={"range": "[1, 1024]", "help": "workers of each trial"})
    poll_seconds: float = field(
        default=2.0, metadata={"range": "(0, 3600]", "help": "how often running trials' curves are read"}
    )
    stall_minutes: float = field(
        default=30.0,
        metadata={
            "range": "(0, 100000]",
            "help": "a trial with no new validation measure for this long, or for 5 times its longest wait between "
            "measures if that is longer, has stopped reporting: it is failed and the search goes on",
        },
    )
    trial_max_minutes: float = field(
        default=0.0,
        metadata={
            "range": "[0, 100000]",
            "help": "a trial's own time limit (its repeats together): one that runs longer is stopped, saving a "
            "checkpoint, and recorded as failed, and the search goes on (0: none; max_minutes bounds the sweep)",
        },
    )
    cache_dir: str | None = field(default=None, metadata={"help": "where remote datasets are mirrored"})

    def __post_init__(self) -> None:
        check_fields(self)
        for name in ("data", "model_dir", "launcher", "workers"):
            if name in self.train_options:
                raise ValueError(f"train_options: {name!r} is set by the sweep itself (give it as --{name})")
        if "seed" in self.train_options:
            raise ValueError("train_options: 'seed' is set by the sweep itself: each training's comes from the sweep's")
        if "train_on" in self.train_options:  # trials measured on what they trained on would choose nothing
            raise ValueError(
                "train_options: 'train_on' is set by the sweep itself: its trials train on the training split and are "
                "measured on the validation split, and the best one's final training learns from both"
            )
        if changed_fields(self, ("startup_trials",)) and self.sampler == "random" and self.pruner != "median":
            raise ValueError(
                f"startup_trials: the trials TPE samples at random and the median pruner never prunes against, and "
                f"sampler random with pruner {self.pruner} has neither: leave it out, or give sampler tpe or pruner "
                "median"
            )
