"""Every answer of the Kubernetes API through one mapping (components/common/coordination.py `call`): the access
review of a run's first step, the kfp-launcher ConfigMap and the secret it names, driven by the real kubernetes
client against the stand-in API with a fault proxy in front: throttling with any Retry-After, the API server's bad
moments, a hang, a refusal, an HTML page or another object where the API's was expected, a boolean written as a
string. Each ends in one line naming what was asked, or goes through."""

from __future__ import annotations

import json
import time

import pytest

from components.common import access, coordination, kfp_launcher
from tests.fake_kubernetes_api import NAMESPACE, FakeKubernetesApi

REVIEWS = r"selfsubjectaccessreviews"
CONFIG_MAP = r"/configmaps/kfp-launcher$"
SECRET = r"/secrets/store-keys$"
LEASE_PERMISSION = [access.Permission("get", "coordination.k8s.io", "leases", "to test", "the test")]


@pytest.fixture
def cluster(tmp_path, monkeypatch):
    monkeypatch.setattr(coordination, "RETRY_SECONDS", 6.0)
    monkeypatch.setattr(coordination, "RETRY_AFTER_MOST", 2.0)
    monkeypatch.setattr(coordination, "REQUEST_SECONDS", 1)
    monkeypatch.setattr(access, "REQUEST_SECONDS", 1)
    with FakeKubernetesApi(release="26.03", pod_folder=tmp_path / "pod") as api:
        for name, value in api.pod_environment().items():
            monkeypatch.setenv(name, value)
        kfp_launcher.forget()
        yield api
        kfp_launcher.forget()


def review(api) -> list:
    api_client, namespace = coordination.in_cluster_client()
    return access.missing(api_client, namespace, LEASE_PERMISSION, coordination.call)


def answer(status: int, body, headers: dict | None = None, kind: str = "application/json") -> tuple:
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    return ("status", status, {"Content-Type": kind, **(headers or {})}, content)


@pytest.mark.parametrize(
    ("faults", "expected"),
    [
        ([answer(500, {"kind": "Status"})], "answered"),
        ([answer(503, {"kind": "Status"})] * 2, "answered"),
        ([("hang", 3)], "answered"),
        ([answer(429, {"kind": "Status"}, {"Retry-After": "0"})] * 3, "answered"),
        ([answer(429, {"kind": "Status"}, {"Retry-After": "3600"})], "answered"),
        ([answer(403, {"kind": "Status", "message": "secret token abc123"})], r"^the Kubernetes API refused this pod's "
                                                                                r"access review \(403\)"),
        ([answer(500, {"kind": "Status"})] * 20, r"could not ask whether it may get leases .* \(500 Internal Server "
                                                 r"Error, for 6 s\)"),
        ([answer(200, b"<html>sign-in-page-xyz</html>", kind="text/html")], r"not a SelfSubjectAccessReview"),
        ([answer(200, {"kind": "Status", "status": "Failure", "message": "token abc123"})], r"not a SelfSubjectAcc"),
        ([answer(200, {"apiVersion": "authorization.k8s.io/v1", "kind": "SelfSubjectAccessReview",
                       "spec": {}, "status": {"allowed": "false"}})], r"status\.allowed is true or false"),
    ],
    ids=["500", "503-twice", "hang", "429-retry-after-0", "429-retry-after-3600", "403", "500-for-good", "html",
         "status-object", "allowed-as-a-string"],
)  # fmt: skip
def test_the_access_review_maps_every_answer_to_one_line_or_goes_through(cluster, faults, expected):
    cluster.faults = [(REVIEWS, fault) for fault in faults]
    started = time.monotonic()
    if expected == "answered":
        assert review(cluster) == []  # the default-editor may get leases once the admin's set is applied
        took = time.monotonic() - started
        assert took < 15, took  # a Retry-After of an hour is waited at most RETRY_AFTER_MOST
        reviews = [request for request in cluster.requests if request[0] != "fault" and REVIEWS in request[2]]
        assert len(reviews) == 1
        if "Retry-After" in str(faults):  # at least a second between two tries, whatever Retry-After says
            assert took >= len(faults) * 0.9
        return
    with pytest.raises((access.AccessError, coordination.CoordinationError, coordination.NotTheApiError)) as raised:
        review(cluster)
    line = str(raised.value)
    assert "\n" not in line and "abc123" not in line and "sign-in-page-xyz" not in line  # no server text quoted
    assert __import__("re").search(expected, line), line


PROVIDERS = (
    "s3:\n  default:\n    endpoint: store.example:9000\n    credentials:\n      secretRef: {secretName: store-keys, "
    "accessKeyKey: accesskey, secretKeyKey: secretkey}\n"
)


@pytest.mark.parametrize(
    ("faults", "secret", "expected"),
    [
        ([(CONFIG_MAP, answer(500, {"kind": "Status"}))], {"accesskey": "a", "secretkey": "b"}, "store.example"),
        ([(CONFIG_MAP, answer(200, b"<html>sign-in-page-xyz</html>", kind="text/html"))], {},
         r"the kfp-launcher ConfigMap is not"),
        ([(CONFIG_MAP, answer(403, {"kind": "Status"}))], {}, None),  # not allowed to read it: KFP's defaults
        ([(SECRET, answer(404, {"kind": "Status", "reason": "NotFound", "code": 404}))], {},
         r"the secret store-keys \(named by the kfp-launcher ConfigMap's providers\) does not exist"),
        ([(SECRET, answer(403, {"kind": "Status", "code": 403}))], {}, r"may not read the secret store-keys"),
        ([(SECRET, answer(200, {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "store-keys"},
                                "data": {"accesskey": "not base64!", "secretkey": "Yg=="}}))], {},
         r"secret store-keys .*: its key 'accesskey' is not base64"),
    ],
    ids=["configmap-500", "configmap-html", "configmap-403", "secret-404", "secret-403", "secret-not-base64"],
)  # fmt: skip
def test_the_kfp_launcher_reader_maps_every_answer_to_one_line(cluster, faults, secret, expected):
    cluster.add_config_map(NAMESPACE, "kfp-launcher", {"providers": PROVIDERS})
    if secret:
        cluster.add_secret(NAMESPACE, "store-keys", secret)
    cluster.faults = list(faults)
    if expected is None:
        assert kfp_launcher.store_settings("bucket", "key") is None
        return
    if expected == "store.example":
        assert kfp_launcher.store_settings("bucket", "key").endpoint == "https://store.example:9000"
        return
    with pytest.raises((ValueError, coordination.CoordinationError)) as raised:
        kfp_launcher.store_settings("bucket", "key")
    assert "\n" not in str(raised.value) and "sign-in-page-xyz" not in str(raised.value)
    assert __import__("re").search(expected, str(raised.value)), raised.value
