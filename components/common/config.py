"""Typed configuration: dataclasses with defaults in code, overridable from a JSON file and the command line.

Every stage declares one frozen dataclass. `parse_config` turns its fields into `--kebab-case` options
(help text from the field's `metadata["help"]`, choices from `metadata["choices"]`, the allowed interval of a
number from `metadata["range"]`, checked on every path by `check_fields`), reads an optional
`--config FILE.json` whose keys are field names, and lets the command line override the file.
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import json
import math
import sys
import types
import typing
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TypeVar

from components.common import documents, storage
from components.common.filesystem import scheme_problem
from components.common.values import in_interval, parse_bool, shown

ConfigT = TypeVar("ConfigT")


def option_name(field_name: str) -> str:
    return "--" + field_name.replace("_", "-")


def _unwrap_optional(annotation: Any) -> tuple[Any, bool]:
    """Return (inner type, is_optional) for `X | None` / `Optional[X]`."""
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        arguments = [argument for argument in typing.get_args(annotation) if argument is not type(None)]
        if len(arguments) == 1:
            return arguments[0], True
    return annotation, False


def changed_fields(config: Any, names: Sequence[str], recipe: dict[str, Any] | None = None) -> list[str]:
    """Those of `names` whose value in `config` is neither its field's default nor the `recipe`'s (a preset's) value:
    set by whoever made the config (a value given equal to either cannot be told apart, and changes nothing)."""
    defaults = {field.name: field.default for field in dataclasses.fields(config)}
    recipe = recipe or {}
    return [
        name
        for name in names
        if getattr(config, name) != defaults[name] and (name not in recipe or getattr(config, name) != recipe[name])
    ]


def setting_words(names: Sequence[str]) -> tuple[str, str]:
    """("a setting", "it") for one name, ("settings", "them") for more: a refusal's words for what it names."""
    return ("a setting", "it") if len(names) == 1 else ("settings", "them")


def check_fields(config: Any) -> None:
    """Every field of a config dataclass has its declared type and, where declared, one of its choices; numbers are
    finite. Called by every config's __post_init__, so the command line, a --config file, KFP parameters and
    direct construction all pass the same check. No conversion: {"augment": "false"} is an error, not True."""
    hints = typing.get_type_hints(type(config))
    for field in dataclasses.fields(config):
        value = getattr(config, field.name)
        annotation, optional = _unwrap_optional(hints[field.name])
        if value is None:
            if not optional:
                raise ValueError(f"{field.name}: must be given (it cannot be null)")
            continue
        if typing.get_origin(annotation) is tuple:
            (element_type, *_rest) = typing.get_args(annotation)
            if not isinstance(value, tuple):
                raise ValueError(f"{field.name}: {shown(value)} is not a list")
            for item in value:
                _check_value(field.name, item, element_type)
        else:
            _check_value(field.name, value, annotation)
        choices = field.metadata.get("choices")
        if choices is not None and value not in choices:
            raise ValueError(f"{field.name}: {shown(value)} is not one of {', '.join(map(str, choices))}")
        interval = field.metadata.get("range")
        if interval is not None:
            for item in value if isinstance(value, tuple) else (value,):
                if not in_interval(item, interval):
                    raise ValueError(f"{field.name}: {shown(item)} is not in {interval}")


def _check_value(name: str, value: Any, annotation: Any) -> None:
    if annotation is float:
        valid = isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
        expected = "a finite number"
    elif annotation is int:
        valid, expected = isinstance(value, int) and not isinstance(value, bool), "an integer"
    elif annotation is bool:
        valid, expected = isinstance(value, bool), "true or false"
    elif annotation is str:
        valid, expected = isinstance(value, str), "a string"
        problem = scheme_problem(name, value) if valid else None
        if problem:
            raise ValueError(problem)
    elif annotation is dict:
        valid, expected = isinstance(value, dict), "a JSON object"
    else:
        return
    if not valid:
        raise ValueError(f"{name}: {shown(value)} is not {expected}")


def _converter(annotation: Any, optional: bool):
    """A function turning one command-line string into a value of `annotation`."""

    def convert(text: str):
        if optional and text.strip().lower() in ("", "none", "null"):
            return None
        if annotation is bool:
            return parse_bool(text)
        if annotation is dict:
            return _json_object(text)
        return annotation(text)

    return convert


def _json_object(text: str) -> dict:
    try:
        value = documents.load(text, "the value", "JSON object", yaml_allowed=False)
    except documents.DocumentError as error:
        raise argparse.ArgumentTypeError(f"not a JSON object ({error}): {text[:80]!r}") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f'expected a JSON object like {{"name": value}}, got {text[:80]!r}')
    return value


def add_config_arguments(parser: argparse.ArgumentParser, config_class: type) -> None:
    """Add one option per field of `config_class`; defaults are left as None so the file can supply them."""
    hints = typing.get_type_hints(config_class)
    for field in dataclasses.fields(config_class):
        annotation, optional = _unwrap_optional(hints[field.name])
        help_text = field.metadata.get("help", "")
        default = field.default if field.default is not dataclasses.MISSING else None
        if field.default_factory is not dataclasses.MISSING:
            default = field.default_factory()
        required = field.default is dataclasses.MISSING and field.default_factory is dataclasses.MISSING
        if "choices" in field.metadata:
            help_text = f"{help_text}; one of: {', '.join(map(str, field.metadata['choices']))}"
        if "range" in field.metadata:
            help_text = f"{help_text}; in {field.metadata['range']}"
        if required:
            help_text = f"{help_text} (required)"
        elif "(default:" not in help_text:  # the help's own words about the default say more than a value
            help_text = f"{help_text} (default: {'not set' if default is None else repr(default)})"
        keywords: dict[str, Any] = {"dest": field.name, "default": None, "help": help_text}
        if typing.get_origin(annotation) is tuple:
            (element_type, *_rest) = typing.get_args(annotation)
            keywords.update(nargs="*", type=_converter(element_type, False), metavar=field.name.upper())
        elif annotation is bool and not optional:
            keywords["action"] = argparse.BooleanOptionalAction
        else:
            keywords.update(type=_converter(annotation, optional), metavar=field.name.upper())
        if "choices" in field.metadata:
            keywords["choices"] = field.metadata["choices"]
        parser.add_argument(option_name(field.name), **keywords)


def with_preset(config_class: type, values: dict[str, Any]) -> dict[str, Any]:
    """`values` over the preset they name (`config_class.PRESETS[values["preset"]]`): a preset supplies every value
    not given. A length given by hand (any of `config_class.LENGTH_FIELDS`) replaces the preset's length."""
    name = values.get("preset")
    presets = getattr(config_class, "PRESETS", {})
    if name is None or name not in presets:
        return values  # no preset, or an unknown name, which the config's own check reports
    preset = dict(presets[name])
    lengths = getattr(config_class, "LENGTH_FIELDS", ())
    if any(values.get(length) is not None for length in lengths):
        preset = {key: value for key, value in preset.items() if key not in lengths}
    return {**preset, **values}


def config_from_mapping(config_class: type[ConfigT], values: dict[str, Any], origin: str) -> ConfigT:
    """Build `config_class` from a mapping (over its preset, if it names one), naming `origin` and the key in every
    error."""
    values = with_preset(config_class, values)
    check_known(values, (config_class,), origin)
    missing = [
        field.name
        for field in dataclasses.fields(config_class)
        if field.init and field.name not in values and field.default is field.default_factory is dataclasses.MISSING
    ]
    if missing:  # not Python's "__init__() missing 1 required positional argument"
        options = ", ".join(f"--{name.replace('_', '-')}" for name in missing)
        raise ValueError(f"{origin}: {', '.join(missing)}: required, and not given ({options} on the command line)")
    try:
        return config_class(**with_field_types(config_class, values))
    except (TypeError, ValueError) as error:
        raise ValueError(f"{origin}: {error}") from error


def with_field_types(config_class: type, values: dict[str, Any]) -> dict[str, Any]:
    """`values` (of `config_class`'s fields) with JSON's one number type read as each field's: 10.0 for an int field
    is 10, 1 for a float field is 1.0; lists for tuple fields are tuples. Anything else is left for the config's
    own check to refuse."""
    hints = typing.get_type_hints(config_class)
    converted = {}
    for name, value in values.items():
        if name not in hints:
            converted[name] = value
            continue
        annotation, _optional = _unwrap_optional(hints[name])
        if typing.get_origin(annotation) is tuple and isinstance(value, list):
            value = tuple(value)
        # JSON (and the protobuf Struct that carries KFP's dict parameters) has one number type: 1 is a fine
        # learning rate, and 10.0 a fine step count; 10.5 steps, "10" or true are not.
        if annotation is float and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        if annotation is int and isinstance(value, float) and value.is_integer():
            value = int(value)
        if typing.get_origin(annotation) is tuple and typing.get_args(annotation)[0] is int:
            value = tuple(int(item) if isinstance(item, float) and item.is_integer() else item for item in value)
        converted[name] = value
    return converted


def check_known(values: dict[str, Any], config_classes: tuple[type, ...], origin: str) -> None:
    """Every key names a field of one of `config_classes`; an unknown one is an error that says what was probably
    meant (the nearest field names), not a list of every field."""
    known = {field.name for config_class in config_classes for field in dataclasses.fields(config_class)}
    unknown = sorted(set(values) - known)
    if not unknown:
        return
    described = []
    for name in unknown:
        near = difflib.get_close_matches(str(name), known, n=3, cutoff=0.6)
        described.append(f"{name!r} (did you mean {' or '.join(map(repr, near))}?)" if near else repr(name))
    raise ValueError(f"{origin}: unknown configuration field(s) {', '.join(described)}; --help lists them all")


def read_config_file(path: str | Path) -> dict[str, Any]:
    """A JSON object of field names to values, from a file, or given inline (text starting with "{"), read as every
    document read back is (`documents`: a regular file, bounded in size, depth and numbers)."""
    if isinstance(path, str) and path.lstrip().startswith("{"):
        return documents.parse(path, "--config (inline)", documents.ANY_OBJECT, "configuration")
    try:
        return storage.document(path, documents.ANY_OBJECT, "configuration file", max_bytes=MAX_CONFIG_BYTES)
    except FileNotFoundError as error:
        raise ValueError(f"{path}: configuration file does not exist") from error


MAX_CONFIG_BYTES = 1 << 20


def parse_config(
    config_class: type[ConfigT], argv: Sequence[str] | None, description: str, program: str | None = None
) -> tuple[ConfigT, argparse.Namespace]:
    """Parse `argv` into a `config_class`; returns the config and the namespace (for the non-config options)."""
    (config,), namespace = parse_configs((config_class,), argv, description, program)
    return config, namespace


def parse_configs(
    config_classes: tuple[type, ...], argv: Sequence[str] | None, description: str, program: str | None = None
) -> tuple[tuple, argparse.Namespace]:
    """Parse `argv` into one config of each class (their fields are distinct options of one command line, and keys
    of one --config file); returns the configs, in order, and the namespace."""
    parser = build_parser(config_classes, description, program)
    namespace = parser.parse_args(argv)
    source = (
        ""
        if not namespace.config
        else " and inline --config"
        if namespace.config.lstrip().startswith("{")
        else f" and {namespace.config}"
    )
    origin = f"configuration (command line{source})"
    values: dict[str, Any] = read_config_file(namespace.config) if namespace.config else {}
    check_known(values, config_classes, origin)
    configs = []
    for config_class in config_classes:
        mine = {field.name: values[field.name] for field in dataclasses.fields(config_class) if field.name in values}
        for field in dataclasses.fields(config_class):
            given = getattr(namespace, field.name)
            if given is not None:
                mine[field.name] = given
        configs.append(config_from_mapping(config_class, mine, origin))
    return tuple(configs), namespace


class ArgumentParser(argparse.ArgumentParser):
    """argparse's parser, but an option given twice with two values is an error: argparse keeps the last in
    silence (`--epochs 2 ... --epochs 3`, or a make variable and EXTRA both setting it). Its subcommands' parsers are
    of its class."""

    def parse_known_args(self, args=None, namespace=None):
        problem = repeated_option(self, sys.argv[1:] if args is None else list(args))
        if problem:
            self.error(problem)
        return super().parse_known_args(args, namespace)


def repeated_option(parser: argparse.ArgumentParser, words: Sequence[str]) -> str | None:
    """The first option of `parser` that `words` give two values (a subcommand's words are its own parser's)."""
    first: dict[str, str] = {}
    index = 0
    while index < len(words) and words[index] != "--":
        name, equals, value = words[index].partition("=")
        action = parser._option_string_actions.get(name) if name.startswith("-") else None
        takes_value = isinstance(action, argparse._StoreAction) and action.nargs is None  # one value, stored
        if not takes_value:
            index += 1
            continue
        if not equals:
            value = words[index + 1] if index + 1 < len(words) else ""
        if action.dest in first and first[action.dest] != value:
            return f"{name} is given twice ({first[action.dest]!r}, then {value!r}): give it once"
        first.setdefault(action.dest, value)
        index += 1 if equals else 2
    return None


def build_parser(
    config_classes: type | tuple[type, ...], description: str, program: str | None = None
) -> argparse.ArgumentParser:
    """One option per field of each config class; no abbreviations (a misspelt `--learning-rat` is an error, not
    `--learning-rate`)."""
    parser = ArgumentParser(prog=program, description=description, allow_abbrev=False)
    parser.add_argument(
        "--config",
        default=None,
        help="JSON file (or inline JSON object) of field names to values; command-line options override it",
    )
    parser.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    for config_class in config_classes if isinstance(config_classes, tuple) else (config_classes,):
        add_config_arguments(parser, config_class)
    return parser


def config_to_dict(config: Any) -> dict[str, Any]:
    """A JSON-ready dict of a config dataclass (tuples become lists)."""
    return json.loads(json.dumps(dataclasses.asdict(config)))  # reader: a round trip of our own dataclass
