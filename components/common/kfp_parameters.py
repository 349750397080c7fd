"""KFP parameters and the stages' configs: the one place where the KFP glue reads defaults and "not given".

Defaults live only in the config dataclasses. Components and the pipeline take theirs from `parameter_defaults`:
a field's own default or, where the config's default is None ("not given": warm_start, train_steps,
validation_fraction, ...), the placeholder of its type in NOT_GIVEN: "" for text, -1 for numbers.
`config_from_parameters` reads a placeholder back as "the config's default", so every component turns its
parameters into its config the same way.

Why placeholders and not `Optional[...] = None` parameters: kfp 2.17's local runner, which `make local-run` uses, can
neither leave a pipeline parameter unset nor pass None to it ("Unknown value type" / "Constant argument inputs must
be one of type ..."), and fails on a component's unset `Optional[int]` input (it calls int(None) while building the
executor input). The KFP backend accepts all three; the placeholders work on both.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from typing import Any, TypeVar

from components.common.config import config_from_mapping

ConfigT = TypeVar("ConfigT")

NOT_GIVEN: dict[type, Any] = {str: "", int: -1, float: -1.0}


def _optional_type(annotation: Any) -> type | None:
    """The inner type of `X | None`, or None when the annotation is not optional."""
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        arguments = [argument for argument in typing.get_args(annotation) if argument is not type(None)]
        if len(arguments) == 1:
            return arguments[0]
    return None


def parameter_defaults(config_class: type) -> types.SimpleNamespace:
    """Each field's default as a KFP parameter default: `parameter_defaults(TrainConfig).depth` is 20, and
    `.train_steps` is -1 (not given). Fields without a default (data, model_dir) are left out."""
    hints = typing.get_type_hints(config_class)
    defaults = {}
    for field in dataclasses.fields(config_class):
        if field.default is dataclasses.MISSING:
            continue
        if field.default is None:
            inner = _optional_type(hints[field.name])
            if inner not in NOT_GIVEN:
                continue  # no KFP placeholder for this type: the parameter is not offered
            defaults[field.name] = NOT_GIVEN[inner]
        else:
            defaults[field.name] = field.default
    return types.SimpleNamespace(**defaults)


def _given(hints: dict[str, Any], name: str, value: Any) -> bool:
    if value is None:
        return False
    inner = _optional_type(hints.get(name))
    return inner not in NOT_GIVEN or value != NOT_GIVEN[inner]


def config_from_parameters(config_class: type[ConfigT], parameters: dict[str, Any], origin: str) -> ConfigT:
    """The config that KFP parameters describe: None and a NOT_GIVEN placeholder mean the config's default for an
    optional field; every value passes the config's own checks, and errors name `origin` and the field.

    With a preset, a parameter at its default means "the preset's value": KFP passes every parameter, so a value
    left alone cannot be told from one set to the default on purpose."""
    return config_from_mapping(config_class, given_parameters(config_class, parameters), origin)


def given_parameters(config_class: type, parameters: dict[str, Any]) -> dict[str, Any]:
    """The parameters that say something: without None and NOT_GIVEN placeholders, and with a preset, without those
    at their default (the preset's value holds)."""
    hints = typing.get_type_hints(config_class)
    given = {name: value for name, value in parameters.items() if _given(hints, name, value)}
    if given.get("preset"):
        defaults = vars(parameter_defaults(config_class))
        given = {
            name: value
            for name, value in given.items()
            if name == "preset" or name not in defaults or value != defaults[name]
        }
    return given


def as_delivered(value: Any) -> Any:
    """A dict or list parameter's value as a step receives it: KFP carries it as a protobuf Struct (ListValue), whose
    numbers are all doubles (8 arrives as 8.0), on the local runners and on a cluster alike. Checking this, not what
    was typed, is checking what the step will see."""
    from google.protobuf import json_format, struct_pb2

    if isinstance(value, dict):
        message = struct_pb2.Struct()
        message.update(value)
    elif isinstance(value, list):
        message = struct_pb2.ListValue()
        message.extend(value)
    else:
        return value
    return json_format.MessageToDict(message)
