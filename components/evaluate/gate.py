"""The promotion gate: blessed when accuracy clears a threshold and does not fall below the baseline."""

from __future__ import annotations

import math
from dataclasses import dataclass

from components.common import documents, storage


@dataclass(frozen=True)
class Decision:
    blessed: bool
    reasons: list[str]

    def summary(self) -> str:
        return ("BLESSED: " if self.blessed else "NOT BLESSED: ") + "; ".join(self.reasons)


BASELINE_SCHEMA = documents.Fields(
    {
        "accuracy": documents.Number("[0, 1]"),
        "metrics": documents.Fields({"accuracy": documents.Number("[0, 1]")}, required=("accuracy",)),
    }
)


def read_baseline_accuracy(uri: str) -> float:
    """The accuracy in a metrics JSON ({"accuracy": ...}) or a current-model pointer ({"metrics": {...}}), read back
    as every document is (bounded, checked: a NaN or an accuracy of 2 is refused, naming the field)."""
    try:
        content = storage.document(uri, BASELINE_SCHEMA, "baseline")
    except FileNotFoundError as error:
        raise ValueError(f"baseline {uri} does not exist") from error
    accuracy = content["metrics"]["accuracy"] if "metrics" in content else content.get("accuracy")
    if accuracy is None:
        raise documents.DocumentError(f"{uri}: not a valid baseline: no field accuracy (or metrics.accuracy)")
    return float(accuracy)


def decide(
    accuracy: float,
    threshold: float,
    baseline: float | None = None,
    tolerance: float = 0.0,
    baseline_description: str = "",
) -> Decision:
    """Blessed only when every check passes; the reasons say what was compared with what (`baseline_description`:
    what the baseline is, or why there is none)."""
    said = f" ({baseline_description})" if baseline_description else ""
    if not math.isfinite(accuracy):
        return Decision(False, [f"accuracy is {accuracy}: never blessed"])
    checks = []
    if accuracy >= threshold:
        checks.append((True, f"accuracy {accuracy:.4f} >= threshold {threshold:.4f}"))
    else:
        checks.append((False, f"accuracy {accuracy:.4f} is below the threshold {threshold:.4f}"))
    if baseline is not None:
        floor = baseline - tolerance
        if accuracy >= floor:
            checks.append(
                (True, f"accuracy {accuracy:.4f} >= baseline {baseline:.4f} - tolerance {tolerance:.4f}{said}")
            )
        else:
            checks.append(
                (
                    False,
                    f"accuracy {accuracy:.4f} is below the baseline {baseline:.4f} - tolerance {tolerance:.4f}{said}",
                )
            )
    else:
        checks.append((True, f"no baseline to compare with{said}"))
    return Decision(all(passed for passed, _ in checks), [reason for _, reason in checks])
