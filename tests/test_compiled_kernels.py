"""The compiled AVX512-BF16 kernels (components/common/compiled_kernels.py): the kernel gradient, the same as
TensorFlow's; the batch norm + GELU, the same as the two layers; their refusals, where they are taken, and what
happens where they cannot be built or run."""

from __future__ import annotations

import logging
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

from components.common import compiled_kernels
from tests.builders import REPOSITORY

HERE = compiled_kernels.choose(compiled_kernels.cpu_flags(), "auto")
RUNS_HERE = HERE.batch_norm_gelu
KERNEL_GRADIENT_HERE = HERE.kernel_gradient  # under auto: not on a CPU with AMX
needs_the_cpu = pytest.mark.skipif(
    not RUNS_HERE, reason=f"the compiled kernels need AVX512-BF16 (avx512f, avx512bw, avx512_bf16): {HERE.reason}"
)


@pytest.fixture
def every_compiled_op(monkeypatch):
    """CIFAR10_PIPELINE_COMPILED_KERNELS=on: the kernel gradient on a CPU with AMX too (its numbers are checked
    everywhere they can run)."""
    monkeypatch.setenv(compiled_kernels.MODE_VARIABLE, "on")
    compiled_kernels.forget()
    yield
    compiled_kernels.forget()


def reference_gradient(inputs, upstream, kernel_size):
    """TensorFlow's kernel gradient of the same bfloat16 values, in float32."""
    rows, columns = kernel_size
    return tf.raw_ops.Conv2DBackpropFilter(
        input=tf.cast(inputs, tf.float32), filter_sizes=[rows, columns, inputs.shape[-1], upstream.shape[-1]],
        out_backprop=tf.cast(upstream, tf.float32), strides=[1, 1, 1, 1], padding="SAME",
    ).numpy()  # fmt: skip


@needs_the_cpu
@pytest.mark.usefixtures("every_compiled_op")
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
@pytest.mark.usefixtures("every_compiled_op")
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
@pytest.mark.usefixtures("every_compiled_op")
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
@pytest.mark.usefixtures("every_compiled_op")
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
     ({"avx512f", "avx512bw", "avx512_bf16", "amx_bf16", "amx_tile"}, None),
     ({"avx512f", "avx512bw"}, "lacks avx512_bf16"),
     (set(), "lacks avx512_bf16, avx512bw, avx512f")],
)  # fmt: skip
def test_the_kernels_are_for_avx512_bf16_cpus(flags, problem):
    found = compiled_kernels.cpu_problem(frozenset(flags))
    assert found is None if problem is None else problem in found


@pytest.mark.parametrize(
    ("flags", "chosen", "taken"),
    [({"avx512_bf16"}, "auto", True),
     ({"avx512_bf16", "amx_bf16", "amx_tile"}, "auto", False),  # oneDNN's convolutions run on the tiles there
     ({"avx512_bf16", "amx_bf16", "amx_tile"}, "on", True)],
)  # fmt: skip
def test_the_compiled_kernel_gradient_gives_way_to_amx_unless_asked_for(flags, chosen, taken):
    problem = compiled_kernels.kernel_gradient_problem(frozenset(flags), chosen)
    assert (problem is None) is taken
    if not taken:
        assert "AMX" in problem and "CIFAR10_PIPELINE_COMPILED_KERNELS=on" in problem


@pytest.mark.parametrize(
    ("environment", "chosen"),
    [({}, "auto"), *(({"CIFAR10_PIPELINE_COMPILED_KERNELS": m}, m) for m in ("auto", "on", "off"))],
)
def test_the_kernels_mode_is_read_from_the_environment(environment, chosen):
    assert compiled_kernels.mode(environment) == chosen


@pytest.mark.parametrize("value", ["", "ON", "1", "true", " off"])
def test_a_bad_kernels_mode_is_named_with_its_variable(value):
    with pytest.raises(ValueError, match=f"^CIFAR10_PIPELINE_COMPILED_KERNELS: {value!r} is not one of auto, on, off$"):
        compiled_kernels.mode({"CIFAR10_PIPELINE_COMPILED_KERNELS": value})


def test_a_bad_kernels_mode_stops_training_before_it_starts(tmp_path):
    """`python -m components.train` with a bad CIFAR10_PIPELINE_COMPILED_KERNELS: one line naming it, exit 2, nothing
    written."""
    done = subprocess.run(
        [sys.executable, "-m", "components.train", "--data", str(tmp_path / "data"), "--model-dir",
         str(tmp_path / "model")], cwd=REPOSITORY, capture_output=True, text=True,
        env={**_environment(), "CIFAR10_PIPELINE_COMPILED_KERNELS": "yes"}, check=False,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert (
        "CIFAR10_PIPELINE_COMPILED_KERNELS: 'yes' is not one of auto, on, off" in done.stderr.strip().splitlines()[-1]
    )
    assert list(tmp_path.iterdir()) == []


@needs_the_cpu
def test_each_mode_takes_the_ops_it_says_on_this_cpu_and_on_one_with_amx(monkeypatch, caplog):
    """auto: both ops (the kernel gradient not on a CPU with AMX); on: both, AMX or not; off: neither, said once."""
    flags = compiled_kernels.cpu_flags()
    cases = [("auto", flags, True, True), ("auto", flags | {"amx_bf16", "amx_tile"}, False, True),
             ("on", flags | {"amx_bf16", "amx_tile"}, True, True), ("off", flags, False, False)]  # fmt: skip
    if not KERNEL_GRADIENT_HERE:  # this CPU has AMX itself
        cases = cases[1:]
    try:
        for chosen, cpu, kernel_gradient, batch_norm_gelu in cases:
            monkeypatch.setenv("CIFAR10_PIPELINE_COMPILED_KERNELS", chosen)
            monkeypatch.setattr(compiled_kernels, "cpu_flags", lambda cpu=cpu: cpu)
            compiled_kernels.forget()
            caplog.clear()
            with caplog.at_level(logging.INFO, logger=compiled_kernels.__name__):
                assert (compiled_kernels.kernel_gradient_op() is not None) is kernel_gradient, chosen
                assert (compiled_kernels.batch_norm_gelu_ops() is not None) is batch_norm_gelu, chosen
                compiled_kernels.kernel_gradient_op()
            said = [record.getMessage() for record in caplog.records]
            assert len(said) == 1, said  # once, however often asked
            if chosen == "off":
                assert "TensorFlow's: CIFAR10_PIPELINE_COMPILED_KERNELS=off" in said[0]
            elif not kernel_gradient:
                assert "the kernel gradient is oneDNN's: the CPU has AMX tile units" in said[0]
    finally:
        compiled_kernels.forget()


def test_a_missing_compiler_is_named_and_training_takes_tensorflows_gradient(tmp_path, monkeypatch, caplog):
    """No compiler: make install's build says why and succeeds (exit 0); the first bfloat16 step logs the reason
    once and takes TensorFlow's kernel gradient."""
    monkeypatch.setenv("CXX", "no-such-compiler")
    with pytest.raises(compiled_kernels.BuildError, match="no C\\+\\+ compiler 'no-such-compiler'"):
        compiled_kernels.build(tmp_path)
    assert list(tmp_path.iterdir()) == []

    monkeypatch.setattr(compiled_kernels, "BUILT_BESIDE_SOURCE", tmp_path / "beside")
    monkeypatch.setattr(compiled_kernels, "cpu_flags", lambda: frozenset({"avx512f", "avx512bw", "avx512_bf16"}))
    compiled_kernels.forget()
    try:
        with caplog.at_level(logging.WARNING):
            assert compiled_kernels.kernel_gradient_op() is None
            assert compiled_kernels.batch_norm_gelu_ops() is None
        assert "batch norms and GELUs are TensorFlow's, slower: no C++ compiler 'no-such-compiler'" in caplog.text
        assert caplog.text.count("no-such-compiler") == 1  # said once
    finally:
        compiled_kernels.forget()

    done = subprocess.run(
        [sys.executable, "-m", "components.common.compiled_kernels"], cwd=REPOSITORY, capture_output=True,
        text=True, env={**_environment(), "CXX": "no-such-compiler"}, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "compiled kernels not built, training will take TensorFlow's kernels: no C++ compiler" in done.stderr


def test_a_compiler_error_is_reported_with_its_last_lines(tmp_path, monkeypatch):
    broken = tmp_path / "batch_norm_gelu.cc"
    broken.write_text("this is not C++;\n")
    monkeypatch.setattr(compiled_kernels, "SOURCES", (compiled_kernels.SOURCES[0], broken))
    with pytest.raises(
        compiled_kernels.BuildError, match=r"could not build kernel_gradient.cc, batch_norm_gelu.cc \(exit 1\): .*error"
    ):
        compiled_kernels.build(tmp_path / "out")
    assert [path.name for path in (tmp_path / "out").iterdir()] == []  # no partial library left


@needs_the_cpu
def test_a_build_into_the_cache_is_loaded_and_named_by_its_source_and_tensorflow(tmp_path, monkeypatch):
    """Where make install's library is absent, the first use builds it into the user's cache and loads both ops
    from it (mode on: whichever ops auto takes on this CPU, with AMX or without); a changed source gets another
    name, so a library of older code is never loaded."""
    program = (  # a process of its own: TensorFlow registers an op once per process, from the first library
        "import sys; from pathlib import Path; from components.common import compiled_kernels as kernels; "
        "kernels.BUILT_BESIDE_SOURCE = Path(sys.argv[1]); "
        "print(kernels.kernel_gradient_op() is not None, kernels.batch_norm_gelu_ops() is not None)"
    )
    done = subprocess.run(
        [sys.executable, "-c", program, str(tmp_path / "beside")], cwd=REPOSITORY, capture_output=True, text=True,
        env={**_environment(), compiled_kernels.MODE_VARIABLE: "on"}, check=True,
    )  # fmt: skip
    assert done.stdout.split()[-2:] == ["True", "True"], done.stderr
    assert not (tmp_path / "beside").exists()
    built = list(compiled_kernels.cache_directory().iterdir())
    assert [path.name for path in built] == [compiled_kernels.library_name()]
    for index, source in enumerate(compiled_kernels.SOURCES):  # either source changed: another library
        changed = tmp_path / source.name
        changed.write_text(source.read_text() + "\n// changed\n")
        sources = list(compiled_kernels.SOURCES)
        sources[index] = changed
        monkeypatch.setattr(compiled_kernels, "SOURCES", tuple(sources))
        assert compiled_kernels.library_name() != built[0].name
        monkeypatch.undo()


def reference_batch_norm_gelu(inputs, upstream, scale, offset, epsilon):
    """The batch norm (statistics of the batch, biased variance) and exact GELU in float64 from the same bfloat16
    values: outputs, the gradients to the inputs, scale and offset, the batch mean and variance."""
    x = tf.cast(inputs, tf.float64)
    scale, offset = tf.cast(scale, tf.float64), tf.cast(offset, tf.float64)
    axes = list(range(len(inputs.shape) - 1))
    with tf.GradientTape() as tape:
        tape.watch([x, scale, offset])
        mean, variance = tf.nn.moments(x, axes)
        normalized = (x - mean) / tf.sqrt(variance + epsilon) * scale + offset
        outputs = normalized * 0.5 * (1 + tf.math.erf(normalized / np.sqrt(2)))
    gradients = tape.gradient(outputs, [x, scale, offset], output_gradients=tf.cast(upstream, tf.float64))
    return outputs.numpy(), [gradient.numpy() for gradient in gradients], mean.numpy(), variance.numpy()


@needs_the_cpu
@pytest.mark.parametrize(
    "shape",
    [(16, 15, 15, 64),  # the fast preset's first stage, a smaller batch
     (12, 7, 7, 256),  # its second
     (3, 5, 4, 40),  # channels not a multiple of 16: the tail of a register
     (1, 1, 1, 8),  # one pixel: the variance is 0
     (700, 3, 3, 32)],  # more pixels than a thread's run, unevenly split
)  # fmt: skip
def test_the_compiled_batch_norm_gelu_is_the_batch_norm_and_gelu(shape):
    """Forward: the float64 result rounded once to bfloat16 (where the two layers round twice); the statistics to
    float32's precision. Backward: the GELU's gradient is rounded to bfloat16, as the separate GELU's is, so the
    input gradient is within a few bfloat16 steps of the float64 one."""
    channels = shape[-1]
    inputs = tf.cast(tf.random.stateless_normal(shape, seed=[1, 2]) * 2 + 0.7, tf.bfloat16)
    upstream = tf.cast(tf.random.stateless_normal(shape, seed=[3, 4]), tf.bfloat16)
    scale = tf.random.stateless_uniform([channels], seed=[5, 6], minval=0.5, maxval=1.5)
    offset = tf.random.stateless_normal([channels], seed=[7, 8]) * 0.3
    epsilon = 1e-5
    forward, backward = compiled_kernels.batch_norm_gelu_ops()
    outputs, mean, variance = forward(inputs, scale, offset, epsilon=epsilon)
    input_gradient, scale_gradient, offset_gradient = backward(
        inputs, upstream, mean, variance, scale, offset, epsilon=epsilon
    )
    expected, (expected_input, expected_scale, expected_offset), expected_mean, expected_variance = (
        reference_batch_norm_gelu(inputs, upstream, scale, offset, epsilon)
    )
    assert outputs.dtype == input_gradient.dtype == tf.bfloat16 and outputs.shape == input_gradient.shape == shape
    np.testing.assert_allclose(mean, expected_mean, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(variance, expected_variance, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(tf.cast(outputs, tf.float32), expected, rtol=2**-8, atol=1e-6)
    largest = np.abs(expected_input).max()
    np.testing.assert_allclose(tf.cast(input_gradient, tf.float32), expected_input, rtol=0, atol=4 * 2**-8 * largest)
    for gradient, reference in ((scale_gradient, expected_scale), (offset_gradient, expected_offset)):
        # sums of the bfloat16-rounded GELU gradient: within its rounding, summed over the pixels
        pixels = np.prod(shape[:-1])
        np.testing.assert_allclose(
            gradient, reference, rtol=0, atol=2**-8 * np.sqrt(pixels) * (1 + np.abs(reference).max() / pixels)
        )


@needs_the_cpu
def test_the_compiled_batch_norm_gelu_is_the_same_every_time():
    """Each thread sums fixed pixels, added in a fixed order: the same to the last bit on every call."""
    inputs = tf.cast(tf.random.stateless_normal([96, 7, 7, 64], seed=[9, 10]), tf.bfloat16)
    upstream = tf.cast(tf.random.stateless_normal([96, 7, 7, 64], seed=[11, 12]), tf.bfloat16)
    ones, zeros = tf.ones([64]), tf.zeros([64])
    forward, backward = compiled_kernels.batch_norm_gelu_ops()

    def both():
        outputs, mean, variance = forward(inputs, ones, zeros, epsilon=1e-5)
        gradients = backward(inputs, upstream, mean, variance, ones, zeros, epsilon=1e-5)
        return [value.numpy() for value in (outputs, mean, variance, *gradients)]

    first = both()
    for _ in range(10):
        for value, expected in zip(both(), first, strict=True):
            assert np.array_equal(value, expected)


@needs_the_cpu
@pytest.mark.parametrize(
    ("shape", "channels", "message"),
    [([4, 3, 3, 8], 6, "one value per channel"),
     ([0, 3, 3, 8], 8, "must have pixels"),
     ([8], 8, "channels last")],
)  # fmt: skip
def test_the_compiled_batch_norm_gelu_refuses_what_it_cannot_take(shape, channels, message):
    forward, _ = compiled_kernels.batch_norm_gelu_ops()
    with pytest.raises((tf.errors.InvalidArgumentError, ValueError), match=message):
        forward(tf.zeros(shape, tf.bfloat16), tf.ones([channels]), tf.zeros([channels]), epsilon=1e-5)


@needs_the_cpu
@pytest.mark.parametrize("scale", [False, True])
def test_the_batch_norm_gelu_layer_trains_as_the_two_layers_and_infers_with_tensorflows_ops(scale):
    """`BatchNormGelu` in bfloat16 training takes the compiled ops and matches `FusedBatchNormalization` then
    `Gelu` (outputs, gradients, moving statistics); inference, and so the exported model, is TensorFlow's ops."""
    import keras

    from components.common.model import BatchNormGelu, FusedBatchNormalization, Gelu

    inputs = tf.cast(tf.random.stateless_normal((8, 6, 6, 48), seed=(1, 2)) * 3 + 1, tf.bfloat16)
    fused = BatchNormGelu(momentum=0.6, epsilon=1e-5, scale=scale, dtype="mixed_bfloat16")
    separate = FusedBatchNormalization(momentum=0.6, epsilon=1e-5, scale=scale, dtype="mixed_bfloat16")
    gelu = Gelu(dtype="mixed_bfloat16")
    for layer in (fused, separate):
        layer.build(inputs.shape)
    fused.set_weights([weight + 0.1 * number for number, weight in enumerate(fused.get_weights())])
    separate.set_weights(fused.get_weights())
    weights = np.linspace(-1, 1, 48, dtype=np.float32)

    def trained(apply, layer):
        step = tf.function(lambda images: apply(images, training=True))
        with tf.GradientTape() as tape:
            tape.watch(inputs)
            outputs = step(inputs)
            loss = tf.reduce_sum(tf.cast(outputs, tf.float32) * weights)
        graph = step.get_concrete_function(inputs).graph.as_graph_def()
        operations = {node.op for function in graph.library.function for node in function.node_def}
        operations |= {node.op for node in graph.node}
        return outputs, tape.gradient(loss, [inputs, *layer.trainable_weights]), layer.get_weights(), operations

    outputs, gradients, moving, operations = trained(fused, fused)
    outputs_s, gradients_s, moving_s, _ = trained(
        lambda images, training: gelu(separate(images, training=training), training=training), separate
    )
    assert "BatchNormGeluBf16" in operations
    np.testing.assert_allclose(tf.cast(outputs, tf.float32), tf.cast(outputs_s, tf.float32), rtol=2**-7, atol=2**-7)
    for gradient, gradient_s in zip(gradients, gradients_s, strict=True):
        gradient, gradient_s = (np.asarray(tf.cast(value, tf.float32)) for value in (gradient, gradient_s))
        np.testing.assert_allclose(gradient, gradient_s, rtol=0, atol=0.02 * np.abs(gradient_s).max())
    for weight, weight_s in zip(moving, moving_s, strict=True):
        np.testing.assert_allclose(weight, weight_s, rtol=1e-5, atol=1e-6)

    inference = tf.function(lambda images: fused(images, training=False))
    inferred = inference(inputs)
    graph = inference.get_concrete_function(inputs).graph.as_graph_def()
    assert not any("Bf16" in node.op for node in graph.node)
    expected = keras.activations.gelu(tf.cast(separate(inputs, training=False), tf.float32), approximate=False)
    np.testing.assert_allclose(tf.cast(inferred, tf.float32), expected, rtol=2**-7, atol=2**-7)
    assert BatchNormGelu.from_config(fused.get_config()).get_config() == fused.get_config()


@needs_the_cpu
@pytest.mark.parametrize(("chosen", "compiled"), [("auto", True), ("off", False)])
def test_the_airbench_network_trains_on_the_ops_its_mode_says(monkeypatch, chosen, compiled):
    """The airbench network's bfloat16 training graph: the compiled batch norm + GELU (and, without AMX, kernel
    gradient) ops under auto, none of them under off."""
    import keras

    from components.common.model import ModelSpec, build_model

    monkeypatch.setenv("CIFAR10_PIPELINE_COMPILED_KERNELS", chosen)
    compiled_kernels.forget()
    keras.mixed_precision.set_global_policy("mixed_bfloat16")
    try:
        model = build_model(ModelSpec(family="airbench", width_multiplier=0.5))
        images = tf.zeros((2, 32, 32, 3))

        @tf.function
        def step(images):
            with tf.GradientTape() as tape:
                loss = tf.reduce_sum(tf.cast(model(images, training=True), tf.float32))
            return tape.gradient(loss, model.trainable_variables)

        graph = step.get_concrete_function(images).graph.as_graph_def()
    finally:
        keras.mixed_precision.set_global_policy("float32")
        compiled_kernels.forget()
    operations = {node.op for function in graph.library.function for node in function.node_def}
    operations |= {node.op for node in graph.node}
    expected = {"BatchNormGeluBf16", "BatchNormGeluGradBf16"} | (
        {"KernelGradientBf16"} if KERNEL_GRADIENT_HERE else set()
    )
    assert (operations & expected == expected) if compiled else not any("Bf16" in name for name in operations)


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
    expected = "1" if precision == "mixed_bfloat16" and KERNEL_GRADIENT_HERE else "0"
    assert outputs == [expected, "0"]


def test_the_training_image_copies_every_kernel_source_it_builds():
    """The image's build layer copies the sources before `python -m components.common.compiled_kernels`: a source
    added to SOURCES and not copied would fail the image's build."""
    dockerfile = (REPOSITORY / "images" / "Dockerfile").read_text()
    copied = {source for line in dockerfile.splitlines() if line.startswith("COPY ") for source in line.split()[1:-1]}
    for source in compiled_kernels.SOURCES:
        assert str(source.relative_to(REPOSITORY)) in copied
