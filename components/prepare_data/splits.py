"""Assigning examples to the train / validation / eval splits, and shuffling them, reproducibly."""

from __future__ import annotations

import logging

import numpy as np

from components.prepare_data.sources import RawDataset, RawSplit

logger = logging.getLogger(__name__)

DEFAULT_VALIDATION_FRACTION = 0.2  # the share of data batch 5 in the official training data


def stratified_holdout(labels: np.ndarray, fraction: float, seed: int) -> np.ndarray:
    """A bool mask choosing round(fraction x count) examples of every class, the same for the same seed."""
    mask = np.zeros(len(labels), bool)
    for label in np.unique(labels):
        members = np.flatnonzero(labels == label)
        chosen = np.random.default_rng([seed, int(label)]).permutation(members)[: round(fraction * len(members))]
        mask[chosen] = True
    return mask


def assign_splits(raw: RawDataset, validation_fraction: float | None, seed: int, shuffle: bool) -> dict[str, RawSplit]:
    """train / validation / eval. The validation split is, in order of preference: a stratified sample of
    `validation_fraction` when given (0 means none), the source's own hold-out, or a stratified 20%."""
    if validation_fraction is None and raw.holdout is not None:
        holdout = raw.holdout
    else:
        fraction = DEFAULT_VALIDATION_FRACTION if validation_fraction is None else validation_fraction
        holdout = stratified_holdout(raw.train.labels, fraction, seed)
    indices = {"train": np.flatnonzero(~holdout), "validation": np.flatnonzero(holdout)}
    if not indices["validation"].size:
        del indices["validation"]
    pools = {"train": raw.train, "validation": raw.train, "eval": raw.eval}
    indices["eval"] = np.arange(len(raw.eval))
    splits = {}
    for stream, (name, chosen) in enumerate(sorted(indices.items())):
        if shuffle:  # one gather per split: choosing and shuffling in a single copy
            chosen = chosen[np.random.default_rng([seed, 1000 + stream]).permutation(len(chosen))]
        splits[name] = pools[name].take(chosen)
    for name, split in splits.items():
        logger.info("split %s: %d examples", name, len(split))
    return splits
