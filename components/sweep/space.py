"""The search space of a sweep: which train settings vary, and over what.

A JSON or YAML mapping of train settings (any TrainConfig field a user may set, as `python -m components.train`
names them with underscores) to a range or a list of choices:

    learning_rate: {low: 0.01, high: 0.3, log: true}     # a float range, sampled on a log scale
    depth: {low: 8, high: 20, step: 6}                   # integers: depth is an integer setting
    weight_decay: {choices: [0, 0.0005]}                 # one of these values

Each setting and each of its values is checked as the train stage would check it (a trial must never be the first
to find a value train refuses): every bound and every choice goes through TrainConfig. A setting's type decides
what its values are, not how they were written: a KFP dict parameter carries every number as a double (protobuf's
Struct), so `depth: {low: 8, high: 20}` reaches the sweep step as 8.0 and 20.0, and is still an integer range;
`learning_rate: {low: 1, high: 2}` is a float range.
"""

from __future__ import annotations

import dataclasses
import decimal
import itertools
import json
import math
from dataclasses import dataclass
from typing import Any

from components.common import storage
from components.common.values import shown

# Settings a search may not vary: where the data and the model go, how the trial is launched, and its seed.
NOT_SEARCHABLE = ("data", "model_dir", "cache_dir", "launcher", "workers", "warm_start", "train_on", "preset", "seed")
# what the sweep sets in every training itself, over anything a space would draw (the sweep's own option)
SET_BY_THE_SWEEP = {"seed": "the sweep seeds each training (its --seed, and --repeats for several seeds a trial)"}
MAX_SETTINGS = 32
MAX_CHOICES = 1000


MAX_CORNERS = 256  # combinations of the space's values checked before a search, beyond which each value alone


class SearchSpaceError(ValueError):
    """A search space a sweep cannot use: the line names the file (or parameter), the setting and the value."""


@dataclass(frozen=True)
class Dimension:
    name: str
    low: float | int | None = None
    high: float | int | None = None
    log: bool = False
    step: float | int | None = None
    choices: tuple | None = None
    integer: bool = False  # an integer setting's range (TrainConfig says which)

    def suggest(self, trial) -> Any:
        """This dimension's value for an Optuna trial."""
        if self.choices is not None:
            return trial.suggest_categorical(self.name, list(self.choices))
        if self.integer:
            return trial.suggest_int(self.name, self.low, self.high, step=int(self.step or 1), log=self.log)
        return trial.suggest_float(self.name, float(self.low), float(self.high), step=self.step, log=self.log)

    def distribution(self):
        """Optuna's distribution of this dimension (what a trial enqueued by hand must fall inside)."""
        from optuna import distributions

        if self.choices is not None:
            return distributions.CategoricalDistribution(list(self.choices))
        if self.integer:
            return distributions.IntDistribution(self.low, self.high, log=self.log, step=int(self.step or 1))
        return distributions.FloatDistribution(float(self.low), float(self.high), log=self.log, step=self.step)


@dataclass(frozen=True)
class SearchSpace:
    dimensions: tuple[Dimension, ...]

    def suggest(self, trial) -> dict[str, Any]:
        return {dimension.name: dimension.suggest(trial) for dimension in self.dimensions}

    def as_dict(self) -> dict:
        described = {}
        for dimension in self.dimensions:
            if dimension.choices is not None:
                described[dimension.name] = {"choices": list(dimension.choices)}
            else:
                entry = {"low": dimension.low, "high": dimension.high}
                entry |= {"log": True} if dimension.log else {}
                entry |= {"step": dimension.step} if dimension.step is not None else {}
                described[dimension.name] = entry
        return described

    def corners(self, limit: int = MAX_CORNERS) -> list[dict[str, Any]]:
        """Trials' settings that between them hold every choice and both bounds of every range, first the first of
        each: every combination when there are at most `limit`, else each dimension's values with the others at
        their first. A setting's use depends on another (momentum on the optimizer, a schedule's settings on the
        schedule), so a space is checked in combination, not one setting at a time."""
        values = [list(d.choices) if d.choices is not None else [d.low, d.high] for d in self.dimensions]
        names = [dimension.name for dimension in self.dimensions]
        if math.prod(len(each) for each in values) <= limit:
            return [dict(zip(names, combination, strict=True)) for combination in itertools.product(*values)]
        first = {name: each[0] for name, each in zip(names, values, strict=True)}
        return [first] + [first | {name: value} for name, each in zip(names, values, strict=True) for value in each[1:]]


def refused_trial(corner: dict[str, Any], error: Exception) -> str:
    """The one line refusing a space one of whose `corners` a trial would refuse (the sweep step's and the check
    before a run's)."""
    return f"space: a trial with {json.dumps(corner)} would be refused: {error}"


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _numeric(value: Any) -> Any:
    """YAML reads 5e-4 as text (its floats need a dot): such a number is taken as the number it spells."""
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            return value
    return value


def _dimension(name: str, spec: Any, where: str) -> Dimension:
    if not isinstance(spec, dict):
        raise SearchSpaceError(
            f"{where}: {name}: {shown(spec)} is neither a range {{low, high}} nor {{choices: [...]}}"
        )
    unknown = set(spec) - {"low", "high", "log", "step", "choices"}
    if unknown:
        raise SearchSpaceError(f"{where}: {name}: unknown key(s) {sorted(unknown)} (low, high, log, step, choices)")
    if "choices" in spec:
        if set(spec) != {"choices"}:
            raise SearchSpaceError(f"{where}: {name}: choices cannot be combined with low, high, log or step")
        choices = spec["choices"]
        if not isinstance(choices, list) or not choices or len(choices) > MAX_CHOICES:
            raise SearchSpaceError(f"{where}: {name}: choices must be a list of 1 to {MAX_CHOICES} values")
        if any(not isinstance(choice, (str, bool, int, float, type(None))) for choice in choices):
            raise SearchSpaceError(f"{where}: {name}: choices must be numbers, strings, booleans or null")
        if len({json.dumps(choice) for choice in choices}) != len(choices):
            raise SearchSpaceError(f"{where}: {name}: choices repeat a value")
        return Dimension(name, choices=tuple(choices))
    if "low" not in spec or "high" not in spec:
        raise SearchSpaceError(f"{where}: {name}: a range needs both low and high")
    low, high, log, step = (_numeric(spec["low"]), _numeric(spec["high"]), spec.get("log", False),
                            _numeric(spec.get("step")))  # fmt: skip
    if not (_number(low) and _number(high)) or not low < high:
        raise SearchSpaceError(f"{where}: {name}: low {shown(low)} and high {shown(high)} must be numbers, low < high")
    if not isinstance(log, bool):
        raise SearchSpaceError(f"{where}: {name}: log: {shown(log)} is not true or false")
    if log and low <= 0:
        raise SearchSpaceError(f"{where}: {name}: a log range needs low > 0 (it is {shown(low)})")
    if step is not None and (not _number(step) or step <= 0 or log):
        raise SearchSpaceError(f"{where}: {name}: step: {shown(step)} must be a positive number, without log")
    if step is not None:  # as Optuna reckons it (in decimals), which else moves high down to the last step, in silence
        span, by = decimal.Decimal(str(high)) - decimal.Decimal(str(low)), decimal.Decimal(str(step))
        if span % by:
            last = decimal.Decimal(str(low)) + span // by * by
            end, next_end = (format(value.normalize(), "f") for value in (last, last + by))
            raise SearchSpaceError(
                f"{where}: {name}: high {shown(high)} is not low {shown(low)} plus whole steps of {shown(step)}, and "
                f"the search would end at {end}: give high {end} or {next_end}"
            )
    return Dimension(name, low, high, log, step)


def _setting_kinds(name: str) -> set:
    """The types a train setting's values have (int, float, str, bool), from TrainConfig."""
    import typing

    from components.train.config import TrainConfig

    hint = typing.get_type_hints(TrainConfig).get(name)
    return (set(typing.get_args(hint)) - {type(None)}) or {hint}


def _typed(dimension: Dimension, where: str) -> Dimension:
    """The dimension's values as its setting's type has them: an integer setting's bounds, step and choices as
    integers (8.0 is 8; 8.5 is refused), a numeric setting's choices written as YAML 1.1 reads 5e-4 (text) as the
    numbers they spell; a float setting's range stays a float range whatever its bounds."""
    kinds = _setting_kinds(dimension.name)
    if str in kinds or not kinds & {int, float}:
        return dimension
    if dimension.choices is not None:
        choices = tuple(_numeric(choice) for choice in dimension.choices)
        if int in kinds and float not in kinds:
            choices = tuple(_whole(choice, dimension.name, where) for choice in choices)
        elif float in kinds:
            choices = tuple(float(choice) if _number(choice) else choice for choice in choices)
        return dataclasses.replace(dimension, choices=choices)
    if int in kinds and float not in kinds:
        low, high = (_whole(value, dimension.name, where) for value in (dimension.low, dimension.high))
        step = None if dimension.step is None else _whole(dimension.step, dimension.name, where)
        return dataclasses.replace(dimension, low=low, high=high, step=step, integer=True)
    low, high = float(dimension.low), float(dimension.high)
    return dataclasses.replace(dimension, low=low, high=high, step=None if dimension.step is None else
                               float(dimension.step))  # fmt: skip


def _whole(value: Any, name: str, where: str) -> Any:
    """An integer setting's value: 8.0 (as a KFP dict parameter delivers 8) is 8; 8.5 is refused."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, float):
        raise SearchSpaceError(f"{where}: {name}: {shown(value)} is not an integer ({name} is an integer setting)")
    return value


def _check_names(dimensions: list[Dimension], where: str) -> None:
    from components.train.config import TrainConfig

    fields = {item.name for item in dataclasses.fields(TrainConfig)}
    for dimension in dimensions:
        if dimension.name not in fields or dimension.name in NOT_SEARCHABLE:
            searchable = sorted(name for name in fields if name not in NOT_SEARCHABLE)
            if dimension.name in SET_BY_THE_SWEEP:
                raise SearchSpaceError(f"{where}: {dimension.name}: {SET_BY_THE_SWEEP[dimension.name]}")
            raise SearchSpaceError(
                f"{where}: {dimension.name}: not a train setting a search can vary (it can: {', '.join(searchable)})"
            )


MAX_CHECKED_VALUES = 1000  # an integer range of at most this many values has each checked, not its bounds alone


def _check_against_train(dimensions: list[Dimension], where: str) -> None:
    """Every bound and choice, one at a time, as the train stage checks it; every value of an integer range of at
    most MAX_CHECKED_VALUES (depth from 8 to 20 holds 9, which no ResNet has: a trial would fail on it)."""
    from components.train.config import TrainConfig

    for dimension in dimensions:
        values = list(dimension.choices) if dimension.choices is not None else [dimension.low, dimension.high]
        inside = dimension.choices is None and dimension.integer
        if inside and (dimension.high - dimension.low) // (dimension.step or 1) < MAX_CHECKED_VALUES:
            values = list(range(dimension.low, dimension.high + 1, dimension.step or 1))
        for value in values:
            try:
                TrainConfig(data="/search", model_dir="/search/model", **{dimension.name: value})
            except (ValueError, TypeError) as error:
                said = str(error).removeprefix(f"{dimension.name}: ")
                within = "" if value in (dimension.low, dimension.high) or dimension.choices is not None else (
                    f" (a value of the range {dimension.low}-{dimension.high}{_step_words(dimension)}; give a step "
                    "or choices that keep to the setting's values)"
                )  # fmt: skip
                raise SearchSpaceError(f"{where}: {dimension.name}: {said}{within}") from None


def _step_words(dimension: Dimension) -> str:
    return f" by {dimension.step}" if dimension.step else ""


def parse_space(document: Any, where: str) -> SearchSpace:
    """A search space from its parsed document; `where` names it in errors (a file, or the pipeline parameter)."""
    if not isinstance(document, dict) or not document:
        raise SearchSpaceError(f"{where}: a search space is a non-empty mapping of train settings to ranges or choices")
    if len(document) > MAX_SETTINGS:
        raise SearchSpaceError(f"{where}: {len(document)} settings; a search varies at most {MAX_SETTINGS}")
    dimensions = [_dimension(str(name), spec, where) for name, spec in document.items()]
    _check_names(dimensions, where)
    dimensions = [_typed(dimension, where) for dimension in dimensions]
    _check_against_train(dimensions, where)
    return SearchSpace(tuple(dimensions))


def read_space(location: str) -> SearchSpace:
    """A search space from a JSON or YAML file, or from inline JSON (the pipeline parameter's text), read by the one
    reader of documents (size, depth and number bounds; a syntax error's line and column)."""
    from components.common import documents

    text = location.strip()
    shown_location = shown(location, 60)
    try:
        if text.startswith(("{", "[")):
            return parse_space(documents.load(text, "space", "search space", yaml_allowed=False), "space")
        content = storage.document_bytes(location, "search space (JSON or YAML)")
        return parse_space(documents.load(content, location, "search space"), location)
    except FileNotFoundError:
        raise SearchSpaceError(f"space: {shown_location}: the search space file does not exist") from None
    except OSError as error:  # a name too long to be a file's, a folder, one it may not read
        raise SearchSpaceError(
            f"space: {shown_location}: neither inline JSON ({{...}}) nor a file that can be read ({error.strerror})"
        ) from None
    except documents.DocumentError as error:
        raise SearchSpaceError(str(error)) from None
