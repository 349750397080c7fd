"""Classification metrics from predicted probabilities and true labels (pure numpy, easy to check by hand)."""

from __future__ import annotations

import itertools
from dataclasses import asdict, dataclass

import numpy as np

CALIBRATION_BINS = 15


@dataclass(frozen=True)
class Metrics:
    num_examples: int
    accuracy: float  # top-1
    top5_accuracy: float
    loss: float  # mean cross-entropy
    expected_calibration_error: float
    precision: list[float]  # per class
    recall: list[float]
    f1: list[float]
    support: list[int]  # true examples per class
    confusion_matrix: list[list[int]]  # [true][predicted]

    def scalars(self) -> dict[str, float]:
        return {
            "accuracy": self.accuracy,
            "top5_accuracy": self.top5_accuracy,
            "loss": self.loss,
            "expected_calibration_error": self.expected_calibration_error,
            "macro_f1": float(np.mean(self.f1)),
        }

    def to_dict(self) -> dict:
        return asdict(self)


def confusion_matrix(labels: np.ndarray, predictions: np.ndarray, num_classes: int) -> np.ndarray:
    """Counts [true class, predicted class]."""
    matrix = np.zeros((num_classes, num_classes), np.int64)
    np.add.at(matrix, (labels, predictions), 1)
    return matrix


def per_class_scores(matrix: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Precision, recall and F1 per class; 0 where a class was never predicted or never true."""
    true_positives = np.diag(matrix).astype(np.float64)
    predicted = matrix.sum(axis=0).astype(np.float64)
    actual = matrix.sum(axis=1).astype(np.float64)
    precision = np.divide(true_positives, predicted, out=np.zeros_like(true_positives), where=predicted > 0)
    recall = np.divide(true_positives, actual, out=np.zeros_like(true_positives), where=actual > 0)
    total = precision + recall
    f1 = np.divide(2 * precision * recall, total, out=np.zeros_like(total), where=total > 0)
    return precision, recall, f1


def top_k_accuracy(probabilities: np.ndarray, labels: np.ndarray, k: int) -> float:
    k = min(k, probabilities.shape[1])
    top = np.argpartition(-probabilities, k - 1, axis=1)[:, :k]
    return float(np.mean(np.any(top == labels[:, None], axis=1)))


def expected_calibration_error(probabilities: np.ndarray, labels: np.ndarray, bins: int = CALIBRATION_BINS) -> float:
    """Sum over equal-width confidence bins of (bin share) x |accuracy in bin - mean confidence in bin|."""
    confidence = probabilities.max(axis=1)
    correct = probabilities.argmax(axis=1) == labels
    edges = np.linspace(0.0, 1.0, bins + 1)
    error = 0.0
    for low, high in itertools.pairwise(edges):
        in_bin = (confidence > low) & (confidence <= high)
        if in_bin.any():
            error += in_bin.mean() * abs(correct[in_bin].mean() - confidence[in_bin].mean())
    return float(error)


def cross_entropy(probabilities: np.ndarray, labels: np.ndarray) -> float:
    chosen = probabilities[np.arange(len(labels)), labels]
    return float(-np.mean(np.log(np.clip(chosen, 1e-12, 1.0))))


def compute(probabilities: np.ndarray, labels: np.ndarray) -> Metrics:
    """All metrics of one evaluation. Raises ValueError for empty input or non-finite probabilities."""
    if len(labels) == 0:
        raise ValueError("no examples to evaluate")
    if not np.all(np.isfinite(probabilities)):
        raise ValueError("the model's predictions contain NaN or Inf")
    probabilities = probabilities.astype(np.float64)
    labels = labels.astype(np.int64)
    num_classes = probabilities.shape[1]
    predictions = probabilities.argmax(axis=1)
    matrix = confusion_matrix(labels, predictions, num_classes)
    precision, recall, f1 = per_class_scores(matrix)
    return Metrics(
        num_examples=len(labels),
        accuracy=float(np.mean(predictions == labels)),
        top5_accuracy=top_k_accuracy(probabilities, labels, 5),
        loss=cross_entropy(probabilities, labels),
        expected_calibration_error=expected_calibration_error(probabilities, labels),
        precision=precision.tolist(),
        recall=recall.tolist(),
        f1=f1.tolist(),
        support=matrix.sum(axis=1).tolist(),
        confusion_matrix=matrix.tolist(),
    )
