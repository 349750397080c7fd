"""Evaluation metrics and the gate, against values computed by hand."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from components.evaluate import gate, metrics

# Four images, three classes. Predictions: 0 (right), 1 (wrong, true 2), 2 (right), 0 (wrong, true 1).
PROBABILITIES = np.array([[0.7, 0.2, 0.1], [0.1, 0.6, 0.3], [0.2, 0.3, 0.5], [0.5, 0.4, 0.1]])
LABELS = np.array([0, 2, 2, 1])


def test_metrics_equal_hand_computed_values():
    result = metrics.compute(PROBABILITIES, LABELS)
    assert result.accuracy == 0.5
    assert result.confusion_matrix == [[1, 0, 0], [1, 0, 0], [0, 1, 1]]
    assert result.precision == pytest.approx([0.5, 0.0, 1.0])  # class 0 predicted twice, right once
    assert result.recall == pytest.approx([1.0, 0.0, 0.5])
    assert result.f1 == pytest.approx([2 / 3, 0.0, 2 / 3])
    assert result.support == [1, 1, 2]
    assert result.loss == pytest.approx(-np.mean(np.log([0.7, 0.3, 0.5, 0.4])))
    assert result.top5_accuracy == 1.0  # three classes: every label is in the top 5
    # Confidence bins of width 1/15: 0.7 (right), 0.6 (wrong), and 0.5 twice (one right, one wrong).
    assert result.expected_calibration_error == pytest.approx(0.25 * 0.3 + 0.25 * 0.6 + 0.5 * 0.0)
    assert result.scalars()["macro_f1"] == pytest.approx(4 / 9)


def test_top_k_accuracy():
    probabilities = np.array([[0.5, 0.3, 0.2], [0.5, 0.3, 0.2], [0.1, 0.2, 0.7]])
    labels = np.array([1, 2, 0])
    assert metrics.top_k_accuracy(probabilities, labels, 1) == 0.0
    assert metrics.top_k_accuracy(probabilities, labels, 2) == pytest.approx(1 / 3)
    assert metrics.top_k_accuracy(probabilities, labels, 3) == 1.0


def test_a_perfectly_calibrated_model_has_zero_ece():
    probabilities = np.array([[0.75, 0.25]] * 4)
    labels = np.array([0, 0, 0, 1])  # 75% confident, 75% right
    assert metrics.expected_calibration_error(probabilities, labels) == pytest.approx(0.0)


def test_nan_predictions_and_empty_input_are_errors():
    with pytest.raises(ValueError, match="NaN or Inf"):
        metrics.compute(np.array([[np.nan, 0.5]]), np.array([0]))
    with pytest.raises(ValueError, match="no examples"):
        metrics.compute(np.zeros((0, 3)), np.zeros((0,), int))


@pytest.mark.parametrize(
    ("accuracy", "threshold", "baseline", "tolerance", "blessed"),
    [
        (0.91, 0.90, None, 0.0, True),
        (0.89, 0.90, None, 0.0, False),
        (0.90, 0.90, None, 0.0, True),  # at the threshold counts
        (0.93, 0.90, 0.935, 0.01, True),  # slightly below the promoted model, within tolerance
        (0.92, 0.90, 0.935, 0.01, False),  # more than the tolerance below
        (0.95, 0.90, 0.93, 0.0, True),
        (math.nan, 0.0, None, 0.0, False),
    ],
)
def test_gate_decisions(accuracy, threshold, baseline, tolerance, blessed):
    decision = gate.decide(accuracy, threshold, baseline, tolerance)
    assert decision.blessed is blessed
    said = " ".join(decision.reasons)  # what the report and the log show a user
    if math.isnan(accuracy):
        assert "never blessed" in said
        return
    assert f"threshold {threshold:.4f}" in said
    assert f"baseline {baseline:.4f}" in said if baseline is not None else "no baseline" in said
    assert ("below" in said) is (not blessed)


def test_gate_reasons_say_what_was_compared():
    decision = gate.decide(0.92, 0.90, 0.935, 0.01)
    assert decision.reasons == [
        "accuracy 0.9200 >= threshold 0.9000",
        "accuracy 0.9200 is below the baseline 0.9350 - tolerance 0.0100",
    ]
    assert decision.summary().startswith("NOT BLESSED: ")


def test_baseline_from_a_metrics_file_or_a_pointer(tmp_path):
    (tmp_path / "metrics.json").write_text(json.dumps({"accuracy": 0.91}))
    (tmp_path / "current.json").write_text(json.dumps({"version": "v1", "metrics": {"accuracy": 0.93}}))
    (tmp_path / "bad.json").write_text(json.dumps({"acc": 0.93}))
    assert gate.read_baseline_accuracy(str(tmp_path / "metrics.json")) == 0.91
    assert gate.read_baseline_accuracy(str(tmp_path / "current.json")) == 0.93
    with pytest.raises(ValueError, match=r"bad.json: not a valid baseline: no field accuracy"):
        gate.read_baseline_accuracy(str(tmp_path / "bad.json"))
    with pytest.raises(ValueError, match=r"missing.json does not exist"):
        gate.read_baseline_accuracy(str(tmp_path / "missing.json"))


def test_the_accuracy_chart_has_labelled_axes_with_readable_ticks():
    import re

    from components.evaluate.report import accuracy_chart

    svg = accuracy_chart([(0, 0.1), (150, 0.45), (300, 0.62)])
    labels = re.findall(r"<text[^>]*>([^<]+)</text>", svg)
    assert "training step" in labels and "accuracy" in labels
    assert {"0.0", "0.5", "1.0"} <= set(labels)  # accuracy every 0.1
    assert {"0", "100", "200", "300"} <= set(labels)  # round step numbers
