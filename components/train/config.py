"""Configuration of the train stage.

It owns every training option with its help text and its check, in one dataclass; the named recipes are in
presets.py.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import ClassVar

from components.common.config import changed_fields, check_fields, setting_words
from components.common.filesystem import is_remote
from components.train.presets import LENGTH_FIELDS, PRESETS

OPTIMIZERS = ("sgd", "adam", "adamw", "rmsprop", "muon")
SCHEDULES = ("piecewise", "cosine", "triangular", "linear", "constant")
PRECISIONS = ("float32", "mixed_float16", "mixed_bfloat16", "auto")
LAUNCHERS = ("auto", "inprocess", "local", "trainjob", "tfjob", "worker")
CLUSTER_LAUNCHERS = ("trainjob", "tfjob")  # start the workers as a Kubernetes job, each in its own pod
MODELS = ("resnet", "airbench", "airbench_muon")


def parse_assignments(entries: tuple[str, ...], field_name: str) -> list[tuple[str, str]]:
    """`("REGEX=VALUE", ...)` -> [(regex, value)]; every regex must compile."""
    pairs = []
    for entry in entries:
        pattern, separator, value = entry.rpartition("=")
        if not separator or not pattern:
            raise ValueError(f"{field_name}: {entry!r} is not of the form REGEX=VALUE")
        try:
            re.compile(pattern)
        except re.error as error:
            raise ValueError(f"{field_name}: {pattern!r} is not a valid regular expression ({error})") from error
        pairs.append((pattern, value))
    return pairs


def _check_regex(value: str | None, field_name: str) -> None:
    if value is None:
        return
    try:
        re.compile(value)
    except re.error as error:
        raise ValueError(f"{field_name}: {value!r} is not a valid regular expression ({error})") from error


@dataclass(frozen=True)
class TrainConfig:
    PRESETS: ClassVar[dict[str, dict]] = PRESETS
    LENGTH_FIELDS: ClassVar[tuple[str, ...]] = LENGTH_FIELDS

    data: str = field(metadata={"help": "prepared dataset: a folder, gs:// or s3:// prefix holding manifest.json"})
    model_dir: str = field(metadata={"help": "checkpoints, summaries and the resolved config (folder, gs:// or s3://)"})
    preset: str | None = field(
        default=None,
        metadata={
            "help": "a recipe whose values apply wherever no other value is given (when a configuration is read: "
            "command line, --config file, KFP parameters): fast = cifar10_speedrun (the 2025 CIFAR-10 speedrun "
            "record's values on airbench94_muon: 7 epochs, batch 1536, bfloat16 where native); airbench94_muon = "
            "airbench's network and whitening, Muon for the convolution kernels, batch 2000, linear schedule, "
            "alternating flips, 6-view test-time augmentation (94%% on the original CIFAR-10 in 8 epochs, "
            "published); airbench94 = its predecessor (batch 1024, triangular schedule, lookahead; 94%% in 10 "
            "epochs); estimator = the CIFAR-10 estimator example's ResNet recipe (the defaults; about 91-92%% in 160 "
            "epochs)",
            "choices": tuple(PRESETS),
        },
    )
    # model
    model: str = field(default="resnet", metadata={"help": "model family", "choices": MODELS})
    depth: int = field(default=20, metadata={"range": "[8, 1000]", "help": "ResNet depth, 6n+2: 20, 32, 44, 56, 110"})
    width_multiplier: float = field(
        default=1.0, metadata={"range": "[0.0625, 16]", "help": "scales every layer's channels"}
    )
    data_format: str = field(
        default="channels_last",
        metadata={"help": "channels_first is faster on some GPUs", "choices": ("channels_last", "channels_first")},
    )
    batch_norm_decay: float = field(
        default=0.997, metadata={"range": "[0, 1)", "help": "moving-average decay of batch norm"}
    )
    batch_norm_epsilon: float = field(default=1e-5, metadata={"range": "(0, 1]", "help": "batch norm epsilon"})
    label_smoothing: float = field(
        default=0.0, metadata={"range": "[0, 1)", "help": "label smoothing of the cross-entropy"}
    )
    test_time_augmentation: str = field(
        default="none",
        metadata={
            "help": "views averaged by evaluation and the exported model: none, mirror (2 passes), mirror_translate "
            "(6 passes)",
            "choices": ("none", "mirror", "mirror_translate"),
        },
    )
    # input
    batch_size: int = field(
        default=128, metadata={"range": "[1, 1048576]", "help": "global batch, split over all replicas"}
    )
    train_on: str = field(
        default="train",
        metadata={
            "help": "the splits trained on: train, or train+validation (after a search chose the settings on the "
            "validation split: the final model learns from all the training data, and is not validated)",
            "choices": ("train", "train+validation"),
        },
    )
    in_memory: bool = field(default=False, metadata={"help": "keep the decoded training set in memory"})
    shuffle_buffer: int = field(
        default=10000,
        metadata={
            "range": "[0, 100000000]",
            "help": "records in the shuffle buffer (streaming mode; 1 keeps the file order)",
        },
    )
    augment: bool = field(default=True, metadata={"help": "augment the training images (see augmentation)"})
    augmentation: str = field(
        default="crop_flip",
        metadata={
            "help": "crop_flip: random pad-4-and-crop and horizontal flip; airbench: random translation by up to "
            "translate pixels and alternating flips (in memory)",
            "choices": ("crop_flip", "airbench"),
        },
    )
    translate: int = field(
        default=2, metadata={"range": "[0, 8]", "help": "augmentation airbench: the largest translation, in pixels"}
    )
    brightness: float = field(
        default=0.0,
        metadata={
            "range": "[0, 1]",
            "help": "augmentation airbench: each image's brightness shifted by up to this many of each channel's "
            "standard deviations (0: none)",
        },
    )
    contrast: float = field(
        default=0.0,
        metadata={
            "range": "[0, 1)",
            "help": "augmentation airbench: each image's contrast about the channel means scaled by 1 +- up to this "
            "(0: none)",
        },
    )
    seed: int = field(
        default=42, metadata={"range": "[0, 2147483647]", "help": "seed of initialization, data order and augmentation"}
    )
    cache_dir: str | None = field(default=None, metadata={"help": "where remote datasets and model dirs are mirrored"})
    # length
    train_steps: int | None = field(
        default=None,
        metadata={"range": "[1, 1000000000]", "help": "global steps to train (default: 80000, unless --epochs)"},
    )
    epochs: float | None = field(
        default=None, metadata={"range": "(0, 1000000]", "help": "epochs to train; instead of --train-steps"}
    )
    # optimization
    optimizer: str = field(
        default="sgd",
        metadata={
            "help": "optimizer; muon: Muon (momentum, then the update of each convolution kernel orthogonalised by a "
            "Newton-Schulz iteration, the kernel renormalised) for convolution kernels and Nesterov-or-not sgd (see "
            "momentum, nesterov) for every other variable",
            "choices": OPTIMIZERS,
        },
    )
    muon_learning_rate: float = field(
        default=0.24,
        metadata={
            "range": "(0, inf)",
            "help": "muon: the rate of the convolution kernels (scheduled like the others; "
            "not scaled with the batch: the orthogonalised update has no scale of its own)",
        },
    )
    muon_momentum: float = field(default=0.6, metadata={"range": "[0, 1)", "help": "muon: momentum of the kernels"})
    newton_schulz_steps: int = field(
        default=3, metadata={"range": "[1, 20]", "help": "muon: iterations of the orthogonalisation"}
    )
    learning_rate: float = field(
        default=0.1, metadata={"range": "(0, inf)", "help": "learning rate at learning_rate_batch_size"}
    )
    learning_rate_batch_size: int = field(
        default=128, metadata={"range": "[1, 1048576]", "help": "the rate is scaled linearly by batch_size / this"}
    )
    schedule: str = field(default="piecewise", metadata={"help": "learning-rate schedule", "choices": SCHEDULES})
    boundary_epochs: tuple[float, ...] = field(
        default=(82.0, 123.0, 300.0),
        metadata={"range": "[0, inf)", "help": "piecewise schedule: epochs where the rate changes"},
    )
    decay_factors: tuple[float, ...] = field(
        default=(0.1, 0.01, 0.002),
        metadata={"range": "(0, inf)", "help": "piecewise schedule: multipliers from each boundary on"},
    )
    warmup_epochs: float = field(
        default=0.0, metadata={"range": "[0, inf)", "help": "linear warm-up from 0 over this many epochs"}
    )
    triangle_start: float = field(
        default=0.2, metadata={"range": "[0, inf)", "help": "triangular schedule: first rate, x learning_rate"}
    )
    triangle_peak: float = field(
        default=0.23,
        metadata={"range": "(0, 1)", "help": "triangular schedule: where the rate peaks, as a fraction of training"},
    )
    triangle_end: float = field(
        default=0.07, metadata={"range": "[0, inf)", "help": "triangular schedule: last rate, x learning_rate"}
    )
    momentum: float = field(default=0.9, metadata={"range": "[0, 1)", "help": "momentum of sgd and rmsprop"})
    nesterov: bool = field(default=False, metadata={"help": "Nesterov momentum (sgd, and muon's kernels)"})
    weight_decay: float = field(
        default=2e-4,
        metadata={
            "range": "[0, inf)",
            "help": "L2 on conv/dense kernels (not muon's: they are renormalised), its gradient added after the "
            "gradient multipliers and clipping (decoupled weight decay for adamw)",
        },
    )
    weight_decay_biases: bool = field(
        default=False, metadata={"help": "weight decay on biases and batch-norm offsets too (PyTorch's default)"}
    )
    clip_global_norm: float | None = field(
        default=None, metadata={"range": "(0, inf)", "help": "clip gradients by their global norm"}
    )
    clip_norm: float | None = field(
        default=None, metadata={"range": "(0, inf)", "help": "clip each variable's gradient by its norm"}
    )
    clip_value: float | None = field(
        default=None, metadata={"range": "(0, inf)", "help": "clip every gradient element to +-value"}
    )
    gradient_multipliers: tuple[str, ...] = field(
        default=(), metadata={"help": "REGEX=FACTOR: scale gradients of variables whose name matches"}
    )
    trainable: str | None = field(default=None, metadata={"help": "train only variables matching this regex"})
    frozen: str | None = field(default=None, metadata={"help": "never update variables matching this regex"})
    whitening_bias_epochs: float | None = field(
        default=None,
        metadata={
            "range": "(0, inf)",
            "help": "airbench models: the whitening layer's bias trains for this many epochs only, its rate falling "
            "linearly from the base rate to zero over them (default: the whole run)",
        },
    )
    ema_decay: float | None = field(
        default=None,
        metadata={"range": "(0, 1)", "help": "keep an exponential moving average of the weights (e.g. 0.999)"},
    )
    lookahead_every_steps: int | None = field(
        default=None,
        metadata={
            "range": "[1, inf)",
            "help": "lookahead (airbench: 5): every N steps the weights move to a slow average",
        },
    )
    lookahead_start_epochs: float = field(
        default=3.0, metadata={"range": "[0, inf)", "help": "lookahead: from this epoch on"}
    )
    lookahead_decay: float = field(
        default=0.95, metadata={"range": "(0, 1)", "help": "lookahead: decay per step of the slow average"}
    )
    lookahead_decay_power: float = field(
        default=3.0,
        metadata={
            "range": "[0, inf)",
            "help": "lookahead: the decay grows as (progress ** this), averaging harder at the end",
        },
    )
    precision: str = field(
        default="float32",
        metadata={
            "help": "compute precision; auto: mixed_bfloat16 where the GPUs (compute capability >= 8.0) or, with "
            "no GPU, the CPU (AMX-BF16, AVX512-BF16) multiply bfloat16 natively, float32 elsewhere",
            "choices": PRECISIONS,
        },
    )
    xla: bool = field(default=False, metadata={"help": "compile the training step with XLA"})
    # checkpoints, warm start
    checkpoint_every_steps: int | None = field(
        default=None,
        metadata={
            "range": "[0, inf)",
            "help": "save a checkpoint every N steps (default: a fifth of the run; 0: only by time and at the end)",
        },
    )
    checkpoint_every_seconds: float | None = field(
        default=600.0, metadata={"range": "(0, inf)", "help": "and/or every N seconds"}
    )
    max_to_keep: int = field(default=5, metadata={"range": "[1, 1000000]", "help": "checkpoints kept"})
    keep_checkpoint_every_hours: float | None = field(
        default=None, metadata={"range": "(0, inf)", "help": "also keep one checkpoint every N hours"}
    )
    assume_single_writer: bool = field(
        default=False,
        metadata={
            "help": "go on with an S3 store that does not honour conditional writes (MinIO before 2024, SeaweedFS "
            "before 4.17): you make sure one writer at a time uses each location, since concurrent writers are then "
            "not detected (also: CIFAR10_PIPELINE_ASSUME_SINGLE_WRITER=1)"
        },
    )
    resume_on_other_data: bool = field(
        default=False,
        metadata={"help": "resume checkpoints trained on another dataset (refused otherwise; recorded in config.json)"},
    )
    warm_start: str | None = field(default=None, metadata={"help": "checkpoint (file prefix or folder) to start from"})
    warm_start_include: tuple[str, ...] = field(
        default=(".*",), metadata={"help": "regexes of variables to take from the warm-start checkpoint"}
    )
    warm_start_exclude: tuple[str, ...] = field(default=(), metadata={"help": "regexes of variables to leave new"})
    warm_start_map: tuple[str, ...] = field(
        default=(), metadata={"help": "REGEX=REPLACEMENT: rewrites a variable's name to its checkpoint name"}
    )
    warm_start_if_damaged: str = field(
        default="fail",
        metadata={
            "help": "a warm-start checkpoint that cannot be read whole: fail (the step ends in one line naming it), "
            "or from_scratch (say so and train from scratch: for unattended retraining)",
            "choices": ("fail", "from_scratch"),
        },
    )
    # logging, summaries
    log_every_steps: int | None = field(
        default=None,
        metadata={
            "range": "[1, inf)",
            "help": "log step, loss, accuracy, rate, examples/s, ETA every N steps "
            "(default: 20 lines a run) and at least every minute",
        },
    )
    summary_every_steps: int | None = field(
        default=None,
        metadata={"range": "[1, inf)", "help": "TensorBoard scalars every N steps (default: 50 points a run)"},
    )
    histogram_every_steps: int | None = field(
        default=None,
        metadata={"range": "[0, inf)", "help": "weight histograms every N steps (default: 10 a run; 0: never)"},
    )
    validation_every_steps: int | None = field(
        default=None,
        metadata={
            "range": "[0, inf)",
            "help": "with a validation split: its loss and accuracy every N steps (default: 10 points a run; 0: never)",
        },
    )
    image_summaries: int = field(
        default=4, metadata={"range": "[0, 100]", "help": "augmented input images shown in TensorBoard"}
    )
    profile_steps: tuple[int, ...] = field(
        default=(), metadata={"range": "[1, inf)", "help": "FIRST LAST: profile these steps"}
    )
    # distribution, launchers
    workers: int = field(default=1, metadata={"range": "[1, 4096]", "help": "training workers (processes or pods)"})
    launcher: str = field(
        default="auto",
        metadata={
            "help": "auto: TF_CONFIG (or a TrainJob pod's identity) set -> run as that worker; --workers 1 -> "
            "in-process; in a Kubernetes pod -> the job kind the cluster serves (trainjob: Kubeflow Trainer v2, "
            "tfjob: training-operator v1); else local worker processes",
            "choices": LAUNCHERS,
        },
    )
    worker_failure_timeout_seconds: float = field(
        default=30.0,
        metadata={"range": "(0, inf)", "help": "local launcher: after one worker fails, how long others get to exit"},
    )
    peer_timeout_seconds: float = field(
        default=600.0,
        metadata={
            "range": "(0, inf)",
            "help": "how long a worker waits for the other workers to start before failing, naming them",
        },
    )

    def __post_init__(self) -> None:
        check_fields(self)
        # Each number's interval is its field's "range", checked by check_fields; what is left relates fields.
        if (self.depth - 2) % 6:
            raise ValueError(f"depth: {self.depth} is not of the form 6n+2 with n >= 1 (20, 32, 44, 56, 110)")
        if (self.brightness or self.contrast) and not (self.augment and self.augmentation == "airbench"):
            raise ValueError(
                f"brightness/contrast: {self.brightness}/{self.contrast} need augmentation airbench (the images in "
                "memory give the channel means they vary about); set them to 0 or use --augmentation airbench"
            )
        if self.batch_size % self.workers:
            raise ValueError(f"batch_size: {self.batch_size} does not split evenly over {self.workers} workers")
        if self.train_steps is not None and self.epochs is not None:
            raise ValueError("train_steps and epochs: give one of them, not both")
        if self.schedule == "piecewise" and len(self.boundary_epochs) != len(self.decay_factors):
            raise ValueError(
                f"boundary_epochs and decay_factors: {len(self.boundary_epochs)} boundaries need as many factors, "
                f"got {len(self.decay_factors)}"
            )
        if list(self.boundary_epochs) != sorted(self.boundary_epochs):
            raise ValueError(f"boundary_epochs: {self.boundary_epochs} must increase")
        if self.profile_steps and (len(self.profile_steps) != 2 or self.profile_steps[0] > self.profile_steps[1]):
            raise ValueError(f"profile_steps: {self.profile_steps} must be FIRST LAST with FIRST <= LAST")
        _check_regex(self.trainable, "trainable")
        _check_regex(self.frozen, "frozen")
        for pattern in (*self.warm_start_include, *self.warm_start_exclude):
            _check_regex(pattern, "warm_start_include/exclude")
        for pattern, factor in parse_assignments(self.gradient_multipliers, "gradient_multipliers"):
            try:
                float(factor)
            except ValueError as error:
                raise ValueError(f"gradient_multipliers: {factor!r} (for {pattern!r}) is not a number") from error
        parse_assignments(self.warm_start_map, "warm_start_map")
        if self.launcher in CLUSTER_LAUNCHERS:
            for name in ("data", "model_dir"):
                if not is_remote(getattr(self, name)):
                    raise ValueError(
                        f"{name}: {getattr(self, name)} is a local path, and a {self.launcher}'s workers run in other "
                        "pods: give a gs:// or s3:// location"
                    )
        self._check_used()

    # (settings, what they belong to, whether this config has it): a setting given (not the default or the preset's
    # value) for what this config does not use would be ignored
    USED_ONLY_WITH: ClassVar[tuple] = (
        (("muon_learning_rate", "muon_momentum", "newton_schulz_steps"), "optimizer muon",
         lambda config: config.optimizer == "muon"),
        (("momentum",), "optimizers sgd, rmsprop and muon",
         lambda config: config.optimizer in ("sgd", "rmsprop", "muon")),
        (("nesterov",), "optimizers sgd and muon", lambda config: config.optimizer in ("sgd", "muon")),
        (("boundary_epochs", "decay_factors"), "schedule piecewise", lambda config: config.schedule == "piecewise"),
        (("triangle_start", "triangle_peak", "triangle_end"), "schedule triangular",
         lambda config: config.schedule == "triangular"),
        (("lookahead_start_epochs", "lookahead_decay", "lookahead_decay_power"), "lookahead_every_steps",
         lambda config: config.lookahead_every_steps is not None),
        (("whitening_bias_epochs",), "the airbench models' whitening layer (model airbench or airbench_muon)",
         lambda config: config.model != "resnet"),
    )  # fmt: skip

    def _check_used(self) -> None:
        recipe = PRESETS.get(self.preset or "", {})
        for names, owner, has_it in self.USED_ONLY_WITH:
            given = changed_fields(self, names, recipe)
            if given and not has_it(self):
                setting, them = setting_words(given)
                raise ValueError(
                    f"{', '.join(given)}: {setting} of {owner}, which this training does not use (optimizer "
                    f"{self.optimizer}, schedule {self.schedule}, model {self.model}): leave {them} out"
                )

    def total_steps(self, train_examples: int) -> int:
        if self.train_steps is not None:
            return self.train_steps
        if self.epochs is not None:
            return max(1, round(self.epochs * train_examples / self.batch_size))
        return 80000

    def scaled_learning_rate(self) -> float:
        return self.learning_rate * self.batch_size / self.learning_rate_batch_size
