"""statistics.json as a page a person reads: Markdown for the KFP UI (the prepare and data check steps' outputs)."""

from __future__ import annotations

from components.common.data_statistics import class_shares

BAR_WIDTH = 30
CHANNELS = ("red", "green", "blue")


def _bar(share: float, widest: float) -> str:
    return "█" * max(1 if share > 0 else 0, round(BAR_WIDTH * share / max(widest, 1e-9)))


def markdown(statistics: dict, reference: dict | None = None, findings: list | None = None, title: str = "") -> str:
    """The dataset's statistics (beside `reference`'s when given) and the data check's `findings` (Finding objects)."""
    lines = [f"# {title or 'Data statistics'}", ""]
    if findings is not None:
        lines += ["## Data check", ""]
        lines += [f"- **{finding.severity}**: {finding.message}" for finding in findings] or ["- nothing changed"]
        lines.append("")
    splits = statistics["splits"]
    lines += ["## Splits", "", "| split | images | leaking (near-duplicate in train) |", "|---|---|---|"]
    for name, split in splits.items():
        leaking = statistics["leakage"].get(name)
        lines.append(f"| {name} | {split['count']:,} | {'' if leaking is None else f'{leaking:,}'} |")
    lines += ["", "## Class balance", ""]
    names = statistics["label_names"]
    for split_name, split in splits.items():
        total = max(split["count"], 1)
        shares = [count / total for count in split["class_counts"]]
        theirs = class_shares(reference, split_name)
        lines += [
            f"**{split_name}**",
            "",
            "| class | images | share | |" + (" reference |" if theirs else ""),
            "|---|---|---|---|" + ("---|" if theirs else ""),
        ]
        for index, name in enumerate(names):
            bar = _bar(shares[index], max(shares))
            row = f"| {name} | {split['class_counts'][index]:,} | {shares[index]:.1%} | `{bar}` |"
            if theirs:
                row += f" {theirs.get(name, 0):.1%} |"
            lines.append(row)
        lines.append("")
    header = "| split | channel | mean | std |" + (" reference mean | reference std |" if reference else "")
    lines += ["## Channels", "", header, "|---|---|---|---|" + ("---|---|" if reference else "")]
    for split_name, split in splits.items():
        other = (reference or {}).get("splits", {}).get(split_name)
        for channel, colour in enumerate(CHANNELS):
            mean, spread = split["channel_mean"][channel], split["channel_std"][channel]
            row = f"| {split_name} | {colour} | {mean:.1f} | {spread:.1f} |"
            if reference:
                row += (
                    f" {other['channel_mean'][channel]:.1f} | {other['channel_std'][channel]:.1f} |"
                    if other
                    else " | |"
                )
            lines.append(row)
    lines += _look_lines(splits, reference)
    lines += ["", "## Source images (before any resize)", "", "| split | sizes | converted to RGB |", "|---|---|---|"]
    for split_name, split in splits.items():
        sizes = ", ".join(f"{size}: {count:,}" for size, count in list(split["source_sizes"].items())[:5])
        converted = ", ".join(f"{kind}: {count:,}" for kind, count in split.get("converted_to_rgb", {}).items())
        lines.append(f"| {split_name} | {sizes} | {converted or 'none'} |")
    lines += ["", "## Duplicates", "", "| images of | found in | with a near-duplicate | exact pairs | near pairs |",
              "|---|---|---|---|---|"]  # fmt: skip
    for comparison in statistics["duplicates"]:
        lines.append(
            f"| {comparison['split']} | {comparison['other']} | {comparison['images_with_near_duplicate']:,} | "
            f"{comparison['exact_duplicate_pairs']:,} | {comparison['near_duplicate_pairs']:,} |"
        )
    leaking_pairs = [
        pair
        for comparison in statistics["duplicates"]
        if comparison["other"] == "train" and comparison["split"] != "train"
        for pair in comparison.get("pairs", [])[:10]
    ]
    if leaking_pairs:
        lines += ["", "Leaking pairs (most similar first):", ""]
        lines += [f"- `{pair['id']}` ~ `{pair['other_id']}` ({pair['similarity']:.3f})" for pair in leaking_pairs]
    method = statistics.get("method", {})
    lines += [
        "",
        f"Near-duplicates: {method.get('descriptor', '')}, cosine >= {method.get('near_duplicate_threshold')}.",
    ]
    return "\n".join(lines) + "\n"


LOOK = (("brightness", "brightness (mean luminance)", ".1f"), ("contrast", "contrast (luminance spread at 8x8)", ".1f"),
        ("saturation", "saturation (distance from grey per unit of contrast)", ".3f"),
        ("detail", "fine detail (per unit of contrast)", ".3f"))  # fmt: skip


def _look_lines(splits: dict, reference: dict | None) -> list[str]:
    """How the images look, per split: each measure's mean over the images (and its spread), beside the
    reference's; nothing for statistics written before these were recorded."""
    if not any("per_image" in split for split in splits.values()):
        return []
    header = "| split | measure | mean | spread |" + (" reference mean |" if reference else "")
    lines = ["", "## How the images look", "", header, "|---|---|---|---|" + ("---|" if reference else "")]
    for split_name, split in splits.items():
        measures = split.get("per_image")
        if not measures:
            continue
        other = ((reference or {}).get("splits", {}).get(split_name) or {}).get("per_image")
        for name, words, style in LOOK:
            row = f"| {split_name} | {words} | {measures[name]['mean']:{style}} | {measures[name]['std']:{style}} |"
            if reference:
                row += f" {other[name]['mean']:{style}} |" if other else " not recorded |"
            lines.append(row)
    return lines
