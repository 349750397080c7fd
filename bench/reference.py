"""The PyTorch reference, airbench94_muon.py as published, run on this CPU on the same images as the project.

Runs under a Python that has PyTorch (not the project's: `make bench-reference-setup` makes bench/work/reference-venv
with the CPU build of torch). The reference script itself is not part of this repository: place the published file
(github.com/KellerJordan/cifar10-airbench, airbench94_muon.py) at bench/work/airbench94_muon.py or pass --script.

The script is imported, not edited, and its own `main(run, model)` trains and evaluates; what this harness changes
is only what a GPU script needs to run on a CPU:
- CUDA calls: `.cuda()` leaves tensors and modules where they are, `torch.load` reads onto the CPU, and
  `torch.cuda.Event` / `synchronize` become wall-clock marks (the script's own timer: each start/stop pair it
  records is kept, so its timed seconds are what it would print on a GPU);
- `.half()`, which the script calls for its network and images, converts to `--precision` instead (float16 runs
  slowly on most CPUs; bfloat16 is what the CPU's matrix units take);
- torchvision (whose PyPI build does not load beside the CPU torch here) is stood in for by the two names the
  script uses: `datasets.CIFAR10` reads the official archive (bench/prepare_data.py's, built from ../shared/data)
  and `transforms.Normalize` subtracts and divides per channel.
Before the measured runs, one warm-up run of a few steps (the script's own warm-up trains a whole run on random
labels) compiles what `torch.compile` compiles. Each run's seed is set with `torch.manual_seed`.

    bench/work/reference-venv/bin/python bench/reference.py --runs 1 [--precision bfloat16] [--no-compile]

Prints one JSON line per run: test accuracy (the script's 6-view test-time augmentation), the script's timed
seconds, and of those the training epochs' seconds and images/s.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import os
import pickle
import sys
import tarfile
import time
import types
from pathlib import Path
from typing import ClassVar

REPOSITORY = Path(__file__).resolve().parents[1]
WORK = REPOSITORY / "bench" / "work"
CLASSES = ("airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck")


def archive_split(archive: Path, train: bool):
    """(images [N, 32, 32, 3] uint8, labels) of one split of the official CIFAR-10 python archive."""
    import numpy as np

    names = [f"data_batch_{number}" for number in range(1, 6)] if train else ["test_batch"]
    images, labels = [], []
    with tarfile.open(archive) as members:
        for name in names:
            member = members.extractfile(f"cifar-10-batches-py/{name}")
            batch = pickle.load(member, encoding="bytes")  # the official archive's own format
            images.append(np.asarray(batch[b"data"], np.uint8).reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1))
            labels.extend(int(label) for label in batch[b"labels"])
    return np.concatenate(images), labels


def torchvision_stand_in(archive: Path) -> types.ModuleType:
    """The two torchvision names the script uses, over the local archive."""
    import torch

    class CIFAR10:
        def __init__(self, root, download=False, train=True):
            Path(root).mkdir(parents=True, exist_ok=True)  # as torchvision's download does
            self.data, self.targets = archive_split(archive, train)
            self.classes = list(CLASSES)

    class Normalize:
        def __init__(self, mean, std):
            self.mean = torch.as_tensor(mean).view(-1, 1, 1)
            self.std = torch.as_tensor(std).view(-1, 1, 1)

        def __call__(self, images):
            return (images - self.mean.to(images.dtype)) / self.std.to(images.dtype)

    torchvision = types.ModuleType("torchvision")
    torchvision.datasets = types.SimpleNamespace(CIFAR10=CIFAR10)
    torchvision.transforms = types.ModuleType("torchvision.transforms")
    torchvision.transforms.Normalize = Normalize
    return torchvision


class WallClockEvent:
    """torch.cuda.Event's timing interface on the wall clock; every interval a stop closes is kept."""

    intervals: ClassVar[list[float]] = []

    def __init__(self, enable_timing=True):
        self.moment = None

    def record(self):
        self.moment = time.perf_counter()

    def elapsed_time(self, end: WallClockEvent) -> float:
        WallClockEvent.intervals.append(end.moment - self.moment)
        return 1000 * (end.moment - self.moment)


def run_on_cpu(precision: str, compile_: bool) -> None:
    """Point the script's GPU calls at the CPU (see the module docstring)."""
    import torch

    dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[precision]
    torch.Tensor.cuda = lambda self, *args, **kwargs: self
    torch.nn.Module.cuda = lambda self, *args, **kwargs: self
    torch.Tensor.half = lambda self, *args, **kwargs: self.to(dtype)
    torch.nn.Module.half = lambda self: self.to(dtype)
    torch.cuda.Event = WallClockEvent
    torch.cuda.synchronize = lambda *args, **kwargs: None
    load = torch.load
    torch.load = lambda path, map_location=None, **kwargs: load(path, map_location="cpu", **kwargs)
    if not compile_:
        torch.compile = lambda function=None, **kwargs: function if function is not None else (lambda f: f)
        torch.nn.Module.compile = lambda self, *args, **kwargs: None


def load_script(script: Path, archive: Path) -> types.ModuleType:
    sys.modules["torchvision"] = torchvision_stand_in(archive)
    sys.modules["torchvision.transforms"] = sys.modules["torchvision"].transforms
    sys.argv[0] = str(script)  # the script reads its own source through sys.argv[0]
    spec = importlib.util.spec_from_file_location("airbench94_muon", script)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # defines; its __main__ block (200 runs) does not run
    return module


@contextlib.contextmanager
def short_run(module: types.ModuleType, steps: int):
    """The script's run lengths (ceil(epochs x batches)) cut to `steps`: a warm-up that compiles everything."""
    original = module.ceil
    module.ceil = lambda value: min(original(value), steps)
    try:
        yield
    finally:
        module.ceil = original


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--script", type=Path, default=WORK / "airbench94_muon.py")
    parser.add_argument("--archive", type=Path, default=WORK / "cifar-10-python.tar.gz")
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--first-seed", type=int, default=1)
    parser.add_argument("--precision", default="bfloat16", choices=("float32", "bfloat16", "float16"))
    parser.add_argument("--compile", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument("--warmup-steps", type=int, default=3)
    arguments = parser.parse_args()
    for path, what in ((arguments.script, "the published airbench94_muon.py"), (arguments.archive, "the archive")):
        if not path.is_file():
            sys.exit(f"{path}: no such file ({what}; see bench/reference.py's docstring)")

    import torch

    run_on_cpu(arguments.precision, arguments.compile)
    scratch = WORK / "reference-run"
    scratch.mkdir(parents=True, exist_ok=True)
    os.chdir(scratch)  # the script keeps its tensors of the images in ./cifar10
    module = load_script(arguments.script, arguments.archive)
    model = module.CifarNet().cuda().to(memory_format=torch.channels_last)
    model.compile(mode="max-autotune")
    started = time.perf_counter()
    with short_run(module, arguments.warmup_steps):
        module.main("warmup", model)
    print(f"warm-up ({arguments.warmup_steps} steps, compiling): {time.perf_counter() - started:.0f} s", flush=True)
    epochs, batch = 8, 2000  # the script's
    for seed in range(arguments.first_seed, arguments.first_seed + arguments.runs):
        torch.manual_seed(seed)
        WallClockEvent.intervals = []
        accuracy = module.main(seed, model)
        training = sum(WallClockEvent.intervals[1:-1])  # between the whitening and the test-time augmentation
        steps = epochs * (50_000 // batch)
        print(json.dumps({
            "reference": "airbench94_muon.py", "precision": arguments.precision, "compiled": arguments.compile,
            "seed": seed, "epochs": epochs, "accuracy": round(float(accuracy), 4),
            "timed_seconds": round(sum(WallClockEvent.intervals), 1), "train_seconds": round(training, 1),
            "images_per_second": round(steps * batch / training), "threads": torch.get_num_threads(),
        }), flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
