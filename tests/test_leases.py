"""`make leases`: the pipeline's document Leases whose documents the store no longer holds, listed and removed by
the profile owner (who holds list and delete on Leases once the admin's set is applied), judged on the API server's
clock, and only over the resourceVersion read."""

from __future__ import annotations

import datetime
import subprocess
import sys

from components.common import coordination, object_stores, storage, stores
from tests.builders import REPOSITORY
from tests.fake_kubernetes_api import NAMESPACE, FakeKubernetesApi


def _age(api: FakeKubernetesApi, uri: str, hours: float, name: str | None = None) -> None:
    """As if the Lease of `uri` (or named `name`) was last written `hours` ago (by the server's clock)."""
    lease = api.lease_store.leases[(NAMESPACE, name or coordination.lease_name(uri))]
    then = datetime.datetime.now(datetime.timezone.utc) - datetime.timedelta(hours=hours)
    for entry in lease["metadata"]["managedFields"]:
        entry["time"] = then.strftime("%Y-%m-%dT%H:%M:%SZ")


def test_leases_whose_documents_are_gone_are_listed_and_removed_and_no_other(
    unsafe_s3, tmp_path, monkeypatch
):  # fmt: skip
    with FakeKubernetesApi(release="1.11", pod_folder=tmp_path / "pod") as api:
        for name, value in api.pod_environment().items():  # a step: its documents go through Leases
            monkeypatch.setenv(name, value)
        object_stores.reset_clients()
        kept, retired, recent = (f"{unsafe_s3}/{folder}" for folder in ("models", "run-1", "run-2"))
        for root in (kept, retired, recent):
            storage.publisher_for(root).swap_document("current.json", b'{"version": 1}', stores.ABSENT)
        for root in (retired, recent):  # KFP's retention expired these runs' folders
            storage.publisher_for(root).withdraw("current.json")
        for root in (kept, retired):
            _age(api, f"{root}/current.json", hours=30)
        for name in api.pod_environment():
            monkeypatch.delenv(name)
        object_stores.reset_clients()
        kubeconfig = api.kubeconfig(tmp_path / "kubeconfig", token="owner-token")  # the profile owner's

        def leases(*variables: str) -> subprocess.CompletedProcess:
            return subprocess.run(
                [sys.executable, "-m", "pipeline.make", "leases", *variables], cwd=REPOSITORY, capture_output=True,
                text=True, env={**_environment(), "KUBECONFIG": str(kubeconfig)}, timeout=120,
            )  # fmt: skip

        listed = leases()
        assert listed.returncode == 0, listed.stderr
        lines = listed.stdout.splitlines()
        assert any(f"{kept}/current.json  kept: the store holds it" in line for line in lines)
        assert any(f"{retired}/current.json  stale: the store no longer holds it" in line for line in lines)
        assert any(f"{recent}/current.json  kept: changed within --min-age-hours" in line for line in lines)
        assert lines[-1] == f"3 Leases in {NAMESPACE}, 1 stale: REMOVE=1 removes them"
        assert len(api.lease_store.leases) == 3  # listing removes nothing

        removed = leases("REMOVE=1")
        assert removed.returncode == 0, removed.stderr
        assert removed.stdout.splitlines()[-1] == f"3 Leases in {NAMESPACE}; removed 1 stale"
        remaining = {lease["metadata"]["annotations"][coordination.URI_ANNOTATION]
                     for lease in api.lease_store.leases.values()}  # fmt: skip
        assert remaining == {f"{kept}/current.json", f"{recent}/current.json"}


def test_the_lease_of_a_step_that_ended_abruptly_is_listed_and_removed_and_a_live_ones_kept(tmp_path, monkeypatch):
    """A launching step holds its job's Lease (components/train/step_lease.py); one killed (SIGKILL, a lost node)
    leaves it behind, unrenewed: `make leases` lists it with the document Leases and REMOVE=1 removes it; the Lease
    of a step that renews it stays."""
    from kubernetes import client

    from components.train import step_lease

    with FakeKubernetesApi(release="26.03", pod_folder=tmp_path / "pod") as api:
        for name, value in api.pod_environment().items():  # the launching steps
            monkeypatch.setenv(name, value)
        api_client, namespace = coordination.in_cluster_client()
        held = {}
        for job in ("cifar10-train-dead", "cifar10-train-live"):
            held[job] = step_lease.StepLease(client.CoordinationV1Api(api_client), namespace,
                                             step_lease.lease_name(job), 90, f"pod of {job}")  # fmt: skip
            assert held[job].hold()
        held["cifar10-train-dead"]._stop.set()  # killed: no renewal, no release
        _age(api, "", hours=2, name="cifar10-train-dead-step")
        for name in api.pod_environment():
            monkeypatch.delenv(name)
        kubeconfig = api.kubeconfig(tmp_path / "kubeconfig", token="owner-token")

        def leases(*variables: str) -> subprocess.CompletedProcess:
            return subprocess.run(
                [sys.executable, "-m", "pipeline.make", "leases", *variables], cwd=REPOSITORY, capture_output=True,
                text=True, env={**_environment(), "KUBECONFIG": str(kubeconfig)}, timeout=120,
            )  # fmt: skip

        try:
            listed = leases()
            assert listed.returncode == 0, listed.stderr
            assert "cifar10-train-dead-step  step of cifar10-train-dead  stale: its step is gone" in listed.stdout
            assert "cifar10-train-live-step  step of cifar10-train-live  kept: its step renews it" in listed.stdout
            assert listed.stdout.splitlines()[-1] == f"2 Leases in {NAMESPACE}, 1 stale: REMOVE=1 removes them"
            removed = leases("REMOVE=1")
            assert removed.stdout.splitlines()[-1] == f"2 Leases in {NAMESPACE}; removed 1 stale", removed.stderr
            assert {name for _namespace, name in api.lease_store.leases} == {"cifar10-train-live-step"}
        finally:
            held["cifar10-train-live"]._stop.set()


def _environment() -> dict[str, str]:
    import os

    return {name: value for name, value in os.environ.items() if not name.startswith("KUBERNETES_")}
