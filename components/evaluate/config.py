"""Configuration of the evaluate stage."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from components.common.config import changed_fields, check_fields, setting_words
from components.evaluate.registry import check_address, check_model_name

MODES = ("latest", "all", "continuous")
WEIGHTS = ("auto", "ema", "raw")


@dataclass(frozen=True)
class EvaluateConfig:
    PRESETS: ClassVar[dict[str, dict]] = {
        "fast": {"test_time_augmentation": "mirror_translate"},
        "airbench94": {"test_time_augmentation": "mirror_translate"},
        "airbench94_muon": {"test_time_augmentation": "mirror_translate"},
        "cifar10_speedrun": {"test_time_augmentation": "mirror_translate"},
        "estimator": {"test_time_augmentation": "none"},
    }

    data: str = field(metadata={"help": "prepared dataset: a folder, gs:// or s3:// prefix holding manifest.json"})
    model_dir: str = field(metadata={"help": "the train stage's model directory (folder, gs:// or s3://)"})
    preset: str | None = field(
        default=None,
        metadata={
            "help": "fast, airbench94, airbench94_muon, cifar10_speedrun: airbench's 6-view test-time augmentation; "
            "estimator: none "
            "(default: what the model was trained with)",
            "choices": ("fast", "airbench94", "airbench94_muon", "cifar10_speedrun", "estimator"),
        },
    )
    mode: str = field(
        default="latest",
        metadata={
            "help": "latest checkpoint, all checkpoints, or continuous: each new one until training ends",
            "choices": MODES,
        },
    )
    checkpoint: str | None = field(
        default=None, metadata={"help": "evaluate this checkpoint (e.g. ckpt-500) instead of by mode"}
    )
    split: str = field(default="eval", metadata={"help": "split to evaluate", "choices": ("eval", "validation")})
    weights: str = field(
        default="auto", metadata={"help": "auto: the moving average when the checkpoint has one", "choices": WEIGHTS}
    )
    batch_size: int = field(default=500, metadata={"range": "[1, 1048576]", "help": "images per evaluation batch"})
    test_time_augmentation: str | None = field(
        default=None,
        metadata={
            "help": "views to average (default: what the model was trained to use)",
            "choices": ("none", "mirror", "mirror_translate"),
        },
    )
    poll_seconds: float = field(
        default=10.0, metadata={"range": "(0, inf)", "help": "continuous mode: how often to look for checkpoints"}
    )
    timeout_seconds: float = field(
        default=3600.0,
        metadata={"range": "(0, inf)", "help": "continuous mode: stop when no new checkpoint came for this long"},
    )
    output_dir: str | None = field(
        default=None, metadata={"help": "where the report and metrics go (default: MODEL_DIR/eval)"}
    )
    misclassified_examples: int = field(
        default=36, metadata={"range": "[0, 1000]", "help": "misclassified images shown in the report"}
    )
    # the gate
    accuracy_threshold: float = field(
        default=0.0, metadata={"range": "[0, 1]", "help": "bless only at or above this top-1 accuracy"}
    )
    baseline: str | None = field(
        default=None,
        metadata={"help": "metrics JSON (or current-model pointer) of the promoted model: a file, gs:// or s3:// URI"},
    )
    baseline_tolerance: float = field(
        default=0.0, metadata={"range": "[0, 1]", "help": "bless only if accuracy >= baseline accuracy - this"}
    )
    compare_with: str | None = field(
        default=None,
        metadata={"help": "a promotion root (folder, gs:// or s3://) whose current.json is the baseline; no promotion"},
    )
    promote_to: str | None = field(
        default=None,
        metadata={
            "help": "when blessed: export a SavedModel under this folder (or gs://, s3://) and point current.json at it"
        },
    )
    data_blocking: str | None = field(
        default=None,
        metadata={
            "help": "what the data check found that blocks promotion (its step's output with --data-check block): "
            "the model is then not blessed, and the decision names it"
        },
    )
    serving_version: str | None = field(
        default=None,
        metadata={
            "help": "the TensorFlow Serving release the promotion root is served by (KServe's runtimeVersion; "
            "recorded in the root's serving.json): a model it cannot load is not promoted (default: what the root "
            "declares)"
        },
    )
    model_registry: str | None = field(
        default=None,
        metadata={
            "help": "after a promotion: register the version in Kubeflow's Model Registry at this REST address, "
            "http(s)://HOST[:PORT] (a registry that cannot be reached leaves the promotion standing, and says so)"
        },
    )
    registered_model_name: str = field(
        default="cifar10", metadata={"help": "the registered model a promotion's version is registered under"}
    )
    cache_dir: str | None = field(default=None, metadata={"help": "where remote datasets and model dirs are mirrored"})
    assume_single_writer: bool = field(
        default=False,
        metadata={
            "help": "go on with an S3 store that does not honour conditional writes (MinIO before 2024, SeaweedFS "
            "before 4.17): you make sure one writer at a time uses each location, since concurrent writers are then "
            "not detected (also: CIFAR10_PIPELINE_ASSUME_SINGLE_WRITER=1)"
        },
    )

    def __post_init__(self) -> None:
        check_fields(self)
        if self.model_registry:
            object.__setattr__(self, "model_registry", check_address(self.model_registry))
        check_model_name(self.registered_model_name)
        self._check_used()

    def _check_used(self) -> None:
        """A setting that another one (or its default) makes the stage ignore is refused, not ignored."""
        waiting = changed_fields(self, ("poll_seconds", "timeout_seconds"))
        if waiting and self.mode != "continuous":
            raise ValueError(
                f"{', '.join(waiting)}: how continuous mode waits for checkpoints, and mode {self.mode} evaluates what "
                f"is there: leave {setting_words(waiting)[1]} out, or give mode continuous"
            )
        if self.checkpoint is not None and self.mode != "latest":
            raise ValueError(
                f"checkpoint: {self.checkpoint} names the checkpoint to evaluate, and mode {self.mode} chooses them "
                "itself: give one of the two"
            )
        promotion = changed_fields(self, ("serving_version", "model_registry", "registered_model_name"))
        if promotion and self.promote_to is None:
            raise ValueError(
                f"{', '.join(promotion)}: {setting_words(promotion)[0]} of a promotion, and promote_to is not given "
                f"(nothing is promoted): give promote_to too, or leave {setting_words(promotion)[1]} out"
            )
        if changed_fields(self, ("baseline_tolerance",)) and not (
            self.baseline or self.compare_with or self.promote_to
        ):
            raise ValueError(
                "baseline_tolerance: how far below the baseline a model may be, and there is none (baseline, "
                "compare_with or promote_to): give one, or leave it out"
            )
