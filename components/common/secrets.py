"""A bearer token kept in a file (a projected service-account token, `kubectl create token ... > FILE`): read the same
way wherever the project sends one (the KFP API, the Model Registry), bounded and without blocking, and never shown;
and the masking every printed and logged line goes through.
"""

from __future__ import annotations

import base64
import os
import re
import threading
import urllib.parse
from pathlib import Path

from components.common import filesystem

MAX_TOKEN_BYTES = 64 * 1024


class TokenFileError(ValueError):
    """A token file that cannot be used: one line naming the file (never its content) and what to do."""


def read_token_file(path: str | Path, source: str, how_to: str) -> str:
    """The token in `path`, stripped; `source` names where the path came from (the variable), `how_to` says what to
    give instead. A FIFO or device is refused without blocking on it, a large file without reading it."""
    try:
        content = filesystem.read_regular_file(path, MAX_TOKEN_BYTES)
    except FileNotFoundError:
        raise TokenFileError(f"{source}: {path} does not exist; {how_to}") from None
    except filesystem.FileReadError as error:
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
    remember(token)
    return token


# -- no secret in any line ---------------------------------------------------------------------------------------
#
# Every line the project prints or logs goes through `mask` (the logging formatter applies it to each record, its
# traceback included): the secrets this process knows (read from a token file, or in a variable whose name says it
# holds one) are replaced wherever they appear, a server's message that repeats a header included, and so are the
# shapes a credential has in text (an Authorization header, a bearer token, a session cookie, a URL's user-info, a
# presigned URL's signature).

MASK = "***"
MIN_SECRET_CHARACTERS = 6  # shorter values would mask ordinary words
_SECRET_NAME = re.compile(r"TOKEN|SECRET|PASSWORD|PASSWD|COOKIE|CREDENTIAL|API_?KEY|PRIVATE_KEY|SESSION", re.IGNORECASE)
_NOT_A_SECRET_NAME = re.compile(r"(_PATH|_FILE|_DIR|_URL|_ID|_NAME|_SECONDS|_REGION)$", re.IGNORECASE)
_SHAPES = (
    (re.compile(r"(?i)\b(authorization[\"']?\s*[:=]\s*[\"']?)(?:(bearer|basic|token)\s+)?[^\s\"',;}]{6,}"),
     lambda match: f"{match[1]}{match[2] + ' ' if match[2] else ''}{MASK}"),
    (re.compile(r"(?i)\b(bearer\s+)[A-Za-z0-9\-._~+/]{16,}=*"), r"\1" + MASK),
    (re.compile(r"(?i)\b((?:set-)?cookie[\"']?\s*:\s*[\"']?)[^\r\n\"']+"), r"\1" + MASK),
    (re.compile(r"(?i)\b(oauth2_proxy[a-z0-9_]*=)[^\s;\"',]{8,}"), r"\1" + MASK),
    (re.compile(r"(?i)\b([a-z][a-z0-9+.\-]*://)[^/\s@\"'<>]+@"), r"\1" + MASK + "@"),
    (re.compile(r"(?i)\b(X-Amz-(?:Signature|Credential|Security-Token)=)[^&\s\"']+"), r"\1" + MASK),
    # an address's query values whose names say they carry a credential (?token=..., &sig=..., &key=...)
    (re.compile(r"(?i)([?&;](?:[a-z0-9_.\-]*token|sig|signature|key|api_?key|password|passwd|secret|code|"
                r"X-Amz-[a-z\-]+)=)[^&#\s\"'<>]+"), r"\1" + MASK),
)  # fmt: skip
_known: set[str] = set()
_lock = threading.Lock()


def encodings(secret: str) -> set[str]:
    """`secret` as a server may echo it back: as it is, percent-encoded or decoded, in base64 (standard and URL-safe,
    padded or not) and in hex (either case)."""
    raw = secret.encode()
    base64_forms = {base64.b64encode(raw).decode(), base64.urlsafe_b64encode(raw).decode()}
    forms = {secret, urllib.parse.unquote(secret), urllib.parse.quote(secret, safe=""), raw.hex(), raw.hex().upper()}
    forms |= base64_forms | {form.rstrip("=") for form in base64_forms}
    return {form for form in forms if len(form) >= MIN_SECRET_CHARACTERS}


def remember(secret: str | None) -> None:
    """Mask `secret`, in each of its encodings, in every line from now on (a value too short to be a secret is not
    remembered)."""
    if secret and len(secret.strip()) >= MIN_SECRET_CHARACTERS:
        with _lock:
            _known.update(encodings(secret.strip()))


def remember_environment(environment: dict[str, str] | None = None) -> None:
    """Remember the values of the variables whose names say they hold a secret (KFP_TOKEN, KFP_COOKIE,
    AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN, ...), and the password of any URL in the environment."""
    for name, value in (os.environ if environment is None else environment).items():
        if _SECRET_NAME.search(name) and not _NOT_A_SECRET_NAME.search(name):
            remember(value)
            if "=" in value and ";" not in value:  # a cookie NAME=VALUE: its value alone may be quoted too
                remember(value.split("=", 1)[1])
        elif "://" in value:
            remember(urllib.parse.urlsplit(value.strip()).password if "@" in value else None)


def mask(text: str) -> str:
    """`text` with every known secret and every credential-shaped part replaced by `***`."""
    for pattern, replacement in _SHAPES:
        text = pattern.sub(replacement, text)
    with _lock:
        known = sorted(_known, key=len, reverse=True)
    for secret in known:
        if secret in text:
            text = text.replace(secret, MASK)
    return text


def without_user_info(address: str) -> str:
    """`address` as it may be printed: a URL's user-info (user:password@) left out."""
    try:
        parts = urllib.parse.urlsplit(address)
    except ValueError:
        return mask(address)
    if "@" not in parts.netloc:
        return address
    return urllib.parse.urlunsplit(parts._replace(netloc=parts.netloc.rsplit("@", 1)[1]))


def refuse_user_info(address: str, field: str, where_credentials_go: str) -> None:
    """A ValueError when `address` carries user-info: a password in an address is printed wherever the address is,
    and sent as Basic auth instead of the credentials meant for the server."""
    try:
        has_user_info = "@" in urllib.parse.urlsplit(address).netloc
    except ValueError:
        return
    if has_user_info:
        remember(urllib.parse.urlsplit(address).password)
        raise ValueError(
            f"{field}: {without_user_info(address)} is given with credentials in the address (user:password@), "
            f"which are not used; give the address without them, and {where_credentials_go}"
        )


def holds_secret(text: str) -> bool:
    """Whether `text` holds a known secret in any of its encodings, or a credential's shape."""
    return mask(text) != text


def server_words(text: str | bytes | None, limit: int = 120) -> str:
    """A server's own message as a line quotes it: one line, shortened, marked as the server's (", the server says
    '...'"; "" for none). A message that holds a credential (echoed in any encoding) is left out whole, not quoted."""
    if isinstance(text, bytes):
        text = text[: limit * 8].decode("utf-8", errors="replace")
    if text and holds_secret(text):
        return ", the server's words left out (they repeat a credential)"
    words = " ".join((text or "").split())
    if not words:
        return ""
    if len(words) > limit:
        words = words[: limit - 1] + "…"
    return f", the server says {words!r}"
