"""What a sweep shows: an HTML report (trials sorted by validation accuracy, the search's progress, each setting's
importance) and TensorBoard runs (one per trial: its validation curve, its settings in the HParams dashboard)."""

from __future__ import annotations

import html
import json
from pathlib import Path

from components.evaluate.report import accuracy_chart
from components.sweep.space import SearchSpace

STYLE = (
    "body{font-family:sans-serif;margin:24px;max-width:1100px}table{border-collapse:collapse;font-size:13px}"
    "td,th{border:1px solid #ddd;padding:3px 8px;text-align:right}th{background:#f4f4f4}"
    ".pruned{color:#888}.failed{color:#b00}.bar{background:#1f77b4;height:12px;display:inline-block}"
)


def _value(value) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return html.escape(json.dumps(value) if not isinstance(value, str) else value)


def trials_table(records: list[dict], names: list[str]) -> str:
    ordered = sorted(records, key=lambda r: (r["state"] != "complete", -(r["validation_accuracy"] or 0.0)))
    head = "".join(f"<th>{html.escape(name)}</th>" for name in names)
    rows = []
    for record in ordered:
        accuracy = record["validation_accuracy"]
        shown = "" if accuracy is None else f"{accuracy:.4f}"
        if record.get("validation_accuracy_std"):
            shown += f" &plusmn; {record['validation_accuracy_std']:.4f}"
        cells = "".join(f"<td>{_value(record['params'].get(name))}</td>" for name in names)
        reason = html.escape(record["reason"]) if record["state"] != "complete" else ""
        rows.append(
            f'<tr class="{record["state"]}"><td>{record["trial"]}</td><td>{shown}</td><td>{record["state"]}</td>'
            f"{cells}<td>{record['seconds']:.0f} s</td><td style='text-align:left'>{reason}</td></tr>"
        )
    return (
        f"<table><tr><th>trial</th><th>validation accuracy</th><th>state</th>{head}<th>time</th><th>why</th></tr>"
        + "".join(rows)
        + "</table>"
    )


def progress_chart(records: list[dict]) -> str:
    """The best validation accuracy found so far, by trial (in the order they finished)."""
    points, best = [], None
    for record in sorted(records, key=lambda r: (r["finished_at"] or "", r["trial"])):
        if record["state"] == "complete":
            best = record["validation_accuracy"] if best is None else max(best, record["validation_accuracy"])
        if best is not None:
            points.append((len(points) + 1, best))
    return accuracy_chart(points, x_label="trials finished", y_label="best validation accuracy")


def importance_bars(importances: dict[str, float]) -> str:
    if not importances:
        return "<p>Not yet: at least three complete trials are needed.</p>"
    rows = "".join(
        f"<tr><td style='text-align:left'>{html.escape(name)}</td><td>{share:.2f}</td>"
        f"<td style='text-align:left'><span class='bar' style='width:{share * 300:.0f}px'></span></td></tr>"
        for name, share in sorted(importances.items(), key=lambda item: -item[1])
    )
    return f"<table><tr><th>setting</th><th>importance</th><th></th></tr>{rows}</table>"


def render(records: list[dict], best: dict | None, space: SearchSpace, importances: dict[str, float]) -> str:
    names = [dimension.name for dimension in space.dimensions]
    counts = {state: sum(r["state"] == state for r in records) for state in ("complete", "pruned", "failed")}
    if best:
        spread = f" &plusmn; {best['validation_accuracy_std']:.4f}" if best["validation_accuracy_std"] else ""
        headline = (
            f"<p><b>Best: trial {best['trial']}</b>, validation accuracy {best['validation_accuracy']:.4f}{spread} "
            f"({best['repeats']} training(s)): "
            + ", ".join(f"{html.escape(k)}={_value(v)}" for k, v in best["params"].items())
            + "</p>"
        )
    else:
        headline = "<p>No trial has completed yet.</p>"
    return (
        f"<!doctype html><html><head><meta charset='utf-8'><title>Sweep</title><style>{STYLE}</style></head><body>"
        f"<h1>Hyperparameter sweep</h1>{headline}"
        f"<p>{len(records)} trials finished: {counts['complete']} complete, {counts['pruned']} pruned, "
        f"{counts['failed']} failed. Measured on the validation split (held out of the training data), never on "
        "the test set.</p>"
        f"<h2>Search space</h2><pre>{html.escape(json.dumps(space.as_dict(), indent=1))}</pre>"
        f"<h2>The search's progress</h2>{progress_chart(records)}"
        f"<h2>Importance of each setting</h2>{importance_bars(importances)}"
        f"<h2>Trials</h2>{trials_table(records, names)}</body></html>"
    )


def write_tensorboard(log_dir: Path, records: list[dict], space: SearchSpace) -> None:
    """One run per finished trial (its validation curve, its settings as HParams), and the experiment's config."""
    import tensorflow as tf
    from tensorboard.plugins.hparams import api as hp

    hparams = []
    for dimension in space.dimensions:
        if dimension.choices is not None:
            hparams.append(hp.HParam(dimension.name, hp.Discrete([_hparam(v, dimension) for v in dimension.choices])))
        else:
            hparams.append(hp.HParam(dimension.name, hp.RealInterval(float(dimension.low), float(dimension.high))))
    metric = hp.Metric("accuracy", group="validation", display_name="validation accuracy")
    root = tf.summary.create_file_writer(str(log_dir))
    with root.as_default():
        hp.hparams_config(hparams=hparams, metrics=[metric])
    root.close()
    for record in records:
        run = log_dir / f"trial-{record['trial']:04d}"
        if run.exists():
            continue  # written when it finished
        session = tf.summary.create_file_writer(str(run))
        with session.as_default():
            values = {
                d.name: _hparam(record["params"][d.name], d) for d in space.dimensions if d.name in record["params"]
            }
            hp.hparams(values, trial_id=f"trial-{record['trial']:04d}")
        session.close()
        curve = tf.summary.create_file_writer(str(run / "validation"))
        with curve.as_default():
            for step, accuracy in record["curve"]:
                tf.summary.scalar("accuracy", accuracy, step=step)
        curve.close()


def _hparam(value, dimension):
    """A value as TensorBoard's HParams take it: one type per setting (numbers as floats, anything else as text,
    unless all of its choices are of one type already)."""
    choices = dimension.choices
    if choices is None:
        return float(value)
    kinds = {type(choice) for choice in choices}
    if len(kinds) == 1 and kinds <= {str, bool, float}:
        return value
    if all(isinstance(choice, (int, float)) and not isinstance(choice, bool) for choice in choices):
        return float(value)
    return json.dumps(value)
