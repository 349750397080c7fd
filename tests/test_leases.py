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


def _age(api: FakeKubernetesApi, uri: str, hours: float) -> None:
    """As if the Lease of `uri` was last written `hours` ago (by the server's clock)."""
    lease = api.lease_store.leases[(NAMESPACE, coordination.lease_name(uri))]
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


def _environment() -> dict[str, str]:
    import os

    return {name: value for name, value in os.environ.items() if not name.startswith("KUBERNETES_")}
