"""Logging set-up shared by every stage's entry point.

Log lines quote what they are given (file names, class names, error messages of other programs), and a name is
input: a newline in it could forge a log line ("... ERROR ..."), an escape sequence could repaint the terminal.
So every message is printed with its control characters escaped (`\\n`, `\\x1b`, `\\u202e`), except tabs, and so is
a file name that is not UTF-8 (its undecodable bytes, held as surrogates, as `\\udcff`); a
traceback, which this program writes itself, is printed as it is.

No secret reaches a line: every formatted record, its traceback included, goes through `secrets.mask` (the tokens
and keys this process knows, and anything shaped like a credential: an Authorization header, a session cookie, a
URL's user-info).
"""

from __future__ import annotations

import logging
import os
import unicodedata

from components.common import secrets

LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
# Characters that move the cursor or change how the rest of a line reads: C0/C1 controls, line and paragraph
# separators, and the bidirectional overrides and isolates.
_INVISIBLE_FORMAT = {"\u2028", "\u2029", *map(chr, range(0x202A, 0x202F)), *map(chr, range(0x2066, 0x206A))}


def escape_controls(text: str) -> str:
    """`text` with every control character written as its Python escape; tabs kept."""
    if text.isprintable():
        return text
    return "".join(
        character
        if character == "\t"
        or (unicodedata.category(character) not in ("Cc", "Cs") and character not in _INVISIBLE_FORMAT)
        else character.encode("unicode_escape").decode("ascii")
        for character in text
    )


class EscapingFormatter(logging.Formatter):
    """A formatter whose lines hold neither raw control characters nor secrets (see the module's description)."""

    def format(self, record: logging.LogRecord) -> str:
        return secrets.mask(super().format(record))

    def formatMessage(self, record: logging.LogRecord) -> str:  # noqa: N802 (logging's name)
        original = record.message
        record.message = escape_controls(original)
        try:
            return super().formatMessage(record)
        finally:
            record.message = original


def setup_logging(level: str = "INFO") -> None:
    """Configure the root logger once, to stderr, and quieten TensorFlow's C++ start-up chatter."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    secrets.remember_environment()
    logging.basicConfig(level=getattr(logging, level.upper()), format=LOG_FORMAT, force=True)
    for handler in logging.getLogger().handlers:
        handler.setFormatter(EscapingFormatter(LOG_FORMAT))
    for noisy in ("urllib3", "google", "absl", "h5py"):
        logging.getLogger(noisy).setLevel(max(logging.WARNING, logging.getLogger().level))
