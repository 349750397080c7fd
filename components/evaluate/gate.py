"""The promotion gate: blessed when accuracy clears a threshold and does not fall below the baseline."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass

from components.common import storage


@dataclass(frozen=True)
class Decision:
    blessed: bool
    reasons: list[str]

    def summary(self) -> str:
        return ("BLESSED: " if self.blessed else "NOT BLESSED: ") + "; ".join(self.reasons)


def read_baseline_accuracy(uri: str) -> float:
    """The accuracy in a metrics JSON ({"accuracy": ...}) or a current-model pointer ({"metrics": {...}})."""
    try:
        content = json.loads(storage.read_bytes(uri))
    except FileNotFoundError as error:
        raise ValueError(f"baseline {uri} does not exist") from error
    except json.JSONDecodeError as error:
        raise ValueError(f"baseline {uri}: not valid JSON ({error})") from error
    metrics = content.get("metrics", content) if isinstance(content, dict) else None
    accuracy = metrics.get("accuracy") if isinstance(metrics, dict) else None
    if not isinstance(accuracy, (int, float)) or not 0.0 <= accuracy <= 1.0:
        raise ValueError(f"baseline {uri}: no field 'accuracy' (or 'metrics.accuracy') between 0 and 1")
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
