"""The evaluation report: one self-contained HTML page with pictures (PNG and SVG inlined, no external files).

- the gate's decision and its reasons;
- the confusion matrix as a table of counts shaded by their share of the row (a heatmap with the class names;
  the image in TensorBoard has none);
- the per-class precision / recall / F1 table;
- a grid of misclassified images with their true and predicted labels;
- accuracy by step when several checkpoints were evaluated.
"""

from __future__ import annotations

import base64
import html
from dataclasses import dataclass

import numpy as np

from components.common.data_statistics import class_shares
from components.evaluate.gate import Decision
from components.evaluate.metrics import Metrics

CELL_PIXELS = 24
THUMBNAIL_SCALE = 3


def encode_png(image: np.ndarray) -> bytes:
    import tensorflow as tf

    return tf.io.encode_png(np.ascontiguousarray(image, np.uint8)).numpy()


def data_uri(png: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(png).decode()


def confusion_heatmap(matrix: np.ndarray) -> np.ndarray:
    """uint8 [H, W, 3]: each cell a square, white (0) to dark blue (the whole row predicted there)."""
    matrix = np.asarray(matrix, np.float64)
    rows = matrix.sum(axis=1, keepdims=True)
    share = np.divide(matrix, rows, out=np.zeros_like(matrix), where=rows > 0)
    white, blue = np.array([255.0, 255.0, 255.0]), np.array([8.0, 48.0, 107.0])
    colors = white + share[..., None] * (blue - white)
    image = np.repeat(np.repeat(colors, CELL_PIXELS, axis=0), CELL_PIXELS, axis=1)
    image[::CELL_PIXELS, :, :] = 200  # grid lines
    image[:, ::CELL_PIXELS, :] = 200
    return image.astype(np.uint8)


def _cell_style(share: float) -> str:
    red, green, blue = (
        np.array([255, 255, 255]) + share * (np.array([8, 48, 107]) - np.array([255, 255, 255]))
    ).astype(int)
    text = "#fff" if share > 0.5 else "#000"
    return f"background:rgb({red},{green},{blue});color:{text}"


def confusion_table(matrix: np.ndarray, names: list[str]) -> str:
    matrix = np.asarray(matrix)
    header = "".join(f"<th>{html.escape(name)}</th>" for name in names)
    rows = []
    for index, name in enumerate(names):
        total = max(int(matrix[index].sum()), 1)
        cells = "".join(f'<td style="{_cell_style(count / total)}">{count}</td>' for count in matrix[index].tolist())
        rows.append(f"<tr><th>{html.escape(name)}</th>{cells}</tr>")
    return '<table class="confusion"><tr><th>true \\ predicted</th>' + header + "</tr>" + "".join(rows) + "</table>"


def per_class_table(names: list[str], precision, recall, f1, support) -> str:
    rows = "".join(
        f"<tr><td>{html.escape(name)}</td><td>{p:.3f}</td><td>{r:.3f}</td><td>{f:.3f}</td><td>{s}</td></tr>"
        for name, p, r, f, s in zip(names, precision, recall, f1, support, strict=True)
    )
    return (
        "<table><tr><th>class</th><th>precision</th><th>recall</th><th>F1</th><th>images</th></tr>" + rows + "</table>"
    )


def misclassified_grid(images: np.ndarray, true: np.ndarray, predicted: np.ndarray, confidence, names) -> str:
    if len(images) == 0:
        return "<p>No misclassified images.</p>"
    tiles = []
    for image, truth, guess, score in zip(images, true, predicted, confidence, strict=True):
        large = enlarged(image)
        caption = f"true: {html.escape(names[truth])}<br>predicted: {html.escape(names[guess])} ({score:.2f})"
        alt = html.escape(f"true {names[truth]}, predicted {names[guess]}", quote=True)
        tiles.append(
            f'<figure><img src="{data_uri(encode_png(large))}" alt="{alt}"><figcaption>{caption}</figcaption></figure>'
        )
    return '<div class="grid">' + "".join(tiles) + "</div>"


def accuracy_chart(
    points: list[tuple[int, float]],
    width: int = 640,
    height: int = 260,
    x_label: str = "training step",
    y_label: str = "accuracy",
) -> str:
    """An SVG line chart of accuracy by training step, with labelled axes: accuracy ticks every 0.1 or 0.25 of the
    range shown, about six step ticks at round numbers, and grid lines to read values across."""
    if len(points) < 2:
        return ""
    left, right, top, bottom = 56, 16, 16, 44
    steps = [step for step, _ in points]
    values = [value for _, value in points]
    low, high = min([*values, 0.0]), max([*values, 1.0])
    span_steps = max(steps[-1] - steps[0], 1)

    def x(step):
        return left + (step - steps[0]) / span_steps * (width - left - right)

    def y(value):
        return height - bottom - (value - low) / max(high - low, 1e-9) * (height - top - bottom)

    value_step = 0.1 if high - low <= 1.0 else 0.25
    value_ticks = [round(low + index * value_step, 2) for index in range(int((high - low) / value_step + 1e-9) + 1)]
    step_ticks = _round_ticks(steps[0], steps[-1], 6)
    grid = "".join(
        f'<line x1="{left}" y1="{y(v):.1f}" x2="{width - right}" y2="{y(v):.1f}" stroke="#eee"/>'
        f'<text x="{left - 6}" y="{y(v) + 4:.1f}" font-size="11" text-anchor="end">{v:.1f}</text>'
        for v in value_ticks
    ) + "".join(
        f'<line x1="{x(s):.1f}" y1="{top}" x2="{x(s):.1f}" y2="{height - bottom}" stroke="#eee"/>'
        f'<text x="{x(s):.1f}" y="{height - bottom + 16}" font-size="11" text-anchor="middle">{s:,}</text>'
        for s in step_ticks
    )
    line = " ".join(f"{x(step):.1f},{y(value):.1f}" for step, value in points)
    dots = "".join(
        f'<circle cx="{x(s):.1f}" cy="{y(v):.1f}" r="3"><title>step {s}: {v:.4f}</title></circle>' for s, v in points
    )
    return (
        f'<svg width="{width}" height="{height}" xmlns="http://www.w3.org/2000/svg" role="img">{grid}'
        f'<line x1="{left}" y1="{height - bottom}" x2="{width - right}" y2="{height - bottom}" stroke="#888"/>'
        f'<line x1="{left}" y1="{top}" x2="{left}" y2="{height - bottom}" stroke="#888"/>'
        f'<text x="{(left + width - right) / 2:.0f}" y="{height - 6}" font-size="12" text-anchor="middle">'
        f"{x_label}</text>"
        f'<text x="14" y="{(top + height - bottom) / 2:.0f}" font-size="12" text-anchor="middle" '
        f'transform="rotate(-90 14 {(top + height - bottom) / 2:.0f})">{y_label}</text>'
        f'<polyline points="{line}" fill="none" stroke="#1f77b4" stroke-width="2"/>{dots}</svg>'
    )


def _round_ticks(first: int, last: int, wanted: int) -> list[int]:
    """About `wanted` round step numbers (1, 2 or 5 times a power of ten apart) from `first` to `last`."""
    span = max(last - first, 1)
    raw = span / max(wanted - 1, 1)
    magnitude = 10 ** max(len(str(int(raw))) - 1, 0)
    spacing = next(factor * magnitude for factor in (1, 2, 5, 10) if factor * magnitude >= raw)
    start = -(-first // spacing) * spacing
    return list(range(start, last + 1, spacing)) or [first, last]


STYLE = """
body{font-family:sans-serif;margin:2em;max-width:1100px}
table{border-collapse:collapse;margin:1em 0}td,th{border:1px solid #ccc;padding:4px 8px;text-align:right}
.confusion td{min-width:2.5em;text-align:center}
.confusion tr:first-child th{max-width:6em;overflow-wrap:anywhere;font-size:12px;text-align:center}
.blessed{background:#e6f4ea;border:1px solid #34a853;padding:1em}
.rejected{background:#fce8e6;border:1px solid #ea4335;padding:1em}
.grid{display:flex;flex-wrap:wrap;gap:8px}figure{margin:0;width:120px;font-size:11px}
.warning{background:#fff4ce;padding:.5em}
.bar{display:inline-block;height:.8em;background:#1a73e8}.reference{display:inline-block;height:.8em;background:#bbb}
.pair{display:flex;gap:2px}
"""


@dataclass(frozen=True)
class ReportContent:
    """What the page shows: the final checkpoint's metrics, the gate's decision, and the evaluation's context."""

    title: str
    facts: dict[str, str]  # shown as given: model directory, checkpoint, dataset...
    decision: Decision
    metrics: Metrics
    label_names: list[str]
    misclassified_html: str
    history: list[tuple[int, float]]  # (step, accuracy) of every evaluated checkpoint
    warning: str | None = None
    data_html: str = ""  # the data section (data_section)


def render(content: ReportContent) -> str:
    metrics, names, warning = content.metrics, content.label_names, content.warning
    matrix = np.asarray(metrics.confusion_matrix)
    facts_html = "".join(
        f"<tr><th>{html.escape(key)}</th><td>{html.escape(str(value))}</td></tr>"
        for key, value in content.facts.items()
    )
    scalars_html = "".join(f"<tr><th>{html.escape(k)}</th><td>{v:.4f}</td></tr>" for k, v in metrics.scalars().items())
    reasons = "".join(f"<li>{html.escape(reason)}</li>" for reason in content.decision.reasons)
    blessed = content.decision.blessed
    verdict = "Blessed for promotion" if blessed else "Not blessed"
    chart = accuracy_chart(content.history)
    title = html.escape(content.title)
    sections = [
        f"<!doctype html><html><head><meta charset='utf-8'><title>{title}</title>",
        f"<style>{STYLE}</style></head><body>",
        f"<h1>{title}</h1>",
        f'<p class="warning">{html.escape(warning)}</p>' if warning else "",
        f'<div class="{"blessed" if blessed else "rejected"}">',
        f"<strong>{verdict}</strong><ul>{reasons}</ul></div>",
        f"<h2>Summary</h2><table>{facts_html}{scalars_html}</table>",
        f"<h2>Accuracy by step</h2>{chart}" if chart else "",
        "<h2>Confusion matrix</h2>",
        "<p>Rows: the true class; columns: the predicted one. Each cell's shade is its share of the row.</p>",
        confusion_table(matrix, names),
        "<h2>Per class</h2>",
        per_class_table(names, metrics.precision, metrics.recall, metrics.f1, metrics.support),
        "<h2>Misclassified images</h2>",
        content.misclassified_html,
        content.data_html,
        "</body></html>",
    ]
    return "\n".join(section for section in sections if section)


def leakage_removed_line(removed: dict) -> str:
    """What --leakage drop_from_train or drop_from_eval removed, in one line (statistics.json's leakage_removed)."""
    counts = ", ".join(
        f"{count:,} from the {split} split" for split, count in removed.get("images_removed", {}).items()
    )
    why = "training images with a near-duplicate among the test or validation images"
    if removed.get("mode") == "drop_from_eval":
        why = "test and validation images with a near-duplicate in training"
    return f"leakage {removed.get('mode', '?')}: removed {counts or 'nothing'} ({why})"


@dataclass(frozen=True)
class LeakingPair:
    test_image: np.ndarray  # uint8 [H, W, 3]
    train_image: np.ndarray | None  # None: not found in the training split's shards
    test_id: str
    train_id: str
    similarity: float


def data_section(
    statistics: dict, reference: dict | None, reference_name: str, split: str, pairs: list[LeakingPair],
    accuracies: tuple[float, float, int] | None,
) -> str:  # fmt: skip
    """The data: class balance bars (against the reference's), channel statistics against the reference, and the
    leaking pairs side by side, with the accuracy with and without the leaking images (`accuracies`: with, without,
    how many leak)."""
    parts = ["<h2>Data</h2>"]
    removed = statistics.get("leakage_removed")
    if removed:
        parts.append(f"<p><strong>{html.escape(leakage_removed_line(removed))}</strong></p>")
    if accuracies is not None:
        with_leaks, without, count = accuracies
        parts.append(
            f"<p>Accuracy on all {html.escape(split)} images: <strong>{with_leaks:.4f}</strong>; without the {count} "
            f"that have a near-duplicate in the training split: <strong>{without:.4f}</strong> (the difference is "
            "what remembering the training images buys).</p>"
        )
    names = statistics["label_names"]
    theirs = class_shares(reference, split)
    mine = statistics["splits"].get(split)
    if mine:
        total = max(mine["count"], 1)
        widest = max([count / total for count in mine["class_counts"]] + list(theirs.values()) + [1e-9])
        rows = []
        for name, count in zip(names, mine["class_counts"], strict=True):
            share = count / total
            bar = f'<span class="bar" style="width:{240 * share / widest:.0f}px"></span>'
            reference_bar = (
                f'<br><span class="reference" style="width:{240 * theirs[name] / widest:.0f}px"></span> '
                f"{theirs[name]:.1%}"
                if name in theirs
                else ""
            )
            rows.append(
                f"<tr><th>{html.escape(name)}</th><td>{count:,}</td><td>{bar} {share:.1%}{reference_bar}</td></tr>"
            )
        described = f" (grey: {html.escape(reference_name)})" if theirs else ""
        parts.append(
            f"<h3>Class balance of the {html.escape(split)} split{described}</h3><table>{''.join(rows)}</table>"
        )
    parts.append(_channel_table(statistics, reference, reference_name))
    parts.append(look_pictures(statistics, reference, reference_name, split))
    if pairs:
        tiles = []
        for pair in pairs:
            images = [pair.test_image] + ([pair.train_image] if pair.train_image is not None else [])
            shown = "".join(
                f'<img src="{data_uri(encode_png(enlarged(image)))}" alt="{html.escape(which, quote=True)}">'
                for image, which in zip(images, ("test image", "its training near-duplicate"), strict=False)
            )
            caption = f"{html.escape(pair.test_id)}<br>~ {html.escape(pair.train_id)} ({pair.similarity:.3f})"
            tiles.append(
                f'<figure style="width:220px"><div class="pair">{shown}</div>'
                f"<figcaption>{caption}</figcaption></figure>"
            )
        parts.append(
            f"<h3>Leaking images: {html.escape(split)} images and their near-duplicates in training</h3>"
            f'<div class="grid">{"".join(tiles)}</div>'
        )
    return "\n".join(parts)


HISTOGRAMS = (("red", (200, 40, 40)), ("green", (40, 150, 40)), ("blue", (40, 70, 200)),
              ("distance from grey", (150, 60, 170)), ("fine detail", (200, 130, 20)))  # fmt: skip
PANEL = (72, 160)  # height, width of one histogram's picture


def histogram_panel(ours: np.ndarray, reference: np.ndarray | None, colour: tuple[int, int, int]) -> np.ndarray:
    """One histogram as a picture: this data's bars in `colour` over the reference's in grey (both as shares)."""
    height, width = PANEL
    panel = np.full((height, width, 3), 255, np.uint8)
    shares = [ours / max(ours.sum(), 1)] + ([reference / max(reference.sum(), 1)] if reference is not None else [])
    top = max(float(np.max(share)) for share in shares) or 1.0
    bar = width // len(ours)
    for layer, (share, paint) in enumerate(zip(shares[::-1], ([(190, 190, 190)] if reference is not None else [])
                                               + [colour], strict=True)):  # fmt: skip
        for index, value in enumerate(share):
            filled = round((height - 2) * value / top)
            if filled:
                left = index * bar + (1 if layer else 0)
                panel[height - filled :, left : left + max(bar - 1 - (2 if layer else 0), 1)] = paint
    return panel


def look_pictures(statistics: dict, reference: dict | None, reference_name: str, split: str) -> str:
    """How the images look, as pictures: the histograms of each channel's values, of the pixels' distance from grey
    and of the images' fine detail (this data's in colour, the reference's in grey behind), and each class's mean
    image, the reference's above this data's."""
    mine = statistics["splits"].get(split) or {}
    theirs = ((reference or {}).get("splits") or {}).get(split) or {}
    if "channel_histogram" not in mine:
        return ""
    ours = [*np.array(mine["channel_histogram"], float), np.array(mine["saturation_histogram"], float),
            np.array(mine["detail_histogram"], float)]  # fmt: skip
    if "channel_histogram" in theirs:
        others = [*np.array(theirs["channel_histogram"], float), np.array(theirs["saturation_histogram"], float),
                  np.array(theirs["detail_histogram"], float)]  # fmt: skip
    else:
        others = [None] * len(ours)
    figures = []
    for (name, colour), histogram, other in zip(HISTOGRAMS, ours, others, strict=True):
        picture = data_uri(encode_png(histogram_panel(histogram, other, colour)))
        figures.append(f'<figure><img src="{picture}" alt="{name}"><figcaption>{name}</figcaption></figure>')
    means = []
    for label, side in ((html.escape(reference_name), theirs), (f"this {html.escape(split)} split", mine)):
        if side.get("class_thumbnails"):
            tiles = [np.repeat(np.repeat(np.clip(np.array(row).reshape(8, 8, 3), 0, 255), 6, 0), 6, 1).astype(np.uint8)
                     for row in side["class_thumbnails"]]  # fmt: skip
            strip = np.concatenate([np.pad(tile, ((0, 0), (0, 4), (0, 0)), constant_values=255) for tile in tiles], 1)
            classes = ", ".join(map(html.escape, statistics["label_names"]))
            means.append(f'<figure><img src="{data_uri(encode_png(strip))}" alt="class mean images">'
                         f"<figcaption>{label}: each class's mean image ({classes})</figcaption></figure>")  # fmt: skip
    behind = f" (grey: {html.escape(reference_name)})" if reference else ""
    return (f"<h3>How the {html.escape(split)} images look{behind}</h3><div class=\"grid\">{''.join(figures)}</div>"
            + "".join(means))  # fmt: skip


def enlarged(image: np.ndarray) -> np.ndarray:
    return np.repeat(np.repeat(image, THUMBNAIL_SCALE, axis=0), THUMBNAIL_SCALE, axis=1)


def _channel_table(statistics: dict, reference: dict | None, reference_name: str) -> str:
    header = "<tr><th>split</th><th>channel</th><th>mean</th><th>std</th>"
    header += (
        f"<th>{html.escape(reference_name)}: mean</th><th>std</th><th>shift (std devs)</th></tr>"
        if reference
        else "</tr>"
    )
    rows = []
    for split, values in statistics["splits"].items():
        other = (reference or {}).get("splits", {}).get(split)
        for channel, colour in enumerate(("red", "green", "blue")):
            row = f"<tr><td>{split}</td><td>{colour}</td><td>{values['channel_mean'][channel]:.1f}</td>"
            row += f"<td>{values['channel_std'][channel]:.1f}</td>"
            if reference and other:
                shift = (values["channel_mean"][channel] - other["channel_mean"][channel]) / max(
                    other["channel_std"][channel], 1e-6
                )
                row += f"<td>{other['channel_mean'][channel]:.1f}</td><td>{other['channel_std'][channel]:.1f}</td>"
                row += f"<td>{shift:+.2f}</td>"
            rows.append(row + "</tr>")
    return f"<h3>Channels</h3><table>{header}{''.join(rows)}</table>"
