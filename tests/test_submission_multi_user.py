"""`run` and `schedule` against a multi-user Kubeflow, through the real kfp.Client: a stand-in that serves the API
under /pipeline, redirects requests without credentials to a login page and refuses what the multi-user API server
refuses (tests/fake_kfp_api.py). Each credential form kfp supports, each refusal in one line and in seconds, a
token never in the output, and `--wait` following a run to its end."""

from __future__ import annotations

import http.server
import json
import ssl
import threading
import time
from pathlib import Path

import pytest

from pipeline import commands, kfp_endpoint
from pipeline.training_pipeline import cifar10_pipeline
from tests.builders import refused_port, self_signed_certificate
from tests.fake_kfp_api import API, FakeKfpApi

TOKEN = "eyJhbGciOiJSUzI1NiJ9.alice-default-editor.c2lnbmF0dXJl"
OTHER_TOKEN = "eyJhbGciOiJSUzI1NiJ9.bob-default-editor.c2lnbmF0dXJl"
COOKIE = "oauth2_proxy_kubeflow=c2Vzc2lvbi1vZi1hbGljZQ"
SECRETS = (TOKEN, OTHER_TOKEN, COOKIE.split("=", 1)[1])
SOURCE = ["--source", "s3://mlpipeline/shared/datasets/cifar-10-python.tar.gz"]
CREDENTIAL_VARIABLES = ("KFP_TOKEN", "KF_PIPELINES_SA_TOKEN_PATH", "KFP_COOKIE", "KFP_NAMESPACE", "KFP_CA_BUNDLE")


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch, tmp_path):
    """No credential, namespace or kfp context of the person running the tests leaks in; no pod files."""
    for name in CREDENTIAL_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setattr(kfp_endpoint, "IN_CLUSTER_TOKEN", tmp_path / "no-pod" / "token")
    monkeypatch.setattr(kfp_endpoint, "IN_CLUSTER_NAMESPACE", tmp_path / "no-pod" / "namespace")


@pytest.fixture
def kubeflow(request):
    """A multi-user endpoint (Kubeflow 1.10 and later): alice's token and cookie may use namespace alice; bob's token
    namespace bob."""
    outcome = getattr(request, "param", "SUCCEEDED")
    with FakeKfpApi(
        multi_user=True,
        prefix="/pipeline",
        tokens={TOKEN: {"alice"}, OTHER_TOKEN: {"bob"}},
        cookies={COOKIE: {"alice"}},
        run_outcome=outcome,
    ) as api:
        yield api


@pytest.mark.parametrize(
    ("release", "expected"),
    [("1.9.0", "redirects to a login page (/oauth2/start"),
     *((release, "needs credentials (it answered 401 to a request that carried none)")
       for release in ("1.9.1", "1.10"))],
)  # fmt: skip
def test_a_request_without_credentials_is_told_to_give_some_on_each_release(release, expected, capsys):
    """Kubeflow 1.9.0's oauth2-proxy redirects to its login page; 1.9.1's and later answer 401 on the API's routes:
    both mean "give credentials", never "your token expired" to someone who sent none."""
    with FakeKfpApi(multi_user=True, prefix="/pipeline", tokens={TOKEN: {"alice"}}, release=release) as api:
        assert run(api, "--namespace", "alice") == 2
    (line,) = [line for line in capsys.readouterr().err.splitlines() if "ERROR" in line]
    assert expected in line and "KF_PIPELINES_SA_TOKEN_PATH=FILE" in line and "expired" not in line, line


def host(api: FakeKfpApi) -> str:
    return api.url + "/pipeline"


def run(api_or_host, *extra: str) -> int:
    target = api_or_host if isinstance(api_or_host, str) else host(api_or_host)
    return commands.main(cifar10_pipeline, ["run", "--host", target, *SOURCE, *extra])


def assert_no_secret(text: str) -> None:
    for secret in SECRETS:
        assert secret not in text


def test_a_token_in_the_environment_submits_into_the_namespace(kubeflow, monkeypatch, capsys):
    monkeypatch.setenv("KFP_TOKEN", TOKEN)
    assert run(kubeflow, "--namespace", "alice", "--experiment", "nightly") == 0
    (experiment,) = kubeflow.bodies("POST", f"{API}/experiments")
    assert experiment["namespace"] == "alice" and experiment["display_name"] == "nightly"
    (submitted,) = kubeflow.bodies("POST", f"{API}/runs")
    assert submitted["experiment_id"] == next(iter(kubeflow.experiments))
    assert all(headers.get("Authorization") == f"Bearer {TOKEN}" for headers in kubeflow.headers_seen)
    output = capsys.readouterr()
    assert f"{kubeflow.url}/pipeline/#/runs/details/" in output.err
    assert_no_secret(output.out + output.err)


def test_a_token_file_is_read_as_kfp_reads_it_and_the_namespace_comes_from_the_environment(
    kubeflow, monkeypatch, tmp_path, capsys
):
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")  # as `kubectl create token ... > FILE` writes it
    monkeypatch.setenv("KF_PIPELINES_SA_TOKEN_PATH", str(token_file))
    monkeypatch.setenv("KFP_NAMESPACE", "alice")
    arguments = ["--cron", "0 0 3 * * *", "--promotion-root", "s3://mlpipeline/private/alice/models"]
    assert commands.main(cifar10_pipeline, ["schedule", "--host", host(kubeflow), *SOURCE, *arguments]) == 0
    (experiment,) = kubeflow.bodies("POST", f"{API}/experiments")
    assert experiment["namespace"] == "alice"
    (recurring,) = kubeflow.bodies("POST", f"{API}/recurringruns")
    assert recurring["experiment_id"] == experiment_id_of(kubeflow)
    output = capsys.readouterr()
    assert_no_secret(output.out + output.err)


def experiment_id_of(api: FakeKfpApi) -> str:
    (experiment_id,) = api.experiments
    return experiment_id


def test_a_session_cookie_authenticates_and_kfps_context_gives_the_namespace(kubeflow, monkeypatch, tmp_path, capsys):
    monkeypatch.setenv("KFP_COOKIE", COOKIE)
    context = tmp_path / "home" / ".config" / "kfp" / "context.json"
    context.parent.mkdir(parents=True)
    context.write_text(json.dumps({"namespace": "alice"}))
    assert run(kubeflow) == 0
    assert kubeflow.bodies("POST", f"{API}/experiments")[0]["namespace"] == "alice"
    assert "namespace alice (from kfp's context" in capsys.readouterr().err


def test_in_a_pod_the_projected_token_and_the_pods_namespace_are_used(kubeflow, monkeypatch, tmp_path):
    pod = tmp_path / "pod"
    pod.mkdir()
    (pod / "token").write_text(TOKEN)
    (pod / "namespace").write_text("alice")
    monkeypatch.setattr(kfp_endpoint, "IN_CLUSTER_TOKEN", pod / "token")
    monkeypatch.setattr(kfp_endpoint, "IN_CLUSTER_NAMESPACE", pod / "namespace")
    assert run(kubeflow) == 0
    assert kubeflow.bodies("POST", f"{API}/experiments")[0]["namespace"] == "alice"
    assert len(kubeflow.bodies("POST", f"{API}/runs")) == 1


@pytest.mark.parametrize(
    ("setting", "expected"),
    [
        ({}, "needs credentials (it answered 401 to a request that carried none)"),
        (
            {"KFP_TOKEN": "not-a-token-of-this-cluster"},
            "refused the credentials from KFP_TOKEN (401, the server says 'Jwt verification fails')",
        ),
        (
            {"KFP_TOKEN": OTHER_TOKEN, "--namespace": "alice"},
            "namespace 'alice' may not be used with these credentials",
        ),
        ({"KFP_TOKEN": TOKEN}, "is a multi-user Kubeflow: give your profile namespace with --namespace"),
        ({"KFP_TOKEN": TOKEN, "--namespace": "Alice_1"}, "namespace 'Alice_1' is not a Kubernetes namespace name"),
        ({"KFP_TOKEN": TOKEN, "--namespace": "alice", "path": "/kubeflow"}, "has no KFP API at /apis/v2beta1 (404)"),
        ({"KFP_TOKEN": TOKEN, "--namespace": "alice", "path": "/oauth2/start#"}, "answered with a page (text/html)"),
        ({"KF_PIPELINES_SA_TOKEN_PATH": "/nonexistent/token"}, "KF_PIPELINES_SA_TOKEN_PATH=/nonexistent/token: "),
        ({"KFP_TOKEN": TOKEN, "host": "127.0.0.1:8888"}, "give it with its scheme"),
        ({"KFP_TOKEN": TOKEN, "host": "grpc://127.0.0.1:8888"}, "'grpc://127.0.0.1:8888': grpc:// is not http://"),
        ({"KFP_TOKEN": TOKEN, "host": "http://"}, "KFP endpoint 'http://': it names no host"),
        ({"KFP_TOKEN": TOKEN, "host": "http://127.0.0.1:88888"}, "its port '88888' is not a port (1 to 65535)"),
        # the UI's address, copied from a browser (the dashboard's frame, a namespace query, a page)
        (
            {"KFP_TOKEN": TOKEN, "host": "http://127.0.0.1:8888/_/pipeline/?ns=alice#/runs"},
            "it is an address of the UI (from a browser), not of the API: give http://127.0.0.1:8888/pipeline",
        ),
        ({"KFP_TOKEN": TOKEN, "host": "http://127.0.0.1:8888/pipeline/#/runs"}, "give http://127.0.0.1:8888/pipeline"),
        ({"KFP_TOKEN": TOKEN, "closed": True}, "cannot be reached"),
    ],
)
def test_each_refusal_is_one_line_in_seconds_and_sends_nothing(kubeflow, monkeypatch, capsys, setting, expected):
    arguments = []
    for name, value in setting.items():
        if name.startswith("--"):
            arguments += [name, value]
        elif name.isupper():
            monkeypatch.setenv(name, value)
    target = host(kubeflow)
    if "path" in setting:
        target = kubeflow.url + setting["path"]
    if "host" in setting:
        target = setting["host"]
    if setting.get("closed"):
        target = f"http://127.0.0.1:{refused_port()}/pipeline"
    started = time.monotonic()
    assert run(target, *arguments) == 2
    assert time.monotonic() - started < 10, "no 25 s of kfp's health-check retries"
    output = capsys.readouterr()
    (line,) = [line for line in output.err.splitlines() if "ERROR" in line]
    assert expected in line, line
    assert "Traceback" not in output.err
    assert_no_secret(output.out + output.err)
    assert not kubeflow.bodies("POST", f"{API}/runs")


def test_a_login_page_answered_mid_way_is_not_taken_for_a_created_run(kubeflow):
    """kfp's generated client reads an HTML answer as an object of None fields: a run id None is refused."""

    class Answer:
        run_id = None

    endpoint = kfp_endpoint.Endpoint(
        config=kfp_endpoint.EndpointConfig(host=host(kubeflow)),
        credentials=kfp_endpoint.Credentials(),
        namespace="alice",
        client=None,
    )
    with pytest.raises(kfp_endpoint.EndpointError, match=r"the answer has no run_id .*nothing is known to be created"):
        endpoint.call("submitting run r", Answer, identifier="run_id")


@pytest.fixture
def tls_endpoint(tmp_path):
    """An HTTPS server on 127.0.0.1 with a self-signed certificate; yields (url, the certificate's file)."""
    certificate, key = self_signed_certificate(tmp_path)

    class Health(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            content = json.dumps({"multi_user": False}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(content)))
            self.end_headers()
            self.wfile.write(content)

        def log_message(self, *_arguments):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Health)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(certificate, key)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"https://127.0.0.1:{server.server_address[1]}", certificate
    server.shutdown()
    server.server_close()


def test_a_private_tls_endpoint_is_refused_until_its_ca_bundle_is_given(tls_endpoint, capsys):
    url, certificate = tls_endpoint
    config = kfp_endpoint.EndpointConfig(host=url)
    with pytest.raises(kfp_endpoint.EndpointError, match=r"TLS certificate is not trusted.*--ca-bundle FILE"):
        kfp_endpoint.probe(config.resolved(), kfp_endpoint.Credentials())
    trusted = kfp_endpoint.EndpointConfig(host=url, ca_bundle=str(certificate)).resolved()
    assert kfp_endpoint.probe(trusted, kfp_endpoint.Credentials())[0] is False


def test_wait_follows_a_run_that_succeeds(kubeflow, monkeypatch, capsys):
    monkeypatch.setenv("KFP_TOKEN", TOKEN)
    assert run(kubeflow, "--namespace", "alice", "--wait", "--poll-seconds", "0.05") == 0
    states = [
        line.rsplit(": ", 1)[1].split(" (")[0]
        for line in capsys.readouterr().err.splitlines()
        if ": run " in line and " (" in line
    ]
    assert states[-3:] == ["PENDING", "RUNNING", "SUCCEEDED"], states


@pytest.mark.parametrize("kubeflow", ["FAILED"], indirect=True)
def test_wait_names_the_failed_task_and_its_error_and_exits_non_zero(kubeflow, monkeypatch, capsys):
    monkeypatch.setenv("KFP_TOKEN", TOKEN)
    assert run(kubeflow, "--namespace", "alice", "--wait", "--poll-seconds", "0.05") == 1
    error = capsys.readouterr().err
    (line,) = [line for line in error.splitlines() if "ERROR" in line]
    assert "failed at task launch-training-job-component: train: the workers' step failed: loss is NaN" in line
    assert f"{kubeflow.url}/pipeline/#/runs/details/" in line


def test_make_run_takes_the_namespace_and_wait_and_never_prints_the_token(kubeflow, tmp_path):
    from tests.test_submission import make

    token_file = tmp_path / "token"
    token_file.write_text(TOKEN)
    environment = {"KF_PIPELINES_SA_TOKEN_PATH": str(token_file), "HOME": str(tmp_path / "home")}
    ran = make("run", KFP_HOST=host(kubeflow), NAMESPACE="alice", WAIT="1", EXTRA="--poll-seconds 0.05", **environment)
    assert ran.returncode == 0, ran.stderr[-2000:]
    assert "SUCCEEDED" in ran.stderr
    assert_no_secret(ran.stdout + ran.stderr)
    refused = make("run", KFP_HOST=host(kubeflow), NAMESPACE="bob", **environment)
    assert refused.returncode == 2 and "namespace 'bob' may not be used" in refused.stderr
    assert_no_secret(refused.stdout + refused.stderr)


def test_the_stand_in_refuses_what_the_multi_user_server_refuses(kubeflow):
    """Strictness of the stand-in itself, through the real client: no namespace is 400, another's is 403."""
    import kfp
    import kfp_server_api

    client = kfp.Client(host=host(kubeflow), existing_token=TOKEN, namespace="alice")
    with pytest.raises(kfp_server_api.ApiException, match="namespace is empty") as refused:
        client._experiment_api.experiment_service_create_experiment(
            experiment=kfp_server_api.V2beta1Experiment(display_name="x")
        )
    assert refused.value.status == 400
    with pytest.raises(kfp_server_api.ApiException) as forbidden:
        client.create_experiment("x", namespace="bob")
    assert forbidden.value.status == 403
    with pytest.raises(kfp_server_api.ApiException) as upload:
        client.upload_pipeline(str(commands.COMPILED), pipeline_name="p", namespace="bob")
    assert upload.value.status == 403
    assert Path(commands.COMPILED).is_file()
