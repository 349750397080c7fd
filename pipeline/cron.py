"""A recurring run's cron expression, checked as the KFP API server parses it (robfig/cron v1's `cron.Parse`: six
fields, seconds first, or a descriptor such as `@daily` or `@every 6h`), so that a bad one is refused before anything
is submitted, with the field and value named. Five fields, which the server also takes (the day of week left out),
are refused here: '0 3 * * *' is a standard cron's 03:00 daily, and the server would read it as minute 3 of every
hour."""

from __future__ import annotations

import re
from fractions import Fraction

MONTHS = ("jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec")
WEEKDAYS = ("sun", "mon", "tue", "wed", "thu", "fri", "sat")
# (name, lowest, highest, names) of the six fields, as robfig/cron v1 bounds them
FIELDS = (
    ("seconds", 0, 59, {}),
    ("minutes", 0, 59, {}),
    ("hours", 0, 23, {}),
    ("day of month", 1, 31, {}),
    ("month", 1, 12, {name: index + 1 for index, name in enumerate(MONTHS)}),
    ("day of week", 0, 6, {name: index for index, name in enumerate(WEEKDAYS)}),
)
DESCRIPTORS = ("@yearly", "@annually", "@monthly", "@weekly", "@daily", "@midnight", "@hourly")
EXAMPLE = "six fields, seconds first: '0 0 3 * * *' is every day at 03:00"
_INTEGER = re.compile(r"[+-]?[0-9]+")  # what Go's strconv.Atoi reads
UNIT_SECONDS = {"ns": "1e-9", "us": "1e-6", "µs": "1e-6", "μs": "1e-6", "ms": "1e-3", "s": "1", "m": "60", "h": "3600"}
_DURATION = re.compile(r"(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:ns|us|µs|μs|ms|s|m|h)")  # one term of time.ParseDuration


# the last day of each month; February's 29th comes every fourth year, and robfig/cron runs it then
DAYS_IN_MONTH = (31, 29, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31)


class _FieldError(Exception):
    """What is wrong with one part of a field."""


def cron_problem(expression: str) -> str | None:
    """What is wrong with `expression` as a KFP recurring run's cron, in words naming the field and value; None when
    the KFP API server takes it and it runs as written (not a date no month has, not an interval the server rounds)."""
    spec = expression.strip()
    if spec.startswith("@"):
        return _descriptor_problem(spec)
    fields = spec.split()
    if len(fields) != len(FIELDS):
        return f"it has {len(fields)} fields; KFP's cron has six, seconds first: '0 0 3 * * *' is every day at 03:00"
    chosen = []
    for value, (name, lowest, highest, names) in zip(fields, FIELDS, strict=True):
        try:
            chosen.append({number for part in value.split(",") for number in _values(part, lowest, highest, names)})
        except _FieldError as problem:
            return f"{name} {value!r}: {problem} ({name} run {lowest}-{highest}; {EXAMPLE})"
    days, months = chosen[3], chosen[4]
    # With the day of week * (or ?), robfig/cron runs on the days of month alone; a date no month has never comes
    if fields[5] in ("*", "?") and not any(day <= DAYS_IN_MONTH[month - 1] for month in months for day in days):
        return f"day of month {fields[3]!r} in month {fields[4]!r}: no such date, so it would never run ({EXAMPLE})"
    return None


def _values(part: str, lowest: int, highest: int, names: dict[str, int]) -> range:
    """robfig/cron v1's getRange: `*` or `?`, a value or a name, `low-high`, each with an optional `/step`."""
    range_and_step = part.split("/")
    if len(range_and_step) > 2:
        raise _FieldError(f"{part!r} has more than one '/'")
    low_and_high = range_and_step[0].split("-")
    if low_and_high[0] in ("*", "?"):
        start, end = lowest, highest
    else:
        if len(low_and_high) > 2:
            raise _FieldError(f"{part!r} has more than one '-'")
        values = []
        for text in low_and_high:
            number = names.get(text.lower()) if names else None
            if number is None:
                if not _INTEGER.fullmatch(text):
                    named = f" or a name ({', '.join(names)})" if names else ""
                    raise _FieldError(f"{text!r} is not a number{named}")
                number = int(text)
                if number < 0:
                    raise _FieldError(f"{number} is negative")
            values.append(number)
        start, end = values[0], values[-1]
    step = 1
    if len(range_and_step) == 2:
        if not _INTEGER.fullmatch(range_and_step[1]) or int(range_and_step[1]) < 0:
            raise _FieldError(f"the step {range_and_step[1]!r} is not a whole number")
        step = int(range_and_step[1])
        if step == 0:
            raise _FieldError("a step of 0")
        if len(low_and_high) == 1:
            end = highest  # "5/15": from 5 to the field's end
    if start < lowest:
        raise _FieldError(f"{start} is below {lowest}")
    if end > highest:
        raise _FieldError(f"{end} is above {highest}")
    if start > end:
        raise _FieldError(f"{start}-{end} runs backwards")
    return range(start, end + 1, step)


def _descriptor_problem(spec: str) -> str | None:
    if spec in DESCRIPTORS:
        return None
    if spec.startswith("@every "):
        duration = spec[len("@every ") :].strip()
        terms = duration.lstrip("+")
        if terms and re.fullmatch(f"(?:{_DURATION.pattern})+", terms):
            seconds = sum(  # exactly, as Go counts nanoseconds
                Fraction(number) * Fraction(UNIT_SECONDS[unit])
                for number, unit in re.findall(r"([0-9.]+)([a-zµμ]+)", terms)
            )
            if seconds < 1 or seconds != int(seconds):  # robfig/cron's Every: at least 1 s, the fraction dropped
                return (
                    f"@every {duration!r}: KFP runs an interval in whole seconds, at least one, so it would run every "
                    f"{max(1, int(seconds))}s; give whole seconds, such as 6h or 1h30m"
                )
            return None
        return f"@every {duration!r} is not a duration (such as 6h or 1h30m)"
    return f"{spec.split()[0]!r} is not a descriptor KFP knows ({', '.join(DESCRIPTORS)}, @every 6h)"
