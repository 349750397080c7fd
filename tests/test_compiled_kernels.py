"""The compiled AVX512-BF16 kernel gradient (components/common/compiled_kernels.py): the same gradient as TensorFlow's,
its refusals, where it is taken, and what happens where it cannot be built or run."""

from __future__ import annotations

import logging
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

from components.common import compiled_kernels
from tests.builders import REPOSITORY

RUNS_HERE = compiled_kernels.cpu_problem(compiled_kernels.cpu_flags()) is None
needs_the_cpu = pytest.mark.skipif(not RUNS_HERE, reason="the compiled kernel needs AVX512-BF16 without AMX")


def reference_gradient(inputs, upstream, kernel_size):
    """TensorFlow's kernel gradient of the same bfloat16 values, in float32."""
    rows, columns = kernel_size
    return tf.raw_ops.Conv2DBackpropFilter(
        input=tf.cast(inputs, tf.float32), filter_sizes=[rows, columns, inputs.shape[-1], upstream.shape[-1]],
        out_backprop=tf.cast(upstream, tf.float32), strides=[1, 1, 1, 1], padding="SAME",
    ).numpy()  # fmt: skip


@needs_the_cpu
@pytest.mark.parametrize(
    ("batch", "height", "width", "in_channels", "out_channels", "kernel_size"),
    [(3, 5, 7, 24, 64, (3, 3)),  # an odd number of pixels: the last pair straddles nothing
     (2, 7, 7, 256, 32, (3, 3)),  # in channels of many tiles
     (5, 3, 3, 64, 96, (3, 3)),  # images smaller than a tile's run of pixels
     (1, 1, 1, 8, 32, (3, 3)),  # one pixel: every tap but the centre outside
     (4, 15, 15, 6, 64, (3, 3)),  # in channels fewer than a register tile
     (2, 6, 9, 12, 32, (3, 5)),  # a wider kernel than tall
     (2, 4, 4, 16, 32, (7, 7))],  # a kernel larger than the image
)  # fmt: skip
def test_the_compiled_kernel_gradient_is_tensorflows(batch, height, width, in_channels, out_channels, kernel_size):
    """Every tap, at the image's edges and corners, across images in the batch: the products are exact in float32,
    so only the order of the sums differs from TensorFlow's."""
    inputs = tf.cast(tf.random.stateless_normal([batch, height, width, in_channels], seed=[1, 2]), tf.bfloat16)
    upstream = tf.cast(tf.random.stateless_normal([batch, height, width, out_channels], seed=[3, 4]), tf.bfloat16)
    gradient = compiled_kernels.kernel_gradient_op()(inputs, upstream, kernel_size=list(kernel_size))
    expected = reference_gradient(inputs, upstream, kernel_size)
    assert gradient.dtype == tf.float32 and gradient.shape == expected.shape
    np.testing.assert_allclose(gradient.numpy(), expected, rtol=1e-5, atol=1e-5 * np.abs(expected).max())


@needs_the_cpu
def test_the_compiled_kernel_gradient_is_the_same_every_time():
    """The threads' shares are fixed, so the float32 sums, and the training, are the same from call to call to the
    last bit (taken as they came, they were not)."""
    inputs = tf.cast(tf.random.stateless_normal([96, 7, 7, 64], seed=[9, 10]), tf.bfloat16)
    upstream = tf.cast(tf.random.stateless_normal([96, 7, 7, 64], seed=[11, 12]), tf.bfloat16)
    operation = compiled_kernels.kernel_gradient_op()
    first = operation(inputs, upstream, kernel_size=[3, 3]).numpy()
    for _ in range(20):
        assert np.array_equal(operation(inputs, upstream, kernel_size=[3, 3]).numpy(), first)


@needs_the_cpu
def test_the_compiled_kernel_gradient_is_the_same_traced_and_for_an_unknown_batch():
    inputs = tf.cast(tf.random.stateless_normal([9, 5, 5, 16], seed=[5, 6]), tf.bfloat16)
    upstream = tf.cast(tf.random.stateless_normal([9, 5, 5, 32], seed=[7, 8]), tf.bfloat16)
    operation = compiled_kernels.kernel_gradient_op()
    traced = tf.function(
        lambda images, gradients: operation(images, gradients, kernel_size=[3, 3]),
        input_signature=[tf.TensorSpec([None, 5, 5, 16], tf.bfloat16), tf.TensorSpec([None, 5, 5, 32], tf.bfloat16)],
    )
    expected = reference_gradient(inputs, upstream, (3, 3))
    np.testing.assert_allclose(traced(inputs, upstream).numpy(), expected, rtol=1e-5, atol=1e-5 * abs(expected).max())


@needs_the_cpu
@pytest.mark.parametrize(
    ("input_shape", "upstream_shape", "kernel_size", "message"),
    [([2, 5, 5, 8], [2, 5, 5, 48], [3, 3], "multiple of 32, got 48"),
     ([2, 5, 5, 8], [2, 5, 4, 32], [3, 3], "upstream must have the input's images, height and width"),
     ([2, 5, 5, 8], [2, 5, 5, 32], [2, 3], "kernel_size must be two odd numbers"),
     ([2, 5, 8], [2, 5, 5, 32], [3, 3], "must be 4-D")],
)  # fmt: skip
def test_the_compiled_kernel_gradient_refuses_what_it_cannot_take(input_shape, upstream_shape, kernel_size, message):
    operation = compiled_kernels.kernel_gradient_op()
    with pytest.raises((tf.errors.InvalidArgumentError, ValueError), match=message):
        operation(tf.zeros(input_shape, tf.bfloat16), tf.zeros(upstream_shape, tf.bfloat16), kernel_size=kernel_size)


@pytest.mark.parametrize(
    ("flags", "problem"),
    [({"avx512f", "avx512bw", "avx512_bf16"}, None),
     ({"avx512f", "avx512bw", "avx512_bf16", "amx_bf16", "amx_tile"}, "AMX"),
     ({"avx512f", "avx512bw"}, "lacks avx512_bf16"),
     (set(), "lacks avx512_bf16, avx512bw, avx512f")],
)  # fmt: skip
def test_the_kernel_is_for_avx512_bf16_cpus_without_amx(flags, problem):
    found = compiled_kernels.cpu_problem(frozenset(flags))
    assert found is None if problem is None else problem in found


def test_a_missing_compiler_is_named_and_training_takes_tensorflows_gradient(tmp_path, monkeypatch, caplog):
    """No compiler: make install's build says why and succeeds (exit 0); the first bfloat16 step logs the reason
    once and takes TensorFlow's kernel gradient."""
    monkeypatch.setenv("CXX", "no-such-compiler")
    with pytest.raises(compiled_kernels.BuildError, match="no C\\+\\+ compiler 'no-such-compiler'"):
        compiled_kernels.build(tmp_path)
    assert list(tmp_path.iterdir()) == []

    monkeypatch.setattr(compiled_kernels, "BUILT_BESIDE_SOURCE", tmp_path / "beside")
    monkeypatch.setattr(compiled_kernels, "cpu_flags", lambda: frozenset({"avx512f", "avx512bw", "avx512_bf16"}))
    compiled_kernels.kernel_gradient_op.cache_clear()
    try:
        with caplog.at_level(logging.WARNING):
            assert compiled_kernels.kernel_gradient_op() is None
        assert "kernel gradient is TensorFlow's, slower: no C++ compiler 'no-such-compiler'" in caplog.text
    finally:
        compiled_kernels.kernel_gradient_op.cache_clear()

    done = subprocess.run(
        [sys.executable, "-m", "components.common.compiled_kernels"], cwd=REPOSITORY, capture_output=True,
        text=True, env={**_environment(), "CXX": "no-such-compiler"}, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "compiled kernel not built, training will take TensorFlow's kernels: no C++ compiler" in done.stderr


def test_a_compiler_error_is_reported_with_its_last_lines(tmp_path, monkeypatch):
    broken = tmp_path / "kernel_gradient.cc"
    broken.write_text("this is not C++;\n")
    monkeypatch.setattr(compiled_kernels, "SOURCE", broken)
    with pytest.raises(compiled_kernels.BuildError, match=r"could not build kernel_gradient.cc \(exit 1\): .*error"):
        compiled_kernels.build(tmp_path / "out")
    assert [path.name for path in (tmp_path / "out").iterdir()] == []  # no partial library left


@needs_the_cpu
def test_a_build_into_the_cache_is_loaded_and_named_by_its_source_and_tensorflow(tmp_path, monkeypatch):
    """Where make install's library is absent, the first use builds it into the user's cache; a changed source
    gets another name, so a library of older code is never loaded."""
    program = (  # a process of its own: TensorFlow registers an op once per process, from the first library
        "import sys; from pathlib import Path; from components.common import compiled_kernels as kernels; "
        "kernels.BUILT_BESIDE_SOURCE = Path(sys.argv[1]); print(kernels.kernel_gradient_op() is not None)"
    )
    done = subprocess.run(
        [sys.executable, "-c", program, str(tmp_path / "beside")], cwd=REPOSITORY, capture_output=True, text=True,
        env=_environment(), check=True,
    )  # fmt: skip
    assert done.stdout.split()[-1] == "True"
    assert not (tmp_path / "beside").exists()
    built = list(compiled_kernels.cache_directory().iterdir())
    assert [path.name for path in built] == [compiled_kernels.library_name()]
    changed = tmp_path / "kernel_gradient.cc"
    changed.write_text(compiled_kernels.SOURCE.read_text() + "\n// changed\n")
    monkeypatch.setattr(compiled_kernels, "SOURCE", changed)
    assert compiled_kernels.library_name() != built[0].name


def _environment() -> dict[str, str]:
    import os

    return {name: value for name, value in os.environ.items() if name != "TF_NUM_INTEROP_THREADS"}


@pytest.mark.parametrize("precision", ["mixed_bfloat16", "float32"])
def test_training_in_bfloat16_runs_one_op_at_a_time_where_the_kernel_runs(precision):
    """The training process sets TensorFlow's inter-op threads to 1 before its first op, in bfloat16 where the
    compiled kernel runs; float32, another CPU, or TF_NUM_INTEROP_THREADS given: TensorFlow's default (0)."""
    program = (
        "import sys; from components.common.compiled_kernels import settle_op_threads; "
        "settle_op_threads(sys.argv[1]); import tensorflow as tf; "
        "print(tf.config.threading.get_inter_op_parallelism_threads())"
    )
    outputs = []
    for extra in ({}, {"TF_NUM_INTEROP_THREADS": "2"}):
        done = subprocess.run(
            [sys.executable, "-c", program, precision], cwd=REPOSITORY, capture_output=True, text=True,
            env={**_environment(), **extra}, check=True,
        )  # fmt: skip
        outputs.append(done.stdout.split()[-1])
    expected = "1" if precision == "mixed_bfloat16" and RUNS_HERE else "0"
    assert outputs == [expected, "0"]
