"""S3-compatible stores as Kubeflow ships them, played by a small HTTP proxy in front of a real S3 server (moto):

- `conditions="ignored"`: MinIO RELEASE.2019-08-14 (Kubeflow 1.10), which predates PUT preconditions: a PUT with
  `If-None-Match: *` or `If-Match` overwrites and answers 200;
- `conditions="check-then-write"`: SeaweedFS 4.00-4.16 (Kubeflow 1.11 and 26.03): the precondition is checked, then
  the object written a moment later, so several concurrent create-if-absent PUTs all succeed (seaweedfs#8800);
- `profile="team-a"`: KFP 2.15+ multi-user: a profile's keys may use only the objects its IAM policy lists, and list
  only the prefixes the bucket policy allows, both read from the vendored profile controller
  (tests/vendor/kfp-2.17.0-profile-controller-sync.py); anything else is the store's 403 AccessDenied.

Faults, for the store-fault tests (`proxy.faults`): a `Fault(method, key pattern, kind, times)` answers matching
requests `503 SlowDown` (kind "503") or forwards them and cuts the answer's body off halfway, closing the
connection (kind "cut"), `times` times (None: always).

Everything else is forwarded unchanged to the real server; every request is recorded as (method, key, status).
"""

from __future__ import annotations

import fnmatch
import http.client
import http.server
import re
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import parse_qs, unquote, urlparse

SYNC = Path(__file__).parent / "vendor" / "kfp-2.17.0-profile-controller-sync.py"
HOP_HEADERS = {"connection", "keep-alive", "transfer-encoding", "proxy-connection", "upgrade", "host"}
WRITE_DELAY_SECONDS = 0.3  # check-then-write: how long after the check the write lands


@dataclass
class Fault:
    method: str
    key_pattern: str
    kind: str  # "503" or "cut"
    times: int | None = None  # None: every matching request

    def take(self, method: str, key: str) -> bool:
        if method != self.method or not fnmatch.fnmatchcase(key, self.key_pattern) or self.times == 0:
            return False
        if self.times is not None:
            self.times -= 1
        return True


SLOW_DOWN = (
    b'<?xml version="1.0" encoding="UTF-8"?><Error><Code>SlowDown</Code><Message>Please reduce your request rate.'
    b"</Message></Error>"
)


def profile_object_patterns(namespace: str) -> list[str]:
    """The object ARNs a profile's user policy allows, as bucket/key glob patterns (from the vendored sync.py)."""
    text = SYNC.read_text()
    bucket = re.search(r"^S3_BUCKET_NAME = '([^']+)'", text, re.MULTILINE).group(1)
    resources = re.findall(r'f"arn:aws:s3:::\{S3_BUCKET_NAME\}/([^"]+)"', text)
    return [f"{bucket}/{resource.replace('{namespace}', namespace)}" for resource in resources]


def profile_list_prefixes(namespace: str) -> list[str]:
    """The s3:prefix patterns the bucket policy lets a profile list (its AllowOwnDeepList statement)."""
    text = SYNC.read_text()
    statement = text[text.index('"Sid": "AllowOwnDeepList"') : text.index('"Sid": "AllowHeadBucket"')]
    prefixes = re.findall(r'"([a-z-]+/[^"]*\*)"', statement)
    return [prefix.replace("${aws:username}", namespace) for prefix in prefixes]


def _access_denied(resource: str) -> bytes:
    return (
        '<?xml version="1.0" encoding="UTF-8"?><Error><Code>AccessDenied</Code><Message>Access Denied</Message>'
        f"<Resource>{resource}</Resource></Error>"
    ).encode()


def _precondition_failed() -> bytes:
    return (
        b'<?xml version="1.0" encoding="UTF-8"?><Error><Code>PreconditionFailed</Code><Message>At least one of the '
        b"pre-conditions you specified did not hold</Message><Condition>If-None-Match</Condition></Error>"
    )


class S3Proxy:
    def __init__(self, upstream: str, conditions: str = "honoured", profile: str | None = None):
        if conditions not in ("honoured", "ignored", "check-then-write"):
            raise ValueError(f"conditions: {conditions!r}")
        parsed = urlparse(upstream)
        self.upstream = (parsed.hostname, parsed.port)
        self.conditions = conditions
        self.profile = profile
        self.objects = profile_object_patterns(profile) if profile else []
        self.list_prefixes = profile_list_prefixes(profile) if profile else []
        self.requests: list[tuple[str, str, int]] = []
        self.faults: list[Fault] = []
        self.lock = threading.Lock()
        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def __enter__(self) -> S3Proxy:
        self._thread.start()
        return self

    def __exit__(self, *_exception) -> None:
        self._server.shutdown()
        self._server.server_close()

    def fault_for(self, method: str, key: str) -> str | None:
        with self.lock:
            for fault in self.faults:
                if fault.take(method, key):
                    return fault.kind
        return None

    def denied(self) -> list[tuple[str, str, int]]:
        return [request for request in self.requests if request[2] == 403]

    def allowed(self, method: str, bucket: str, key: str, query: dict) -> bool:
        """What the profile's user policy and the bucket policy allow (object ARNs; ListBucket by prefix)."""
        if not self.profile or not bucket:
            return True
        if key:
            return any(fnmatch.fnmatchcase(f"{bucket}/{key}", pattern) for pattern in self.objects)
        if method == "HEAD":
            return True  # AllowHeadBucket
        prefix = query.get("prefix", [None])[0]
        if prefix is None:
            return query.get("delimiter", [None])[0] == "/"  # AllowTopLevelDelimitedBrowse
        return any(fnmatch.fnmatchcase(prefix, pattern) for pattern in self.list_prefixes)

    def forward(self, method: str, path: str, headers: dict, body: bytes) -> tuple[int, list, bytes]:
        connection = http.client.HTTPConnection(*self.upstream, timeout=60)
        try:
            connection.request(method, path, body=body or None, headers=headers)
            response = connection.getresponse()
            return response.status, response.getheaders(), response.read()
        finally:
            connection.close()


def _handler(proxy: S3Proxy):
    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def _handle(self) -> None:
            url = urlparse(self.path)
            bucket, _, key = unquote(url.path).lstrip("/").partition("/")
            query = parse_qs(url.query)
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length) if length else b""
            headers = {name: value for name, value in self.headers.items() if name.lower() not in HOP_HEADERS}
            if not proxy.allowed(self.command, bucket, key, query):
                return self._reply(403, [], _access_denied(f"/{bucket}/{key}"), key)
            fault = proxy.fault_for(self.command, key)
            if fault == "503":
                return self._reply(503, [("Content-Type", "application/xml")], SLOW_DOWN, key)
            conditional = self.command == "PUT" and key and (
                "If-None-Match" in self.headers or "If-Match" in self.headers
            )  # fmt: skip
            if conditional and proxy.conditions != "honoured":
                if proxy.conditions == "check-then-write" and not self._check_holds(url.path, headers):
                    return self._reply(412, [], _precondition_failed(), key)
                headers = {n: v for n, v in headers.items() if n.lower() not in ("if-none-match", "if-match")}
                if proxy.conditions == "check-then-write":
                    time.sleep(WRITE_DELAY_SECONDS)  # the window in which a concurrent writer also passes the check
            status, response_headers, content = proxy.forward(self.command, self.path, headers, body)
            self._reply(status, response_headers, content, key, cut=fault == "cut" and status == 200)

        def _check_holds(self, path: str, headers: dict) -> bool:
            """The store's check, before it writes: If-None-Match * -> absent; If-Match -> the same ETag."""
            signed = ("authorization", "x-amz-date", "x-amz-content-sha256")
            plain = {name: value for name, value in headers.items() if name.lower() in signed}
            status, response_headers, _content = proxy.forward("HEAD", path, plain, b"")
            etag = dict((name.lower(), value) for name, value in response_headers).get("etag")
            if "If-None-Match" in self.headers:
                return status == 404
            return status == 200 and etag == self.headers["If-Match"]

        def _reply(self, status: int, headers: list, content: bytes, key: str, cut: bool = False) -> None:
            with proxy.lock:
                proxy.requests.append((self.command, key, status))
            self.send_response(status)
            for name, value in headers:
                if name.lower() not in HOP_HEADERS and name.lower() != "content-length":
                    self.send_header(name, value)
            upstream_length = dict((name.lower(), value) for name, value in headers).get("content-length")
            head = self.command == "HEAD" and upstream_length is not None
            self.send_header("Content-Length", upstream_length if head else str(len(content)))  # HEAD: the object's
            self.end_headers()
            if cut:  # the whole length announced, half of it sent, the connection closed: a body cut short
                self.wfile.write(content[: len(content) // 2])
                self.wfile.flush()
                self.close_connection = True
            elif self.command != "HEAD":
                self.wfile.write(content)

        def do_GET(self):
            self._handle()

        def do_PUT(self):
            self._handle()

        def do_HEAD(self):
            self._handle()

        def do_DELETE(self):
            self._handle()

        def do_POST(self):
            self._handle()

        def log_message(self, *_arguments):
            pass

    return Handler
