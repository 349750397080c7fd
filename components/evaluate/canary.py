"""Before a version is made visible (TFX's InfraValidator, in small): load the exported SavedModel in a fresh process,
by its serving signatures only, as a server would, and send it canary requests: a few images the evaluation scored,
as uint8 arrays (`serving_default`) and encoded as PNG and JPEG (`serving_image_bytes`). The uint8 and PNG answers
must match the evaluation's predictions image for image (so the accuracy on them is the evaluation's); the JPEG
answers must be valid probabilities over the model's classes (JPEG changes pixels, so classes may differ).

    python -m components.evaluate.canary SAVED_MODEL_DIR REQUESTS.npz    (prints the answers as JSON)
"""

from __future__ import annotations

import json
import logging
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from components.common import filesystem, processes

logger = logging.getLogger(__name__)

CANARY_IMAGES = 16
TIMEOUT_SECONDS = 600


class InfraValidationError(RuntimeError):
    """The exported model did not load, or did not answer like the evaluated model."""


@dataclass(frozen=True)
class Canary:
    images: np.ndarray  # uint8 [k, H, W, C]
    expected_classes: np.ndarray  # int [k]: what the evaluation predicted for them
    labels: np.ndarray  # int [k]
    label_names: list[str]

    @classmethod
    def from_evaluation(cls, images, probabilities, labels, label_names, count: int = CANARY_IMAGES) -> Canary:
        return cls(
            np.asarray(images[:count], np.uint8),
            np.asarray(probabilities[:count]).argmax(axis=1),
            np.asarray(labels[:count]),
            list(label_names),
        )

    def accuracy(self, classes) -> float:
        return float(np.mean(np.asarray(classes) == self.labels))


def _encoded(images: np.ndarray, kind: str) -> list[bytes]:
    import tensorflow as tf

    if kind == "png":
        return [tf.io.encode_png(image).numpy() for image in images]
    return [tf.io.encode_jpeg(image, quality=95).numpy() for image in images]


def answer(saved_model_dir: str, requests: Path) -> dict:
    """In the fresh process: the SavedModel's answers to the canary requests, by signature."""
    import tensorflow as tf

    loaded = tf.saved_model.load(saved_model_dir)
    images = np.load(requests)["images"]  # reader: the requests the parent process just wrote
    answers = {"uint8": loaded.signatures["serving_default"](images=tf.constant(images))}
    by_bytes = loaded.signatures["serving_image_bytes"]
    for kind in ("png", "jpeg"):
        answers[kind] = by_bytes(image_bytes=tf.constant(_encoded(images, kind)))
    return {
        kind: {
            "classes": outputs["classes"].numpy().tolist(),
            "class_names": [name.decode() for name in outputs["class_names"].numpy()],
            "probability_sums": outputs["probabilities"].numpy().sum(axis=1).tolist(),
        }
        for kind, outputs in answers.items()
    }


def validate(saved_model_dir: str | Path, canary: Canary) -> dict:
    """Run the canary requests in a fresh process; InfraValidationError when any answer is wrong. Returns what was
    checked (for the promotion record)."""
    with filesystem.scratch("canary") as scratch:
        requests = Path(scratch, "requests.npz")
        np.savez(requests, images=canary.images)
        completed = processes.run(  # the fresh process ends with this one
            [sys.executable, "-m", "components.evaluate.canary", str(saved_model_dir), str(requests)],
            capture_output=True, text=True, timeout=TIMEOUT_SECONDS,
        )  # fmt: skip
    if completed.returncode != 0:
        last = (completed.stderr.strip().splitlines() or ["(no output)"])[-1]
        raise InfraValidationError(f"the exported model did not load or answer in a fresh process: {last}")
    answers = json.loads(completed.stdout.strip().splitlines()[-1])  # reader: the answer of our own child process
    expected = canary.expected_classes.tolist()
    for kind in ("uint8", "png"):
        if answers[kind]["classes"] != expected:
            wrong = sum(a != b for a, b in zip(answers[kind]["classes"], expected, strict=True))
            raise InfraValidationError(
                f"the exported model's {kind} answers differ from the evaluation's on {wrong} of {len(expected)} "
                "canary images"
            )
    for kind, outputs in answers.items():
        if not all(abs(total - 1.0) < 1e-3 for total in outputs["probability_sums"]):
            raise InfraValidationError(f"the exported model's {kind} answers are not probabilities")
        if not set(outputs["class_names"]) <= set(canary.label_names):
            raise InfraValidationError(f"the exported model's {kind} answers name classes it was not trained on")
    accuracy = canary.accuracy(expected)
    logger.info(
        "canary requests answered in a fresh process: %d images, accuracy %.4f by uint8 and PNG (the evaluation's), "
        "JPEG answered", len(expected), accuracy,
    )  # fmt: skip
    return {"images": len(expected), "accuracy": accuracy, "signatures": ["serving_default", "serving_image_bytes"]}


def main(argv: list[str] | None = None) -> int:
    arguments = sys.argv[1:] if argv is None else argv
    logging.disable(logging.WARNING)
    result = answer(arguments[0], Path(arguments[1]))
    sys.stdout.write(json.dumps(result) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
