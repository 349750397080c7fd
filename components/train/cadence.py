"""How often the loop logs, writes summaries and histograms, saves checkpoints and measures the validation split:
as configured, or chosen from the run's length so that any run, ten steps or eighty thousand, gives curves of a few
dozen points (Keras's TensorBoard callback gives one a epoch), and a progress line at least every minute.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from components.train.config import TrainConfig

# Points a run gets of each, when not configured.
POINTS = {"log": 20, "summary": 50, "histogram": 10, "checkpoint": 5, "validation": 10}
LOG_SECONDS = 60.0  # a progress line at least this often, whatever the step cadence


@dataclass(frozen=True)
class Cadence:
    """Steps between each kind of event; 0 is never."""

    log: int
    summary: int
    histogram: int
    checkpoint: int
    validation: int


def resolve(config: TrainConfig, total_steps: int) -> Cadence:
    def chosen(given: int | None, kind: str) -> int:
        return given if given is not None else max(1, math.ceil(total_steps / POINTS[kind]))

    return Cadence(
        log=chosen(config.log_every_steps, "log"),
        summary=chosen(config.summary_every_steps, "summary"),
        histogram=chosen(config.histogram_every_steps, "histogram"),
        checkpoint=chosen(config.checkpoint_every_steps, "checkpoint"),
        validation=chosen(config.validation_every_steps, "validation"),
    )


def every(step: int, period: int | None, last: int | None = None) -> bool:
    """The one test for "every N steps" decisions: step is a multiple of `period` (never when it is None or 0),
    or the `last` step."""
    return (bool(period) and step % period == 0) or step == last
