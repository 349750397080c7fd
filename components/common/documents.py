"""Reading back a JSON document the project did not just write itself: one reader for all of them.

A `--config` file, a model directory's config.json and metrics, a promotion root's current.json and serving.json, a
baseline, a dataset's manifest and statistics.json, a run folder's run.json, a writer's lease: each was written by
this project once, but what is read back may have been edited by hand, damaged, replaced by a link or a special
file, or written by another release. Each is read here (`read`, or `parse` for bytes a store handed over), under
the same rules:

- the file: a regular file (a FIFO, a device or a socket is refused without blocking on it), not a link leading
  out of its root, at most `max_bytes` (checked before reading), UTF-8;
- the JSON: at most MAX_DEPTH levels deep, integers of at most MAX_INTEGER_DIGITS digits, no NaN or Infinity (nor a
  number that overflows to one), strings of at most MAX_TEXT characters, an object at the top;
- the values: a schema of the fields the reader uses (`Fields`, `Number`, `Text`, `Flag`, `Items`, `Location`):
  types, intervals (the same as the config fields they mirror), choices, paths confined to the document's root.

Every failure is a DocumentError (a ValueError: exit 2) of one line naming the file and the field, a value shown
shortened (`shown`), raised within a few milliseconds and without reading more than `max_bytes`.
"""

from __future__ import annotations

import json
import math
import os
import posixpath
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from components.common import filesystem
from components.common.values import in_interval, shown

MAX_DOCUMENT_BYTES = 4 << 20  # configs, pointers, metrics, records: kilobytes when well-formed
MAX_DEPTH = 32
MAX_INTEGER_DIGITS = 30
MAX_TEXT = 64 << 10


class DocumentError(ValueError):
    """A document read back is not what its reader accepts; the message names the file and the field."""


# -- schemas ---------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Number:
    interval: str = "(-inf, inf)"
    integer: bool = False
    nullable: bool = False


@dataclass(frozen=True)
class Text:
    choices: tuple[str, ...] | None = None
    max_length: int = 4096
    nullable: bool = False


@dataclass(frozen=True)
class Flag:
    nullable: bool = False


@dataclass(frozen=True)
class Location:
    """A path or gs:// / s3:// URI that must lie inside the document's root (given to `read`/`parse`)."""

    nullable: bool = False


@dataclass(frozen=True)
class Items:
    item: Any
    max_items: int = 1_000_000
    length: int | None = None
    nullable: bool = False


@dataclass(frozen=True)
class Fields:
    """An object: `fields` checked when present, `required` ones present; other fields are allowed unless
    `closed` (their values still obey the JSON bounds)."""

    fields: Mapping[str, Any] = field(default_factory=dict)
    required: tuple[str, ...] = ()
    closed: bool = False
    nullable: bool = False


ANY_OBJECT = Fields()


def check_size(content: bytes, location: str, kind: str, max_bytes: int = MAX_DOCUMENT_BYTES) -> bytes:
    if len(content) > max_bytes:
        raise DocumentError(f"{location}: {len(content):,} bytes, more than a {kind} may have ({max_bytes:,})")
    return content


def parse(
    content: bytes | str,
    origin: str,
    schema: Fields,
    kind: str,
    root: str | Path | None = None,
) -> dict:
    """`content` parsed within the JSON bounds and checked against `schema`, errors naming `origin`."""
    reader = _Reader(origin, kind, None if root is None else str(root))
    content = _text_within_depth(content, reader, kind)
    try:
        document = json.loads(
            content, parse_int=_integer, parse_float=_float, parse_constant=_NonFinite, object_pairs_hook=_object
        )
    except json.JSONDecodeError as error:
        raise reader.fail("", f"not valid JSON ({error.msg} at line {error.lineno} column {error.colno})") from error
    except RecursionError as error:  # the depth count missed a form: still one line
        raise reader.fail("", f"nested too deep for a {kind}") from error
    reader.check_bounds(document, "")
    if not isinstance(document, dict):
        raise reader.fail("", f"expected a JSON object, got {_type_name(document)}")
    reader.check(document, schema, "")
    return document


def load(content: bytes | str, origin: str, kind: str, yaml_allowed: bool = True) -> Any:
    """A JSON (or, with `yaml_allowed`, YAML) value of any shape within the bounds every document obeys: depth
    (counted before the document is built, so a deeply nested one costs nothing), integer digits, finite numbers,
    string sizes, no field given twice; YAML without aliases (an alias bomb expands when written). Errors are one
    line naming `origin` and, for a syntax error, the line and column."""
    reader = _Reader(origin, kind, None)
    content = _text(content, reader)
    as_json = not yaml_allowed or content.lstrip().startswith(("{", "["))
    if as_json:
        _check_depth(content, reader, kind)
    try:  # JSON first where it may be JSON: its numbers are exact (YAML 1.1 reads 1e-05 as text)
        document = _json(content, reader, kind) if as_json else _yaml(content, reader, kind)
    except DocumentError:
        if not yaml_allowed or not as_json:
            raise
        document = _yaml(content, reader, kind)  # a YAML flow mapping: {low: 0.01, high: 0.3}
    reader.check_bounds(document, "")
    return document


def load_foreign(content: bytes | str, origin: str, kind: str) -> Any:
    """A JSON value in another program's own format (an Optuna journal line, which may hold NaN): its depth bounded
    before it is built, its values that program's to check."""
    reader = _Reader(origin, kind, None)
    content = _text_within_depth(content, reader, kind)
    try:
        return json.loads(content)
    except json.JSONDecodeError as error:
        raise reader.fail("", f"not valid JSON ({error.msg} at line {error.lineno}, column {error.colno})") from None


def _text(content: bytes | str, reader: _Reader) -> str:
    if isinstance(content, bytes):
        try:
            return content.decode("utf-8")
        except UnicodeDecodeError as error:
            raise reader.fail("", f"not UTF-8 text (byte {error.start})") from error
    return content


def _check_depth(content: str, reader: _Reader, kind: str) -> None:
    """Counted on the text, before anything is built: a deeply nested document costs nothing."""
    depth = _depth(content)
    if depth > MAX_DEPTH:
        raise reader.fail("", f"nested {depth:,} levels deep, more than the {MAX_DEPTH} a {kind} may have")


def _text_within_depth(content: bytes | str, reader: _Reader, kind: str) -> str:
    content = _text(content, reader)
    _check_depth(content, reader, kind)
    return content


def _json(content: str, reader: _Reader, kind: str) -> Any:
    try:
        return json.loads(
            content, parse_int=_integer, parse_float=_float, parse_constant=_NonFinite, object_pairs_hook=_object
        )
    except json.JSONDecodeError as error:
        raise reader.fail("", f"not valid JSON ({error.msg} at line {error.lineno}, column {error.colno})") from None
    except RecursionError as error:
        raise reader.fail("", f"nested too deep for a {kind}") from error


def _yaml(content: str, reader: _Reader, kind: str) -> Any:
    import yaml

    try:
        depth = 0
        for event in yaml.parse(content, Loader=yaml.SafeLoader):  # events come one at a time: stop at the bound
            if isinstance(event, yaml.MappingStartEvent | yaml.SequenceStartEvent):
                depth += 1
                if depth > MAX_DEPTH:
                    raise reader.fail("", f"nested more than the {MAX_DEPTH} levels a {kind} may have")
            elif isinstance(event, yaml.MappingEndEvent | yaml.SequenceEndEvent):
                depth -= 1
            elif isinstance(event, yaml.AliasEvent):
                raise reader.fail("", f"a YAML alias (*{event.anchor}); write the value out instead")
        return yaml.load(content, Loader=_unique_key_loader())  # a SafeLoader that marks repeated keys
    except DocumentError:
        raise
    except yaml.MarkedYAMLError as error:
        mark = error.problem_mark or error.context_mark
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = error.problem or error.context or "not YAML"
        raise reader.fail("", f"not valid JSON or YAML ({problem}{where})") from None
    except yaml.YAMLError as error:
        raise reader.fail("", f"not valid JSON or YAML ({str(error).splitlines()[0]})") from None
    except (RecursionError, ValueError) as error:  # ValueError: an integer of thousands of digits, say
        raise reader.fail("", f"a value YAML cannot build ({str(error).splitlines()[0][:120]})") from None


def _unique_key_loader():
    import yaml

    class UniqueKeyLoader(yaml.SafeLoader):
        def construct_mapping(self, node, deep=False):
            document = {}
            for key_node, value_node in node.value:
                key = self.construct_object(key_node, deep=deep)
                value = self.construct_object(value_node, deep=deep)
                document[key] = _Duplicate(str(key)) if key in document else value
            return document

    UniqueKeyLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, UniqueKeyLoader.construct_mapping)
    # Numbers as JSON writes them: YAML 1.1 wants a dot in a float, so that 1e-05 would be text.
    UniqueKeyLoader.yaml_implicit_resolvers = {
        first: [(tag, regexp) for tag, regexp in resolvers if tag != "tag:yaml.org,2002:float"]
        for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
    }
    UniqueKeyLoader.add_implicit_resolver(
        "tag:yaml.org,2002:float",
        re.compile(r"^(?:[-+]?(?:[0-9][0-9_]*)\.[0-9_]*(?:[eE][-+]?[0-9]+)?|[-+]?(?:[0-9][0-9_]*)(?:[eE][-+]?[0-9]+)"
                   r"|\.[0-9_]+(?:[eE][-+][0-9]+)?|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$"),
        list("-+0123456789."),
    )  # fmt: skip
    return UniqueKeyLoader


# -- the parts ----------------------------------------------------------------------------------------------------

_STRINGS = re.compile(r'"(?:[^"\\]|\\.)*"', re.DOTALL)
_BRACKETS = re.compile(r"[\[\]{}]")


def _depth(text: str) -> int:
    """How deep arrays and objects nest in `text` (outside strings), without recursion."""
    depth = deepest = 0
    for match in _BRACKETS.finditer(_STRINGS.sub("", text)):
        depth += 1 if match.group() in "[{" else -1
        deepest = max(deepest, depth)
    return deepest


class _Oversized:
    def __init__(self, text: str):
        self.digits = len(text.lstrip("-"))


class _NonFinite:
    def __init__(self, text: str):
        self.text = text


class _Duplicate:
    def __init__(self, name: str):
        self.name = name


def _integer(text: str):
    return _Oversized(text) if len(text.lstrip("-")) > MAX_INTEGER_DIGITS else int(text)


def _float(text: str):
    if len(text) > 2 * MAX_INTEGER_DIGITS:
        return _Oversized(text)
    value = float(text)
    return value if math.isfinite(value) else _NonFinite(text)


def _object(pairs: list[tuple[str, Any]]) -> dict:
    document: dict = {}
    for name, value in pairs:
        if name in document:
            document[name] = _Duplicate(name)  # a field given twice: which one was meant is not knowable
        else:
            document[name] = value
    return document


def _type_name(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true or false"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "a list"
    return "an object"


def _join(where: str, name: str | int) -> str:
    if isinstance(name, int):
        return f"{where}[{name}]"
    return f"{where}.{name}" if where else str(name)


@dataclass
class _Reader:
    origin: str
    kind: str
    root: str | None

    def fail(self, where: str, problem: str) -> DocumentError:
        at = f"{where}: " if where else ""
        return DocumentError(f"{self.origin}: not a valid {self.kind}: {at}{problem}")

    def check_bounds(self, value: Any, where: str) -> None:
        """The rules every value of every document obeys, whatever its schema."""
        stack = [(value, where)]
        while stack:
            value, where = stack.pop()
            if isinstance(value, _Oversized):
                raise self.fail(where, f"a number of {value.digits:,} digits (at most {MAX_INTEGER_DIGITS})")
            if isinstance(value, _NonFinite):
                raise self.fail(where, f"{value.text[:20]} is not a finite number")
            if isinstance(value, _Duplicate):
                raise self.fail(where, "given more than once")
            if isinstance(value, int) and not isinstance(value, bool) and abs(value) >= 10**MAX_INTEGER_DIGITS:
                raise self.fail(where, f"a number of more than {MAX_INTEGER_DIGITS} digits")
            if isinstance(value, float) and not math.isfinite(value):
                raise self.fail(where, f"{value} is not a finite number")
            if isinstance(value, str) and len(value) > MAX_TEXT:
                raise self.fail(where, f"a string of {len(value):,} characters (at most {MAX_TEXT:,})")
            if isinstance(value, dict):
                for name, item in value.items():
                    if len(name) > 256:
                        raise self.fail(where or "the top level", f"a field name of {len(name):,} characters")
                    stack.append((item, _join(where, name)))
            elif isinstance(value, list):
                stack.extend((item, _join(where, index)) for index, item in enumerate(value))

    def check(self, value: Any, spec: Any, where: str) -> None:
        if value is None:
            if not getattr(spec, "nullable", True):
                raise self.fail(where, "must be given (it cannot be null)")
            return
        if isinstance(spec, Fields):
            self._check_fields(value, spec, where)
        elif isinstance(spec, Items):
            if not isinstance(value, list):
                raise self.fail(where, f"expected a list, got {_type_name(value)}")
            if len(value) > spec.max_items or (spec.length is not None and len(value) != spec.length):
                wanted = spec.length if spec.length is not None else f"at most {spec.max_items:,}"
                raise self.fail(where, f"a list of {len(value):,} items ({wanted} expected)")
            for index, item in enumerate(value):
                self.check(item, spec.item, _join(where, index))
        elif isinstance(spec, Number):
            number = isinstance(value, int | float) and not isinstance(value, bool)
            if not number or (spec.integer and not isinstance(value, int)):
                expected = "an integer" if spec.integer else "a number"
                raise self.fail(where, f"expected {expected}, got {shown(value)}")
            if not in_interval(value, spec.interval):
                raise self.fail(where, f"{shown(value)} is not in {spec.interval}")
        elif isinstance(spec, Text | Location):
            if not isinstance(value, str):
                raise self.fail(where, f"expected a string, got {_type_name(value)} {shown(value)}")
            if isinstance(spec, Text):
                if len(value) > spec.max_length:
                    raise self.fail(where, f"a string of {len(value):,} characters (at most {spec.max_length:,})")
                if spec.choices is not None and value not in spec.choices:
                    raise self.fail(where, f"{shown(value)} is not one of {', '.join(spec.choices)}")
            elif self.root is not None and not confined(value, self.root):
                raise self.fail(where, f"{shown(value)} is not inside {self.root}")
        elif isinstance(spec, Flag) and not isinstance(value, bool):
            raise self.fail(where, f"expected true or false, got {shown(value)}")

    def _check_fields(self, value: Any, spec: Fields, where: str) -> None:
        if not isinstance(value, dict):
            raise self.fail(where, f"expected an object, got {_type_name(value)} {shown(value)}")
        for name in spec.required:
            if name not in value:
                raise self.fail(_join(where, name), "missing")
        if spec.closed:
            unknown = sorted(set(value) - set(spec.fields))
            if unknown:
                raise self.fail(_join(where, unknown[0]), f"not a field of a {self.kind}")
        for name, field_spec in spec.fields.items():
            if name in value:
                self.check(value[name], field_spec, _join(where, name))


def confined(location: str, root: str) -> bool:
    """Whether `location` lies inside `root` (or is it), after `.` and `..` are resolved: on the same store and
    bucket for gs:// and s3://; a local path lexically (callers resolve links themselves, as `read` does)."""
    if filesystem.is_remote(location) or filesystem.is_remote(root):
        if not (filesystem.is_remote(location) and filesystem.is_remote(root)):
            return False
        scheme, _, rest = location.partition("://")
        root_scheme, _, root_rest = root.partition("://")
        if scheme != root_scheme or ".." in rest.split("/"):
            return False
        bucket, _, key = rest.partition("/")
        root_bucket, _, root_key = root_rest.partition("/")
        key, root_key = key.strip("/"), root_key.strip("/")
        return bucket == root_bucket and (not root_key or key == root_key or key.startswith(root_key + "/"))
    path = posixpath.normpath(os.path.abspath(location))
    base = posixpath.normpath(os.path.abspath(root))
    return path == base or path.startswith(base.rstrip("/") + "/")
