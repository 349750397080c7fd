"""The model: what it is (`ModelSpec`, the block `model_spec` of a model directory's config.json) and how it is built
(`build_model`), read by train and evaluate alike. Keras 3 layers, uint8 images in, logits out. Families:

- `resnet`: ResNet v1 for CIFAR (He et al. 2016, section 4.2), depth 6n+2, as in the CIFAR-10 estimator example:
  3x3 convolution with 16 filters, three stages of n residual blocks (16, 32, 64 filters; stride 2 at the start of
  stages 2 and 3; identity shortcuts, average-pooled and zero-padded where the shape changes), global average
  pooling, and a dense classifier.
- `airbench`: the network of airbench94 (Jordan 2024, arXiv 2404.00498): a frozen 2x2 patch-whitening convolution
  fitted to training images (`PatchWhitening.adapt`), then three groups of conv, max-pool, batch norm, GELU, conv,
  batch norm, GELU (widths 64, 256, 256), max-pool and a bias-free linear head scaled by 1/9. Batch norm has no
  learned scale; convolutions start as identities (dirac) in their first input-many filters.
- `airbench_muon`: the same network with airbench94_muon's head: initialised to unit standard deviation, its logits
  scaled by 1/width instead of 1/9.

Every layer has an explicit name (`stage2_block1_conv1/kernel`, `head/kernel`), the names checkpoints and warm
starts use.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field, fields
from typing import Any

import keras
import numpy as np
import tensorflow as tf

from components.common import compiled_kernels
from components.common.config import check_fields


@keras.saving.register_keras_serializable(package="cifar10_pipeline")
class PadChannels(keras.layers.Layer):
    """Zero-pads the channel axis on both sides: the parameter-free shortcut of ResNet v1 on CIFAR."""

    def __init__(self, padding: int, channel_axis: int = -1, **kwargs):
        super().__init__(**kwargs)
        self.padding = padding
        self.channel_axis = channel_axis

    def call(self, inputs):
        rank = len(inputs.shape)
        axis = self.channel_axis % rank
        pads = [[0, 0]] * rank
        pads[axis] = [self.padding, self.padding]
        return keras.ops.pad(inputs, pads)

    def get_config(self):
        return {**super().get_config(), "padding": self.padding, "channel_axis": self.channel_axis}


FAMILIES = ("resnet", "airbench", "airbench_muon")
TEST_TIME_AUGMENTATIONS = ("none", "mirror", "mirror_translate")


@dataclass(frozen=True)
class ModelSpec:
    """Everything that decides the network and how it predicts: the model directory records it (`model_spec` in
    config.json), and every stage builds the model from it. Its values are checked as the train config's are (the
    same choices and intervals: tests/test_documents.py holds them equal), so one read back from a model directory
    cannot build a network train would have refused."""

    family: str = field(default="resnet", metadata={"choices": FAMILIES})
    depth: int = field(default=20, metadata={"range": "[8, 1000]"})
    width_multiplier: float = field(default=1.0, metadata={"range": "[0.0625, 16]"})
    num_classes: int = field(default=10, metadata={"range": "[1, 100000]"})
    data_format: str = field(default="channels_last", metadata={"choices": ("channels_last", "channels_first")})
    batch_norm_decay: float = field(default=0.997, metadata={"range": "[0, 1)"})
    batch_norm_epsilon: float = field(default=1e-5, metadata={"range": "(0, 1]"})
    image_shape: tuple[int, int, int] = field(default=(32, 32, 3), metadata={"range": "[1, 4096]"})
    test_time_augmentation: str = field(default="none", metadata={"choices": TEST_TIME_AUGMENTATIONS})

    def __post_init__(self):
        check_fields(self)
        if len(self.image_shape) != 3:
            raise ValueError(f"image_shape: {list(self.image_shape)} is not [height, width, channels]")

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "image_shape": list(self.image_shape)}


SPEC_FIELDS_IN_TRAIN_CONFIG = ("depth", "width_multiplier", "data_format", "batch_norm_decay", "batch_norm_epsilon")


def weights_sha256(model) -> str:
    """The SHA-256 of a model's variables, by name: equal for equal weights, whichever stage computes it (train
    records it, the promotion gate compares it with the promoted version's)."""
    digest = hashlib.sha256()
    for variable in sorted(model.variables, key=variable_name):
        digest.update(variable_name(variable).encode())
        digest.update(np.ascontiguousarray(variable.numpy()).tobytes())
    return digest.hexdigest()


def model_spec_of(train_config: Mapping[str, Any], origin: str = "config.json") -> ModelSpec:
    """The spec a model directory's config.json records: its `model_spec` block, or for a directory written before
    there was one, the same values read from the train config and what it resolved; every value checked, a
    ValueError naming `origin` and the field otherwise."""
    block = train_config.get("model_spec")
    try:
        if block is None:
            resolved = train_config.get("resolved", {})
            block = {
                "family": train_config["model"],
                "num_classes": resolved["num_classes"],
                "image_shape": resolved["image_shape"],
                "test_time_augmentation": train_config.get("test_time_augmentation", "none"),
                **{key: train_config[key] for key in SPEC_FIELDS_IN_TRAIN_CONFIG},
            }
    except KeyError as error:
        raise ValueError(f"{origin}: no model_spec, and no {error.args[0]} to rebuild it from") from error
    if not isinstance(block, Mapping):
        raise ValueError(f"{origin}: model_spec: expected an object")
    unknown = set(block) - {field_.name for field_ in fields(ModelSpec)}
    if unknown:
        raise ValueError(f"{origin}: model_spec: unknown field(s) {sorted(unknown)} (written by a newer version?)")
    shape = block.get("image_shape", ModelSpec.image_shape)
    try:
        return ModelSpec(**{**block, "image_shape": tuple(shape) if isinstance(shape, list) else shape})
    except (TypeError, ValueError) as error:
        raise ValueError(f"{origin}: model_spec.{error}") from error


@keras.saving.register_keras_serializable(package="cifar10_pipeline")
class FusedBatchNormalization(keras.layers.BatchNormalization):
    """Keras's batch norm, the same weights and the same arithmetic, trained through one fused kernel
    (FusedBatchNormV3 forward and backward: oneDNN's on a CPU, cuDNN's on a GPU) instead of Keras's separate
    float32 passes (cast, mean, variance, normalize, cast back, and their gradients), memory-bound passes that
    bfloat16 does not shorten (bench/fused_layers.py). Statistics are taken in float32 either way; the moving
    variance keeps Keras's biased batch variance. Inference, and any case the kernel does not cover (another axis,
    a mask, renorm, synchronized statistics, float16), is Keras's own code."""

    def _fused(self, inputs, training, mask) -> bool:
        channels_last = self.axis in (-1, len(inputs.shape) - 1)
        return bool(
            training
            and self.trainable
            and mask is None
            and not self.renorm
            and not self.synchronized
            and len(inputs.shape) == 4
            and channels_last
            and self.compute_dtype in ("float32", "bfloat16")
            and keras.backend.backend() == "tensorflow"
        )

    def call(self, inputs, training=None, mask=None):
        if not self._fused(inputs, training, mask):
            return super().call(inputs, training=training, mask=mask)
        inputs = tf.cast(inputs, self.compute_dtype)
        channels = inputs.shape[-1]
        scale = tf.cast(self.gamma, tf.float32) if self.scale else tf.ones([channels], tf.float32)
        offset = tf.cast(self.beta, tf.float32) if self.center else tf.zeros([channels], tf.float32)
        outputs, mean, unbiased_variance, _, _, _ = tf.raw_ops.FusedBatchNormV3(
            x=inputs,
            scale=scale,
            offset=offset,
            mean=tf.zeros([0], tf.float32),
            variance=tf.zeros([0], tf.float32),
            epsilon=self.epsilon,
            exponential_avg_factor=1.0,
            data_format="NHWC",
            is_training=True,
        )
        count = tf.cast(tf.size(inputs, out_type=tf.int64) // channels, tf.float32)
        self._update_moving_statistics(mean, unbiased_variance * (count - 1.0) / tf.maximum(count, 1.0))
        return outputs

    def _update_moving_statistics(self, mean, variance) -> None:
        """The moving mean and (biased) variance, Keras's way: moving * momentum + batch * (1 - momentum)."""
        momentum = self.momentum
        self.moving_mean.assign(self.moving_mean * momentum + mean * (1.0 - momentum))
        self.moving_variance.assign(self.moving_variance * momentum + variance * (1.0 - momentum))


_SQRT_HALF = 0.5**0.5
_INVERSE_SQRT_TWO_PI = (2 * np.pi) ** -0.5


def _normal_cdf(x):
    """Phi(x), the standard normal's cumulative distribution."""
    return 0.5 + 0.5 * tf.math.erf(x * _SQRT_HALF)


def _widened(values):
    """`values` in float32. A bfloat16 is the top half of a float32, so its widening is a 16-bit shift of its bits:
    integer work that XLA's CPU code vectorizes, where its bfloat16 conversion runs element by element."""
    if values.dtype != tf.bfloat16:
        return tf.cast(values, tf.float32)
    bits = tf.cast(tf.bitcast(values, tf.uint16), tf.uint32)
    return tf.bitcast(tf.bitwise.left_shift(bits, 16), tf.float32)


def _narrowed(values, dtype):
    """float32 `values` as `dtype`; to bfloat16 by the same rounding as tf.cast (to nearest, ties to even,
    overflow to infinity; a NaN stays a NaN), done on the bits for the reason `_widened` gives."""
    if dtype != tf.bfloat16:
        return tf.cast(values, dtype)
    bits = tf.bitcast(values, tf.uint32)
    rounded = bits + 0x7FFF + tf.bitwise.bitwise_and(tf.bitwise.right_shift(bits, 16), 1)
    bits = tf.where(tf.math.is_nan(values), tf.bitwise.bitwise_or(bits, 0x00400000), rounded)
    return tf.bitcast(tf.cast(tf.bitwise.right_shift(bits, 16), tf.uint16), tf.bfloat16)


@tf.function(jit_compile=True)
def _gelu_forward(inputs):
    """x Phi(x), in float32 inside one compiled kernel whatever the dtype in memory."""
    x = _widened(inputs)
    return _narrowed(x * _normal_cdf(x), inputs.dtype)


@tf.function(jit_compile=True)
def _gelu_backward(inputs, upstream):
    """d/dx x Phi(x) = Phi(x) + x phi(x), times the upstream gradient: one kernel where the derivative of the
    forward's graph (what autodiff gives) is several."""
    x = _widened(inputs)
    derivative = _normal_cdf(x) + x * tf.exp(-0.5 * x * x) * _INVERSE_SQRT_TWO_PI
    return _narrowed(_widened(upstream) * derivative, inputs.dtype)


@tf.custom_gradient
def _compiled_gelu(inputs):
    return _gelu_forward(inputs), lambda upstream: _gelu_backward(inputs, upstream)


def _gelu(inputs, training):
    """The exact GELU: the compiled one in training, TensorFlow's op otherwise (nothing downstream needs XLA)."""
    if training and keras.backend.backend() == "tensorflow":
        return _compiled_gelu(inputs)
    return keras.activations.gelu(inputs, approximate=False)


@keras.saving.register_keras_serializable(package="cifar10_pipeline")
class Gelu(keras.layers.Activation):
    """The exact (erf) GELU. In training it runs as one compiled kernel (XLA) for the forward pass and one for the
    gradient, its closed form, where TensorFlow's own is a chain of elementwise passes over memory and autodiff's
    gradient of it a longer one (bench/fused_layers.py).
    Inference (evaluation, the exported SavedModel, serving) is TensorFlow's op, so nothing downstream needs XLA."""

    def __init__(self, **kwargs):
        kwargs.pop("activation", None)
        super().__init__("gelu", **kwargs)

    def call(self, inputs, training=None):
        return _gelu(inputs, training)


def _compiled_batch_norm_gelu(inputs, scale, offset, epsilon: float):
    """(y, mean, biased variance) of the compiled batch norm + GELU (components/common/compiled_kernels.py) on
    bfloat16 `inputs`, with its gradient (to the inputs, the scale and the offset) as the backward pass."""
    forward, backward = compiled_kernels.batch_norm_gelu_ops()

    @tf.custom_gradient
    def normalize_and_activate(inputs, scale, offset):
        outputs, mean, variance = forward(inputs, scale, offset, epsilon=epsilon)

        def gradient(upstream, *_statistics):
            return backward(inputs, upstream, mean, variance, scale, offset, epsilon=epsilon)

        return (outputs, mean, variance), gradient

    return normalize_and_activate(inputs, scale, offset)


@keras.saving.register_keras_serializable(package="cifar10_pipeline")
class BatchNormGelu(FusedBatchNormalization):
    """A batch norm followed by the exact GELU, as one layer: `FusedBatchNormalization` then `Gelu`, the same
    weights and arithmetic. Training in bfloat16 on a CPU that runs the project's compiled kernels, both are one op
    each way (components/common/kernels/batch_norm_gelu.cc), without the batch norm's output and its gradient
    written to memory and read back between them (the fast preset's step: docs/benchmarks.md). Elsewhere, and in
    inference, it is the two layers' own code."""

    def _compiled(self, inputs, training, mask) -> bool:
        return bool(
            self._fused(inputs, training, mask)
            and self.compute_dtype == "bfloat16"
            and inputs.shape[-1] is not None
            and not tf.config.list_logical_devices("GPU")  # the ops are the CPU's
            and compiled_kernels.batch_norm_gelu_ops() is not None
        )

    def call(self, inputs, training=None, mask=None):
        if not self._compiled(inputs, training, mask):
            return _gelu(super().call(inputs, training=training, mask=mask), training)
        channels = inputs.shape[-1]
        scale = tf.cast(self.gamma, tf.float32) if self.scale else tf.ones([channels], tf.float32)
        offset = tf.cast(self.beta, tf.float32) if self.center else tf.zeros([channels], tf.float32)
        outputs, mean, variance = _compiled_batch_norm_gelu(
            tf.cast(inputs, tf.bfloat16), scale, offset, float(self.epsilon)
        )
        self._update_moving_statistics(tf.stop_gradient(mean), tf.stop_gradient(variance))
        return outputs


SMALL_IMAGE_PIXELS = 49  # up to 7x7: where oneDNN's filter gradient is slower than the per-tap matrix products
COMPILED_OUT_CHANNELS_MULTIPLE = 32  # the compiled kernel gradient's register tile is 32 out channels wide


TAP_CHUNK_BYTES = 2 * 2**20  # a chunk of the batch whose input, upstream gradient and shifted copy stay in cache


def _batch_chunk_sizes(inputs, chunk_bytes: int) -> list[int]:
    """The batch split into nearly equal chunks of about `chunk_bytes` of `inputs` each (one chunk when the batch
    is not known while tracing)."""
    batch = inputs.shape[0]
    if batch is None:
        return [-1]
    image_bytes = inputs.shape[1:].num_elements() * inputs.dtype.size
    chunks = max(1, min(batch, round(batch * image_bytes / chunk_bytes)))
    return [batch // chunks + (1 if index < batch % chunks else 0) for index in range(chunks)]


def _filter_gradient_by_taps(inputs, upstream, kernel_shape, chunk_bytes: int | None = None):
    """The kernel's gradient of a stride-1 'same' convolution as one matrix product per kernel tap: the input
    shifted by the tap (of the zero-padded input), as a (pixels x in-channels) matrix, transposed, times the
    upstream gradient as (pixels x out-channels). Taken over chunks of the batch of about `chunk_bytes` of input
    each (TAP_CHUNK_BYTES by default), one after another, summed in float32, so that a chunk is still in cache
    from one tap's product to the next: 1.22-1.26x the whole batch's rate at 7x7 images of 256 channels, 1.05x at
    3x3 (bench/convolutions.py)."""
    sizes = _batch_chunk_sizes(inputs, chunk_bytes or TAP_CHUNK_BYTES)
    if len(sizes) == 1:
        return _chunk_filter_gradient_by_taps(inputs, upstream, kernel_shape)
    total = None
    for chunk_inputs, chunk_upstream in zip(tf.split(inputs, sizes), tf.split(upstream, sizes), strict=True):
        if total is not None:  # one chunk after another: run side by side, they evict each other from the cache
            with tf.control_dependencies([total]):
                chunk_inputs, chunk_upstream = tf.identity(chunk_inputs), tf.identity(chunk_upstream)
        part = tf.cast(_chunk_filter_gradient_by_taps(chunk_inputs, chunk_upstream, kernel_shape), tf.float32)
        total = part if total is None else total + part
    return tf.cast(total, inputs.dtype)


def _chunk_filter_gradient_by_taps(inputs, upstream, kernel_shape):
    rows, columns, in_channels, out_channels = kernel_shape
    height, width = inputs.shape[1], inputs.shape[2]
    padded = tf.pad(inputs, [[0, 0], [rows // 2, rows // 2], [columns // 2, columns // 2], [0, 0]])
    upstream = tf.reshape(upstream, [-1, out_channels])
    taps = [
        tf.linalg.matmul(
            tf.reshape(padded[:, row : row + height, column : column + width, :], [-1, in_channels]),
            upstream,
            transpose_a=True,
        )
        for row in range(rows)
        for column in range(columns)
    ]
    return tf.reshape(tf.stack(taps), kernel_shape)


def _compiled_filter_gradient(inputs, upstream, kernel_shape):
    """The kernel's gradient of a stride-1 'same' convolution in bfloat16 by the project's compiled AVX512-BF16
    kernel (components/common/compiled_kernels.py), summed in float32."""
    gradient = compiled_kernels.kernel_gradient_op()(inputs, upstream, kernel_size=list(kernel_shape[:2]))
    return tf.cast(gradient, inputs.dtype)


def _convolution_with_filter_gradient(inputs, kernel, filter_gradient):
    """A stride-1 'same' convolution whose kernel gradient is `filter_gradient(inputs, upstream, kernel_shape)`."""

    @tf.custom_gradient
    def convolve(inputs, kernel):
        def gradient(upstream):
            input_gradient = tf.raw_ops.Conv2DBackpropInput(
                input_sizes=tf.shape(inputs), filter=kernel, out_backprop=upstream, strides=[1, 1, 1, 1],
                padding="SAME",
            )  # fmt: skip
            return input_gradient, filter_gradient(inputs, upstream, kernel.shape)

        return tf.nn.conv2d(inputs, kernel, 1, "SAME"), gradient

    return convolve(inputs, kernel)


def _tap_convolution(inputs, kernel):
    """A stride-1 'same' convolution whose kernel gradient is `_filter_gradient_by_taps`."""
    return _convolution_with_filter_gradient(inputs, kernel, _filter_gradient_by_taps)


def _compiled_convolution(inputs, kernel):
    """A stride-1 'same' convolution whose kernel gradient is `_compiled_filter_gradient`."""
    return _convolution_with_filter_gradient(inputs, kernel, _compiled_filter_gradient)


@keras.saving.register_keras_serializable(package="cifar10_pipeline")
class SmallImageConv2D(keras.layers.Conv2D):
    """Keras's Conv2D, the same weights and arithmetic, whose kernel gradient in bfloat16 training on a CPU (a
    stride-1 'same' convolution of odd kernel, channels last, no bias) is its own, where oneDNN's bfloat16 filter
    gradient reaches a fraction of its forward pass's rate (each layer's passes in bench/convolutions.py):
    - on a CPU with AVX512-BF16 and without AMX, for out channels a multiple of COMPILED_OUT_CHANNELS_MULTIPLE, the
      project's compiled kernel (components/common/compiled_kernels.py; 15x15, 64 -> 256: 861 against 598 GFLOP/s;
      7x7, 256 -> 256: 842 against 385-411);
    - else, for images of at most SMALL_IMAGE_PIXELS pixels, one matrix product per kernel tap (on an AMX CPU, 7x7:
      540 against 2,100 GFLOP/s for the forward pass; 3x3: 210 against 1,470).
    In float32 neither is faster, so, as everything else (inference, a GPU, larger images elsewhere), it is Keras's
    call."""

    def _kernel_gradient(self, inputs, training) -> str | None:
        """'compiled', 'taps', or None (Keras's convolution) for this input in this mode."""
        if not self._own_gradient_applies(inputs, training):
            return None
        if self.filters % COMPILED_OUT_CHANNELS_MULTIPLE == 0 and compiled_kernels.kernel_gradient_op() is not None:
            return "compiled"
        if inputs.shape[1] * inputs.shape[2] <= SMALL_IMAGE_PIXELS:
            return "taps"
        return None

    def _own_gradient_applies(self, inputs, training) -> bool:
        rows, columns = self.kernel_size
        return bool(
            training
            and keras.backend.backend() == "tensorflow"
            and self.data_format == "channels_last"
            and self.padding == "same"
            and tuple(self.strides) == (1, 1)
            and tuple(self.dilation_rate) == (1, 1)
            and self.groups == 1
            and not self.use_bias
            and self.activation in (None, keras.activations.linear)
            and rows % 2 == 1
            and columns % 2 == 1
            and inputs.shape[1] is not None
            and inputs.shape[2] is not None
            and inputs.shape[-1] is not None
            and self.compute_dtype == "bfloat16"
            and not tf.config.list_logical_devices("GPU")
        )

    def call(self, inputs, training=None):
        kernel_gradient = self._kernel_gradient(inputs, training)
        if kernel_gradient == "compiled":
            return _compiled_convolution(inputs, tf.cast(self.kernel, inputs.dtype))
        if kernel_gradient == "taps":
            return _tap_convolution(inputs, tf.cast(self.kernel, inputs.dtype))
        return super().call(inputs)


def _batch_norm(spec: ModelSpec, name: str):
    axis = -1 if spec.data_format == "channels_last" else 1
    return FusedBatchNormalization(
        axis=axis, momentum=spec.batch_norm_decay, epsilon=spec.batch_norm_epsilon, name=name
    )


def _conv(filters: int, strides: int, spec: ModelSpec, name: str):
    return keras.layers.Conv2D(
        filters,
        3,
        strides=strides,
        padding="same",
        use_bias=False,
        data_format=spec.data_format,
        kernel_initializer="he_normal",
        name=name,
    )


def _residual_block(inputs, filters: int, strides: int, spec: ModelSpec, name: str):
    input_filters = inputs.shape[-1 if spec.data_format == "channels_last" else 1]
    shortcut = inputs
    if strides != 1 or input_filters != filters:
        shortcut = keras.layers.AveragePooling2D(strides, strides, data_format=spec.data_format, name=f"{name}_pool")(
            shortcut
        )
        shortcut = PadChannels(
            (filters - input_filters) // 2, -1 if spec.data_format == "channels_last" else 1, name=f"{name}_pad"
        )(shortcut)
    x = _conv(filters, strides, spec, f"{name}_conv1")(inputs)
    x = _batch_norm(spec, f"{name}_bn1")(x)
    x = keras.layers.ReLU(name=f"{name}_relu1")(x)
    x = _conv(filters, 1, spec, f"{name}_conv2")(x)
    x = _batch_norm(spec, f"{name}_bn2")(x)
    x = keras.layers.Add(name=f"{name}_add")([x, shortcut])
    return keras.layers.ReLU(name=f"{name}_relu2")(x)


def build_resnet(spec: ModelSpec) -> keras.Model:
    """ResNet v1 of depth 6n+2; takes uint8 images (NHWC), returns logits. Its first layer maps the pixels to
    [-1, 1], so every caller (training, evaluation, the exported SavedModel) feeds the model the same way."""
    if (spec.depth - 2) % 6:
        raise ValueError(f"depth: {spec.depth} is not of the form 6n+2")
    blocks = (spec.depth - 2) // 6
    widths = [max(1, round(16 * spec.width_multiplier)) * factor for factor in (1, 2, 4)]
    inputs = keras.Input(shape=spec.image_shape, dtype="uint8", name="images")
    x = keras.layers.Rescaling(1 / 127.5, offset=-1.0, name="normalize")(inputs)  # [0, 255] -> [-1, 1]
    if spec.data_format == "channels_first":
        x = keras.layers.Permute((3, 1, 2), name="to_channels_first")(x)
    x = _conv(widths[0], 1, spec, "stem_conv")(x)
    x = _batch_norm(spec, "stem_bn")(x)
    x = keras.layers.ReLU(name="stem_relu")(x)
    for stage, filters in enumerate(widths, start=1):
        for block in range(1, blocks + 1):
            strides = 2 if stage > 1 and block == 1 else 1
            x = _residual_block(x, filters, strides, spec, f"stage{stage}_block{block}")
    x = keras.layers.GlobalAveragePooling2D(data_format=spec.data_format, name="pool")(x)
    outputs = keras.layers.Dense(spec.num_classes, kernel_initializer="he_normal", name="head")(x)
    outputs = keras.layers.Activation("linear", dtype="float32", name="logits")(
        outputs
    )  # float32 under mixed precision
    return keras.Model(inputs, outputs, name=f"resnet{spec.depth}")


# -- airbench ---------------------------------------------------------------------------------------------------


def patch_whitening_kernel(images: np.ndarray, patch_size: int, epsilon: float) -> np.ndarray:
    """Convolution filters that whiten `patch_size` x `patch_size` patches of `images` ([N, H, W, C] floats):
    the eigenvectors of the patches' second-moment matrix, each divided by sqrt(its eigenvalue + epsilon), largest
    first, followed by their negatives (so a ReLU-like activation after it loses nothing). Shape [p, p, C, 2pp C]."""
    channels = images.shape[-1]
    windows = np.lib.stride_tricks.sliding_window_view(images, (patch_size, patch_size), axis=(1, 2))
    # windows: [N, H-p+1, W-p+1, C, p, p] -> patches flattened in the kernel's (row, column, channel) order
    patches = windows.transpose(0, 1, 2, 4, 5, 3).reshape(-1, patch_size * patch_size * channels).astype(np.float64)
    second_moment = patches.T @ patches / len(patches)
    eigenvalues, eigenvectors = np.linalg.eigh(second_moment)  # ascending
    eigenvalues, eigenvectors = eigenvalues[::-1], eigenvectors[:, ::-1]
    filters = eigenvectors / np.sqrt(eigenvalues + epsilon)  # [patch dims, filters]
    filters = np.concatenate([filters, -filters], axis=1)
    return filters.reshape(patch_size, patch_size, channels, -1).astype(np.float32)


@keras.saving.register_keras_serializable(package="cifar10_pipeline")
class PatchWhitening(keras.layers.Layer):
    """uint8 images -> per-channel standardized -> a frozen patch-whitening convolution (valid padding) + a bias.

    The mean, standard deviation and filters are weights fitted by `adapt` to training images, so checkpoints and
    the exported SavedModel carry them; only the bias is trainable."""

    def __init__(self, patch_size: int = 2, epsilon: float = 5e-4, **kwargs):
        super().__init__(**kwargs)
        self.patch_size = patch_size
        self.epsilon = epsilon

    def build(self, input_shape):
        channels = input_shape[-1]
        filters = 2 * self.patch_size * self.patch_size * channels
        self.mean = self.add_weight(shape=(channels,), initializer="zeros", trainable=False, name="mean")
        self.std = self.add_weight(shape=(channels,), initializer="ones", trainable=False, name="std")
        self.kernel = self.add_weight(
            shape=(self.patch_size, self.patch_size, channels, filters),
            initializer="zeros",
            trainable=False,
            name="kernel",
        )
        self.bias = self.add_weight(shape=(filters,), initializer="zeros", name="bias")

    def call(self, images):
        # The standardization (pixels / 255 - mean) / std = (pixels - 255 mean) * scale, its scale folded into the
        # kernel (each input channel's taps times its scale): one bias add in float32 over the batch, rounded once
        # to the compute dtype, where the three elementwise ops in bfloat16 it replaces took 16 ms of the fast
        # preset's step.
        mean, std = keras.ops.cast(self.mean, "float32"), keras.ops.cast(self.std, "float32")
        centered = tf.nn.bias_add(keras.ops.cast(images, "float32"), -255.0 * mean)
        kernel = keras.ops.cast(self.kernel, "float32") / (255.0 * std)[:, None]
        outputs = keras.ops.conv(
            keras.ops.cast(centered, self.compute_dtype),
            keras.ops.cast(kernel, self.compute_dtype),
            strides=1,
            padding="valid",
        )
        return outputs + self.bias

    def fitted_values(self, images: np.ndarray) -> list[np.ndarray]:
        """[mean, std, kernel] fitted to uint8 `images` ([N, H, W, C]), in the order of `weights_to_fit`."""
        pixels = images.astype(np.float64) / 255.0
        mean, std = pixels.mean(axis=(0, 1, 2)), pixels.std(axis=(0, 1, 2)) + 1e-8
        kernel = patch_whitening_kernel((pixels - mean) / std, self.patch_size, self.epsilon)
        return [mean.astype(np.float32), std.astype(np.float32), kernel]

    @property
    def weights_to_fit(self) -> list:
        return [self.mean, self.std, self.kernel]

    def adapt(self, images: np.ndarray) -> None:
        for variable, value in zip(self.weights_to_fit, self.fitted_values(images), strict=True):
            variable.assign(value)

    def get_config(self):
        return {**super().get_config(), "patch_size": self.patch_size, "epsilon": self.epsilon}


@keras.saving.register_keras_serializable(package="cifar10_pipeline")
class DiracUniform(keras.initializers.Initializer):
    """A convolution kernel whose first input-many filters are identities (the center tap of their own channel)
    and the rest uniform in +-1/sqrt(fan in), PyTorch's default: an implicit residual at initialization."""

    def __init__(self, seed: int | None = None):
        self.seed = seed

    def __call__(self, shape, dtype=None):
        height, width, inputs, outputs = shape
        kernel = keras.initializers.VarianceScaling(1 / 3, "fan_in", "uniform", seed=self.seed)(shape, dtype)
        identities = min(inputs, outputs)
        dirac = np.zeros((height, width, inputs, identities), np.float32)
        dirac[height // 2, width // 2, np.arange(identities), np.arange(identities)] = 1.0
        return keras.ops.concatenate([keras.ops.cast(dirac, kernel.dtype), kernel[..., identities:]], axis=-1)

    def get_config(self):
        return {"seed": self.seed}


def _airbench_group(x, filters: int, spec: ModelSpec, name: str):
    def conv(suffix):
        return SmallImageConv2D(
            filters, 3, padding="same", use_bias=False, kernel_initializer=DiracUniform(), name=f"{name}_{suffix}"
        )

    def norm_gelu(suffix):
        # No learned scale: airbench's batch norm trains its bias only.
        return BatchNormGelu(
            momentum=spec.batch_norm_decay, epsilon=spec.batch_norm_epsilon, scale=False, name=f"{name}_{suffix}"
        )

    x = conv("conv1")(x)
    x = keras.layers.MaxPooling2D(2, name=f"{name}_pool")(x)
    x = norm_gelu("bn1")(x)
    x = conv("conv2")(x)
    return norm_gelu("bn2")(x)


@keras.saving.register_keras_serializable(package="cifar10_pipeline")
class UnitStandardDeviation(keras.initializers.Initializer):
    """PyTorch's default linear initialisation (uniform in +-1/sqrt(fan in)) rescaled to a standard deviation of
    exactly 1, as airbench94_muon's head (`w *= 1 / w.std()`)."""

    def __init__(self, seed: int | None = None):
        self.seed = seed

    def __call__(self, shape, dtype=None):
        values = keras.initializers.VarianceScaling(1 / 3, "fan_in", "uniform", seed=self.seed)(shape, dtype)
        return values / keras.ops.std(values)

    def get_config(self):
        return {"seed": self.seed}


def build_airbench(spec: ModelSpec, head: str = "airbench94") -> keras.Model:
    """airbench94's network; `width_multiplier` scales the 64/256/256 widths (airbench95 widens them). `head`
    airbench94: logits / 9 of a PyTorch-initialised head; airbench94_muon: logits / width of a head initialised to
    unit standard deviation."""
    if spec.data_format != "channels_last":
        raise ValueError("data_format: the airbench model is written for channels_last")
    widths = [max(1, round(width * spec.width_multiplier)) for width in (64, 256, 256)]
    inputs = keras.Input(shape=spec.image_shape, dtype="uint8", name="images")
    x = PatchWhitening(name="whitening")(inputs)
    x = Gelu(name="whitening_gelu")(x)
    for stage, filters in enumerate(widths, start=1):
        x = _airbench_group(x, filters, spec, f"stage{stage}")
    x = keras.layers.MaxPooling2D(3, name="pool")(x)
    x = keras.layers.Flatten(name="flatten")(x)
    if head == "airbench94_muon":
        head_initializer, head_scale = UnitStandardDeviation(), 1 / widths[-1]
    else:
        head_initializer, head_scale = keras.initializers.VarianceScaling(1 / 3, "fan_in", "uniform"), 1 / 9
    x = keras.layers.Dense(spec.num_classes, use_bias=False, kernel_initializer=head_initializer, name="head")(x)
    x = keras.layers.Rescaling(head_scale, name="head_scale")(x)
    outputs = keras.layers.Activation("linear", dtype="float32", name="logits")(x)
    return keras.Model(inputs, outputs, name="airbench")


TEST_TIME_AUGMENTATIONS = ("none", "mirror", "mirror_translate")


def predict_logits(model: keras.Model, images, test_time_augmentation: str = "none"):
    """The model's logits for a uint8 batch, averaged over test-time views (airbench's): `mirror` averages each
    image and its mirror; `mirror_translate` gives that half the weight and the other half to the mirrored pairs of
    the image shifted one pixel up-left and one down-right (reflected borders). 1, 2 and 6 forward passes."""
    if test_time_augmentation not in TEST_TIME_AUGMENTATIONS:
        raise ValueError(f"test_time_augmentation: {test_time_augmentation!r} is not one of {TEST_TIME_AUGMENTATIONS}")

    def mirrored(batch):
        return 0.5 * model(batch, training=False) + 0.5 * model(keras.ops.flip(batch, axis=2), training=False)

    if test_time_augmentation == "none":
        return model(images, training=False)
    logits = mirrored(images)
    if test_time_augmentation == "mirror":
        return logits
    height, width = images.shape[1], images.shape[2]
    padded = keras.ops.pad(images, [[0, 0], [1, 1], [1, 1], [0, 0]], mode="reflect")
    up_left, down_right = padded[:, :height, :width, :], padded[:, 2 : height + 2, 2 : width + 2, :]
    return 0.5 * logits + 0.25 * (mirrored(up_left) + mirrored(down_right))


def whitening_layer(model: keras.Model) -> PatchWhitening | None:
    """The model's patch-whitening layer, which must be fitted to training images before training starts."""
    return next((layer for layer in model.layers if isinstance(layer, PatchWhitening)), None)


MODEL_BUILDERS: dict[str, Callable[[ModelSpec], keras.Model]] = {
    "resnet": build_resnet,
    "airbench": build_airbench,
    "airbench_muon": lambda spec: build_airbench(spec, head="airbench94_muon"),
}


def build_model(spec: ModelSpec) -> keras.Model:
    if spec.family not in MODEL_BUILDERS:
        raise ValueError(f"model: {spec.family!r} is not one of {sorted(MODEL_BUILDERS)}")
    return MODEL_BUILDERS[spec.family](spec)


def variable_name(variable) -> str:
    """The stable name of a model variable: `<layer>/<weight>`, e.g. `head/kernel`."""
    return variable.path


def is_kernel(variable) -> bool:
    """Conv and dense kernels: the variables weight decay applies to."""
    return variable_name(variable).endswith("/kernel")


class LabelCountError(ValueError):
    """Class names that do not belong to the model: their count is not the number of classes it scores."""


def check_label_count(scored: int, label_names, model: str, names_from: str) -> None:
    """The model `model` scores `scored` classes; its class names (read from `names_from`) must name each one, each
    once (two classes of one name could not be told apart in a prediction, a report or a confusion matrix)."""
    repeated = sorted({name for name in label_names if list(label_names).count(name) > 1})
    if repeated:
        raise LabelCountError(
            f"{names_from}: names {', '.join(repr(name) for name in repeated[:3])} more than once: each class needs a "
            "name of its own"
        )
    if scored != len(label_names):
        raise LabelCountError(
            f"{names_from}: lists {len(label_names)} class names, but the model {model} scores {scored} classes: "
            "the names do not belong to this model (give the model with its own names)"
        )
