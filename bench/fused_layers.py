"""The project's fused batch norm and GELU against Keras's own layers, in the same process run: a preset's bare
step (forward, backward and the recipe's update on one fixed batch) and its training loop, with
`FusedBatchNormalization`, `Gelu` and `BatchNormGelu` (components/common/model.py) and then with
keras.layers.BatchNormalization and Activation("gelu") in their places, in alternating order, per precision; prints
the speed-up.

    .venv/bin/python bench/fused_layers.py [--preset cifar10_speedrun] [--precisions float32 mixed_bfloat16]
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
import sys
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
REPOSITORY = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPOSITORY))

from bench import step_profile  # noqa: E402
from bench.accuracy import full_training_set  # noqa: E402


def keras_gelu(name: str):
    import keras

    return keras.layers.Activation("gelu", name=name)


def keras_batch_norm_gelu(name: str, **batch_norm):
    import keras

    return keras.Sequential([keras.layers.BatchNormalization(**batch_norm), keras.layers.Activation("gelu")], name=name)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="cifar10_speedrun")
    parser.add_argument("--precisions", nargs="+", default=["float32", "mixed_bfloat16"])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--parts", nargs="+", default=["recipe step", "loop"], choices=step_profile.PARTS)
    arguments = parser.parse_args()

    import keras

    from components.common import model
    from components.common.config import config_from_mapping
    from components.train.config import TrainConfig

    sides = {
        "fused": (model.FusedBatchNormalization, model.Gelu, model.BatchNormGelu),
        "keras": (keras.layers.BatchNormalization, keras_gelu, keras_batch_norm_gelu),
    }
    data = full_training_set()
    base = config_from_mapping(TrainConfig, {"data": data, "model_dir": "unused", "preset": arguments.preset}, "bench")
    for precision in arguments.precisions:
        config = dataclasses.replace(base, precision=precision)
        seconds: dict[tuple[str, str], list[float]] = {}
        try:
            for round_number in range(1, arguments.rounds + 1):
                order = list(sides) if round_number % 2 else list(reversed(sides))
                for side in order:
                    model.FusedBatchNormalization, model.Gelu, model.BatchNormGelu = sides[side]
                    for part in arguments.parts:
                        measured = step_profile.measure(config, part, window_steps=3, windows=2)
                        seconds.setdefault((side, part), []).append(measured)
                        print(f"{precision} round {round_number}: {side} layers, {part}: "
                              f"{config.batch_size / measured:.0f} images/s", flush=True)  # fmt: skip
        finally:
            model.FusedBatchNormalization, model.Gelu, model.BatchNormGelu = sides["fused"]
        for part in arguments.parts:
            fused = statistics.median(seconds[("fused", part)])
            plain = statistics.median(seconds[("keras", part)])
            print(f"{arguments.preset} {precision} {part}: fused layers {config.batch_size / fused:.0f} images/s, "
                  f"Keras's {config.batch_size / plain:.0f}: {plain / fused:.2f}x ({arguments.rounds} rounds)",
                  flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
