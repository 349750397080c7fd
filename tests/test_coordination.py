"""Out of the box on the stores Kubeflow ships: where the store cannot compare-and-swap, a step in a pod swaps its
documents (a dataset's manifest, a writer lease, a promotion pointer) as Kubernetes Leases, through the real
`kubernetes` client configured in-cluster, against a strict stand-in of the API (tests/fake_coordination_api.py).
The concurrency tests of publishing, the writer lease and promotion run on such a store too (their `s3-kubernetes`
variants)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from components.common import coordination, filesystem, object_stores, storage, stores
from components.common.access import AccessError
from tests.fake_coordination_api import FakeCoordinationApi

REPOSITORY = Path(__file__).resolve().parents[1]


def lease_of(pod: FakeCoordinationApi, uri: str) -> dict | None:
    return pod.lease(coordination.lease_name(uri))


def test_one_of_many_concurrent_writers_wins_a_document_and_the_store_holds_the_winners_copy(pod, unsafe_s3):
    root = f"{unsafe_s3}/contested"
    barrier = threading.Barrier(6)
    outcomes: dict[int, object] = {}

    def write(index: int) -> None:
        publisher = storage.publisher_for(root)
        barrier.wait(timeout=30)
        try:
            outcomes[index] = publisher.swap_document("current.json", f'{{"writer": {index}}}'.encode(), stores.ABSENT)
        except filesystem.PublishConflictError as error:
            outcomes[index] = error

    threads = [threading.Thread(target=write, args=(index,)) for index in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    winners = [index for index, outcome in outcomes.items() if isinstance(outcome, str)]
    assert len(winners) == 1, outcomes  # on this store alone, every one of the six would have "won"
    publisher = storage.publisher_for(root)
    content, version = publisher.read_document("current.json")
    assert json.loads(content) == {"writer": winners[0]} and version.startswith(coordination.VERSION_PREFIX)
    assert publisher.read("current.json") == content  # the store's copy, for readers outside the cluster
    lease = lease_of(pod, publisher.uri("current.json"))
    assert lease["metadata"]["annotations"][coordination.URI_ANNOTATION] == publisher.uri("current.json")
    assert object_stores.known_mode(publisher) == object_stores.KUBERNETES


def test_a_holder_paused_past_its_turn_cannot_make_its_late_copy_the_truth(pod, unsafe_s3):
    """A swaps, then pauses before writing the store's copy; B swaps after it and writes its copy; A wakes and writes
    its copy late. Steps read the Lease: B's document; A's next swap, on the version it saw, is refused."""
    publisher = storage.publisher_for(f"{unsafe_s3}/root")
    a_version = publisher.swap_document("current.json", b'{"version": 1}', stores.ABSENT)
    _content, seen = publisher.read_document("current.json")
    publisher.swap_document("current.json", b'{"version": 2}', seen)  # B, while A is paused
    object_stores.s3_client().put_object(  # A's late copy, straight to the store
        Bucket=filesystem.split_uri(publisher.root)[1], Key="root/current.json", Body=b'{"version": 1}'
    )
    assert publisher.read_document("current.json")[0] == b'{"version": 2}'
    with pytest.raises(filesystem.PublishConflictError):
        publisher.swap_document("current.json", b'{"version": 1, "again": true}', a_version)
    _content, latest = publisher.read_document("current.json")
    publisher.swap_document("current.json", b'{"version": 3}', latest)  # the next swap writes the copy again
    assert publisher.read("current.json") == b'{"version": 3}'


def test_a_document_written_before_the_coordination_is_read_and_swapped_from_the_stores_copy(pod, unsafe_s3):
    publisher = storage.publisher_for(f"{unsafe_s3}/older")
    object_stores.s3_client().put_object(Bucket=filesystem.split_uri(publisher.root)[1], Key="older/current.json",
                                         Body=b'{"version": 4}')  # fmt: skip
    content, version = publisher.read_document("current.json")
    assert content == b'{"version": 4}' and not version.startswith(coordination.VERSION_PREFIX)
    swapped = publisher.swap_document("current.json", b'{"version": 5}', version)
    assert swapped.startswith(coordination.VERSION_PREFIX)
    with pytest.raises(filesystem.PublishConflictError):  # a second writer that read the same copy loses
        publisher.swap_document("current.json", b'{"version": 5, "other": true}', version)
    publisher.withdraw_document("current.json")
    assert publisher.read_document("current.json") == (None, stores.ABSENT)
    assert lease_of(pod, publisher.uri("current.json")) is None


def test_a_lost_api_server_fails_the_write_retryably_and_a_silent_writer_fences_itself(pod, unsafe_s3, monkeypatch):
    from components.common import writer_claim

    publisher = storage.publisher_for(f"{unsafe_s3}/lost")
    publisher.swap_document("current.json", b"{}", stores.ABSENT)
    monkeypatch.setattr(writer_claim, "LEASE_SECONDS", 2.0)
    monkeypatch.setattr(writer_claim, "RENEW_SECONDS", 0.5)
    lease = writer_claim.WriterLease(f"{unsafe_s3}/lost/model", "pid 1 on here")
    lease.acquire()
    try:
        pod.down = True
        with pytest.raises(coordination.CoordinationError, match="could not read a Lease"):
            publisher.read_document("current.json")
        assert issubclass(coordination.CoordinationError, filesystem.StoreUnavailableError)  # exit 145: retried
        time.sleep(2.6)  # renewals fail against the lost server past the lease's duration
        with pytest.raises(writer_claim.WriterClaimError, match="could not renew its lease for"):
            lease.check()
    finally:
        pod.down = False
        lease.release()


def test_without_the_role_the_step_says_who_grants_it_in_one_line(tmp_path, unsafe_s3, monkeypatch):
    with FakeCoordinationApi(tmp_path / "other", service_account="someone-else") as api:
        for name, value in api.pod_environment().items():
            monkeypatch.setenv(name, value)
        object_stores.reset_clients()
        with pytest.raises(AccessError) as refused:  # a ValueError: exit 2 from every stage, one line
            storage.publisher_for(f"{unsafe_s3}/x").swap_document("current.json", b"{}", stores.ABSENT)
        assert "kubectl apply -k manifests/admin/" in str(refused.value) and "\n" not in str(refused.value)
        assert storage.publisher_for(f"{unsafe_s3}/x").read_document("current.json") == (None, stores.ABSENT)
    object_stores.reset_clients()


def test_a_second_profile_writing_one_prefix_is_refused_in_one_line_and_may_read(tmp_path, unsafe_s3, monkeypatch):
    """Leases are namespaced: a document swapped through team-a's Leases is not written from team-b, whose steps
    would not see them (its copy names the namespace it is coordinated in); reading it is fine."""
    root = f"{unsafe_s3}/mlpipeline-shared/models"
    for namespace in ("team-a", "team-b"):
        with FakeCoordinationApi(tmp_path / namespace, namespace=namespace) as api:
            for name, value in api.pod_environment().items():
                monkeypatch.setenv(name, value)
            object_stores.reset_clients()
            publisher = storage.publisher_for(root)
            if namespace == "team-a":
                publisher.swap_document("current.json", b'{"version": 1}', stores.ABSENT)
                continue
            assert publisher.read_document("current.json")[0] == b'{"version": 1}'
            with pytest.raises(ValueError) as refused:
                publisher.swap_document("current.json", b'{"version": 2}', publisher.read_document("current.json")[1])
            assert (
                "coordinate through the Leases of namespace team-a, which a step of namespace team-b does not"
                in str(refused.value)
                and "\n" not in str(refused.value)
            )
            assert api.leases == {}  # nothing made in team-b
    object_stores.reset_clients()
    assert storage.publisher_for(root).read("current.json") == b'{"version": 1}'


def test_the_stand_in_refuses_what_the_api_server_refuses(pod):
    from kubernetes.client.exceptions import ApiException

    api = coordination.documents().api
    body = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": {"name": "cifar10-pipeline-x"},
            "spec": {"holderIdentity": "a"}}  # fmt: skip
    created = api.create_namespaced_lease("team-a", body)
    refused = {}
    for why, call in {
        "exists": lambda: api.create_namespaced_lease("team-a", body),
        "stale": lambda: api.replace_namespaced_lease(
            "cifar10-pipeline-x", "team-a", {**body, "metadata": {**body["metadata"], "resourceVersion": "1"}}),
        "unknown field": lambda: api.create_namespaced_lease(
            "team-a", {**body, "metadata": {"name": "y"}, "spec": {"holder": "a"}}),
        "not a micro time": lambda: api.create_namespaced_lease(
            "team-a", {**body, "metadata": {"name": "z"}, "spec": {"renewTime": "2026-11-26T10:00:00Z"}}),
        "bad name": lambda: api.create_namespaced_lease("team-a", {**body, "metadata": {"name": "Not_A_Name"}}),
        "other namespace": lambda: api.read_namespaced_lease("cifar10-pipeline-x", "team-b"),
        "stale delete": lambda: api.delete_namespaced_lease(
            "cifar10-pipeline-x", "team-a", body={"preconditions": {"resourceVersion": "1"}}),
    }.items():  # fmt: skip
        with pytest.raises(ApiException) as raised:
            call()
        refused[why] = raised.value.status
    assert refused == {"exists": 409, "stale": 409, "unknown field": 400, "not a micro time": 422, "bad name": 422,
                       "other namespace": 403, "stale delete": 409}  # fmt: skip
    current = api.read_namespaced_lease("cifar10-pipeline-x", "team-a")
    assert current.metadata.resource_version == created.metadata.resource_version


def test_steps_in_a_pod_prepare_train_and_promote_on_a_store_without_conditional_writes_with_nothing_set(
    pod, unsafe_s3, tmp_path
):
    """What a Kubeflow 1.10 (MinIO RELEASE.2019-08-14) user's first run does, step by step as the pods run them: no
    setting (not ASSUME_SINGLE_WRITER); each step says which mechanism it uses; the documents are Leases, their
    copies in the store."""
    from tests.builders import tiny_train_config

    environment = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}
    assert filesystem.ASSUME_SINGLE_WRITER not in environment and "KUBERNETES_SERVICE_HOST" in environment
    data, model, models = f"{unsafe_s3}/datasets/d", f"{unsafe_s3}/runs/r/model", f"{unsafe_s3}/models"

    def step(*command: str) -> str:
        ran = subprocess.run([sys.executable, "-m", *command], cwd=REPOSITORY, env=environment, capture_output=True,
                             text=True, timeout=600)  # fmt: skip
        assert ran.returncode == 0, ran.stderr[-3000:]
        assert "swapped through the Kubernetes API instead" in ran.stderr, ran.stderr[-3000:]
        return ran.stderr

    step("components.prepare_data", "--source", "synthetic", "--output", data, "--synthetic-train-per-class", "8",
         "--synthetic-eval-per-class", "4")  # fmt: skip
    config = tiny_train_config(data, model, train_steps=4)
    from components.common.config import config_to_dict

    step("components.train", "--config", json.dumps({**config_to_dict(config), "launcher": "inprocess"}))
    step("components.evaluate", "--data", data, "--model-dir", model, "--promote-to", models)
    for uri in (f"{data}/manifest.json", f"{models}/current.json"):
        lease = lease_of(pod, uri)
        assert lease is not None, uri
        content = lease["metadata"]["annotations"][coordination.CONTENT_ANNOTATION].encode()
        assert storage.read_bytes(uri) == content  # the copy a reader outside the cluster reads
    pointer = json.loads(storage.read_bytes(f"{models}/current.json"))
    assert pointer["version"] == 1 and pointer["state"] == "ready"
    assert lease_of(pod, f"{model}/.writer-lease.json") is None  # the writer's lease ended with the run


# -- what stands in front of the API: throttling, bad moments, a login page, a proxy's own 409 --------------------


def _status(code: int, reason: str) -> dict:
    return {
        "apiVersion": "v1",
        "kind": "Status",
        "status": "Failure",
        "reason": reason,
        "code": code,
        "message": reason,
    }


@pytest.mark.parametrize(
    ("faults", "least_seconds"),
    [([(429, _status(429, "TooManyRequests"), {"Retry-After": "1"})], 1.0),
     ([(503, _status(503, "ServiceUnavailable"), {}), (500, _status(500, "InternalError"), {})], 1.0),
     ([(409, _status(409, "AlreadyExists"), {})], 0.0)],
    ids=["429-retry-after", "503-then-500", "409-not-applied"],
)  # fmt: skip
def test_throttling_bad_moments_and_a_409_nobody_caused_are_gone_through(pod, unsafe_s3, faults, least_seconds):
    """A 429 is waited out as its Retry-After says, 5xx retried with back-off, and a create answered 409 with
    nothing there (a proxy's answer, not another writer's) made again: the swap succeeds, nothing reported lost."""
    publisher = storage.publisher_for(f"{unsafe_s3}/faults")
    publisher.read_document("current.json")  # the store checked first (its probes are not this test's)
    pod.faults = list(faults)
    started = time.monotonic()
    version = publisher.swap_document("current.json", b'{"version": 1}', stores.ABSENT)
    assert version.startswith(coordination.VERSION_PREFIX) and time.monotonic() - started >= least_seconds
    assert pod.faults == [] and publisher.read_document("current.json") == (b'{"version": 1}', version)


def test_throttling_that_lasts_ends_retryably_naming_how_long(pod, unsafe_s3, monkeypatch):
    monkeypatch.setattr(coordination, "RETRY_SECONDS", 2.0)
    publisher = storage.publisher_for(f"{unsafe_s3}/throttled")
    publisher.read_document("current.json")
    pod.faults = [(429, _status(429, "TooManyRequests"), {"Retry-After": "1"})] * 10
    with pytest.raises(coordination.CoordinationError, match=r"could not create a Lease \(429 .*, for 2 s\)"):
        publisher.swap_document("current.json", b"{}", stores.ABSENT)
    assert issubclass(coordination.CoordinationError, filesystem.StoreUnavailableError)  # exit 145: the step retried


def test_an_html_page_instead_of_the_api_is_one_line_never_a_traceback(pod, unsafe_s3):
    publisher = storage.publisher_for(f"{unsafe_s3}/login")
    publisher.swap_document("current.json", b"{}", stores.ABSENT)
    pod.faults = [(200, b"<html><body>Sign in</body></html>", {})]
    with pytest.raises(
        coordination.NotTheApiError, match=r"answer to read a Lease is not a Lease \(an HTML page"
    ) as refused:
        publisher.read_document("current.json")
    assert "\n" not in str(refused.value)


def test_a_holder_whose_clock_is_1000_s_behind_keeps_its_lease_while_it_renews(pod, unsafe_s3, monkeypatch):
    """client-go's rule: a newcomer acts on what it watches on its own clock, never on the record's timestamps.
    The holder's records say it renewed 1000 s ago; it renews every half second: the newcomer sees the renewals and
    refuses, after watching, however old the record looks."""
    from components.common import writer_claim

    monkeypatch.setattr(writer_claim, "LEASE_SECONDS", 3.0)
    monkeypatch.setattr(writer_claim, "RENEW_SECONDS", 0.5)
    monkeypatch.setattr(writer_claim, "POLL_SECONDS", 0.1)
    uri = f"{unsafe_s3}/clocks/model"
    holder = writer_claim.WriterLease(uri, "pid 1 on a host whose clock is behind")
    behind = holder._record
    monkeypatch.setattr(holder, "_record", lambda: json.dumps({
        **json.loads(behind()), "renewed_at": time.time() - 1000}).encode())  # fmt: skip
    holder.acquire()
    try:
        newcomer = writer_claim.WriterLease(uri, "pid 2 on here")
        started = time.monotonic()
        with pytest.raises(writer_claim.WriterClaimError, match="renewed its lease while this one watched"):
            newcomer.acquire()
        assert time.monotonic() - started < 3.0  # a renewal showed it alive before the lease could run out
        holder.check()  # still its own
    finally:
        holder.release()
    assert storage.publisher_for(uri).read_document(writer_claim.WRITER_LEASE)[0] is None


def test_the_holder_gives_up_before_a_newcomer_may_take_over(pod, unsafe_s3, monkeypatch):
    """The holder's deadline is a third of the lease shorter than the lease (LeaseDuration > RenewDeadline)."""
    from components.common import writer_claim

    monkeypatch.setattr(writer_claim, "LEASE_SECONDS", 3.0)
    monkeypatch.setattr(writer_claim, "RENEW_SECONDS", 0.5)
    lease = writer_claim.WriterLease(f"{unsafe_s3}/deadline/model", "pid 1 on here")
    lease.acquire()
    try:
        pod.down = True  # no renewal goes through
        time.sleep(writer_claim.renew_deadline() + 0.3)
        with pytest.raises(writer_claim.WriterClaimError, match=r"a newcomer may take it over 3 s after"):
            lease.check()
        assert writer_claim.renew_deadline() == pytest.approx(2.0)
    finally:
        pod.down = False
        lease.release()


def test_a_release_removes_only_the_lease_it_holds(pod, unsafe_s3, monkeypatch):
    """A delete carries the resourceVersion read: a lease that changed hands just before is not removed."""
    from components.common import writer_claim

    monkeypatch.setattr(writer_claim, "RENEW_SECONDS", 60.0)
    uri = f"{unsafe_s3}/handover/model"
    lease = writer_claim.WriterLease(uri, "pid 1 on here")
    lease.acquire()
    publisher = storage.publisher_for(uri)
    content, version = publisher.read_document(writer_claim.WRITER_LEASE)
    real_read = type(publisher).read_document

    def read_then_taken_over(self, name):  # the release reads its own lease; a newcomer swaps right after
        found = real_read(self, name)
        if name == writer_claim.WRITER_LEASE and found[0] == content:
            taken = {"holder": "pid 2 elsewhere", "token": "newcomer", "renewed_at": 0}
            real_swap(self, name, json.dumps(taken).encode(), found[1])
        return found

    real_swap = type(publisher).swap_document
    with monkeypatch.context() as patched:
        patched.setattr(type(publisher), "read_document", read_then_taken_over)
        lease.release()
    held = json.loads(storage.publisher_for(uri).read_document(writer_claim.WRITER_LEASE)[0])
    assert held["token"] == "newcomer" and version  # the newcomer's lease stands


@pytest.mark.parametrize("fault", ["close", "close-applied", ("hang", 3.0)], ids=["closed", "closed-applied", "hang"])
@pytest.mark.parametrize("call", ["create", "read", "replace", "delete"])
def test_a_connection_closed_or_hung_is_gone_through_and_an_applied_write_is_known_as_its_own(
    pod, unsafe_s3, monkeypatch, fault, call
):
    """Whatever the proxy does to one request (closes it before or after the API applied it, holds it past the
    client's timeout), the document ends as this writer made it and nothing is reported lost or taken over."""
    monkeypatch.setattr(coordination, "REQUEST_SECONDS", 1)
    publisher = storage.publisher_for(f"{unsafe_s3}/closed")
    publisher.read_document("current.json")
    version = stores.ABSENT
    if call != "create":
        version = publisher.swap_document("current.json", b'{"version": 1}', stores.ABSENT)
    pod.faults = [fault]
    if call == "create":
        version = publisher.swap_document("current.json", b'{"version": 1}', stores.ABSENT)
        assert publisher.read_document("current.json") == (b'{"version": 1}', version)
    elif call == "read":
        assert publisher.read_document("current.json") == (b'{"version": 1}', version)
    elif call == "replace":
        replaced = publisher.swap_document("current.json", b'{"version": 2}', version)
        assert publisher.read_document("current.json") == (b'{"version": 2}', replaced)
    else:
        publisher.withdraw_document("current.json", version)
        assert publisher.read_document("current.json")[0] is None
    assert pod.faults == []


def test_an_api_that_keeps_hanging_ends_retryably_naming_how_long(pod, unsafe_s3, monkeypatch):
    monkeypatch.setattr(coordination, "REQUEST_SECONDS", 1)
    monkeypatch.setattr(coordination, "RETRY_SECONDS", 3.0)
    publisher = storage.publisher_for(f"{unsafe_s3}/hung")
    publisher.read_document("current.json")
    pod.faults = [("hang", 2.0)] * 20
    started = time.monotonic()
    with pytest.raises(coordination.CoordinationError, match=r"could not create a Lease \(no answer.*for 3 s\)"):
        publisher.swap_document("current.json", b"{}", stores.ABSENT)
    assert time.monotonic() - started < 15
    pod.faults = []


def test_the_steps_lease_goes_through_the_fault_proxy_and_refuses_what_is_not_the_api(pod):
    """The launching step's lease (components/train/step_lease.py), which its job's workers watch to delete the job
    when the step is gone: a login page instead of the API is one line; throttling, a closed connection and a
    request that hangs are gone through, and renewals that meet a hang keep the workers' watch from lapsing."""
    import threading

    from components.train import step_lease

    api, namespace = coordination.in_cluster_api()
    lease = step_lease.StepLease(api, namespace, "job-step", 6.0, "step-1")
    pod.faults = [(200, b"<html><body>Sign in</body></html>", {})]
    with pytest.raises(coordination.NotTheApiError, match="not a Lease"):
        lease.hold()
    pod.faults = [(429, _status(429, "TooManyRequests"), {"Retry-After": "1"}), "close", ("hang", 4.0)]
    assert lease.hold()
    stop, seen = threading.Event(), []
    watch = step_lease.LeaseWatch(api, namespace, "job-step", 6.0, stop=stop)
    watcher = threading.Thread(target=lambda: seen.append(watch.lapsed()), daemon=True)
    watcher.start()
    try:
        pod.faults = [("hang", 4.0), "close-applied", ("hang", 4.0)]
        watcher.join(timeout=14)
        assert seen == [] and pod.faults == []  # renewed through every fault: no lapse seen
    finally:
        lease.release()
    watcher.join(timeout=20)
    assert seen and "job-step of the step that launched this job was deleted" in seen[0]
