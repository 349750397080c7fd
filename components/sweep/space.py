"""The search space of a sweep: which train settings vary, and over what.

A JSON or YAML mapping of train settings (any TrainConfig field a user may set, as `python -m components.train`
names them with underscores) to a range or a list of choices:

    learning_rate: {low: 0.01, high: 0.3, log: true}     # a float range, sampled on a log scale
    depth: {low: 8, high: 20, step: 6}                   # integers when both bounds are integers
    weight_decay: {choices: [0, 0.0005]}                 # one of these values

Each setting and each of its values is checked as the train stage would check it (a trial must never be the first
to find a value train refuses): every bound and every choice goes through TrainConfig.
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass
from typing import Any

from components.common.values import shown

# Settings a search may not vary: where the data and the model go, and how the trial is launched.
NOT_SEARCHABLE = ("data", "model_dir", "cache_dir", "launcher", "workers", "warm_start", "train_on", "preset")
MAX_SETTINGS = 32
MAX_CHOICES = 1000


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

    @property
    def integer(self) -> bool:
        return self.choices is None and isinstance(self.low, int) and isinstance(self.high, int)

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
    return Dimension(name, low, high, log, step)


def _typed_choices(dimension: Dimension) -> Dimension:
    """Choices of a numeric train setting written as YAML reads 5e-4 (text) taken as the numbers they spell."""
    import typing

    from components.train.config import TrainConfig

    if dimension.choices is None:
        return dimension
    hints = typing.get_type_hints(TrainConfig)
    kinds = set(typing.get_args(hints.get(dimension.name))) or {hints.get(dimension.name)}
    if str in kinds or not kinds & {int, float}:
        return dimension
    return dataclasses.replace(dimension, choices=tuple(_numeric(choice) for choice in dimension.choices))


def _check_against_train(dimensions: list[Dimension], where: str) -> None:
    """Every bound and choice, one at a time, as the train stage checks it."""
    from components.train.config import TrainConfig

    fields = {item.name: item for item in dataclasses.fields(TrainConfig)}
    for dimension in dimensions:
        if dimension.name not in fields or dimension.name in NOT_SEARCHABLE:
            searchable = sorted(name for name in fields if name not in NOT_SEARCHABLE)
            raise SearchSpaceError(
                f"{where}: {dimension.name}: not a train setting a search can vary (it can: {', '.join(searchable)})"
            )
        values = list(dimension.choices) if dimension.choices is not None else [dimension.low, dimension.high]
        for value in values:
            try:
                TrainConfig(data="/search", model_dir="/search/model", **{dimension.name: value})
            except (ValueError, TypeError) as error:
                raise SearchSpaceError(f"{where}: {dimension.name}: {shown(value)}: {error}") from None


def parse_space(document: Any, where: str) -> SearchSpace:
    """A search space from its parsed document; `where` names it in errors (a file, or the pipeline parameter)."""
    if not isinstance(document, dict) or not document:
        raise SearchSpaceError(f"{where}: a search space is a non-empty mapping of train settings to ranges or choices")
    if len(document) > MAX_SETTINGS:
        raise SearchSpaceError(f"{where}: {len(document)} settings; a search varies at most {MAX_SETTINGS}")
    dimensions = [_typed_choices(_dimension(str(name), spec, where)) for name, spec in document.items()]
    _check_against_train(dimensions, where)
    return SearchSpace(tuple(dimensions))


def read_space(location: str) -> SearchSpace:
    """A search space from a JSON or YAML file, or from inline JSON (the pipeline parameter's text)."""
    import yaml

    from components.common import documents

    text = location.strip()
    if text.startswith("{"):
        where, content = "space", text
        try:
            return parse_space(json.loads(text), where)  # JSON first: YAML 1.1 reads 1e-05 as text
        except json.JSONDecodeError:
            pass
    else:
        try:
            content = documents.read_bytes(location, "search space (JSON or YAML)").decode("utf-8")
        except FileNotFoundError:
            raise SearchSpaceError(f"{location}: the search space file does not exist") from None
        except UnicodeDecodeError:
            raise SearchSpaceError(f"{location}: not UTF-8 text; expected a search space (JSON or YAML)") from None
        where = location
    try:
        document = yaml.safe_load(content)  # JSON is YAML
    except yaml.YAMLError as error:
        raise SearchSpaceError(f"{where}: not JSON or YAML: {str(error).splitlines()[0]}") from None
    return parse_space(document, where)
