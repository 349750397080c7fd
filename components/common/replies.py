"""The one reader of HTTP replies: every answer the project reads, itself or through a client it configures (kfp's,
the Model Registry's), is read here, with the rules every document has.

- Size before content: at most `max_bytes` of a body are read (decompressed), and a larger one is refused without
  reading the rest (a 1 GiB answer costs a megabyte, not three gigabytes).
- What it is before what it says: an answer that should be the API's JSON and is not (a login page, a proxy's HTML,
  another service at that address) is refused as "not the KFP API" or "not the Model Registry", naming the address,
  the status and the content type, instead of being parsed into a validation error.
- A JSON body is parsed by the one parser (components/common/documents.py: depth, size and value bounds).
- A server's own words are quoted shortened, masked and marked as the server's (`secrets.server_words`).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from components.common import documents, secrets

MAX_REPLY_BYTES = 16 << 20  # an API page of runs or models: kilobytes to a few megabytes when well-formed


class ReplyError(ValueError):
    """An answer that is not the one asked for: one line naming the address, what was expected and what came."""


def is_json(content_type: str | None) -> bool:
    kind = (content_type or "").split(";", 1)[0].strip().lower()
    return kind == "application/json" or (kind.startswith("application/") and kind.endswith("+json"))


def read_bounded(read, max_bytes: int, where: str, what: str) -> bytes:
    """Up to `max_bytes` from `read(amount)` (a stream's read, decoded); a longer body refused."""
    body = b""
    while len(body) <= max_bytes:
        chunk = read(max_bytes + 1 - len(body))
        if not chunk:
            break
        body += chunk
    if len(body) > max_bytes:
        raise ReplyError(f"{where}: the answer is larger than {max_bytes:,} bytes, not {what}'s; check the address")
    return body


def check_kind(status: int, content_type: str | None, body: bytes, where: str, what: str) -> None:
    """A successful answer with a body must be JSON; anything else is not `what`'s answer."""
    if 200 <= status < 300 and body.strip() and not is_json(content_type):
        raise ReplyError(
            f"{where}: the answer (HTTP {status}, {content_type or 'no content type'}) is not {what}'s: a login "
            f"page, a proxy, or another service at this address; check the address and the credentials"
            f"{secrets.server_words(body, 80) if 'html' not in (content_type or '') else ''}"
        )


@dataclasses.dataclass(frozen=True)
class Reply:
    status: int
    content_type: str
    body: bytes
    location: str = ""
    retirement: str = ""  # the API's Deprecation (RFC 9745) and Sunset (RFC 8594) headers, as one phrase, if any

    def json(self, where: str, what: str) -> Any:
        """The body as JSON, through the one parser; refused when it is not JSON."""
        if not is_json(self.content_type):
            raise ReplyError(
                f"{where}: the answer (HTTP {self.status}, {self.content_type or 'no content type'}) is not "
                f"{what}'s; check the address"
            )
        try:
            return documents.load(self.body, where, f"{what}'s answer", yaml_allowed=False)
        except documents.DocumentError as error:
            raise ReplyError(f"{where}: the answer is not {what}'s ({error})") from None

    def server_words(self, limit: int = 80) -> str:
        """The body as the server's words when it is short text or a JSON message (never a page of HTML)."""
        if is_json(self.content_type):
            try:
                decoded = documents.load(self.body, "answer", "answer", yaml_allowed=False)
            except documents.DocumentError:
                decoded = None
            if isinstance(decoded, dict):
                message = decoded.get("message") or decoded.get("error") or ""
                return secrets.server_words(str(message), limit)
            return ""
        if self.content_type.startswith("text/plain"):
            return secrets.server_words(self.body, limit)
        return ""


def get(
    url: str,
    where: str,
    what: str,
    headers: dict[str, str] | None = None,
    timeout: tuple[float, float] = (5.0, 30.0),
    verify: str | bool = True,
    max_bytes: int = MAX_REPLY_BYTES,
) -> Reply:
    """One GET, redirects not followed, its body read bounded. requests' own errors (no answer, TLS) pass through for
    the caller to name."""
    import requests

    with requests.get(
        url, headers=headers or {}, timeout=timeout, verify=verify, stream=True, allow_redirects=False
    ) as answer:
        body = read_bounded(lambda amount: answer.raw.read(amount, decode_content=True), max_bytes, where, what)
        return Reply(
            answer.status_code,
            answer.headers.get("Content-Type", ""),
            body,
            answer.headers.get("Location", ""),
            retirement(answer.headers),
        )


def retirement(headers: Any) -> str:
    """What an answer's Deprecation and Sunset headers say of the API, as "Deprecation: ...; Sunset: ..." (each value
    cut to 80 printable characters), or ""."""
    said = []
    for name in ("Deprecation", "Sunset"):
        value = headers.get(name)
        if value:
            printable = "".join(character for character in str(value) if character.isprintable())[:80]
            said.append(f"{name}: {printable}")
    return "; ".join(said)


class BoundedPoolManager:
    """A urllib3 pool manager (kfp_server_api's) whose every answer is read bounded and checked to be JSON before
    the client sees it."""

    def __init__(self, pool_manager: Any, where: str, what: str, max_bytes: int = MAX_REPLY_BYTES):
        self._pool_manager, self._where, self._what, self._max_bytes = pool_manager, where, what, max_bytes

    def request(self, method: str, url: str, *args: Any, **kwargs: Any) -> Any:
        import urllib3

        kwargs["preload_content"] = False
        response = self._pool_manager.request(method, url, *args, **kwargs)
        try:
            body = read_bounded(
                lambda amount: response.read(amount, decode_content=True), self._max_bytes, self._where, self._what
            )
        finally:
            response.release_conn()
        content_type = response.headers.get("Content-Type")
        check_kind(response.status, content_type, body, self._where, self._what)
        headers = {name: value for name, value in response.headers.items() if name.lower() != "content-encoding"}
        return urllib3.HTTPResponse(
            body=body, headers=headers, status=response.status, reason=response.reason, preload_content=True
        )

    def __getattr__(self, name: str) -> Any:
        return getattr(self._pool_manager, name)


def bound_aiohttp_client(rest_client: Any, where: str, what: str, max_bytes: int = MAX_REPLY_BYTES) -> None:
    """Make an OpenAPI-generated aiohttp REST client (the Model Registry's) read every answer bounded and check it
    is JSON; its `read()` then returns what was read here."""
    original = rest_client.request

    async def request(*args: Any, **kwargs: Any) -> Any:
        answer = await original(*args, **kwargs)
        body = b""
        try:
            while len(body) <= max_bytes:
                chunk = await answer.response.content.read(max_bytes + 1 - len(body))
                if not chunk:
                    break
                body += chunk
        finally:
            answer.response.release()
        if len(body) > max_bytes:
            raise ReplyError(f"{where}: the answer is larger than {max_bytes:,} bytes, not {what}'s; check the address")
        check_kind(answer.status, answer.response.headers.get("Content-Type"), body, where, what)
        answer.data = body
        return answer

    rest_client.request = request
