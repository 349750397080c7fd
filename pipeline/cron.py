"""A recurring run's cron expression, checked as the KFP API server parses it (robfig/cron v1's `cron.Parse`: six
fields, seconds first, or a descriptor such as `@daily` or `@every 6h`), so that a bad one is refused before anything
is submitted, with the field and value named. Five fields, which the server also takes (the day of week left out),
are refused here: '0 3 * * *' is a standard cron's 03:00 daily, and the server would read it as minute 3 of every
hour."""

from __future__ import annotations

import re

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
_DURATION = re.compile(r"(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:ns|us|µs|μs|ms|s|m|h)")  # one term of time.ParseDuration


def cron_problem(expression: str) -> str | None:
    """What is wrong with `expression` as a KFP recurring run's cron, in words naming the field and value; None when
    the KFP API server takes it."""
    spec = expression.strip()
    if spec.startswith("@"):
        return _descriptor_problem(spec)
    fields = spec.split()
    if len(fields) != len(FIELDS):
        return f"it has {len(fields)} fields; KFP's cron has six, seconds first: '0 0 3 * * *' is every day at 03:00"
    for value, (name, lowest, highest, names) in zip(fields, FIELDS, strict=True):
        for part in value.split(","):
            problem = _range_problem(part, lowest, highest, names)
            if problem:
                return f"{name} {value!r}: {problem} ({name} run {lowest}-{highest}; {EXAMPLE})"
    return None


def _range_problem(part: str, lowest: int, highest: int, names: dict[str, int]) -> str | None:
    """robfig/cron v1's getRange: `*` or `?`, a value or a name, `low-high`, each with an optional `/step`."""
    range_and_step = part.split("/")
    if len(range_and_step) > 2:
        return f"{part!r} has more than one '/'"
    low_and_high = range_and_step[0].split("-")
    if low_and_high[0] in ("*", "?"):
        start, end = lowest, highest
    else:
        if len(low_and_high) > 2:
            return f"{part!r} has more than one '-'"
        values = []
        for text in low_and_high:
            number = names.get(text.lower()) if names else None
            if number is None:
                if not _INTEGER.fullmatch(text):
                    return f"{text!r} is not a number" + (f" or a name ({', '.join(names)})" if names else "")
                number = int(text)
                if number < 0:
                    return f"{number} is negative"
            values.append(number)
        start, end = values[0], values[-1]
    if len(range_and_step) == 2:
        if not _INTEGER.fullmatch(range_and_step[1]) or int(range_and_step[1]) < 0:
            return f"the step {range_and_step[1]!r} is not a whole number"
        if int(range_and_step[1]) == 0:
            return "a step of 0"
        if len(low_and_high) == 1:
            end = highest  # "5/15": from 5 to the field's end
    if start < lowest:
        return f"{start} is below {lowest}"
    if end > highest:
        return f"{end} is above {highest}"
    if start > end:
        return f"{start}-{end} runs backwards"
    return None


def _descriptor_problem(spec: str) -> str | None:
    if spec in DESCRIPTORS:
        return None
    if spec.startswith("@every "):
        duration = spec[len("@every ") :].strip()
        terms = duration.lstrip("+")
        if terms and re.fullmatch(f"(?:{_DURATION.pattern})+", terms):
            return None
        return f"@every {duration!r} is not a duration (such as 6h or 1h30m)"
    return f"{spec.split()[0]!r} is not a descriptor KFP knows ({', '.join(DESCRIPTORS)}, @every 6h)"
