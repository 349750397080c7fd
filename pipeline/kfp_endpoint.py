"""The one owner of talking to a KFP endpoint: who we are, in which namespace, and what its answers mean.

`make run`, `make schedule` and `python -m pipeline.pipeline run|schedule` reach KFP through `connect()` and every
call through `Endpoint.call()`; nothing else builds a `kfp.Client`.

A Kubeflow installed from its manifests (Istio, oauth2-proxy, Dex, profiles) redirects every request that carries
neither a bearer token nor a session cookie to its login page, and kfp's client follows the redirect and reads the
HTML as an empty answer (a run "created" with id None). Its multi-user API server refuses experiments, runs and
recurring runs without a namespace, and in a namespace the caller may not use. So before anything is sent, one
request to the health check, with the credentials and without following redirects, says which of these it is, in
seconds (kfp's own constructor retries a failed health check for 25 s); every later answer is checked for the
identifier it must carry.

Credentials, in the forms kfp supports, the first that is set wins:
- `KFP_TOKEN`: a bearer token in the environment;
- `KF_PIPELINES_SA_TOKEN_PATH` (kfp's own variable): a file holding a token, re-read on every request, as a
  projected service-account token is rotated (`kubectl -n NAMESPACE create token default-editor > FILE`);
- `KFP_COOKIE`: a browser session's cookie (`oauth2_proxy_kubeflow=...`), for a login behind oauth2-proxy;
- in a pod: the projected token at kfp's default path `/var/run/secrets/kubeflow/pipelines/token`.
A token or cookie is never printed, logged, or written to a file.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from components.common import documents, filesystem, replies, secrets
from components.common.pod import SERVICE_ACCOUNT_NAMESPACE

logger = logging.getLogger("pipeline")

API_PATH = "/apis/v2beta1"
TOKEN_VARIABLE = "KFP_TOKEN"
TOKEN_FILE_VARIABLE = "KF_PIPELINES_SA_TOKEN_PATH"  # kfp.client.KF_PIPELINES_SA_TOKEN_ENV
COOKIE_VARIABLE = "KFP_COOKIE"
NAMESPACE_VARIABLE = "KFP_NAMESPACE"
CA_BUNDLE_VARIABLE = "KFP_CA_BUNDLE"
# Where a pod finds its projected KFP token (kfp.client.KF_PIPELINES_SA_TOKEN_PATH) and its namespace.
IN_CLUSTER_TOKEN = Path("/var/run/secrets/kubeflow/pipelines/token")
IN_CLUSTER_NAMESPACE = SERVICE_ACCOUNT_NAMESPACE
PROBE_TIMEOUT_SECONDS = (5.0, 15.0)  # connect, read
MAX_CONTEXT_BYTES = 64 * 1024
MAX_HEALTH_BYTES = 64 * 1024
HOW_TO_AUTHENTICATE = (
    f"give a token: {TOKEN_FILE_VARIABLE}=FILE with FILE from "
    "'kubectl -n <your profile namespace> create token default-editor > FILE', "
    f"or {TOKEN_VARIABLE}=<token>, or a browser session's cookie as {COOKIE_VARIABLE}='oauth2_proxy_kubeflow=...'"
)
TERMINAL_STATES = ("SUCCEEDED", "SKIPPED", "FAILED", "CANCELED")


class EndpointError(RuntimeError):
    """The endpoint cannot be used as asked: one line naming the endpoint or namespace and what to do."""


class RunOutcomeError(RuntimeError):
    """A followed run ended other than succeeded (failed, cancelled) or was not done in time."""

    def __init__(self, message: str, exit_code: int):
        super().__init__(message)
        self.exit_code = exit_code


# -- who we are ---------------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Credentials:
    """How requests authenticate; `describe()` names the source, never the secret."""

    token: str | None = dataclasses.field(default=None, repr=False)
    token_file: Path | None = None
    cookie: str | None = dataclasses.field(default=None, repr=False)
    source: str = "no credentials"

    def headers(self) -> dict[str, str]:
        headers = {}
        token = self.token if self.token_file is None else read_secret(self.token_file, self.source)
        if token:
            headers["Authorization"] = f"Bearer {token}"
        if self.cookie:
            headers["Cookie"] = self.cookie
        return headers


def read_secret(path: Path, source: str) -> str:
    """A token file's content, read as every token file is (components/common/secrets.py); one line naming the file
    (never its content) when it is not a token."""
    from components.common.secrets import TokenFileError, read_token_file

    try:
        return read_token_file(path, source, HOW_TO_AUTHENTICATE)
    except TokenFileError as error:
        raise EndpointError(str(error)) from None


def credentials_from_environment(environment: dict[str, str] | None = None) -> Credentials:
    environment = os.environ if environment is None else environment
    if environment.get(TOKEN_VARIABLE):
        token = environment[TOKEN_VARIABLE].strip()
        if any(character.isspace() for character in token) or not token.isascii():
            raise EndpointError(f"{TOKEN_VARIABLE}: not a token (more than one word, or non-ASCII characters)")
        secrets.remember(token)
        return Credentials(token=token, source=TOKEN_VARIABLE)
    if environment.get(TOKEN_FILE_VARIABLE):
        path = Path(environment[TOKEN_FILE_VARIABLE]).expanduser()
        source = f"{TOKEN_FILE_VARIABLE}={path}"
        read_secret(path, source)  # refused now, not at the first request
        return Credentials(token_file=path, source=source)
    if environment.get(COOKIE_VARIABLE):
        cookie = environment[COOKIE_VARIABLE].strip()
        if "=" not in cookie or "\n" in cookie or "\r" in cookie:
            raise EndpointError(f"{COOKIE_VARIABLE}: not a cookie (expected NAME=VALUE: oauth2_proxy_kubeflow=...)")
        for part in cookie.split(";"):
            secrets.remember(part.partition("=")[2])
        return Credentials(cookie=cookie, source=COOKIE_VARIABLE)
    if IN_CLUSTER_TOKEN.is_file():
        return Credentials(token_file=IN_CLUSTER_TOKEN, source=f"the pod's KFP token ({IN_CLUSTER_TOKEN})")
    return Credentials()


def default_namespace() -> tuple[str | None, str]:
    """(namespace, where it came from) when none is given: kfp's own context, then the pod's namespace."""
    context = Path.home() / ".config" / "kfp" / "context.json"
    try:
        setting = documents.load(filesystem.read_regular_file(context, MAX_CONTEXT_BYTES), str(context), "kfp context")
        if isinstance(setting, dict) and isinstance(setting.get("namespace"), str) and setting["namespace"]:
            return setting["namespace"], f"kfp's context ({context})"
    except (OSError, ValueError):
        pass
    try:
        namespace = IN_CLUSTER_NAMESPACE.read_text(
            encoding="utf-8"
        ).strip()  # reader: the kubelet's one-line namespace file
        if namespace:
            return namespace, "this pod's namespace"
    except (OSError, UnicodeDecodeError):
        pass
    return None, "none"


# -- the endpoint -------------------------------------------------------------------------------------------------


def address_problem(host: str) -> str | None:
    """What is wrong with `host` as an http(s) address of the KFP API (its scheme, host name, port), or None."""
    import urllib.parse

    if "://" not in host:
        return f"give it with its scheme, https://{host} or http://{host}"
    parsed = urllib.parse.urlsplit(host)
    if parsed.scheme not in ("http", "https"):
        return f"{parsed.scheme}:// is not http:// or https://"
    if not parsed.hostname:
        return "it names no host (e.g. https://kubeflow.example.com/pipeline)"
    try:
        parsed.port  # noqa: B018 (urllib checks the port when it is read)
    except ValueError:
        return f"its port {parsed.netloc.rpartition(':')[2]!r} is not a port (1 to 65535)"
    # An address of the UI, copied from a browser: the central dashboard's frame (/_/pipeline/), a query (?ns=...) or
    # a page (#/runs). The API's paths would follow them, and the answers be the UI's pages.
    dashboard = parsed.path.startswith("/_/")
    if parsed.query or parsed.fragment or dashboard:
        path = parsed.path.rstrip("/")[2 if dashboard else 0 :]
        api = urllib.parse.urlunsplit((parsed.scheme, parsed.netloc, path, "", ""))
        return f"it is an address of the UI (from a browser), not of the API: give {api}"
    return None


@dataclasses.dataclass(frozen=True)
class EndpointConfig:
    host: str
    namespace: str | None = None  # None: KFP_NAMESPACE, then default_namespace()
    ca_bundle: str | None = None  # None: KFP_CA_BUNDLE

    def resolved(self) -> EndpointConfig:
        host = (self.host or "").strip().rstrip("/")
        if not host:
            raise EndpointError("no KFP endpoint: set KFP_HOST (e.g. https://kubeflow.example.com/pipeline)")
        try:
            secrets.refuse_user_info(host, "KFP endpoint", HOW_TO_AUTHENTICATE)
        except ValueError as error:
            raise EndpointError(str(error)) from None
        problem = address_problem(self.host.strip())  # before the trailing slashes go: http:// is not http:
        if problem:
            raise EndpointError(f"KFP endpoint {self.host.strip()!r}: {problem}")
        ca_bundle = self.ca_bundle or os.environ.get(CA_BUNDLE_VARIABLE) or None
        if ca_bundle and not Path(ca_bundle).is_file():
            raise EndpointError(f"CA bundle {ca_bundle}: no such file (--ca-bundle or {CA_BUNDLE_VARIABLE})")
        namespace = self.namespace or os.environ.get(NAMESPACE_VARIABLE) or None
        if namespace is not None:
            _check_namespace(namespace)
        return dataclasses.replace(self, host=host, namespace=namespace, ca_bundle=ca_bundle)


def _check_namespace(namespace: str) -> None:
    import re

    if len(namespace) > 63 or not re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", namespace):
        raise EndpointError(
            f"namespace {namespace!r} is not a Kubernetes namespace name (lowercase letters, digits and '-', "
            "at most 63 characters)"
        )


def probe(config: EndpointConfig, credentials: Credentials) -> tuple[bool, str]:
    """One request to the health check, redirects not followed: whether the endpoint is multi-user, and the backend's
    version as it names it (its `tag_name`: "2.15.0"; "unknown" when it does not say)."""
    import requests

    url = config.host + API_PATH + "/healthz"
    where = f"the KFP endpoint {config.host}"
    try:
        answer = replies.get(url, where, "the KFP API", credentials.headers(), PROBE_TIMEOUT_SECONDS,
                             config.ca_bundle or True, MAX_HEALTH_BYTES)  # fmt: skip
    except replies.ReplyError as error:
        raise EndpointError(f"{error}, and {HOW_TO_AUTHENTICATE}") from None
    except requests.exceptions.SSLError as error:
        raise EndpointError(
            f"{where}: its TLS certificate is not trusted ({_reason(error)}); give its CA bundle with "
            f"--ca-bundle FILE or {CA_BUNDLE_VARIABLE}=FILE"
        ) from None
    except requests.exceptions.Timeout:
        seconds = sum(PROBE_TIMEOUT_SECONDS)
        raise EndpointError(f"{where} did not answer within {seconds:.0f} s; check KFP_HOST") from None
    except (requests.exceptions.ConnectionError, requests.exceptions.InvalidURL) as error:
        raise EndpointError(f"{where} cannot be reached ({_reason(error)}); check KFP_HOST") from None
    status = answer.status
    if 300 <= status < 400:
        location = secrets.without_user_info(answer.location)
        raise EndpointError(
            f"{where} redirects to a login page ({_short(location)}): it needs credentials "
            f"({credentials.source} were sent); {HOW_TO_AUTHENTICATE}"
        )
    if status == 401 and not credentials.headers():
        raise EndpointError(  # Kubeflow 1.9.1 and later: oauth2-proxy answers 401 on /apis/ without credentials
            f"{where} needs credentials (it answered 401 to a request that carried none); {HOW_TO_AUTHENTICATE}"
        )
    if status == 401:
        said = answer.server_words()
        raise EndpointError(
            f"{where} refused the credentials from {credentials.source} (401{said}): the token has expired or is not "
            f"one of this cluster's; {HOW_TO_AUTHENTICATE}"
        )
    if status == 403:
        raise EndpointError(
            f"{where} forbids these credentials ({credentials.source}, 403): use a token of a service account in "
            "your profile namespace (default-editor)"
        )
    if status == 404:
        raise EndpointError(
            f"{where} has no KFP API at {API_PATH} (404); on Kubeflow the endpoint ends in /pipeline "
            "(https://<kubeflow>/pipeline)"
        )
    if status >= 400:
        raise EndpointError(f"{where} answered {status} to its health check; try again later, or check KFP_HOST")
    try:
        health = answer.json(where, "the KFP API")
    except replies.ReplyError:
        health = None
    if not isinstance(health, dict):
        kind = answer.content_type or "no content type"
        raise EndpointError(
            f"{where} answered with a page ({kind}), not KFP's API: a login page, or not a KFP endpoint; "
            f"check KFP_HOST, and {HOW_TO_AUTHENTICATE}"
        )
    version = health.get("tag_name")
    return health.get("multi_user") is True, version if isinstance(version, str) and version else "unknown"


def _reason(error: Exception) -> str:
    """The innermost reason of a requests/urllib3 error, short."""
    text = str(error)
    for marker in ("SSLError(", "NewConnectionError(", "NameResolutionError(", "ConnectionRefusedError("):
        if marker in text:
            text = text[text.index(marker) :]
            break
    return _short(text, 160)


def _short(text: str, limit: int = 120) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


@dataclasses.dataclass
class Endpoint:
    """A checked endpoint: the kfp client, the namespace its calls go into (None: single-user)."""

    config: EndpointConfig
    credentials: Credentials
    namespace: str | None
    client: Any
    backend_version: str = "unknown"  # the KFP backend's, from its health check

    def call(self, what: str, function: Callable[[], Any], identifier: str | None = None) -> Any:
        """`function()`, with the API's refusals as one line each; `identifier` must be set on the answer."""
        import kfp_server_api

        try:
            result = function()
        except kfp_server_api.ApiException as error:
            raise EndpointError(self._refusal(what, error)) from None
        except (OSError, ValueError) as error:  # urllib3's connection errors are OSErrors
            raise EndpointError(f"{what} at {self.config.host}: {_short(str(error), 200)}") from None
        if identifier is not None and not getattr(result, identifier, None):
            raise EndpointError(
                f"{what} at {self.config.host}: the answer has no {identifier} (an HTML or empty answer: a login "
                f"page?); nothing is known to be created; {HOW_TO_AUTHENTICATE}"
            )
        return result

    def _refusal(self, what: str, error: Any) -> str:
        status = getattr(error, "status", None)
        body = getattr(error, "body", None) or getattr(error, "reason", "") or ""
        body = body.decode("utf-8", errors="replace") if isinstance(body, bytes) else str(body)
        kind = "application/json" if body.lstrip().startswith("{") else "text/plain"
        said = replies.Reply(status or 0, kind, body.encode()).server_words(300)
        where = f"{what} at {self.config.host}"
        if status == 403:
            return (
                f"{where}: namespace {self.namespace!r} may not be used with these credentials "
                f"({self.credentials.source}, 403{said}): give your own profile namespace with --namespace or "
                f"{NAMESPACE_VARIABLE}, or ask its owner to add you as a contributor"
            )
        if status == 401:
            return f"{where}: the credentials were refused (401{said}): {HOW_TO_AUTHENTICATE}"
        if status == 400 and "namespace" in said.lower():
            return f"{where}: refused (400{said}); give the profile namespace with --namespace or {NAMESPACE_VARIABLE}"
        return f"{where}: refused ({status}{said})"


def connect(config: EndpointConfig) -> Endpoint:
    """Check the endpoint and the credentials, then build kfp's client for them."""
    import warnings

    import kfp

    config = config.resolved()
    credentials = credentials_from_environment()
    multi_user, backend_version = probe(config, credentials)
    namespace = config.namespace
    if multi_user:
        if namespace is None:
            namespace, source = default_namespace()
            if namespace is None:
                raise EndpointError(
                    f"the KFP endpoint {config.host} is a multi-user Kubeflow: give your profile namespace with "
                    f"--namespace NAMESPACE or {NAMESPACE_VARIABLE}=NAMESPACE (make run NAMESPACE=...)"
                )
            logger.info("namespace %s (from %s)", namespace, source)
    elif namespace is not None:
        logger.info("the KFP endpoint %s is single-user: namespace %s is not used", config.host, namespace)
        namespace = None
    arguments: dict[str, Any] = {"host": config.host, "ssl_ca_cert": config.ca_bundle}
    if namespace:
        arguments["namespace"] = namespace
    if credentials.token_file is not None:
        from kfp.client.set_volume_credentials import ServiceAccountTokenVolumeCredentials

        arguments["credentials"] = ServiceAccountTokenVolumeCredentials(str(credentials.token_file))
    elif credentials.token:
        arguments["existing_token"] = credentials.token
    if credentials.cookie:
        arguments["cookies"] = credentials.cookie
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="This client only works with Kubeflow Pipeline")
        kfp_client = kfp.Client(**arguments)
    rest_client = kfp_client._run_api.api_client.rest_client  # one ApiClient serves every kfp API object
    rest_client.pool_manager = replies.BoundedPoolManager(
        rest_client.pool_manager, f"the KFP endpoint {config.host}", "the KFP API"
    )
    logger.info(
        "KFP endpoint %s (KFP %s, %s, %s%s)",
        config.host,
        backend_version,
        "multi-user" if multi_user else "single-user",
        credentials.source,
        f", namespace {namespace}" if namespace else "",
    )
    return Endpoint(config, credentials, namespace, kfp_client, backend_version)


# -- recurring runs ------------------------------------------------------------------------------------------------


def recurring_runs(endpoint: Endpoint, name: str | None = None) -> list:
    """The recurring runs in the endpoint's namespace (all of them on a single-user endpoint), or those named
    `name`, every page read."""
    found, token = [], ""
    predicate = {"operation": "EQUALS", "key": "display_name", "string_value": name}
    text_filter = json.dumps({"predicates": [predicate]}) if name else None
    while True:
        page = endpoint.call(
            "listing the schedules",
            lambda token=token: endpoint.client.list_recurring_runs(
                page_token=token, page_size=100, namespace=endpoint.namespace, filter=text_filter
            ),
        )
        found += [run for run in (page.recurring_runs or []) if name is None or run.display_name == name]
        token = page.next_page_token or ""
        if not token:
            return found


def change_recurring_run(endpoint: Endpoint, recurring_run_id: str, action: str) -> None:
    """enable, disable or delete one recurring run."""
    method = {"enable": "enable_recurring_run", "disable": "disable_recurring_run", "delete": "delete_recurring_run"}
    endpoint.call(f"{action} schedule {recurring_run_id}", lambda: getattr(endpoint.client, method[action])(
        recurring_run_id))  # fmt: skip


# -- following a run ------------------------------------------------------------------------------------------------


def run_address(endpoint: Endpoint, run_id: str) -> str:
    """The run's page in the KFP UI (the UI is served where the API is: https://<kubeflow>/pipeline)."""
    return f"{endpoint.config.host}/#/runs/details/{run_id}"


def follow_run(
    endpoint: Endpoint,
    run_id: str,
    timeout_seconds: float,
    poll_seconds: float = 10.0,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> str:
    """Follow a run to its end: a line when its state changes; returns on success, raises RunOutcomeError else."""
    from components.common import exit_codes

    started = clock()
    state = None
    address = run_address(endpoint, run_id)
    try:
        while True:
            run = endpoint.call(f"reading run {run_id}", lambda: endpoint.client.get_run(run_id), identifier="run_id")
            new_state = str(run.state or "PENDING")
            if new_state != state:
                state = new_state
                logger.info("run %s: %s (%.0f s)", run.display_name or run_id, state, clock() - started)
            if state in TERMINAL_STATES:
                break
            if clock() - started > timeout_seconds:
                raise RunOutcomeError(
                    f"run {run_id} is still {state} after {timeout_seconds:.0f} s (--wait-timeout); it goes on: "
                    f"{address}",
                    exit_codes.TIMED_OUT,
                )
            sleep(poll_seconds)
    except KeyboardInterrupt:
        raise RunOutcomeError(
            f"stopped following run {run_id}; the run goes on: {address}", exit_codes.INTERRUPTED
        ) from None
    if state in ("SUCCEEDED", "SKIPPED"):
        logger.info("run %s %s: %s", run_id, state.lower(), address)
        return state
    if state == "CANCELED":
        raise RunOutcomeError(f"run {run_id} was cancelled: {address}", exit_codes.FAILED)
    raise RunOutcomeError(f"run {run_id} failed{failure_reason(run)}: {address}", exit_codes.FAILED)


def failure_reason(run: Any) -> str:
    """' at task T: message' for the first failed task (by end time), else the run's own error, else ''."""
    tasks = [task for task in ((run.run_details and run.run_details.task_details) or []) if task.state == "FAILED"]
    # A failed step fails the DAGs around it too: the innermost is the one without failed children.
    failed_parents = {task.parent_task_id for task in tasks if task.parent_task_id}
    leaves = [task for task in tasks if task.task_id not in failed_parents] or tasks
    leaves.sort(key=lambda task: str(task.end_time or ""))
    for task in leaves:
        message = (task.error and task.error.message) or ""
        return f" at task {task.display_name}" + (f": {_short(message, 300)}" if message else "")
    if run.error and run.error.message:
        return f": {_short(run.error.message, 300)}"
    return ""
