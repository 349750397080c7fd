"""Small pure pieces of the train stage: TF_CONFIG validation, schedules, gradient processing, the model."""

from __future__ import annotations

import json

import numpy as np
import pytest
import tensorflow as tf

from components.common.model import ModelSpec, build_resnet
from components.train import distribution, optimization
from components.train.config import TrainConfig
from components.train.launcher import choose_launcher


def tf_config(workers=2, task_type="worker", index=0):
    workers = [f"127.0.0.1:{2222 + i}" for i in range(workers)]
    return json.dumps({"cluster": {"worker": workers}, "task": {"type": task_type, "index": index}})


class TestTfConfig:
    def test_a_valid_cluster(self):
        cluster = distribution.parse_tf_config(tf_config(3, index=1), expected_workers=3)
        assert cluster.size == 3 and cluster.name == "worker-1" and not cluster.is_chief
        assert distribution.parse_tf_config(tf_config(3, index=0), 3).is_chief

    def test_the_tfjob_shape_with_environment_is_accepted(self):
        text = json.dumps({**json.loads(tf_config(2)), "environment": "cloud"})
        assert distribution.parse_tf_config(text, 2).size == 2

    @pytest.mark.parametrize(
        ("text", "problem"),
        [
            ("{not json", "not valid JSON"),
            ("[1, 2]", "expected a JSON object, got a list"),
            ('{"cluster": ' * 40 + "{}" + "}" * 40, "nested 41 levels deep"),
            ('{"cluster": {"worker": ["127.0.0.1:1"]}, "task": {"type": "worker", "index": 1e999}}', "not a finite"),
            (json.dumps({"task": {"type": "worker", "index": 0}}), "no 'cluster' object"),
            (json.dumps({"cluster": {"worker": ["nohostport"]}, "task": {"type": "worker", "index": 0}}), "host:port"),
            (json.dumps({"cluster": {"worker": ["a:1", "b:1"]}}), "no 'task' object"),
            (tf_config(2, index=2), r"task index 2 is out of range"),
            (tf_config(2, task_type="chief"), r"task type 'chief' is not in the cluster"),
            (json.dumps({"cluster": {"ps": ["a:1"], "worker": ["b:1"]}, "task": {"type": "worker", "index": 0}}), "ps"),
            (
                json.dumps({"cluster": {"worker": ["a:1", "a:1"]}, "task": {"type": "worker", "index": 0}}),
                r"lists a:1 more than once",
            ),
            (
                json.dumps({"cluster": {"chief": ["a:1"], "worker": ["a:1"]}, "task": {"type": "chief", "index": 0}}),
                r"lists a:1 more than once",
            ),
            (
                json.dumps({"cluster": {"worker": ["a:1", "b:1"]}, "task": {"type": "worker", "index": True}}),
                r"task index True is out of range",
            ),
        ],
    )
    def test_malformed_tf_config_is_a_clear_error(self, text, problem):
        with pytest.raises(distribution.ClusterError, match=problem):
            distribution.parse_tf_config(text, expected_workers=2)

    def test_a_cluster_of_another_size_than_asked_is_refused(self):
        with pytest.raises(distribution.ClusterError, match=r"describes 3 training worker\(s\) but --workers is 2"):
            distribution.parse_tf_config(tf_config(3), expected_workers=2)

    def test_an_empty_tf_config_never_silently_trains_alone_when_workers_were_asked(self):
        assert distribution.parse_tf_config("", expected_workers=1) is None
        with pytest.raises(distribution.ClusterError, match="TF_CONFIG is empty but 4 workers were asked for"):
            distribution.parse_tf_config("  ", expected_workers=4)

    def test_launcher_choice(self, monkeypatch):
        monkeypatch.delenv("TF_CONFIG", raising=False)
        assert choose_launcher(TrainConfig(data="d", model_dir="m")) == "inprocess"
        assert choose_launcher(TrainConfig(data="d", model_dir="m", workers=2)) == "local"
        assert (
            choose_launcher(TrainConfig(data="gs://bkb/d", model_dir="gs://bkb/m", workers=2, launcher="tfjob"))
            == "tfjob"
        )
        monkeypatch.setenv("TF_CONFIG", tf_config(2))
        assert choose_launcher(TrainConfig(data="d", model_dir="m", workers=2)) == "worker"


def test_bad_train_options_name_the_field():
    with pytest.raises(ValueError, match=r"depth: 21 is not of the form 6n\+2"):
        TrainConfig(data="d", model_dir="m", depth=21)
    with pytest.raises(ValueError, match=r"batch_size: 10 does not split evenly over 4 workers"):
        TrainConfig(data="d", model_dir="m", batch_size=10, workers=4)
    with pytest.raises(ValueError, match=r"train_steps and epochs"):
        TrainConfig(data="d", model_dir="m", train_steps=5, epochs=1)
    with pytest.raises(ValueError, match=r"gradient_multipliers: 'conv' is not of the form REGEX=VALUE"):
        TrainConfig(data="d", model_dir="m", gradient_multipliers=("conv",))
    with pytest.raises(ValueError, match=r"frozen: '\[' is not a valid regular expression"):
        TrainConfig(data="d", model_dir="m", frozen="[")


def test_piecewise_schedule_follows_the_estimator_example_and_scales_with_the_batch():
    config = TrainConfig(data="d", model_dir="m", batch_size=256)
    schedule = optimization.make_schedule(config, steps_per_epoch=100, total_steps=40000)
    rates = {step: float(schedule(step)) for step in (0, 8199, 8200, 12300, 30000)}
    assert rates == pytest.approx({0: 0.2, 8199: 0.2, 8200: 0.02, 12300: 0.002, 30000: 0.0004})


def test_cosine_schedule_and_warmup():
    config = TrainConfig(data="d", model_dir="m", schedule="cosine", warmup_epochs=1)
    schedule = optimization.make_schedule(config, steps_per_epoch=10, total_steps=100)
    assert float(schedule(0)) == pytest.approx(0.1 * 0.5 * (1 + np.cos(0)) * 0.1)
    assert float(schedule(50)) == pytest.approx(0.05, rel=1e-5)
    assert float(schedule(100)) == pytest.approx(0.0, abs=1e-7)


def test_triangular_schedule_is_airbenchs_triangle():
    """airbench94: from 0.2 x the rate up to the rate at 23% of training, then down to 0.07 x the rate."""
    config = TrainConfig(data="d", model_dir="m", schedule="triangular", learning_rate=2.0)
    schedule = optimization.make_schedule(config, steps_per_epoch=10, total_steps=1000)
    rates = {step: float(schedule(step)) for step in (0, 115, 230, 615, 1000)}
    assert rates == pytest.approx({0: 0.4, 115: 1.2, 230: 2.0, 615: 2.0 * (1 - 0.93 / 2), 1000: 0.14}, rel=1e-5)
    with pytest.raises(ValueError, match=r"triangle_peak: 1.5 is not in \(0, 1\)"):
        TrainConfig(data="d", model_dir="m", triangle_peak=1.5)


def variables(*names_and_values):
    model = tf.Module()
    made = []
    for name, value in names_and_values:
        variable = tf.Variable(value, name=name.replace("/", "_"))
        variable.path = name  # the attribute Keras 3 variables carry
        made.append(variable)
    model.variables_list = made
    return made


def test_gradient_processing_numerically():
    config = TrainConfig(
        data="d", model_dir="m", gradient_multipliers=("^head/=3", "conv=0.5"), clip_value=10.0, clip_global_norm=5.0
    )
    held = variables(("conv1/kernel", [0.0, 0.0]), ("head/kernel", [0.0]), ("bn/gamma", [0.0]))
    processing = optimization.GradientProcessing.for_variables(config, held)
    assert processing.multipliers == (0.5, 3.0, 1.0)
    processed, norm = processing([tf.constant([6.0, 8.0]), tf.constant([4.0]), tf.constant([20.0])])
    assert float(norm) == pytest.approx(np.sqrt(36 + 64 + 16 + 400))
    # multipliers: [3, 4], [12], [20] -> clip by value 10: [3, 4], [10], [10] -> global norm 15 -> x 5/15
    expected = [np.array([3.0, 4.0]) / 3, np.array([10.0]) / 3, np.array([10.0]) / 3]
    for got, want in zip(processed, expected, strict=True):
        np.testing.assert_allclose(got.numpy(), want, rtol=1e-6)


def test_per_variable_norm_clipping():
    config = TrainConfig(data="d", model_dir="m", clip_norm=1.0)
    held = variables(("a/kernel", [0.0, 0.0]), ("b/kernel", [0.0]))
    processed, _ = optimization.GradientProcessing.for_variables(config, held)(
        [tf.constant([3.0, 4.0]), tf.constant([0.5])]
    )
    np.testing.assert_allclose(processed[0].numpy(), [0.6, 0.8], rtol=1e-6)
    np.testing.assert_allclose(processed[1].numpy(), [0.5])


def test_a_multiplier_that_matches_nothing_is_an_error():
    held = variables(("a/kernel", [0.0]))
    with pytest.raises(ValueError, match=r"gradient_multipliers: 'head' matches no trained variable"):
        optimization.GradientProcessing.for_variables(
            TrainConfig(data="d", model_dir="m", gradient_multipliers=("head=2",)), held
        )


def test_trainable_and_frozen_select_by_name():
    held = variables(("stem_conv/kernel", [0.0]), ("stage1_block1_conv1/kernel", [0.0]), ("head/kernel", [0.0]))
    trained, frozen = optimization.select_trainable(held, trainable="^(stage|head)", frozen="^head")
    assert [v.path for v in trained] == ["stage1_block1_conv1/kernel"]
    assert [v.path for v in frozen] == ["stem_conv/kernel", "head/kernel"]
    with pytest.raises(ValueError, match="leave no variable to train"):
        optimization.select_trainable(held, trainable="^nothing", frozen=None)


@pytest.mark.parametrize("depth", [8, 20, 32])
def test_resnet_has_6n_plus_2_weighted_layers_and_classifies(depth):
    model = build_resnet(ModelSpec(depth=depth, num_classes=7))
    weighted = [
        layer for layer in model.layers if layer.name.endswith(("conv", "conv1", "conv2")) or layer.name == "head"
    ]
    assert len(weighted) == depth
    logits = model(tf.zeros([2, 32, 32, 3], tf.uint8), training=False)
    assert logits.shape == (2, 7) and logits.dtype == tf.float32
    batch_norm = model.get_layer("stem_bn")
    assert batch_norm.momentum == 0.997 and batch_norm.epsilon == 1e-5


def test_resnet20_parameter_count_and_width_multiplier():
    # 0.27M parameters, as in He et al. 2016, Table 6 (parameter-free shortcuts).
    assert build_resnet(ModelSpec(depth=20)).count_params() == pytest.approx(272_000, rel=0.01)
    half = build_resnet(ModelSpec(depth=20, width_multiplier=0.5))
    assert half.get_layer("stage3_block1_conv1").filters == 32


def _step_on_one_batch(**options):
    """A TrainStep of a tiny ResNet (4 classes, batch 16, one step per epoch) and an endless iterator over one
    fixed batch: the step without a model directory."""
    from components.train.step import TrainStep

    config = TrainConfig(data="unused", model_dir="unused", depth=8, width_multiplier=0.25, batch_size=16,
                         learning_rate=0.05, schedule="constant", **options)  # fmt: skip
    tf.keras.utils.set_random_seed(0)
    strategy = tf.distribute.get_strategy()
    model = build_resnet(ModelSpec(depth=8, width_multiplier=0.25, num_classes=4))
    step = TrainStep(config, strategy, model, num_classes=4, steps_per_epoch=1.0, total_steps=config.train_steps)
    images = tf.constant(np.random.default_rng(0).integers(0, 256, (16, 32, 32, 3)), tf.uint8)
    labels = tf.constant(np.arange(16) % 4, tf.int64)
    batches = iter(strategy.experimental_distribute_dataset(tf.data.Dataset.from_tensors((images, labels)).repeat()))
    return step, model, batches


def test_the_step_alone_fits_a_batch_and_reports_the_workers_flags():
    """The distributed step without a model directory: model, batch, step."""
    step, _model, batches = _step_on_one_batch(train_steps=30)
    losses = []
    for _ in range(30):
        outputs, _batch = step(batches, save_due=True)
        losses.append(float(outputs["loss"]))
    assert int(step.step.numpy()) == 30
    assert losses[-1] < 0.8 * losses[0], losses  # it learns the batch
    assert bool(outputs["state_finite"]) and not outputs["stop_agreed"] and outputs["save_agreed"]


def test_the_step_stops_computing_the_whitening_bias_gradient_when_the_bias_stops(monkeypatch):
    """Once the whitening bias has had its steps, the step takes its gradient as zero instead of computing it (the
    backward pass through the first convolution's input, the whitening's GELU and the whitening): every weight moves
    as when it is computed, and the bias stays where it stopped."""
    from components.common.config import config_from_mapping
    from components.common.model import ModelSpec, build_model, variable_name
    from components.train.step import TrainStep

    config = config_from_mapping(TrainConfig, {"data": "unused", "model_dir": "unused", "preset": "airbench94_muon",
                                 "width_multiplier": 0.125, "batch_size": 16, "learning_rate_batch_size": 16,
                                 "whitening_bias_epochs": 2.0, "train_steps": 5}, "test")  # fmt: skip
    images = tf.constant(correlated_images(16), tf.uint8)
    labels = tf.constant(np.arange(16) % 10, tf.int64)
    strategy = tf.distribute.get_strategy()
    runs = {}
    for skip in (True, False):
        tf.keras.utils.set_random_seed(0)
        model = build_model(ModelSpec("airbench", width_multiplier=0.125))
        step = TrainStep(config, strategy, model, num_classes=10, steps_per_epoch=1.0, total_steps=5)
        if not skip:
            monkeypatch.setattr(step, "whitening_bias_stopped", lambda: False)
        batches = iter(
            strategy.experimental_distribute_dataset(tf.data.Dataset.from_tensors((images, labels)).repeat())
        )
        stopped, biases = [], []
        for _ in range(5):
            stopped.append(step.whitening_bias_stopped())
            step(batches)
            biases.append(model.get_layer("whitening").bias.numpy().copy())
        runs[skip] = ({variable_name(v): v.numpy() for v in model.variables}, stopped, biases)
    weights, stopped, biases = runs[True]
    assert stopped == [False, False, True, True, True]
    assert not np.array_equal(biases[0], biases[1])  # it trains, then stops
    np.testing.assert_array_equal(biases[1], biases[4])
    for name, value in runs[False][0].items():
        np.testing.assert_allclose(weights[name], value, rtol=1e-5, atol=1e-6, err_msg=name)


def correlated_images(count: int, seed: int = 0) -> np.ndarray:
    """uint8 images whose neighbouring pixels and channels are strongly correlated, as in photographs."""
    rng = np.random.default_rng(seed)
    noise = rng.normal(size=(count, 32, 32, 3))
    smooth = noise + np.roll(noise, 1, axis=1) + np.roll(noise, 1, axis=2) + noise[..., :1]
    return np.clip(128 + 30 * smooth, 0, 255).astype(np.uint8)


def test_patch_whitening_whitens_the_training_patches():
    """After `adapt`, the layer's output (bias aside) has an identity second-moment matrix over the 2x2 patches of
    the images it was fitted to; its second half is the negation of the first."""
    import keras

    from components.common.model import ModelSpec, build_model, whitening_layer

    images = correlated_images(64)
    model = build_model(ModelSpec("airbench", batch_norm_decay=0.6, batch_norm_epsilon=1e-12))
    layer = whitening_layer(model)
    pixels = images.astype(np.float64).reshape(-1, 3)
    before = np.corrcoef(pixels.T)
    assert before[0, 1] > 0.3, "the test images must be correlated for whitening to show"

    layer.adapt(images)
    outputs = keras.Model(model.input, layer.output)(images).numpy() - layer.bias.numpy()
    assert outputs.shape == (64, 31, 31, 24)  # valid 2x2 patches, 2 x 12 filters
    first_half = outputs[..., :12].reshape(-1, 12)
    np.testing.assert_allclose(first_half.T @ first_half / len(first_half), np.eye(12), atol=0.01)
    np.testing.assert_allclose(outputs[..., 12:], -outputs[..., :12], atol=1e-5)


def test_dirac_initialised_convolutions_pass_their_input_through():
    import keras

    from components.common.model import DiracUniform

    convolution = keras.layers.Conv2D(8, 3, padding="same", use_bias=False, kernel_initializer=DiracUniform(seed=1))
    inputs = np.random.default_rng(0).normal(size=(2, 6, 6, 4)).astype(np.float32)
    outputs = convolution(inputs).numpy()
    np.testing.assert_allclose(outputs[..., :4], inputs, atol=1e-6)  # identities in the first input-many filters
    assert np.abs(outputs[..., 4:]).max() > 0.1  # the others are random
    kernel = convolution.kernel.numpy()[..., 4:]
    assert np.abs(kernel).max() <= 1 / np.sqrt(3 * 3 * 4) + 1e-6  # PyTorch's default bound, 1/sqrt(fan in)


def test_the_airbench_network_has_airbench94s_shape():
    from components.common.model import ModelSpec, build_model

    model = build_model(ModelSpec("airbench"))
    assert model(correlated_images(2)).shape == (2, 10)
    assert [layer.filters for layer in model.layers if hasattr(layer, "filters")] == [64, 64, 256, 256, 256, 256]
    batch_norms = [layer for layer in model.layers if "bn" in layer.name]
    assert len(batch_norms) == 6 and not any(layer.scale for layer in batch_norms)
    # airbench94's published network: 1.97 M parameters (whitening 12*24 + 24 included).
    assert 1.9e6 < model.count_params() < 2.05e6


def test_lookahead_moves_the_weights_to_a_slow_average_of_themselves():
    """Every `lookahead_every_steps` steps from `lookahead_start_epochs` on, the weights become the shadow, which
    follows them slowly; the first time the shadow is the weights themselves; the last step ends on the shadow."""
    step, model, batches = _step_on_one_batch(
        train_steps=9, lookahead_every_steps=2, lookahead_start_epochs=2.0, lookahead_decay=0.99,
        lookahead_decay_power=0.0,
    )  # fmt: skip
    head, shadow = model.get_layer("head").kernel, step.lookahead["head/kernel"]
    weights, shadows = {}, {}
    for number in range(1, 10):
        step(batches)
        weights[number], shadows[number] = head.numpy(), shadow.numpy()
        if number == 1:
            assert not bool(step.lookahead_started)  # before lookahead_start_epochs
    assert bool(step.lookahead_started)
    for number in (2, 4, 6, 8, 9):  # due steps, and the last one: the weights are the shadow
        np.testing.assert_array_equal(weights[number], shadows[number])
    for number in (3, 5, 7):  # between them the weights train on while the shadow waits
        np.testing.assert_array_equal(shadows[number], shadows[number - 1])
        assert not np.allclose(weights[number], shadows[number])
    # rho = 0.99^2: at a due step the weights are pulled almost all the way back to the previous shadow, though
    # the step before moved them freely.
    free = np.linalg.norm(weights[3] - shadows[2])
    assert np.linalg.norm(weights[4] - shadows[2]) < 0.1 * free


def test_the_logged_learning_rate_says_what_it_is_per():
    from components.common.config import config_from_mapping
    from components.train.loop import describe_learning_rate

    muon = config_from_mapping(TrainConfig, {"data": "d", "model_dir": "m", "preset": "airbench94_muon"}, "test")
    said = describe_learning_rate(muon)
    assert "batch-mean loss" in said and "base rate 106 at batch 2000" in said and "would write 0.053" in said
    assert "Muon's convolution kernels follow the same schedule from 0.24" in said


@pytest.mark.parametrize("precision", ["float32", "mixed_bfloat16"])
@pytest.mark.parametrize("scale", [False, True])
def test_the_fused_batch_norm_trains_as_keras_own(precision, scale):
    """Same outputs, gradients and moving statistics as keras.layers.BatchNormalization (whose weights it keeps),
    in training; Keras's own code in inference."""
    import keras

    from components.common.model import FusedBatchNormalization

    keras.mixed_precision.set_global_policy(precision)
    try:
        inputs = tf.cast(
            tf.random.stateless_normal((8, 6, 6, 5), seed=(1, 2)) * 3 + 1,
            keras.mixed_precision.global_policy().compute_dtype,
        )
        fused = FusedBatchNormalization(momentum=0.6, epsilon=1e-12, scale=scale)
        plain = keras.layers.BatchNormalization(momentum=0.6, epsilon=1e-12, scale=scale)
        for layer in (fused, plain):
            layer.build(inputs.shape)
        plain.set_weights([weight + 0.1 * number for number, weight in enumerate(fused.get_weights())])
        fused.set_weights(plain.get_weights())
        results = []
        for layer in (fused, plain):
            with tf.GradientTape() as tape:
                tape.watch(inputs)
                outputs = layer(inputs, training=True)
                loss = tf.reduce_sum(tf.cast(outputs, tf.float32) * tf.range(5, dtype=tf.float32))
            gradients = tape.gradient(loss, [inputs, *layer.trainable_weights])
            results.append((outputs, gradients, layer.get_weights(), layer(inputs, training=False)))
        tolerance = 1e-5 if precision == "float32" else 1e-2

        def close(first, second, scale=1.0):
            first, second = (np.asarray(tf.cast(value, tf.float32)) for value in (first, second))
            np.testing.assert_allclose(first, second, rtol=tolerance, atol=tolerance * scale)

        (outputs, gradients, weights, inferred), (outputs_k, gradients_k, weights_k, inferred_k) = results
        assert outputs.dtype == outputs_k.dtype
        close(outputs, outputs_k)
        for gradient, gradient_k in zip(gradients, gradients_k, strict=True):
            close(gradient, gradient_k, scale=10)  # a sum over the batch: the scale's is 0 up to round-off
        for weight, weight_k in zip(weights, weights_k, strict=True):  # moving mean and (biased) variance
            np.testing.assert_allclose(weight, weight_k, rtol=1e-5, atol=1e-6)
        close(inferred, inferred_k)
    finally:
        keras.mixed_precision.set_global_policy("float32")


@pytest.mark.parametrize(
    ("dtype", "image", "kernel", "channels"),
    [("float32", 3, 3, (5, 7)), ("float32", 7, 3, (4, 6)), ("float32", 5, 5, (3, 2)), ("float32", 4, 1, (6, 3)),
     ("bfloat16", 7, 3, (8, 16)), ("bfloat16", 3, 3, (16, 8))],
)  # fmt: skip
def test_the_per_tap_kernel_gradient_is_the_convolutions(dtype, image, kernel, channels):
    """The convolution whose kernel gradient is one matrix product per tap: its output and both gradients are
    TensorFlow's convolution's (float32: to float rounding; bfloat16: each a bfloat16 rounding of the same sums)."""
    from components.common.model import _tap_convolution

    in_channels, out_channels = channels
    inputs = tf.cast(tf.random.stateless_normal([6, image, image, in_channels], seed=[1, 2]), dtype)
    weights = tf.cast(tf.random.stateless_normal([kernel, kernel, in_channels, out_channels], seed=[5, 6]), dtype)
    upstream = tf.cast(tf.random.stateless_normal([6, image, image, out_channels], seed=[3, 4]), dtype)
    results = []
    for convolution in (_tap_convolution, lambda inputs, weights: tf.nn.conv2d(inputs, weights, 1, "SAME")):
        with tf.GradientTape() as tape:
            tape.watch([inputs, weights])
            outputs = convolution(inputs, weights)
        gradients = tape.gradient(outputs, [inputs, weights], output_gradients=upstream)
        results.append([tf.cast(value, tf.float32).numpy() for value in (outputs, *gradients)])
    tolerance = {"float32": 1e-5, "bfloat16": 2**-7}[dtype]
    for ours, theirs in zip(*results, strict=True):
        np.testing.assert_allclose(ours, theirs, rtol=tolerance, atol=tolerance * np.abs(theirs).max())


@pytest.mark.parametrize(
    ("image", "out_channels", "kernel_gradient"),
    [(7, 16, "taps"), (7, 32, "compiled"), (15, 64, "compiled")],
)  # fmt: skip
def test_the_small_image_convolution_trains_as_keras_own_in_bfloat16(image, out_channels, kernel_gradient):
    """The layer in mixed bfloat16 (where it takes its own kernel gradient: the compiled one where this CPU runs it,
    else the per-tap one on small images): Keras's Conv2D's output and gradients, its kernel's gradient reaching the
    float32 variable; it saves and loads as itself."""
    import keras

    from components.common.compiled_kernels import kernel_gradient_op
    from components.common.model import SmallImageConv2D

    if kernel_gradient == "compiled" and kernel_gradient_op() is None:
        kernel_gradient = "taps" if image * image <= 49 else None
    keras.mixed_precision.set_global_policy("mixed_bfloat16")
    try:
        inputs = tf.cast(tf.random.stateless_normal([6, image, image, 8], seed=[1, 2]), tf.bfloat16)
        upstream = tf.cast(tf.random.stateless_normal([6, image, image, out_channels], seed=[3, 4]), tf.bfloat16)
        layers = []
        for cls in (SmallImageConv2D, keras.layers.Conv2D):
            layer = cls(out_channels, 3, padding="same", use_bias=False, kernel_initializer="he_normal")
            layer.build(inputs.shape)
            layers.append(layer)
        layers[1].set_weights(layers[0].get_weights())
        assert layers[0]._kernel_gradient(inputs, True) == kernel_gradient
        results = []
        for layer in layers:
            with tf.GradientTape() as tape:
                tape.watch(inputs)
                outputs = layer(inputs, training=True)
            gradients = tape.gradient(outputs, [inputs, layer.kernel], output_gradients=upstream)
            assert gradients[1].dtype == tf.float32
            results.append([tf.cast(value, tf.float32).numpy() for value in (outputs, *gradients)])
        for ours, theirs in zip(*results, strict=True):
            np.testing.assert_allclose(ours, theirs, rtol=2**-7, atol=2**-7 * np.abs(theirs).max())
        restored = keras.layers.deserialize(keras.layers.serialize(layers[0]))
        assert type(restored) is SmallImageConv2D and restored.get_config() == layers[0].get_config()
    finally:
        keras.mixed_precision.set_global_policy("float32")


def test_the_per_tap_kernel_gradient_over_chunks_of_the_batch_is_the_whole_batch_gradient():
    """The per-tap kernel gradient taken over chunks of the batch (uneven ones included; eagerly, and traced, where
    the chunks are ordered one after another) and summed is the convolution's kernel gradient, as is the one taken
    in one piece when the batch is unknown while tracing."""
    from components.common.model import _batch_chunk_sizes, _filter_gradient_by_taps

    inputs = tf.cast(tf.random.stateless_normal([7, 5, 5, 8], seed=[5, 6]), tf.bfloat16)
    upstream = tf.cast(tf.random.stateless_normal([7, 5, 5, 16], seed=[7, 8]), tf.bfloat16)
    expected = tf.raw_ops.Conv2DBackpropFilter(
        input=tf.cast(inputs, tf.float32), filter_sizes=[3, 3, 8, 16], out_backprop=tf.cast(upstream, tf.float32),
        strides=[1, 1, 1, 1], padding="SAME",
    ).numpy()  # fmt: skip
    image_bytes = 5 * 5 * 8 * 2
    assert _batch_chunk_sizes(inputs, 2 * image_bytes) == [2, 2, 2, 1]
    assert _batch_chunk_sizes(inputs, 100 * image_bytes) == [7]
    unknown_batch = tf.function(
        lambda images, gradients: _filter_gradient_by_taps(images, gradients, [3, 3, 8, 16], image_bytes),
        input_signature=[tf.TensorSpec([None, 5, 5, 8], tf.bfloat16), tf.TensorSpec([None, 5, 5, 16], tf.bfloat16)],
    )
    for gradient in (
        _filter_gradient_by_taps(inputs, upstream, [3, 3, 8, 16], 2 * image_bytes),
        _filter_gradient_by_taps(inputs, upstream, [3, 3, 8, 16], image_bytes),
        tf.function(lambda: _filter_gradient_by_taps(inputs, upstream, [3, 3, 8, 16], 2 * image_bytes))(),
        unknown_batch(inputs, upstream),
    ):
        assert gradient.dtype == tf.bfloat16 and gradient.shape == (3, 3, 8, 16)
        np.testing.assert_allclose(
            tf.cast(gradient, tf.float32).numpy(), expected, rtol=2**-7, atol=2**-7 * np.abs(expected).max()
        )


@pytest.mark.parametrize("compiled_runs", [True, False])
def test_the_small_image_convolution_takes_its_own_gradient_only_where_it_pays(monkeypatch, compiled_runs):
    """Training in bfloat16, stride 1, 'same': the compiled kernel gradient where the CPU runs it, for out channels a
    multiple of 32, at any image size; else the per-tap one on images of at most 7x7 pixels. Float32, another stride
    or padding, an even kernel, a bias, and inference: Keras's own convolution."""
    import keras

    from components.common import compiled_kernels
    from components.common.model import SmallImageConv2D

    monkeypatch.setattr(
        compiled_kernels, "kernel_gradient_op", lambda: (lambda *_, **__: None) if compiled_runs else None
    )

    def taken(image, filters=32, training=True, dtype="mixed_bfloat16", **options):
        layer = SmallImageConv2D(filters, 3, use_bias=False, dtype=dtype, **{"padding": "same", **options})
        return layer._kernel_gradient(tf.zeros([2, image, image, 3], layer.compute_dtype), training)

    own = "compiled" if compiled_runs else "taps"
    assert taken(7) == own and taken(3) == own
    assert taken(32) == ("compiled" if compiled_runs else None)
    assert taken(7, filters=4) == "taps" and taken(8, filters=4) is None
    for other in (
        {"dtype": "float32"}, {"training": False}, {"strides": 2}, {"padding": "valid"}, {"dilation_rate": 2}
    ):  # fmt: skip
        assert taken(7, **other) is None
    for layer in (  # an even kernel; a bias
        SmallImageConv2D(32, 2, padding="same", use_bias=False, dtype="mixed_bfloat16"),
        SmallImageConv2D(32, 3, padding="same", dtype="mixed_bfloat16"),
    ):
        assert layer._kernel_gradient(tf.zeros([2, 7, 7, 3], tf.bfloat16), True) is None
    assert isinstance(SmallImageConv2D(4, 3), keras.layers.Conv2D)


@pytest.mark.parametrize("precision", ["mixed_bfloat16", "float32"])
def test_the_batch_norm_gelu_without_its_compiled_op_is_the_two_layers(monkeypatch, precision):
    """Where the compiled ops cannot run (another CPU, no compiler), or in float32, `BatchNormGelu` is
    `FusedBatchNormalization` then `Gelu`, to the bit: outputs, gradients and moving statistics; in inference,
    Keras's batch norm and GELU."""
    from components.common import compiled_kernels
    from components.common.model import BatchNormGelu, FusedBatchNormalization, Gelu

    monkeypatch.setattr(compiled_kernels, "batch_norm_gelu_ops", lambda: None)
    dtype = "bfloat16" if precision == "mixed_bfloat16" else "float32"
    inputs = tf.cast(tf.random.stateless_normal((6, 5, 5, 24), seed=(3, 4)) * 2 + 1, dtype)
    fused = BatchNormGelu(momentum=0.6, epsilon=1e-5, scale=False, dtype=precision)
    normalization = FusedBatchNormalization(momentum=0.6, epsilon=1e-5, scale=False, dtype=precision)
    gelu = Gelu(dtype=precision)
    for layer in (fused, normalization):
        layer.build(inputs.shape)
    fused.set_weights([weight + 0.1 * number for number, weight in enumerate(fused.get_weights())])
    normalization.set_weights(fused.get_weights())
    assert not fused._compiled(inputs, True, None)
    results = []
    for apply, layer in (
        (fused, fused),
        (lambda x, training: gelu(normalization(x, training=training), training=training), normalization),
    ):
        with tf.GradientTape() as tape:
            tape.watch(inputs)
            outputs = apply(inputs, training=True)
        gradients = tape.gradient(outputs, [inputs, *layer.trainable_weights])
        results.append([outputs, *gradients, *layer.get_weights(), apply(inputs, training=False)])
    for value, expected in zip(*results, strict=True):
        np.testing.assert_array_equal(np.asarray(tf.cast(value, tf.float32)), np.asarray(tf.cast(expected, tf.float32)))


def test_the_gelus_bfloat16_conversions_on_the_bits_are_tensorflows_casts():
    """The compiled GELU converts bfloat16 by shifting bits; every bfloat16 widens, and float32s of every kind
    (ties either way, subnormals, overflow, infinities, NaNs) narrow, as tf.cast converts them."""
    from components.common.model import _narrowed, _widened

    every_bfloat16 = tf.bitcast(tf.cast(tf.range(2**16), tf.uint16), tf.bfloat16)
    widened = tf.function(_widened, jit_compile=True)(every_bfloat16)
    expected = tf.cast(every_bfloat16, tf.float32)
    is_nan = tf.math.is_nan(expected)
    np.testing.assert_array_equal(tf.math.is_nan(widened), is_nan)
    np.testing.assert_array_equal(tf.bitcast(widened, tf.uint32)[~is_nan], tf.bitcast(expected, tf.uint32)[~is_nan])

    generator = np.random.default_rng(0)
    bits = np.concatenate(
        [
            generator.integers(0, 2**32, 200_000, dtype=np.uint64),
            (np.arange(2**16, dtype=np.uint64) << 16) | 0x8000,  # exact ties: to even
            (np.arange(2**16, dtype=np.uint64) << 16) | 0x7FFF,
            (np.arange(2**16, dtype=np.uint64) << 16) | 0x8001,
            np.array(
                [
                    0x7F7FFFFF,
                    0xFF7FFFFF,
                    0x7F7F8000,
                    0x7F800000,
                    0xFF800000,
                    0x7FFFFFFF,
                    0xFFFFFFFF,
                    0x7F800001,
                    0x00000001,
                    0x807FFFFF,
                    0,
                ],
                dtype=np.uint64,
            ),
        ]
    ).astype(np.uint32)
    values = tf.bitcast(tf.constant(bits), tf.float32)
    narrowed = tf.function(lambda values: _narrowed(values, tf.bfloat16), jit_compile=True)(values)
    expected = tf.cast(values, tf.bfloat16)
    is_nan = tf.math.is_nan(tf.cast(expected, tf.float32))
    np.testing.assert_array_equal(tf.math.is_nan(tf.cast(narrowed, tf.float32)), is_nan)
    np.testing.assert_array_equal(tf.bitcast(narrowed, tf.uint16)[~is_nan], tf.bitcast(expected, tf.uint16)[~is_nan])


def test_the_compiled_gelu_is_the_exact_gelu_and_inference_needs_no_xla(tmp_path):
    import keras

    from components.common.model import Gelu

    inputs = tf.linspace(-6.0, 6.0, 97)
    layer = Gelu(name="gelu")
    np.testing.assert_allclose(
        layer(inputs, training=True), keras.activations.gelu(inputs, approximate=False), atol=1e-6
    )
    np.testing.assert_allclose(layer(inputs), keras.activations.gelu(inputs, approximate=False), atol=1e-6)
    with tf.GradientTape() as tape:
        tape.watch(inputs)
        trained = layer(inputs, training=True)
    with tf.GradientTape() as tape_plain:
        tape_plain.watch(inputs)
        plain = keras.activations.gelu(inputs, approximate=False)
    np.testing.assert_allclose(tape.gradient(trained, inputs), tape_plain.gradient(plain, inputs), atol=1e-6)
    # In bfloat16 both directions are the float32 result rounded once (within a bfloat16 step of it).
    upstream = tf.cos(inputs)
    with tf.GradientTape() as tape:
        low = tf.cast(inputs, tf.bfloat16)
        tape.watch(low)
        trained = Gelu(dtype="mixed_bfloat16")(low, training=True)
    gradient = tape.gradient(trained, low, output_gradients=tf.cast(upstream, tf.bfloat16))
    assert trained.dtype == gradient.dtype == tf.bfloat16
    with tf.GradientTape() as tape_plain:
        exact = tf.cast(low, tf.float32)
        tape_plain.watch(exact)
        plain = keras.activations.gelu(exact, approximate=False)
    exact_gradient = tape_plain.gradient(
        plain, exact, output_gradients=tf.cast(tf.cast(upstream, tf.bfloat16), tf.float32)
    )
    np.testing.assert_allclose(tf.cast(trained, tf.float32), plain, rtol=2**-8, atol=1e-6)
    np.testing.assert_allclose(tf.cast(gradient, tf.float32), exact_gradient, rtol=2**-8, atol=1e-6)
    assert Gelu.from_config(layer.get_config()).get_config() == layer.get_config()

    # The airbench network, trained a step (so the compiled kernels exist in this process), then exported the way
    # evaluation exports it: the served graph has no XLA in it (TF Serving and KServe need none).
    from components.common.model import ModelSpec, build_model
    from components.evaluate.export import export_saved_model

    model = build_model(ModelSpec("airbench"))
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(model(correlated_images(2), training=True))
    assert all(gradient is not None for gradient in tape.gradient(loss, model.trainable_variables))
    export_saved_model(model, [str(number) for number in range(10)], tmp_path / "exported")
    graph = (tmp_path / "exported" / "saved_model.pb").read_bytes()
    assert b"Erf" in graph  # TensorFlow's own exact GELU
    assert b"Xla" not in graph


def test_workers_sum_gradients_with_nccl_between_gpus_the_ring_between_cpus_and_in_one_pack():
    from tensorflow.python.distribute import cross_device_utils

    implementations = tf.distribute.experimental.CommunicationImplementation
    assert distribution.communication_options(gpus=1).implementation == implementations.NCCL
    assert distribution.communication_options(gpus=0).implementation == implementations.RING
    options = distribution.communication_options(gpus=8)
    gradients = [tf.zeros([3, 3, 16, 16]) for _ in range(59)]  # ResNet-20's count of gradient tensors
    assert len(cross_device_utils.group_by_size(gradients, options.bytes_per_pack)) == 1  # one all-reduce a step
