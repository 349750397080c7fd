"""On paper: what synchronous multi-worker training costs in communication, for the project's two networks.

Each step, MultiWorkerMirroredStrategy sums every worker's gradients with one all-reduce after the backward pass
(the custom loop's `apply_gradients`: nothing overlaps it). A ring all-reduce of S bytes over N workers sends
2 (N - 1) / N x S bytes from each worker and takes 2 (N - 1) latency-bound hops, so a step's communication takes

    T_comm = 2 (N - 1) / N x S / bandwidth + 2 (N - 1) x hop

The gradient bytes S are counted from the networks themselves (float32 gradients, as the strategy sums them); the
single-GPU step time is airbench94's published one (Jordan 2024: 3.83 s for 9.9 epochs of 50,000 images at batch
1024 on an A100, 483 steps: 7.9 ms a step); ResNet-20's has no published figure, so it is bounded below by its
arithmetic (41 million multiply-adds an image forward, three times that to train) at 25 TFLOP/s, a V100's practical
float16 rate (an optimistic bound, so its efficiencies are pessimistic). Efficiency with the per-worker batch kept
(weak scaling: each worker's step takes the single-GPU time) is T_step / (T_step + T_comm).

    .venv/bin/python bench/allreduce_cost.py [--hop-microseconds 25]
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

WORKERS = (2, 4, 8, 16, 32)
LINKS_GBIT = (10, 25, 100)
AIRBENCH_STEP_SECONDS = 3.83 / (9.9 * 50_000 / 1024)  # published: Jordan 2024, an A100, batch 1024
RESNET20_STEP_SECONDS = 3 * 41e6 * 2 * 128 / 25e12  # a lower bound: batch 128 at 25 TFLOP/s


def gradient_bytes(family: str) -> tuple[int, int]:
    """(float32 gradient bytes, gradient tensors) of the network the train stage builds for `family`."""
    from components.common.model import ModelSpec, build_model

    variables = build_model(ModelSpec(family=family)).trainable_variables
    return sum(4 * int(variable.shape.num_elements()) for variable in variables), len(variables)


def ring_seconds(size_bytes: int, workers: int, gigabits: float, hop_seconds: float) -> float:
    return 2 * (workers - 1) / workers * size_bytes / (gigabits * 1e9 / 8) + 2 * (workers - 1) * hop_seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hop-microseconds", type=float, default=25.0, help="latency of one ring hop (TCP: 10-50)")
    arguments = parser.parse_args()
    hop = arguments.hop_microseconds * 1e-6
    for family, label, step in (("resnet", "ResNet-20, batch 128", RESNET20_STEP_SECONDS),
                                ("airbench", "airbench94, batch 1024", AIRBENCH_STEP_SECONDS)):  # fmt: skip
        size, tensors = gradient_bytes(family)
        print(
            f"{label}: {size / 1e6:.2f} MB of gradients in {tensors} tensors a step; one GPU's step {step * 1e3:.1f} ms"
        )
        print("  workers | " + " | ".join(f"{link} Gb/s: all-reduce ms, efficiency" for link in LINKS_GBIT))
        for workers in WORKERS:
            cells = []
            for link in LINKS_GBIT:
                seconds = ring_seconds(size, workers, link, hop)
                cells.append(f"{seconds * 1e3:6.2f} ms, {step / (step + seconds):4.0%}")
            print(f"  {workers:7d} | " + " | ".join(cells))


if __name__ == "__main__":
    main()
