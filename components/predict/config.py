"""Configuration of the predict stage."""

from __future__ import annotations

from dataclasses import dataclass, field

from components.common.config import check_fields
from components.prepare_data.config import parse_image_size


@dataclass(frozen=True)
class PredictConfig:
    model: str = field(
        metadata={
            "help": "a promotion root (its current version), a version folder under one (ROOT/3), or a SavedModel "
            "folder exported by this project (local, gs:// or s3://)"
        }
    )
    images: str = field(
        metadata={
            "help": "what to score: a folder of JPEG/PNG images (searched below), a prepared dataset (its --split), "
            "or a gs:// / s3:// prefix of images"
        }
    )
    output: str = field(
        metadata={
            "help": "the predictions, JSON Lines (one image per line); the same job run again continues it (the images "
            "it holds are not scored again); a file of another job (other images, model version or options) is refused"
        }
    )
    split: str = field(
        default="eval",
        metadata={"help": "with a prepared dataset: the split to score", "choices": ("train", "validation", "eval")},
    )
    top_k: int = field(
        default=3, metadata={"range": "[1, 1000]", "help": "classes listed per image, most likely first"}
    )
    batch_size: int = field(default=256, metadata={"range": "[1, 65536]", "help": "images per model call"})
    resize: str | None = field(
        default=None,
        metadata={
            "help": "HEIGHTxWIDTH (or N), the model's input size: resize every image to it (bilinear, antialiased, as "
            "prepare_data --resize does); without it, an image of another size is skipped and counted"
        },
    )
    report: str | None = field(
        default=None,
        metadata={"help": "the HTML summary (default: the output's name with .html): classes, confidence, the least "
                          "confident images"},
    )  # fmt: skip
    least_confident: int = field(
        default=24, metadata={"range": "[0, 1000]", "help": "the least confident images shown in the report"}
    )
    max_image_megabytes: int = field(
        default=32, metadata={"range": "[1, 1024]", "help": "a larger image file is skipped as bad"}
    )

    def __post_init__(self) -> None:
        check_fields(self)
        for name in ("model", "images", "output"):
            if not getattr(self, name):
                raise ValueError(f"{name}: must be given")
        if self.resize is not None:
            parse_image_size(self.resize)

    @property
    def image_size(self) -> tuple[int, int] | None:
        """(height, width) asked for by `resize`, or None."""
        return parse_image_size(self.resize) if self.resize else None

    @property
    def report_path(self) -> str:
        return self.report or (self.output.removesuffix(".jsonl") + ".html")

    @property
    def summary_path(self) -> str:
        return self.output.removesuffix(".jsonl") + ".summary.json"
