"""The same convolutions as bench/convolutions.py, in PyTorch's oneDNN (the reference's library): what a newer
oneDNN build reaches on this CPU for each pass, as a ceiling for the project's own.

Runs under a Python that has PyTorch (`make bench-reference-setup`: bench/work/reference-venv). For each of the
preset's stride-1 'same' 3x3 convolutions (cifar10_speedrun's by default, at its batch 1536; bench/convolutions.py
prints the same list), in bfloat16, channels last (PyTorch's fastest layout for them on a CPU) and channels first:
forward, input gradient and kernel gradient, each as GFLOP/s and as a share of the peak measured in the same run
(the best of bfloat16 matrix products of 2048 and 4096 squares and the forward passes timed).

    bench/work/reference-venv/bin/python bench/reference_convolutions.py [--batch 1536] [--rounds 3]
"""

from __future__ import annotations

import argparse
import statistics
import time

# cifar10_speedrun's stride-1 'same' 3x3 convolutions, each shape once (7x7 is two of its layers): (image side,
# in-channels, out-channels)
CONVOLUTIONS = ((31, 24, 64), (15, 64, 64), (15, 64, 256), (7, 256, 256), (3, 256, 256))
PASSES = ("forward", "input gradient", "kernel gradient")


def seconds(function, rounds: int) -> float:
    """Median wall-clock seconds of `function` over `rounds` calls after one warm-up call."""
    function()
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        function()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def matrix_peak(rounds: int) -> float:
    """The best bfloat16 matrix product FLOP/s of 2048 and 4096 squares."""
    import torch

    best = 0.0
    for size in (2048, 4096):
        left, right = (torch.randn(size, size).to(torch.bfloat16) for _ in range(2))
        best = max(best, 2 * size**3 / seconds(lambda left=left, right=right: left @ right, rounds))
    return best


def convolution_passes(batch: int, side: int, in_channels: int, out_channels: int, channels_last: bool) -> dict:
    """The three passes of one convolution as callables."""
    import torch

    layout = torch.channels_last if channels_last else torch.contiguous_format

    def tensor(*shape, scale=1.0):
        return (torch.randn(*shape) * scale).to(torch.bfloat16).contiguous(memory_format=layout)

    inputs = tensor(batch, in_channels, side, side)
    kernel = tensor(out_channels, in_channels, 3, 3, scale=0.05)
    upstream = tensor(batch, out_channels, side, side)

    def backward(which):
        return torch.ops.aten.convolution_backward(
            upstream, inputs, kernel, None, [1, 1], [1, 1], [1, 1], False, [0, 0], 1, which
        )

    return {
        "forward": lambda: torch.nn.functional.conv2d(inputs, kernel, padding=1),
        "input gradient": lambda: backward([True, False, False]),
        "kernel gradient": lambda: backward([False, True, False]),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=1536)
    parser.add_argument("--rounds", type=int, default=3)
    arguments = parser.parse_args()

    import torch

    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, bfloat16, batch {arguments.batch}")
    rates = {}
    with torch.no_grad():
        for layout in ("channels last", "channels first"):
            for side, in_channels, out_channels in CONVOLUTIONS:
                passes = convolution_passes(arguments.batch, side, in_channels, out_channels, layout == "channels last")
                work = 2 * arguments.batch * side * side * in_channels * out_channels * 9
                for name, function in passes.items():
                    rates[layout, side, in_channels, out_channels, name] = work / seconds(function, arguments.rounds)
        peak = max(matrix_peak(arguments.rounds), *(rate for key, rate in rates.items() if key[-1] == "forward"))
    print(f"peak {peak / 1e9:.0f} GFLOP/s (the best of the matrix products and the forward passes)")
    print("| layout | image, channels | " + " | ".join(f"{name} GFLOP/s (of peak)" for name in PASSES) + " |")
    print("|---|---|" + "---|" * len(PASSES))
    for layout in ("channels last", "channels first"):
        for side, in_channels, out_channels in CONVOLUTIONS:
            cells = " | ".join(
                f"{rate / 1e9:.0f} ({rate / peak:.0%})"
                for rate in (rates[layout, side, in_channels, out_channels, name] for name in PASSES)
            )
            print(f"| {layout} | {side}x{side}, {in_channels}->{out_channels} | {cells} |", flush=True)


if __name__ == "__main__":
    main()
