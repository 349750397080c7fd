"""The shape every stage's `__main__` shares: parse the config, set up logging, run, report errors clearly."""

from __future__ import annotations

import contextlib
import logging
import sys
from collections.abc import Callable, Sequence
from typing import Any

from components.common import exit_codes, file_errors, out_of_space
from components.common.config import parse_configs
from components.common.filesystem import StoreUnavailableError
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
    except Exception as error:
        code = report_error(error, program, expected_errors)
        if code is None:
            raise
        return code
    return outcome if isinstance(outcome, int) and not isinstance(outcome, bool) else 0


def report_error(error: BaseException, program: str, expected_errors: tuple[type[BaseException], ...]) -> int | None:
    """Log `error` as the one line it deserves and return its exit code: a full disk (retryable), a path it may not
    use or name (bad input), an expected error (bad input, final); None for anything else, a bug, whose traceback is
    the useful report."""
    if out_of_space.out_of_space(error):  # before the expected errors: a full disk is not a bad input
        logging.getLogger(program).error("%s (exit %d)", out_of_space.describe(error), exit_codes.NO_SPACE)
        return exit_codes.NO_SPACE
    if isinstance(error, StoreUnavailableError):  # before the expected errors: a store's bad moment is retried
        logging.getLogger(program).error("%s (exit %d)", error, exit_codes.STORE_UNAVAILABLE)
        return exit_codes.STORE_UNAVAILABLE
    denied = file_errors.describe(error)  # a folder it may not write, a name that is not UTF-8: a setting to fix
    if denied is not None:
        logging.getLogger(program).error("%s", denied)
        return exit_codes.BAD_INPUT
    if isinstance(error, expected_errors):
        logging.getLogger(program).error("%s", error)
        return exit_codes.BAD_INPUT
    return None


@contextlib.contextmanager
def component_errors(program: str, expected_errors: tuple[type[BaseException], ...] = (ValueError,)):
    """A KFP component's body: logging set up, and an error it expects (or a full disk) ends the step with one line
    and its exit code instead of a traceback, as the stage's command line does."""
    setup_logging()
    try:
        yield
    except Exception as error:
        code = report_error(error, program, expected_errors)
        if code is None:
            raise
        sys.exit(code)
