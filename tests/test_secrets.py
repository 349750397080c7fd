"""No secret in any line, and no server's answer read unbounded or taken for another's: the Model Registry's and
the KFP API's refusals (401, 403, 500) repeating the credentials, pages in place of the API, answers too large,
addresses with passwords, exception texts and tracebacks naming a token, through the real clients and the project's
own logging set-up."""

from __future__ import annotations

import base64
import http.server
import json
import logging
import os
import subprocess
import sys
import threading
import urllib.parse
from pathlib import Path

import pytest

from components.common import logs, object_stores, replies, secrets
from components.evaluate import registry
from pipeline import kfp_endpoint

REPOSITORY = Path(__file__).resolve().parents[1]
TOKEN = "eyJhbGciOiJSUzI1NiJ9.registry-writer.c2lnbmF0dXJlLW9mLWEtdG9rZW4"
API = registry.API_PATH


class Scripted:
    """An HTTP server on 127.0.0.1 answering each path prefix with (status, content type, body or a byte count to
    stream); the last request's headers are kept."""

    def __init__(self, answers: dict[str, tuple[int, str, bytes | int]]):
        self.answers, self.headers = answers, []
        scripted = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def answer(self):
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                scripted.headers.append(dict(self.headers))
                path = next((p for p in sorted(scripted.answers, key=len, reverse=True) if self.path.startswith(p)), "")
                status, kind, body = scripted.answers.get(path, (404, "text/plain", b"no such path"))
                self.send_response(status)
                self.send_header("Content-Type", kind)
                if isinstance(body, int):  # a body of `body` bytes, streamed: the client should stop early
                    self.send_header("Content-Length", str(body))
                    self.end_headers()
                    chunk = b"[" + b" " * (1 << 16)
                    try:
                        for _ in range(body // len(chunk)):
                            self.wfile.write(chunk)
                    except OSError:
                        pass
                    return
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self):
                self.answer()

            def do_POST(self):
                self.answer()

            def do_PATCH(self):
                self.answer()

            def log_message(self, *_arguments):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def token_file(tmp_path, monkeypatch):
    path = tmp_path / "token"
    path.write_text(TOKEN + "\n")
    monkeypatch.setenv(registry.TOKEN_PATH_VARIABLE, str(path))
    monkeypatch.setattr(registry, "RETRY_SECONDS", 0.01)
    return path


@pytest.fixture
def lines(capsys):
    """Every line the process logs and prints, through the project's own logging set-up."""
    logs.setup_logging("DEBUG")
    yield lambda: "\n".join(capsys.readouterr())
    logging.getLogger().handlers.clear()


def registration(root: Path) -> registry.Registration:
    """Version 3 of a promotion root in `root`."""
    (root / "3").mkdir(parents=True)
    (root / "3" / "saved_model.pb").write_bytes(b"a model")
    pointer = {"version": 3, "saved_model": str(root / "3"), "metrics": {"accuracy": 0.9}}
    return registry.registration_of("cifar10", pointer, str(root), registry.Lineage())


def echo(kind: str, said: str) -> tuple[str, bytes]:
    """A server's answer of `kind` that repeats what it was sent."""
    if kind == "json":
        return "application/json", json.dumps({"code": 16, "message": said}).encode()
    if kind == "text":
        return "text/plain; charset=utf-8", said.encode()
    return "text/html", f"<html><body><h1>Denied</h1><pre>{said}</pre></body></html>".encode()


ENCODED = {
    "plain": lambda token: token,
    "base64": lambda token: base64.b64encode(token.encode()).decode(),
    "base64url-unpadded": lambda token: base64.urlsafe_b64encode(token.encode()).decode().rstrip("="),
    "percent": lambda token: urllib.parse.quote(token, safe=""),
    "hex": lambda token: token.encode().hex(),
    # the outside round's: the words are never quoted, so no list of encodings is needed to keep these out
    "mime-wrapped": lambda token: base64.encodebytes(token.encode() * 2).decode(),
    "base64-of-bearer": lambda token: base64.b64encode(f"Bearer {token}".encode()).decode(),
    "percent-lower-and-double": lambda token: urllib.parse.quote(urllib.parse.quote(token, safe="")).lower(),
    "json-escaped-slashes": lambda token: token.replace(".", "\\/"),
    "split-by-a-newline": lambda token: token[:30] + "\n" + token[30:],
    "base32": lambda token: base64.b32encode(token.encode()).decode(),
    "hex-with-colons": lambda token: ":".join(f"{byte:02x}" for byte in token.encode()),
}


@pytest.mark.parametrize("encoding", list(ENCODED))
def test_a_registry_echoing_the_token_in_any_encoding_has_its_words_left_out(token_file, lines, tmp_path, encoding):
    """The server's text repeats the token (base64, percent-encoded, hex...): no line prints it in any encoding, and
    the server's words are left out, not quoted."""
    echoed = ENCODED[encoding](TOKEN)
    server = Scripted({API: (403, *echo("json", f"token {echoed} is not allowed here"))})
    try:
        outcome = registry.register_promotion(server.url, registration(tmp_path / "models"))
    finally:
        server.stop()
    output = lines() + outcome.line
    assert not outcome.registered
    assert not any(form in output for form in (ENCODED[name](TOKEN) for name in ENCODED)), output
    assert not any(piece in output for piece in (TOKEN[:24], TOKEN[-24:], echoed[:24], echoed[-24:])), output
    assert "is not allowed here" not in output and "403 Forbidden" in outcome.line  # its status, never its words


@pytest.mark.parametrize(
    "address",
    ["https://kubeflow.example/pipeline?token=SECRETVALUE123", "https://h/p?a=1&access_token=SECRETVALUE123#x",
     "https://h/p?sig=SECRETVALUE123&se=2030", "https://h/p?X-Amz-Security-Token=SECRETVALUE123&key=SECRETVALUE123"],
)  # fmt: skip
def test_query_values_named_as_credentials_are_masked_in_every_address_printed(address):
    masked = secrets.mask(f"cannot reach {address}")
    assert "SECRETVALUE123" not in masked and "***" in masked and "https://" in masked


@pytest.mark.parametrize("kind", ["json", "text", "html"])
@pytest.mark.parametrize("status", [401, 403, 500])
def test_a_registry_repeating_the_authorization_header_never_has_the_token_printed(
    token_file, lines, tmp_path, status, kind
):
    said = f"request had Authorization: Bearer {TOKEN}; cookie: oauth2_proxy_kubeflow=c2Vzc2lvbg9876; token={TOKEN}"
    server = Scripted({API: (status, *echo(kind, said))})
    try:
        outcome = registry.register_promotion(server.url, registration(tmp_path / "models"))
    finally:
        server.stop()
    assert server.headers[0]["Authorization"] == f"Bearer {TOKEN}"  # the token was sent...
    assert not outcome.registered and "\n" not in outcome.line
    output = lines() + outcome.line
    assert TOKEN not in output and "c2Vzc2lvbg9876" not in output  # ...and is in no line
    assert f"the Model Registry at {server.url}" in outcome.line
    assert "request had" not in output and str(status) in outcome.line  # its status, never its words
    assert "<body>" not in output


def test_a_login_page_in_place_of_the_registry_is_said_to_be_not_the_registry(token_file, lines, tmp_path):
    page = b"<!DOCTYPE html><html><title>Sign in</title><form action=/oauth2/start></form></html>"
    server = Scripted({API: (200, "text/html; charset=utf-8", page)})
    try:
        outcome = registry.register_promotion(server.url, registration(tmp_path / "models"))
    finally:
        server.stop()
    assert "is not the Model Registry's" in outcome.line and server.url in outcome.line
    assert "ValidationError" not in lines()


def test_a_registry_answer_too_large_is_refused_after_reading_its_bound(token_file, lines, tmp_path):
    """The probe is answered well; the client's next call gets 200 MB: refused after reading 16 MiB, not 200 MB."""
    listing = json.dumps({"items": [], "size": 0, "pageSize": 1, "nextPageToken": ""}).encode()
    server = Scripted(
        {f"{API}/registered_models?pageSize=1": (200, "application/json", listing),
         f"{API}/registered_model": (200, "application/json", 200 << 20)},
    )  # fmt: skip
    try:
        outcome = registry.register_promotion(server.url, registration(tmp_path / "models"))
    finally:
        server.stop()
    assert f"larger than {replies.MAX_REPLY_BYTES:,} bytes, not the Model Registry's" in outcome.line, outcome.line


def test_a_kfp_api_answering_pages_or_oversized_answers_is_not_taken_for_the_api(monkeypatch):
    """The health check passes; then the API answers a page (200, HTML) or 200 MB: each one line, never parsed."""
    for name in ("KFP_TOKEN", "KF_PIPELINES_SA_TOKEN_PATH", "KFP_COOKIE", "KFP_NAMESPACE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("KFP_TOKEN", TOKEN)
    monkeypatch.setattr(kfp_endpoint, "IN_CLUSTER_TOKEN", Path("/nonexistent/token"))
    health = json.dumps({"multi_user": False}).encode()
    server = Scripted(
        {"/apis/v2beta1/healthz": (200, "application/json", health),
         "/apis/v2beta1/experiments": (200, "text/html", b"<html><body>Sign in</body></html>"),
         "/apis/v2beta1/runs": (200, "application/json", 200 << 20)},
    )  # fmt: skip
    try:
        endpoint = kfp_endpoint.connect(kfp_endpoint.EndpointConfig(host=server.url))
        with pytest.raises(kfp_endpoint.EndpointError) as page:
            endpoint.call("listing experiments", lambda: endpoint.client.list_experiments())
        with pytest.raises(kfp_endpoint.EndpointError) as large:
            endpoint.call("listing runs", lambda: endpoint.client.list_runs())
    finally:
        server.stop()
    assert f"the KFP endpoint {server.url}: the answer (HTTP 200, text/html) is not the KFP API's" in str(page.value)
    assert "larger than 16,777,216 bytes, not the KFP API's" in str(large.value)


@pytest.mark.parametrize("status", [401, 403, 500])
def test_kfp_refusals_repeating_the_token_never_print_it(monkeypatch, capsys, status):
    from pipeline import commands
    from pipeline.training_pipeline import cifar10_pipeline

    for name in ("KF_PIPELINES_SA_TOKEN_PATH", "KFP_COOKIE", "KFP_NAMESPACE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("KFP_TOKEN", TOKEN)
    monkeypatch.setattr(kfp_endpoint, "IN_CLUSTER_TOKEN", Path("/nonexistent/token"))
    health = json.dumps({"multi_user": False}).encode()
    refusal = json.dumps({"code": 7, "message": f"denied: header Authorization: Bearer {TOKEN} (token {TOKEN})"})
    server = Scripted(
        {"/apis/v2beta1/healthz": (200, "application/json", health),
         "/apis/v2beta1/": (status, "application/json", refusal.encode())},
    )  # fmt: skip
    try:
        code = commands.main(cifar10_pipeline, ["run", "--host", server.url, "--source", "s3://bkb/cifar.tar.gz"])
    finally:
        server.stop()
        logging.getLogger().handlers.clear()
    output = "\n".join(capsys.readouterr())
    assert code != 0
    assert TOKEN not in output, output
    assert "the server's words left out (they repeat a credential)" in output, output
    sent = {name.lower(): value for name, value in server.headers[-1].items()}
    assert sent["authorization"] == f"Bearer {TOKEN}"


@pytest.mark.parametrize(
    "check",
    [
        lambda address: registry.check_address(address),
        lambda address: kfp_endpoint.EndpointConfig(host=address).resolved(),
    ],
    ids=["model registry", "kfp"],
)
@pytest.mark.parametrize("address", ["http://alice:s3cr3t-pa55@127.0.0.1:8080", "https://user%40x:p%40ss-w0rd@h:1"])
def test_an_address_with_a_password_is_refused_in_one_line_that_says_where_credentials_go(check, address):
    with pytest.raises((ValueError, kfp_endpoint.EndpointError)) as refused:
        check(address)
    message = str(refused.value)
    assert "credentials in the address" in message and "\n" not in message
    assert "s3cr3t" not in message and "p%40ss" not in message and "p@ss" not in message
    assert "token" in message  # where they go instead


def test_an_object_store_endpoint_with_keys_in_it_is_refused_naming_the_variables(monkeypatch):
    monkeypatch.delenv("AWS_ENDPOINT_URL_S3", raising=False)
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://minio:minio-s3cret-key@127.0.0.1:9000")
    with pytest.raises(ValueError, match=r"AWS_ENDPOINT_URL: http://127\.0\.0\.1:9000 is given with credentials") as e:
        object_stores.s3_endpoint()
    assert "AWS_SECRET_ACCESS_KEY" in str(e.value) and "minio-s3cret-key" not in str(e.value)


def test_exception_texts_and_tracebacks_are_masked_in_the_output_and_the_log_file(tmp_path):
    """A stage's process, with secrets in its environment, logs an error and a traceback that name them (a client
    library's exception text, a URL with a password, a presigned URL): neither stderr nor its log file has them."""
    program = f"""
import logging, sys
from components.common import logs
logs.setup_logging()
handler = logging.FileHandler({str(tmp_path / "step.log")!r})
handler.setFormatter(logs.EscapingFormatter(logs.LOG_FORMAT))
logging.getLogger().addHandler(handler)
log = logging.getLogger("stage")
try:
    raise ConnectionError("POST http://svc:8080 with headers {{'Authorization': 'Bearer ' + sys.argv[1]}} failed")
except ConnectionError:
    log.exception("the request failed")
log.error("reading s3://bucket/x?X-Amz-Signature=0badc0ffee0badc0ffee&X-Amz-Credential=AKIAEXAMPLE%2F2026")
log.error("session key %s, url http://u:hunter2-pw@host/", sys.argv[2])
"""
    environment = {**os.environ, "KFP_TOKEN": TOKEN, "AWS_SECRET_ACCESS_KEY": "wJalrXUtnFEMI/K7MDENG/bPxRfiCY"}
    result = subprocess.run(
        [sys.executable, "-c", program, TOKEN, "wJalrXUtnFEMI/K7MDENG/bPxRfiCY"], cwd=REPOSITORY, env=environment,
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    for text in (result.stderr, (tmp_path / "step.log").read_text()):
        assert "Traceback" in text and "the request failed" in text
        for secret in (TOKEN, "wJalrXUtnFEMI", "0badc0ffee", "AKIAEXAMPLE", "hunter2-pw"):
            assert secret not in text, (secret, text)


def test_masking_leaves_ordinary_lines_alone():
    for line in (
        "the Model Registry at http://127.0.0.1:8080 needs a bearer token (MODEL_REGISTRY_TOKEN_PATH)",
        "give a token, or a browser session's cookie as KFP_COOKIE='oauth2_proxy_kubeflow=...'",
        "step 40/100 loss 1.23 examples/s 1,234",
    ):
        assert secrets.mask(line) == line
