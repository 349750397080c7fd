"""The shape every stage's `__main__` shares: parse the config, set up logging, run, report errors clearly."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

from components.common import exit_codes
from components.common.config import parse_configs
from components.common.logs import setup_logging


def run_stage(
    config_class: type | tuple[type, ...],
    run: Callable[[Any], Any],
    argv: Sequence[str] | None,
    description: str,
    program: str,
    expected_errors: tuple[type[BaseException], ...] = (ValueError,),
) -> int:
    """Parse `argv` into `config_class` (or one config per class of a tuple), call `run(config, ...)`; a bad input
    logs one clear line and exits 2.

    When `run` returns an int, that is the exit code (0 otherwise).
    """
    classes = config_class if isinstance(config_class, tuple) else (config_class,)
    try:
        configs, namespace = parse_configs(classes, argv, description, program)
    except ValueError as error:
        setup_logging("INFO")
        logging.getLogger(program).error("%s", error)
        return exit_codes.BAD_INPUT
    setup_logging(namespace.log_level)
    try:
        outcome = run(*configs)
    except expected_errors as error:
        logging.getLogger(program).error("%s", error)
        return exit_codes.BAD_INPUT
    return outcome if isinstance(outcome, int) and not isinstance(outcome, bool) else 0
