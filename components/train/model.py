"""Models, chosen by name. ResNet v1 for CIFAR (He et al. 2016, section 4.2), depth 6n+2, Keras 3 layers.

As in the CIFAR-10 estimator example: 3x3 convolution with 16 filters, three stages of n residual blocks
(16, 32, 64 filters; stride 2 at the start of stages 2 and 3; identity shortcuts, average-pooled and
zero-padded where the shape changes), global average pooling, and a dense classifier. Every layer has
an explicit name (`stage2_block1_conv1/kernel`, `head/kernel`), the names checkpoints and warm starts use.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import keras


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


@dataclass(frozen=True)
class ModelSpec:
    depth: int = 20
    width_multiplier: float = 1.0
    num_classes: int = 10
    data_format: str = "channels_last"
    batch_norm_decay: float = 0.997
    batch_norm_epsilon: float = 1e-5
    image_shape: tuple[int, int, int] = (32, 32, 3)


def _batch_norm(spec: ModelSpec, name: str):
    axis = -1 if spec.data_format == "channels_last" else 1
    return keras.layers.BatchNormalization(
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


MODEL_BUILDERS: dict[str, Callable[[ModelSpec], keras.Model]] = {"resnet": build_resnet}


def build_model(name: str, spec: ModelSpec) -> keras.Model:
    if name not in MODEL_BUILDERS:
        raise ValueError(f"model: {name!r} is not one of {sorted(MODEL_BUILDERS)}")
    return MODEL_BUILDERS[name](spec)


def variable_name(variable) -> str:
    """The stable name of a model variable: `<layer>/<weight>`, e.g. `head/kernel`."""
    return variable.path


def is_kernel(variable) -> bool:
    """Conv and dense kernels: the variables weight decay applies to."""
    return variable_name(variable).endswith("/kernel")
