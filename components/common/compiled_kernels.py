"""The project's own compiled kernels, TensorFlow ops built against the installed TensorFlow by the system's C++
compiler into one library, for bfloat16 training on a CPU:
- the kernel gradient of a stride-1 'same' convolution, with AVX512-BF16 dot products (kernels/kernel_gradient.cc):
  630-861 GFLOP/s on the fast preset's layers where TensorFlow's (oneDNN's) runs at 250-598 on the same CPU
  (bench/convolutions.py);
- a batch norm and the GELU after it as one op forward and one backward (kernels/batch_norm_gelu.cc): 9 passes over
  the activations where the separate ops take 13.

`make install` builds it (`python -m components.common.compiled_kernels`) next to its sources, in kernels/.build/;
the training image builds it there too. Where that was not done, the first training step that wants it builds it
into the user's cache (a few seconds). Where it cannot be built or loaded (no compiler, another TensorFlow), or the
CPU lacks AVX512-BF16, training takes TensorFlow's kernels, as before, and says why once. On a CPU with AMX, whose
tile units oneDNN's convolutions use, the kernel gradient is oneDNN's (the compiled one has not been measured
against it there); the batch norm + GELU, memory-bound work the tile units do not do, is the compiled op.

The environment variable CIFAR10_PIPELINE_COMPILED_KERNELS chooses: `auto` (the default, as above), `off` (TensorFlow's
kernels everywhere: to rule the compiled ones out, or to time them against TensorFlow's) or `on` (both ops on a CPU
with AMX too, to measure them there; a CPU without AVX512-BF16 cannot run them at all).

    python -m components.common.compiled_kernels    # build it now; prints where, or why not
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import logging
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Mapping
from pathlib import Path

logger = logging.getLogger(__name__)

KERNELS = Path(__file__).with_name("kernels")
SOURCES = (KERNELS / "kernel_gradient.cc", KERNELS / "batch_norm_gelu.cc")
BUILT_BESIDE_SOURCE = KERNELS / ".build"  # make install's and the image's; hidden: no part of an image tag
NEEDED_CPU_FLAGS = frozenset({"avx512f", "avx512bw", "avx512_bf16"})
TILE_UNIT_FLAG = "amx_bf16"  # oneDNN's convolutions run on AMX tiles there; the kernel gradient's is not measured there
MODE_VARIABLE = "CIFAR10_PIPELINE_COMPILED_KERNELS"
MODES = ("auto", "on", "off")
COMPILE_SECONDS = 300


class BuildError(RuntimeError):
    """The compiler is missing or refused the source (the message says which, with its last lines)."""


def cpu_flags(cpuinfo: Path = Path("/proc/cpuinfo")) -> frozenset[str]:
    """The CPU's feature flags (Linux), empty where they cannot be read."""
    try:
        text = cpuinfo.read_text(errors="replace")  # reader: the kernel's cpu feature list
    except OSError:
        return frozenset()
    for line in text.splitlines():
        if line.startswith("flags"):
            return frozenset(line.partition(":")[2].split())
    return frozenset()


def mode(environment: Mapping[str, str] = os.environ) -> str:
    """CIFAR10_PIPELINE_COMPILED_KERNELS: auto (unset), on or off. Raises ValueError naming the variable and the
    value."""
    value = environment.get(MODE_VARIABLE, "auto")
    if value not in MODES:
        raise ValueError(f"{MODE_VARIABLE}: {value!r} is not one of {', '.join(MODES)}")
    return value


def cpu_problem(flags: frozenset[str]) -> str | None:
    """Why this CPU cannot run the kernels, or None when it can."""
    missing = sorted(NEEDED_CPU_FLAGS - flags)
    if missing:
        return f"the CPU lacks {', '.join(missing)}"
    return None


def kernel_gradient_problem(flags: frozenset[str], chosen: str) -> str | None:
    """Why the compiled kernel gradient is not taken on a CPU that runs the library, or None when it is."""
    if TILE_UNIT_FLAG in flags and chosen == "auto":
        return (
            f"the CPU has AMX tile units, which oneDNN's convolutions use ({MODE_VARIABLE}=on takes the compiled one)"
        )
    return None


@dataclasses.dataclass(frozen=True)
class KernelChoice:
    """What the compiled kernels do on a CPU with these flags in this mode, decided before the library is built or
    loaded (a library that then cannot be built or loaded takes neither, and says why)."""

    batch_norm_gelu: bool
    kernel_gradient: bool
    reason: str | None  # why not both, None when both are taken


def choose(flags: frozenset[str], chosen: str) -> KernelChoice:
    """The ops the library gives on a CPU with `flags` under mode `chosen` (auto, on or off)."""
    if chosen == "off":
        return KernelChoice(False, False, f"{MODE_VARIABLE}=off")
    if problem := cpu_problem(flags):
        return KernelChoice(False, False, problem)
    problem = kernel_gradient_problem(flags, chosen)
    return KernelChoice(True, problem is None, problem)


def inter_op_threads(precision: str, kernel_gradient: bool, gpus: int, environment: Mapping[str, str]) -> int | None:
    """TensorFlow's inter-op threads for training in `precision`: 1 (one op at a time) in bfloat16 on a CPU that
    takes the compiled kernel gradient, TF_NUM_INTEROP_THREADS not given; None (TensorFlow's own choice)
    elsewhere."""
    if precision != "mixed_bfloat16" or environment.get("TF_NUM_INTEROP_THREADS") or gpus:
        return None
    return 1 if kernel_gradient else None


def _compile_flags() -> list[str]:
    import tensorflow as tf

    return ["-shared", "-fPIC", "-O3", "-w", *tf.sysconfig.get_compile_flags(), *tf.sysconfig.get_link_flags()]


def library_name() -> str:
    """The library's file name, keyed on the sources and the TensorFlow it is built against (a library built
    against another TensorFlow, or older sources, is never loaded)."""
    import tensorflow as tf

    digest = hashlib.sha256()
    for source in SOURCES:
        digest.update(source.name.encode() + b"\0" + source.read_bytes())  # reader: the project's own kernel source
    digest.update(f"\0{tf.__version__}\0{tf.__git_version__}\0{' '.join(_compile_flags())}".encode())
    return f"kernels-{digest.hexdigest()[:16]}.so"


def cache_directory() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "cifar10-pipeline" / "kernels"


def build(directory: Path) -> Path:
    """Compile the kernels into one library in `directory` (written under a temporary name, then renamed: a library
    there is whole, whoever else builds it at the same time). Raises BuildError."""
    compiler = os.environ.get("CXX") or "g++"
    if not shutil.which(compiler):
        raise BuildError(f"no C++ compiler {compiler!r} on the PATH (set CXX to another)")
    directory.mkdir(parents=True, exist_ok=True)
    target = directory / library_name()
    descriptor, partial = tempfile.mkstemp(prefix=".partial-", suffix=".so", dir=directory)
    os.close(descriptor)
    try:
        command = [compiler, *map(str, SOURCES), "-o", partial, *_compile_flags()]
        result = subprocess.run(command, capture_output=True, text=True, timeout=COMPILE_SECONDS, check=False)
        if result.returncode != 0:
            last_lines = " | ".join(result.stderr.strip().splitlines()[-3:])
            names = ", ".join(source.name for source in SOURCES)
            raise BuildError(f"{compiler} could not build {names} (exit {result.returncode}): {last_lines}")
        os.chmod(partial, 0o755)  # readable by every user (an image builds it as root, runs it as another)
        os.replace(partial, target)
    finally:
        Path(partial).unlink(missing_ok=True)
    return target


def _library() -> Path:
    """The built library: make install's, else the cache's, else built into the cache now."""
    name = library_name()
    for directory in (BUILT_BESIDE_SOURCE, cache_directory()):
        if (directory / name).is_file():
            return directory / name
    logger.info("building the compiled kernels into %s (once for this TensorFlow)", cache_directory())
    return build(cache_directory())


@functools.cache
def _choice() -> KernelChoice:
    return choose(cpu_flags(), mode())


@functools.cache
def _operations():
    """The library's ops (a module of Python wrappers), or None where they are turned off or this CPU or this
    installation cannot run them (logged once, with the reason)."""
    choice = _choice()
    if not choice.batch_norm_gelu:
        logger.info("the convolutions' kernel gradient, batch norms and GELUs are TensorFlow's: %s", choice.reason)
        return None
    import tensorflow as tf

    try:
        operations = tf.load_op_library(str(_library()))
    except (BuildError, OSError, subprocess.SubprocessError, tf.errors.OpError) as error:
        logger.warning("the convolutions' kernel gradient, batch norms and GELUs are TensorFlow's, slower: %s", error)
        return None
    if choice.kernel_gradient:
        logger.info("the convolutions' kernel gradient, batch norms and GELUs are the compiled AVX512-BF16 ones")
    else:
        logger.info(
            "batch norms and GELUs are the compiled AVX512-BF16 ones; the kernel gradient is oneDNN's: %s",
            choice.reason,
        )
    return operations


@functools.cache
def kernel_gradient_op():
    """The op `KernelGradientBf16(input, upstream, kernel_size) -> float32 gradient`, or None where it is not
    taken."""
    operations = _operations()
    if operations is None or not _choice().kernel_gradient:
        return None
    return operations.kernel_gradient_bf16


def forget() -> None:
    """Choose again at the next call (after CIFAR10_PIPELINE_COMPILED_KERNELS changed: a benchmark timing both ways)."""
    _choice.cache_clear()
    _operations.cache_clear()
    kernel_gradient_op.cache_clear()


def batch_norm_gelu_ops():
    """The ops `BatchNormGeluBf16(x, scale, offset, epsilon) -> (y, mean, variance)` and
    `BatchNormGeluGradBf16(x, upstream, mean, variance, scale, offset, epsilon) -> (x, scale, offset gradients)`,
    or None where they cannot run."""
    operations = _operations()
    return None if operations is None else (operations.batch_norm_gelu_bf16, operations.batch_norm_gelu_grad_bf16)


def one_op_at_a_time(precision: str) -> bool:
    """Whether training in `precision` runs TensorFlow's ops one at a time (settle_op_threads): bfloat16 on a CPU
    that takes the compiled kernel gradient, TF_NUM_INTEROP_THREADS not given."""
    import tensorflow as tf

    if precision != "mixed_bfloat16":  # the kernels are not even looked at
        return False
    gpus = len(tf.config.list_physical_devices("GPU"))
    return inter_op_threads(precision, kernel_gradient_op() is not None, gpus, os.environ) == 1


def settle_op_threads(precision: str) -> None:
    """Training in bfloat16 on a CPU that runs the compiled kernels: TensorFlow runs one op at a time (inter-op
    threads 1), each on all its threads, unless TF_NUM_INTEROP_THREADS says otherwise. Two ops side by side each
    split over the same cores, and the kernel gradient, side by side with the next layer's input gradient, runs
    slower than both in turn (the fast preset's gradients step in bfloat16: 1,415-1,444 ms in turn, 1,458-1,506 side
    by side; docs/benchmarks.md). Call it before TensorFlow runs its first op; it is too late after, and says so."""
    import tensorflow as tf

    if not one_op_at_a_time(precision):
        return
    try:
        tf.config.threading.set_inter_op_parallelism_threads(1)
    except RuntimeError as error:  # TensorFlow's runtime already started
        logger.warning("TensorFlow's ops stay side by side, the compiled kernel gradient slower: %s", error)
        return
    logger.info("TensorFlow runs one op at a time, each on every core (the compiled kernel gradient's best)")


def main() -> int:
    """Build the kernels beside their sources (make install). A machine that cannot is told why and goes on: the
    training then takes TensorFlow's kernels."""
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        target = build(BUILT_BESIDE_SOURCE)
    except (BuildError, OSError, subprocess.SubprocessError) as error:
        print(f"compiled kernels not built, training will take TensorFlow's kernels: {error}", file=sys.stderr)
        return 0
    choice = choose(cpu_flags(), "auto")
    if not choice.batch_norm_gelu:
        note = f" (not used on this machine: {choice.reason})"
    elif not choice.kernel_gradient:
        note = f" (the kernel gradient not used on this machine: {choice.reason})"
    else:
        note = ""
    print(f"compiled kernels built: {target}{note}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
