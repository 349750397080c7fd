"""A bearer token kept in a file (a projected service-account token, `kubectl create token ... > FILE`): read the same
way wherever the project sends one (the KFP API, the Model Registry), bounded and without blocking, and never shown.
"""

from __future__ import annotations

from pathlib import Path

from components.common import storage

MAX_TOKEN_BYTES = 64 * 1024


class TokenFileError(ValueError):
    """A token file that cannot be used: one line naming the file (never its content) and what to do."""


def read_token_file(path: str | Path, source: str, how_to: str) -> str:
    """The token in `path`, stripped; `source` names where the path came from (the variable), `how_to` says what to
    give instead. A FIFO or device is refused without blocking on it, a large file without reading it."""
    try:
        content = storage.read_regular_file(path, MAX_TOKEN_BYTES)
    except FileNotFoundError:
        raise TokenFileError(f"{source}: {path} does not exist; {how_to}") from None
    except storage.FileReadError as error:
        why = "larger than a token" if error.size is not None else str(error).removeprefix(f"{path}: ")
        raise TokenFileError(f"{source}: {path} is not a token file ({why}); {how_to}") from None
    except IsADirectoryError:
        raise TokenFileError(f"{source}: {path} is a folder, not a token file; {how_to}") from None
    except OSError as error:
        raise TokenFileError(f"{source}: cannot read {path} ({error.strerror}); {how_to}") from None
    try:
        token = content.decode("ascii").strip()
    except UnicodeDecodeError:
        raise TokenFileError(f"{source}: {path} is not a token (it holds non-ASCII bytes); {how_to}") from None
    if not token or any(character.isspace() for character in token):
        raise TokenFileError(f"{source}: {path} is not a token (empty, or more than one word); {how_to}")
    return token
