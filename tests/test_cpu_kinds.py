"""Every choice the project makes from the CPU's features, for each kind of CPU it runs on, without that CPU: the
flags come from one reader (compiled_kernels.cpu_flags), and each choice is a function of them."""

from __future__ import annotations

import pytest

from components.common import compiled_kernels
from components.train import precision

# The flags lines of /proc/cpuinfo on each kind (the features the project looks at, among their neighbours).
CPU_KINDS = {
    "AMD EPYC with AVX512-BF16, no AMX (Zen 4)": (
        "fpu sse4_1 sse4_2 avx f16c fma avx2 avx512f avx512dq avx512ifma avx512cd avx512bw avx512vl avx512_bf16 "
        "avx512vbmi avx512_vnni avx512_bitalg avx512_vpopcntdq"
    ),
    "Intel Xeon with AMX (Sapphire Rapids)": (
        "fpu sse4_1 sse4_2 avx f16c fma avx2 avx512f avx512dq avx512ifma avx512cd avx512bw avx512vl avx_vnni "
        "avx512_bf16 avx512vbmi avx512_vnni avx512_bitalg avx512_vpopcntdq amx_bf16 avx512_fp16 amx_tile amx_int8"
    ),
    "AVX2 only (Intel Haswell, AMD Zen 2)": "fpu sse4_1 sse4_2 avx f16c fma avx2",
    "Intel Xeon with AVX-512, no BF16 (Cascade Lake)": (
        "fpu sse4_1 sse4_2 avx f16c fma avx2 avx512f avx512dq avx512cd avx512bw avx512vl avx512_vnni"
    ),
}

# kind: (precision auto, compiled batch norm + GELU, compiled kernel gradient, inter-op threads in bfloat16), under
# CIFAR10_PIPELINE_COMPILED_KERNELS=auto.
EXPECTED_UNDER_AUTO = {
    "AMD EPYC with AVX512-BF16, no AMX (Zen 4)": ("mixed_bfloat16", True, True, 1),
    "Intel Xeon with AMX (Sapphire Rapids)": ("mixed_bfloat16", True, False, None),
    "AVX2 only (Intel Haswell, AMD Zen 2)": ("float32", False, False, None),
    "Intel Xeon with AVX-512, no BF16 (Cascade Lake)": ("float32", False, False, None),
}


def flags_of(kind: str, tmp_path) -> frozenset[str]:
    """The flags as the project reads them, from a /proc/cpuinfo of that kind (two processors, as the kernel
    writes it)."""
    cpuinfo = tmp_path / "cpuinfo"
    processor = f"processor\t: {{}}\nvendor_id\t: X\nmodel name\t: {kind}\nflags\t\t: {CPU_KINDS[kind]}\n\n"
    cpuinfo.write_text(processor.format(0) + processor.format(1))
    return compiled_kernels.cpu_flags(cpuinfo)


@pytest.mark.parametrize("kind", CPU_KINDS)
def test_each_cpu_kind_gets_its_precision_kernels_and_op_threads(kind, tmp_path):
    flags = flags_of(kind, tmp_path)
    policy, batch_norm_gelu, kernel_gradient, threads = EXPECTED_UNDER_AUTO[kind]
    assert ("mixed_bfloat16" if precision.bfloat16_unit([], flags) else "float32") == policy
    choice = compiled_kernels.choose(flags, "auto")
    assert (choice.batch_norm_gelu, choice.kernel_gradient) == (batch_norm_gelu, kernel_gradient)
    assert (choice.reason is None) is (batch_norm_gelu and kernel_gradient)
    assert compiled_kernels.inter_op_threads(policy, choice.kernel_gradient, 0, {}) == threads
    # the kernels are never taken where precision auto would not train in bfloat16
    assert not batch_norm_gelu or policy == "mixed_bfloat16"


@pytest.mark.parametrize("kind", CPU_KINDS)
def test_each_cpu_kind_says_why_it_does_without_a_kernel(kind, tmp_path):
    flags = flags_of(kind, tmp_path)
    choice = compiled_kernels.choose(flags, "auto")
    if not choice.batch_norm_gelu:
        assert choice.reason.startswith("the CPU lacks ") and "avx512_bf16" in choice.reason
    elif not choice.kernel_gradient:
        assert "AMX tile units" in choice.reason and "CIFAR10_PIPELINE_COMPILED_KERNELS=on" in choice.reason


@pytest.mark.parametrize("kind", CPU_KINDS)
def test_on_takes_both_kernels_wherever_they_can_run_and_off_takes_none(kind, tmp_path):
    flags = flags_of(kind, tmp_path)
    runs = compiled_kernels.cpu_problem(flags) is None
    on = compiled_kernels.choose(flags, "on")
    assert (on.batch_norm_gelu, on.kernel_gradient) == (runs, runs)
    assert compiled_kernels.inter_op_threads("mixed_bfloat16", on.kernel_gradient, 0, {}) == (1 if runs else None)
    off = compiled_kernels.choose(flags, "off")
    assert (off.batch_norm_gelu, off.kernel_gradient, off.reason) == (
        False, False, "CIFAR10_PIPELINE_COMPILED_KERNELS=off"
    )  # fmt: skip


def test_op_threads_stay_tensorflows_in_float32_on_a_gpu_or_when_given():
    assert compiled_kernels.inter_op_threads("mixed_bfloat16", True, 0, {}) == 1
    assert compiled_kernels.inter_op_threads("float32", True, 0, {}) is None
    assert compiled_kernels.inter_op_threads("mixed_float16", True, 0, {}) is None
    assert compiled_kernels.inter_op_threads("mixed_bfloat16", True, 1, {}) is None
    assert compiled_kernels.inter_op_threads("mixed_bfloat16", True, 0, {"TF_NUM_INTEROP_THREADS": "2"}) is None


# The kernels numpy and its OpenBLAS take on each kind, chosen here by their own variables (the kernels whose
# rounding depends on a product's shape): OpenBLAS's core type and the SIMD levels numpy may dispatch to.
NUMERIC_KERNELS = {
    "AMD EPYC with AVX512-BF16, no AMX (Zen 4)": ({"OPENBLAS_CORETYPE": "Zen"}, "avx2"),
    "Intel Xeon with AMX (Sapphire Rapids)": ({"OPENBLAS_CORETYPE": "SapphireRapids"}, "avx512f"),
    "AVX2 only (Intel Haswell, AMD Zen 2)": (
        {"OPENBLAS_CORETYPE": "Haswell", "NPY_DISABLE_CPU_FEATURES": "X86_V4 AVX512_ICL AVX512_SPR"},
        "avx2",
    ),
    "Intel Xeon with AVX-512, no BF16 (Cascade Lake)": (
        {"OPENBLAS_CORETYPE": "SkylakeX", "NPY_DISABLE_CPU_FEATURES": "AVX512_ICL AVX512_SPR"},
        "avx512f",
    ),
}
# Each side's split, described whole and in three parts (as one process and a fan-out's workers add shards), then
# the digest of every statistic a dataset publishes from them.
STATISTICS_SCRIPT = """
import hashlib, json
import numpy as np
from components.prepare_data import statistics

def described(side, parts):
    rng = np.random.default_rng(side)
    images = rng.integers(0, 256, size=(500, side, side, 3), dtype=np.uint8)
    images[250:260] = images[0:10] // 2 + 60  # near-duplicates of the first ten
    labels = rng.integers(0, 4, size=500)
    merged = statistics.SplitStatistics(4)
    for start, end in parts:
        shard = statistics.SplitStatistics(4)
        shard.add(images[start:end], labels[start:end], [str(i) for i in range(start, end)],
                  np.tile([side, side], (end - start, 1)), None)
        merged.merge(statistics.SplitStatistics.from_bytes(shard.to_bytes(), "a shard"))
    features = merged.descriptors().astype(np.float32)
    pairs = statistics.near_duplicate_pairs(features)
    values = {"descriptors": features, "pairs": np.asarray(pairs, dtype=object).astype(str),
              "digests": np.concatenate(merged.digests)}
    for name in ("channel_sum", "channel_square_sum", "class_pixel_sum", "channel_histogram",
                 "saturation_histogram", "detail_histogram", "class_counts"):
        values[name] = getattr(merged, name)
    return {name: hashlib.sha256(np.ascontiguousarray(value).tobytes()).hexdigest() for name, value in values.items()}

print(json.dumps({side: {"whole": described(side, [(0, 500)]),
                         "parts": described(side, [(0, 100), (100, 356), (356, 500)])} for side in (32, 40, 64)}))
"""


def statistics_under(kind: str) -> dict:
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    variables, _needs = NUMERIC_KERNELS[kind]
    environment = {**os.environ, **variables}
    environment.pop("OPENBLAS_L2_SIZE", None)  # set with a core type of the machine's own (env's README)
    done = subprocess.run([sys.executable, "-c", STATISTICS_SCRIPT], capture_output=True, text=True, timeout=300,
                          env=environment, cwd=Path(__file__).resolve().parents[1])  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.splitlines()[-1])


@pytest.mark.slow
def test_the_published_statistics_are_the_same_bits_whole_or_in_parts_on_every_cpu_kind():
    flags = compiled_kernels.cpu_flags()
    runnable = [kind for kind, (_variables, needs) in NUMERIC_KERNELS.items() if needs in flags]
    assert runnable, "this CPU runs none of the kinds' kernels"
    results = {kind: statistics_under(kind) for kind in runnable}
    for kind, by_side in results.items():
        for side, described in by_side.items():
            differing = [name for name in described["whole"] if described["whole"][name] != described["parts"][name]]
            assert differing == [], (kind, side, differing)
    first = next(iter(results.values()))
    for kind, by_side in results.items():  # the same bits on every kind, too
        assert by_side == first, kind
