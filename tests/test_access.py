"""The run's first step asks the API server (SelfSubjectAccessReview) whether its service account holds what the
run will need, and refuses the run in one line before any data is read: the step in a pod of a profile, against the
stand-in API of each release, with what the cluster admin and the profile owner applied, or not."""

from __future__ import annotations

import pytest

from components.common import object_stores
from components.prepare_data.component import source_fingerprint_component
from tests.fake_kubernetes_api import NAMESPACE, FakeKubernetesApi

JOB_KIND = {"1.9": "tfjobs", "1.10": "tfjobs", "1.11": "trainjobs", "26.03": "trainjobs"}


@pytest.fixture
def step_pod(tmp_path, monkeypatch):
    """This process as the run's first step in a pod of the profile: a function taking the stand-in's release and
    whether the manifests were applied, returning the running stand-in."""
    apis = []

    def start(release: str, installed: bool) -> FakeKubernetesApi:
        api = FakeKubernetesApi(release=release, installed=installed, pod_folder=tmp_path / f"pod-{len(apis)}")
        api.__enter__()
        apis.append(api)
        for name, value in api.pod_environment().items():
            monkeypatch.setenv(name, value)
        object_stores.reset_clients()
        return api

    yield start
    for api in apis:
        api.__exit__(None, None, None)
    object_stores.reset_clients()


def first_step(source: str, launcher: str, promotion_root: str = "") -> str:
    return source_fingerprint_component.python_func(source=source, launcher=launcher, promotion_root=promotion_root)


def said(capfd, level: str = "ERROR") -> list[str]:
    """The step's log lines of `level` (a component sets up its own logging, to stderr)."""
    return [line.split(": ", 1)[1] for line in capfd.readouterr().err.splitlines() if f" {level} " in line]


@pytest.mark.parametrize("release", ["1.9", "1.10", "1.11", "26.03"])
def test_a_run_without_the_admins_set_is_refused_before_its_data_is_read(release, step_pod, unsafe_s3, capfd):
    """Kubeflow's stores cannot compare-and-swap, so the run needs Leases; before the admin applied manifests/admin/
    nobody in the profile holds them: exit 2, one line naming the permission, the manifest and who applies it, and
    the source never read."""
    api = step_pod(release, installed=False)
    api.add_config_map(NAMESPACE, "kfp-launcher", {"defaultPipelineRoot": f"{unsafe_s3}/private-artifacts/v2"})
    with pytest.raises(SystemExit) as ended:
        first_step(f"{unsafe_s3}/no-such-source.tar.gz", "auto", promotion_root=f"{unsafe_s3}/models")
    assert ended.value.code == 2
    (line,) = said(capfd)
    assert line.startswith("the service account default-editor may not get leases (coordination.k8s.io), create "
                           "leases (coordination.k8s.io), update leases")  # fmt: skip
    assert f"in namespace {NAMESPACE}" in line and "kubectl apply -k manifests/admin/" in line
    assert "cluster admin" in line
    assert not any("no-such-source" in line for line in said(capfd, "INFO"))  # the source was never looked at


@pytest.mark.parametrize("release", ["1.9", "1.10", "1.11", "26.03"])
def test_an_installed_profile_holds_everything_the_run_asks_for(release, step_pod, unsafe_s3, capfd):
    """After the admin and the owner applied their sets: the release's job kind, pods, logs, events and Leases are
    asked for and held; the step goes on to its work (here: fingerprinting a source that is not there, which it
    names and leaves to the prepare step)."""
    api = step_pod(release, installed=True)
    assert first_step(f"{unsafe_s3}/no-such-source.tar.gz", "auto").startswith("unavailable:")  # on to the work
    asked = {(verb, resource) for _user, verb, _group, resource in api.access_reviews}
    assert {("create", JOB_KIND[release]), ("delete", JOB_KIND[release]), ("get", "pods/log"),
            ("create", "leases"), ("update", "leases")} <= asked  # fmt: skip
    text = capfd.readouterr().err
    resources = ", ".join(sorted([JOB_KIND[release], "events", "leases", "pods", "pods/log"]))
    assert f"access: default-editor may use {resources} in namespace {NAMESPACE}" in text
    assert "no-such-source" in text


def test_a_store_that_compares_and_swaps_and_a_pod_launcher_ask_for_nothing(step_pod, s3_bucket, capfd):
    """No Leases where the store honours conditional writes; no job kind where training stays in the step's pod:
    nothing to ask, and a profile without the admin's set runs."""
    api = step_pod("26.03", installed=False)
    api.add_config_map(NAMESPACE, "kfp-launcher", {"defaultPipelineRoot": f"s3://{s3_bucket}/private-artifacts/v2"})
    first_step(f"s3://{s3_bucket}/no-such-source.tar.gz", "pod", promotion_root=f"s3://{s3_bucket}/models")
    assert api.access_reviews == []
    assert "may not" not in capfd.readouterr().err


def test_a_missing_job_kind_permission_names_the_release_roles(step_pod, s3_bucket, capfd):
    """launcher=tfjob on a Trainer release: no profile role grants TFJobs there."""
    step_pod("1.11", installed=True)
    with pytest.raises(SystemExit) as ended:
        first_step(f"s3://{s3_bucket}/x.tar.gz", "tfjob")
    assert ended.value.code == 2
    (line,) = said(capfd)
    assert "may not create tfjobs (kubeflow.org), get tfjobs (kubeflow.org)" in line
    assert "kubeflow-edit" in line and "manifests/single-user/" in line


def test_outside_a_pod_nothing_is_asked(tmp_path):
    (tmp_path / "images").mkdir()
    assert first_step(str(tmp_path / "images"), "auto")  # a fingerprint, no API
