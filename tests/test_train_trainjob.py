"""The trainjob launcher (Kubeflow Trainer v2), driven through the real `kubernetes` client against a strict stand-in
of a Kubeflow 1.11 cluster (Trainer v2.3's CRDs, webhooks and a profile's RBAC; JobSet v0.12), and launcher auto on
the clusters users run. End to end: the stand-in plays Trainer, PlainML and JobSet far enough to give each pod the env
and host name they would, and real worker processes train with exactly that env, are preempted, and resume."""

from __future__ import annotations

import contextlib
import copy
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import yaml

from components.train import cluster_job, launch_trainjob, launcher, step_lease
from components.train.config import TrainConfig
from components.train.distribution import ADDRESS_MAP, WORKER_PORT, ClusterError, tf_config_from_jobset
from components.train.launch_config import LaunchConfig
from tests.fake_kubernetes_api import (
    NAMESPACE,
    TRAINJOB_COMPLETE,
    TRAINJOB_FAILED,
    TRAINJOB_RUNNING,
    TRAINJOB_SUSPENDED,
    FakeKubernetesApi,
    PodRecord,
    Refused,
    Tick,
    condition,
    job_failure,
    jobset_action,
    jobset_for,
    resolve_env,
    trainjob_pods,
)

REPOSITORY = Path(__file__).resolve().parents[1]
RUNTIME = yaml.safe_load((REPOSITORY / "manifests" / "admin" / "trainer" / "trainjob-runtime.yaml").read_text())
NODE0_LOG = {
    0: "step 10/40 loss 2.1\nstep 20/40 loss 1.7\n" + "x" * 70_000 + "\npreempted: saving\n",
    1: "resumed at step 20\nstep 40/40 loss 0.9\n",
}


def config(**overrides) -> TrainConfig:
    values = {
        "data": "s3://mlpipeline/private-artifacts/team-a/data",
        "model_dir": "s3://mlpipeline/private-artifacts/team-a/v2/artifacts/run/model-directory",
        "workers": 4,
        "batch_size": 512,
        "launcher": "trainjob",
        "train_steps": 1000,
    }
    values.update(overrides)
    return TrainConfig(**values)


def launch(**overrides) -> LaunchConfig:
    values = {
        "gpus_per_worker": 2,
        "worker_cpu": "8",
        "worker_memory": "30Gi",
        "worker_image": "registry.example/cifar10/gpu:1.2.3",
        "image_pull_secrets": ("registry-credentials",),
        "queue_name": "team-a-gpus",
    }
    values.update(overrides)
    return LaunchConfig(**values)


@pytest.fixture(autouse=True)
def in_a_profile_namespace(tmp_path, monkeypatch):
    """The launching step's pod, in a KFP profile's namespace, with the object store's endpoint set."""
    path = tmp_path / "namespace"
    path.write_text(f"{NAMESPACE}\n")
    monkeypatch.setattr(cluster_job, "SERVICE_ACCOUNT_NAMESPACE", path)
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://seaweedfs.kubeflow:8333")
    monkeypatch.setenv("CIFAR10_PIPELINE_COMPILED_KERNELS", "off")  # set on the step: the workers take it too


def install_runtime(api: FakeKubernetesApi, runtime: dict | None = None) -> dict:
    """The cluster admin applies manifests/admin/trainer/ (as cluster-admin: a profile may not create runtimes)."""
    custom, _core = api.clients(token="admin-token")
    return custom.create_cluster_custom_object(
        "trainer.kubeflow.org", "v1alpha1", "clustertrainingruntimes", copy.deepcopy(runtime or RUNTIME),
        field_validation="Strict",  # kubectl apply validates strictly
    )  # fmt: skip


def trainjob_launcher(api: FakeKubernetesApi, **options) -> cluster_job.ClusterJobLauncher:
    custom, core = api.clients()
    settings = {"poll_seconds": 0.3, "backoff_seconds": 0.01, "log_poll_seconds": 0.02, **options}
    return launch_trainjob.trainjob_launcher(custom, core, **settings)


def logged_lines(caplog, pod_prefix: str) -> list[str]:
    lines = []
    for record in caplog.records:
        message = record.getMessage()
        if message.startswith(f"[{pod_prefix}"):
            lines.append(message.split("] ", 1)[1])
    return lines


# Trainer v2.1 (Kubeflow 1.11 and 26.03, each with its own roles); v2.2 and v2.3 (an admin's)
TRAINER_RELEASES = ("1.11", "26.03", "trainer-2.2", "trainer-2.3")


@pytest.mark.parametrize("release", TRAINER_RELEASES)
def test_the_trainjob_sent_passes_the_crds_webhooks_and_rbac_and_worker_0s_log_survives_a_jobset_restart(
    release, caplog
):
    timeline = [
        Tick(TRAINJOB_RUNNING, pod="Pending"),
        Tick(TRAINJOB_RUNNING),
        Tick(TRAINJOB_RUNNING),
        Tick(TRAINJOB_RUNNING, pod="Pending", restarts=1),  # the JobSet restarted: a new pod for worker 0
        Tick(TRAINJOB_RUNNING, restarts=1),
        Tick(TRAINJOB_RUNNING, restarts=1),
        Tick(TRAINJOB_COMPLETE, pod="Succeeded", restarts=1),
    ]
    with FakeKubernetesApi(timeline, NODE0_LOG, release=release) as api, caplog.at_level("INFO"):
        install_runtime(api)
        outcome = trainjob_launcher(api).run(config(), launch(), name="cifar10-train-run42")
    assert outcome.succeeded and api.refused == []
    (body,) = api.created
    assert body["metadata"] == {
        "name": "cifar10-train-run42",
        "namespace": NAMESPACE,  # the pod's own namespace
        "labels": {
            "app.kubernetes.io/name": "cifar10-pipeline",
            "app.kubernetes.io/component": "train",
            "kueue.x-k8s.io/queue-name": "team-a-gpus",
        },
    }
    spec = body["spec"]
    assert spec["runtimeRef"] == {
        "name": "cifar10-pipeline-tensorflow",
        "apiGroup": "trainer.kubeflow.org",
        "kind": "ClusterTrainingRuntime",
    }
    trainer = spec["trainer"]
    assert trainer["numNodes"] == 4 and trainer["image"] == "registry.example/cifar10/gpu:1.2.3"
    assert trainer["resourcesPerNode"] == {
        "requests": {"cpu": "8", "memory": "30Gi"},
        "limits": {"memory": "30Gi", "nvidia.com/gpu": 2},
    }
    environment = {variable["name"]: variable for variable in trainer["env"]}
    assert environment["TRAINJOB_NAME"]["value"] == "cifar10-train-run42"
    assert environment["TRAINJOB_NUM_NODES"]["value"] == "4"
    assert environment["AWS_ENDPOINT_URL"]["value"] == "http://seaweedfs.kubeflow:8333"
    assert environment["CIFAR10_PIPELINE_COMPILED_KERNELS"]["value"] == "off"
    assert environment["AWS_ACCESS_KEY_ID"]["valueFrom"]["secretKeyRef"] == {
        "name": "mlpipeline-minio-artifact",
        "key": "accesskey",
        "optional": True,
    }
    worker_config = json.loads(trainer["args"][1])
    assert worker_config["launcher"] == "worker" and worker_config["workers"] == 4
    pod_settings = {
        "serviceAccountName": "cifar10-pipeline",
        "imagePullSecrets": [{"name": "registry-credentials"}],
        "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
    }
    if release in ("1.11", "26.03"):  # Trainer v2.1: pod template overrides, no grace period, no active deadline
        assert spec["podTemplateOverrides"] == [{"targetJobs": [{"name": "node"}], "spec": pod_settings}]
        assert "runtimePatches" not in spec and "activeDeadlineSeconds" not in spec
    else:
        (patch,) = spec["runtimePatches"]
        (node,) = patch["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"]
        pod = node["template"]["spec"]["template"]["spec"]
        grace = {"terminationGracePeriodSeconds": 300} if release == "trainer-2.3" else {}  # v2.2's patch has none
        assert pod == {**pod_settings, **grace}
        assert spec["activeDeadlineSeconds"] == 7 * 24 * 3600 and "podTemplateOverrides" not in spec
    assert api.pruned == []  # nothing was dropped: every field is one the cluster's Trainer knows
    assert api.deleted == [(NAMESPACE, "cifar10-train-run42")]
    # Every line of both pods' logs, whole (one is longer than the client's 64 KiB reads), once, in order.
    expected = [line for instance in (0, 1) for line in NODE0_LOG[instance].splitlines()]
    assert logged_lines(caplog, "cifar10-train-run42-node-0-0") == expected
    assert "a new pod after JobSet restart 1" in caplog.text
    # Nothing but what a profile's default-editor may do: no JobSet, no runtime written.
    touched = {path.split("/")[-2] if path.endswith("/log") else path for _user, _method, path in api.requests}
    assert not any("jobsets" in path or "/trainingruntimes" in path for path in touched)


def test_cpu_workers_neither_request_nor_tolerate_gpus():
    with FakeKubernetesApi([Tick(TRAINJOB_COMPLETE, pod="Succeeded")], release="trainer-2.3") as api:
        install_runtime(api)
        trainjob_launcher(api).run(config(), launch(gpus_per_worker=0, image_pull_secrets=()), name="cpu-job")
    spec = api.created[0]["spec"]
    pod = spec["runtimePatches"][0]["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"][0]
    assert "tolerations" not in pod["template"]["spec"]["template"]["spec"]
    assert "nvidia.com/gpu" not in spec["trainer"]["resourcesPerNode"]["limits"]


def test_a_missing_runtime_fails_at_once_naming_the_manifest_the_admin_applies():
    with (
        FakeKubernetesApi([Tick(TRAINJOB_RUNNING)], release="1.11") as api,
        pytest.raises(cluster_job.JobError, match=r"'cifar10-pipeline-tensorflow' is not installed.*manifests/admin"),
    ):
        trainjob_launcher(api).run(config(), launch(), name="no-runtime")
    assert api.created == []


def test_a_trainjob_on_a_kubeflow_1_10_cluster_says_what_is_missing():
    with (
        FakeKubernetesApi([Tick(TRAINJOB_RUNNING)], release="1.10") as api,
        pytest.raises(cluster_job.JobError, match=r"does not serve trainer.kubeflow.org/v1alpha1"),
    ):
        trainjob_launcher(api).run(config(), launch(), name="old-cluster")


@pytest.mark.parametrize(
    ("release", "expected"),
    [("1.11", "trainjob"), ("trainer-2.3", "trainjob"), ("1.10", "tfjob"),
     ("none", "install Kubeflow Trainer v2.3.*launcher=pod")],
)  # fmt: skip
def test_launcher_auto_picks_what_the_cluster_serves(release, expected):
    with FakeKubernetesApi([Tick()], release=release) as api:
        custom, _core = api.clients()
        if release == "none":
            with pytest.raises(ValueError, match=expected):
                launcher.cluster_job_kind(custom)
        else:
            assert launcher.cluster_job_kind(custom) == expected


def test_the_launch_component_resolves_auto_by_asking_the_cluster(monkeypatch):
    from components.train import kfp_run

    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    assert kfp_run.resolve_launcher("auto", 2) == "auto"  # kfp.local: the CLI's auto (local processes)
    assert kfp_run.resolve_launcher("pod", 2) == "local" and kfp_run.resolve_launcher("pod", 1) == "inprocess"
    with FakeKubernetesApi([Tick()], release="1.11") as api:
        monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.0.0.1")
        monkeypatch.setattr(cluster_job, "kubernetes_apis", lambda: api.clients())
        assert kfp_run.resolve_launcher("auto", 1) == "trainjob"  # a job even for one worker: not in the small pod


def _node_patch(job: dict) -> dict:
    return job["spec"]["runtimePatches"][0]["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"][0]


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda job: job["spec"]["trainer"].update(numNodes="4"), "'4' is not of type 'integer'"),
        (lambda job: job["spec"]["trainer"].update(nodes=4), 'strict decoding error: unknown field "spec.trainer.nod'),
        (lambda job: job["metadata"].update(name="1st-job"), "RFC 1035"),
        (lambda job: job["spec"]["runtimePatches"][0].update(manager="launcher"), "domain-prefixed path"),
        (lambda job: _node_patch(job).update(name="worker"), "replicated job that doesn't exist"),
        (
            lambda job: _node_patch(job)["template"]["spec"]["template"]["spec"].update(
                containers=[{"name": "node", "env": [{"name": "A", "value": "1"}]}]
            ),
            "must not have envs for",
        ),
        (lambda job: job["spec"]["runtimeRef"].update(name="tensorflow-distributed"), "must be created before"),
        (lambda job: job["spec"].update(managedBy="me"), "Invalid value"),
    ],
)
def test_the_stand_in_refuses_what_the_api_server_or_webhooks_would(change, message):
    job = launch_trainjob.TrainJobKind().build(config(), launch(), "good-name", NAMESPACE)
    change(job)
    with FakeKubernetesApi([Tick()], release="trainer-2.3") as api:
        install_runtime(api)
        with pytest.raises(Refused, match=message):
            api.create("trainjobs", NAMESPACE, job)


@pytest.mark.parametrize(
    ("path", "kind"),
    [("/apis/jobset.x-k8s.io/v1alpha2/namespaces/team-a/jobsets", "jobsets"),
     ("/apis/trainer.kubeflow.org/v1alpha1/namespaces/team-a/trainingruntimes", "trainingruntimes"),
     ("/apis/trainer.kubeflow.org/v1alpha1/clustertrainingruntimes", "clustertrainingruntimes")],
)  # fmt: skip
def test_a_profile_may_not_create_jobsets_or_runtimes_and_gets_the_apis_403(path, kind):
    """What the vendored kubeflow-edit role does not allow, the stand-in refuses as the API server would."""
    from kubernetes.client.exceptions import ApiException

    with FakeKubernetesApi([Tick()], release="1.11") as api:
        custom, _core = api.clients()
        with pytest.raises(ApiException) as refused:
            custom.api_client.call_api(path, "POST", body={}, auth_settings=["BearerToken"], response_type="object")
    assert refused.value.status == 403
    message = json.loads(refused.value.body)["message"]
    assert f'User "system:serviceaccount:team-a:default-editor" cannot create resource "{kind}"' in message


def test_a_field_the_clusters_trainer_does_not_know_is_refused_never_dropped(monkeypatch):
    """The API server drops unknown fields unless asked to be strict (its default since Kubernetes 1.23 only warns):
    the stand-in does the same, and the launcher asks to be strict."""
    stale = launch_trainjob.TrainJobKind(launch_trainjob.CURRENT_SPEC_FIELDS)  # built for v2.3, as if misinformed
    job = stale.build(config(), launch(), "stale", NAMESPACE)
    with FakeKubernetesApi([Tick()], release="1.11") as api:
        install_runtime(api)
        api.create("trainjobs", NAMESPACE, copy.deepcopy(job), field_validation="Warn")
        assert "spec.runtimePatches" in api.pruned and "spec.activeDeadlineSeconds" in api.pruned  # silently gone
        current = launch_trainjob.CURRENT_SPEC_FIELDS, launch_trainjob.CURRENT_POD_PATCH_FIELDS
        monkeypatch.setattr(launch_trainjob, "served_spec_fields", lambda _launcher: current)
        with pytest.raises(cluster_job.JobError, match=r'strict decoding error: unknown field "spec.activeDeadlineSec'):
            trainjob_launcher(api).run(config(), launch(), name="stale-2")


@pytest.mark.parametrize("release", ["1.11", "trainer-2.2"])
def test_before_trainer_2_3_the_runtimes_grace_period_applies_and_the_log_says_so(caplog, release):
    with FakeKubernetesApi([Tick(TRAINJOB_COMPLETE, pod="Succeeded")], release=release) as api, caplog.at_level("INFO"):
        install_runtime(api)
        trainjob_launcher(api).run(config(), launch(termination_grace_seconds=900), name="grace")
    assert "cannot set a TrainJob's termination grace period: the runtime's 300 s applies, not 900 s" in caplog.text


def test_a_suspended_job_is_waited_for_and_a_failed_one_fails_the_step_and_is_deleted(caplog):
    timeline = [Tick(TRAINJOB_SUSPENDED, pod=None), Tick(TRAINJOB_SUSPENDED, pod=None), Tick(TRAINJOB_FAILED)]
    with (
        FakeKubernetesApi(timeline, release="1.11") as api,
        caplog.at_level("WARNING"),
        pytest.raises(cluster_job.JobError, match=r"TrainJob team-a/job-1 failed: FailJobSetFailurePolicyAction"),
    ):
        install_runtime(api)
        trainjob_launcher(api).run(config(), launch(), name="job-1")
    assert "is suspended (waiting to be admitted, e.g. by Kueue)" in caplog.text
    assert api.deleted == [(NAMESPACE, "job-1")]


def test_a_complete_condition_with_status_false_is_not_success():
    not_yet = [condition("Complete", "False")]
    with (
        FakeKubernetesApi([Tick(not_yet), Tick(not_yet), Tick(TRAINJOB_FAILED)], release="1.11") as api,
        pytest.raises(cluster_job.JobError, match="failed"),
    ):
        install_runtime(api)
        trainjob_launcher(api).run(config(), launch(), name="job-2")


def test_a_job_that_never_ends_times_out_and_is_deleted():
    with (
        FakeKubernetesApi([Tick(TRAINJOB_RUNNING)], release="trainer-2.3") as api,
        pytest.raises(cluster_job.JobError, match=r"did not finish within 1 s; it was deleted"),
    ):
        install_runtime(api)
        trainjob_launcher(api).run(config(), launch(job_timeout_seconds=1), name="job-3")
    assert api.deleted == [(NAMESPACE, "job-3")]
    assert api.created[0]["spec"]["activeDeadlineSeconds"] == 1  # the job times itself out too


@pytest.mark.parametrize("number", [signal.SIGTERM, signal.SIGINT])
def test_sigterm_or_ctrl_c_cancels_the_step_and_deletes_the_job(number):
    with FakeKubernetesApi([Tick(TRAINJOB_RUNNING)], release="1.11") as api:
        install_runtime(api)
        api.on_job_get = lambda tick: tick == 2 and os.kill(os.getpid(), number)
        with pytest.raises(cluster_job.Cancelled):
            trainjob_launcher(api).run(config(), launch(), name="cancelled")
    assert api.deleted == [(NAMESPACE, "cancelled")]


def test_a_retried_step_follows_the_job_its_earlier_attempt_started(caplog):
    name = cluster_job.job_name_for_run("8d3f2a10-run-of-the-pipeline")
    with FakeKubernetesApi([Tick(TRAINJOB_RUNNING), Tick(TRAINJOB_COMPLETE)], release="trainer-2.3") as api:
        install_runtime(api)
        api.create_job(NAMESPACE, launch_trainjob.TrainJobKind().build(config(), launch(), name, NAMESPACE))
        with caplog.at_level("WARNING"):
            assert trainjob_launcher(api).run(config(), launch(), name=name).succeeded
    assert "exists already (an earlier attempt of this step): following it" in caplog.text
    assert len(api.created) == 1 and api.deleted == [(NAMESPACE, name)]


@pytest.mark.parametrize("release", ["1.11", "26.03"])
def test_a_launched_trainjob_is_owned_by_the_runs_workflow_and_goes_with_it(release, monkeypatch, caplog):
    """The launching step finds its run's Workflow from its own pod (Argo's owner reference) and makes it the job's
    owner: when KFP deletes the finished run's Workflow, the garbage collector deletes the job too (a job whose
    launching step died, which no exit handler or lease removed)."""
    name = cluster_job.job_name_for_run("run-owned-by-its-workflow")
    with FakeKubernetesApi([Tick(TRAINJOB_RUNNING), Tick(TRAINJOB_COMPLETE)], release=release) as api:
        install_runtime(api)
        owner = api.add_workflow(NAMESPACE, "cifar10-pipeline-x7k2p")
        api.add_pod(PodRecord(NAMESPACE, "cifar10-pipeline-x7k2p-system-container-impl-42", {}, {}, "main",
                              phase="Running", owners=[owner]))  # fmt: skip
        monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "127.0.0.1")  # in a pod, whose host name is its name
        monkeypatch.setenv("HOSTNAME", "cifar10-pipeline-x7k2p-system-container-impl-42")
        with caplog.at_level("INFO"):
            assert trainjob_launcher(api).run(config(), launch(), name=name).succeeded
        (created,) = api.created
        assert created["metadata"]["ownerReferences"] == [
            {"apiVersion": "argoproj.io/v1alpha1", "kind": "Workflow", "name": "cifar10-pipeline-x7k2p",
             "uid": owner["uid"]}
        ]  # fmt: skip
        assert "owned by Workflow cifar10-pipeline-x7k2p" in caplog.text
        api.create_job(NAMESPACE, created)  # as a step that died after creating it would have left it
        api.delete_workflow(NAMESPACE, "cifar10-pipeline-x7k2p")
        assert api.jobs == {} and api.collected == [(NAMESPACE, name)]


@pytest.mark.parametrize("named_by", ["KFP_POD_NAME", "POD_NAME"])
def test_a_pod_named_by_253_characters_finds_its_workflow_by_the_name_kfp_gives_it(named_by, monkeypatch, caplog):
    """Argo names a step's pod after the run and its DAG path (up to 253 characters); the kubelet cuts the host name
    to 63. The launching step reads its name where KFP's own launcher does ($KFP_POD_NAME, from the downward API),
    not from $HOSTNAME."""
    workflow = "cifar10-pipeline-" + "x" * 40
    pod_name = f"{workflow}-{'condition-branches-3-' * 10}system-container-impl-4242"[:253]
    name = cluster_job.job_name_for_run("run-with-a-long-pod-name")
    with FakeKubernetesApi([Tick(TRAINJOB_RUNNING), Tick(TRAINJOB_COMPLETE)], release="26.03") as api:
        install_runtime(api)
        owner = api.add_workflow(NAMESPACE, workflow)
        api.add_pod(PodRecord(NAMESPACE, pod_name, {}, {}, "main", phase="Running", owners=[owner]))
        monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "127.0.0.1")
        monkeypatch.setenv("HOSTNAME", pod_name[:63])  # as the kubelet sets it
        monkeypatch.setenv(named_by, pod_name)
        assert trainjob_launcher(api).run(config(), launch(), name=name).succeeded
        (created,) = api.created
        assert created["metadata"]["ownerReferences"][0]["name"] == workflow
        monkeypatch.delenv(named_by)  # with the host name alone: the pod is not found, and the line says why
        with caplog.at_level("WARNING"):
            assert trainjob_launcher(api).run(config(), launch(), name=name + "-2").succeeded
        assert "its name from HOSTNAME (cut to 63 characters by the kubelet" in caplog.text
        assert "ownerReferences" not in api.created[-1]["metadata"]


def test_without_a_workflow_owner_the_job_has_none_and_the_stand_in_collects_a_dangling_one(monkeypatch, caplog):
    with FakeKubernetesApi([Tick(TRAINJOB_RUNNING), Tick(TRAINJOB_COMPLETE)], release="1.11") as api:
        install_runtime(api)
        monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "127.0.0.1")
        monkeypatch.setenv("HOSTNAME", "no-such-pod")
        with caplog.at_level("WARNING"):
            assert trainjob_launcher(api).run(config(), launch(), name="lonely").succeeded
        assert "ownerReferences" not in api.created[0]["metadata"]
        assert "the job is removed by this step's lease alone" in caplog.text
        orphan = copy.deepcopy(api.created[0])
        orphan["metadata"]["ownerReferences"] = [{"apiVersion": "argoproj.io/v1alpha1", "kind": "Workflow",
                                                  "name": "gone", "uid": "uid-of-a-deleted-workflow"}]  # fmt: skip
        api.create_job(NAMESPACE, orphan)  # an owner that is not there: the garbage collector deletes it at once
        assert api.jobs == {} and api.collected == [(NAMESPACE, "lonely")]


# -- the runtime the admin applies ---------------------------------------------------------------------------------


@pytest.mark.parametrize("release", TRAINER_RELEASES)
def test_the_shipped_runtime_passes_the_crd_and_webhook_and_names_the_container_and_port_workers_use(release):
    with FakeKubernetesApi([Tick()], release=release) as api:
        stored = install_runtime(api)
        broken = copy.deepcopy(RUNTIME)
        broken["metadata"]["name"] = "two-replicas"
        broken["spec"]["template"]["spec"]["replicatedJobs"][0]["replicas"] = 2
        with pytest.raises(Exception, match="always must be 1"):
            install_runtime(api, broken)
    assert stored["metadata"]["name"] == LaunchConfig().runtime
    assert "torch" not in stored["spec"]["mlPolicy"]  # PlainML: no framework plugin sets anything
    (node,) = stored["spec"]["template"]["spec"]["replicatedJobs"]
    (container,) = node["template"]["spec"]["template"]["spec"]["containers"]
    assert container["name"] == launch_trainjob.NODE
    assert [port["containerPort"] for port in container["ports"]] == [WORKER_PORT]


def _failed_pods(codes: dict[int, int], trainjob: dict) -> tuple[str, str]:
    """The runtime's answer to workers ending with these exit codes: the Job's failure, then the JobSet's action."""
    jobset = jobset_for(trainjob, RUNTIME)
    job = jobset["spec"]["replicatedJobs"][0]["template"]["spec"]
    index, code = next((index, code) for index, code in sorted(codes.items()) if code != 0)
    reason, message = job_failure(job, f"pod-{index}", NAMESPACE, code)
    return jobset_action(jobset["spec"], reason, message)


@pytest.mark.parametrize(
    ("codes", "action"),
    [
        ({0: 143, 1: 143}, ("RestartJobSetAndIgnoreMaxRestarts", "Preempted")),  # preempted: all restart, not counted
        ({0: 1, 1: 143}, ("FailJobSet", "FinalError")),  # NaN or a failed peer: final, no retries
        ({0: 0, 1: 2}, ("FailJobSet", "FinalError")),  # bad input
        ({0: 137, 1: 143}, ("RestartJobSet", "default")),  # out of memory: restarted, counted against maxRestarts
    ],
)
def test_the_runtimes_failure_policies_restart_preemptions_and_end_final_errors_at_once(codes, action):
    trainjob = launch_trainjob.TrainJobKind().build(config(), launch(), "policy", NAMESPACE)
    trainjob["metadata"]["namespace"] = NAMESPACE
    assert _failed_pods(codes, trainjob) == action


TRAINER_2_1_FIELDS = frozenset({"runtimeRef", "trainer", "podTemplateOverrides", "labels", "annotations"})


@pytest.mark.parametrize(
    ("release", "fields"), [("1.11", TRAINER_2_1_FIELDS), ("trainer-2.3", launch_trainjob.CURRENT_SPEC_FIELDS)]
)
def test_the_controller_gives_each_pod_its_host_name_and_the_env_that_makes_its_tf_config(release, fields):
    kind = launch_trainjob.TrainJobKind(fields)
    trainjob = kind.build(config(workers=3, batch_size=3), launch(), "cifar", NAMESPACE)
    secrets = {(NAMESPACE, "mlpipeline-minio-artifact"): {"accesskey": "id", "secretkey": "key"}}
    plans = trainjob_pods(trainjob, RUNTIME, release)
    assert {plan.pod_spec["serviceAccountName"] for plan in plans} == {"cifar10-pipeline"}
    assert {plan.pod_spec["imagePullSecrets"][0]["name"] for plan in plans} == {"registry-credentials"}
    assert [plan.hostname for plan in plans] == ["cifar-node-0-0", "cifar-node-0-1", "cifar-node-0-2"]
    assert {plan.subdomain for plan in plans} == {"cifar"}
    environments = [resolve_env(plan, NAMESPACE, secrets) for plan in plans]
    assert environments[2]["AWS_ACCESS_KEY_ID"] == "id" and environments[2]["XDG_CACHE_HOME"] == "/tmp/cache"
    configs = [json.loads(tf_config_from_jobset(environment, 3)) for environment in environments]
    addresses = [f"cifar-node-0-{index}.cifar:{WORKER_PORT}" for index in range(3)]
    assert [c["task"]["index"] for c in configs] == [0, 1, 2]
    assert all(c["cluster"]["worker"] == addresses for c in configs)


@pytest.mark.parametrize(
    ("environment", "message"),
    [
        ({"JOB_COMPLETION_INDEX": "", "TRAINJOB_NUM_NODES": "2"}, "not a worker index"),
        ({"JOB_COMPLETION_INDEX": "2", "TRAINJOB_NUM_NODES": "2"}, "out of range for 2 workers"),
        ({"JOB_COMPLETION_INDEX": "0", "TRAINJOB_NUM_NODES": "3"}, "3 node\\(s\\) .* but --workers is 2"),
        ({"JOB_COMPLETION_INDEX": "-1", "TRAINJOB_NUM_NODES": "2"}, "not a worker index"),
    ],
)
def test_a_pod_whose_identity_does_not_fit_is_refused(environment, message):
    with pytest.raises(ClusterError, match=message):
        tf_config_from_jobset({"TRAINJOB_NAME": "job", **environment}, 2)


# -- end to end: real workers with the env the stand-in gives them --------------------------------------------------


class TrainerController:
    """Plays Trainer + JobSet + kubelet for the stand-in: for each TrainJob created, run its pods as local worker
    processes with exactly the env the vendored controllers would give them, report their phases and logs through the
    API, apply the runtime's failure policies to their exit codes, and set the TrainJob's conditions."""

    def __init__(self, tmp_path: Path, preempt_at_step: int | None = None):
        self.tmp_path = tmp_path
        self.preempt_at_step = preempt_at_step
        self.attempts: list[dict] = []  # per JobSet attempt: {"codes": {...}, "action": ...}
        self.processes: list[subprocess.Popen] = []
        self.done = threading.Event()

    def __call__(self, api: FakeKubernetesApi, trainjob: dict) -> None:
        threading.Thread(target=self._play, args=(api, trainjob), daemon=True).start()

    def _play(self, api: FakeKubernetesApi, trainjob: dict) -> None:
        try:
            self._run_attempts(api, trainjob)
        except Exception as error:  # the launcher then times out; the test reads why
            self.attempts.append({"error": repr(error)})
            api.set_conditions(NAMESPACE, trainjob["metadata"]["name"], [condition("Failed", reason="StandIn")])
        finally:
            self.done.set()

    def _run_attempts(self, api: FakeKubernetesApi, trainjob: dict) -> None:
        name = trainjob["metadata"]["name"]
        runtime = api.objects[("clustertrainingruntimes", None, trainjob["spec"]["runtimeRef"]["name"])]
        plans = trainjob_pods(trainjob, runtime, api.release)
        jobset = jobset_for(trainjob, runtime)
        job_spec = jobset["spec"]["replicatedJobs"][0]["template"]["spec"]
        ports = _free_ports(len(plans))
        address_map = {f"{plan.hostname}.{plan.subdomain}:{WORKER_PORT}": f"127.0.0.1:{port}"
                       for plan, port in zip(plans, ports, strict=True)}  # fmt: skip
        for attempt in range(5):
            records, processes = [], []
            for plan in plans:
                environment = resolve_env(plan, NAMESPACE, api.secrets)
                environment.update(  # what differs between local processes and pods: their own /tmp
                    XDG_CACHE_HOME=str(self.tmp_path / f"{plan.hostname}-cache"), TMPDIR=str(self.tmp_path),
                    PATH=os.environ["PATH"], HOME=str(self.tmp_path), PYTHONUNBUFFERED="1", TF_CPP_MIN_LOG_LEVEL="2",
                )  # fmt: skip
                environment[ADDRESS_MAP] = json.dumps(address_map)
                command = [sys.executable if part == "python" else part for part in plan.container["command"]]
                labels = {**plan.labels, "jobset.sigs.k8s.io/restart-attempt": str(attempt)}
                record = api.add_pod(
                    PodRecord(NAMESPACE, f"{plan.name}-a{attempt}", labels, plan.annotations, "node", "Running")
                )
                record.logs[0] = []
                process = subprocess.Popen(
                    command + plan.container["args"], cwd=REPOSITORY, env=environment, stdout=subprocess.PIPE,
                    stderr=subprocess.STDOUT, text=True, start_new_session=True,
                )  # fmt: skip
                self.processes.append(process)
                records.append(record)
                processes.append(process)
            readers = [
                threading.Thread(target=self._read, args=(process, record, processes, attempt), daemon=True)
                for process, record in zip(processes, records, strict=True)
            ]
            for reader in readers:
                reader.start()
            codes = {}
            for index, (process, record, reader) in enumerate(zip(processes, records, readers, strict=True)):
                codes[index] = process.wait(timeout=600)
                reader.join()
                record.phase = "Succeeded" if codes[index] == 0 else "Failed"
            if all(code == 0 for code in codes.values()):
                self.attempts.append({"codes": codes})
                api.set_conditions(NAMESPACE, name, TRAINJOB_COMPLETE)
                return
            first = min(index for index, code in codes.items() if code != 0)
            reason, message = job_failure(job_spec, records[first].name, NAMESPACE, codes[first])
            action, rule = jobset_action(jobset["spec"], reason, message)
            self.attempts.append({"codes": codes, "action": action, "rule": rule})
            if action == "FailJobSet":
                api.set_conditions(NAMESPACE, name, [condition("Failed", reason="FailJobSetFailurePolicyAction")])
                return
        raise AssertionError("the JobSet kept failing")

    def _read(self, process, record, processes, attempt):
        for line in process.stdout:
            record.logs[0].append(line)
            if (
                attempt == 0
                and self.preempt_at_step is not None
                and record.labels["batch.kubernetes.io/job-completion-index"] == "0"
                and f"step {self.preempt_at_step}/" in line
            ):
                processes[1].send_signal(signal.SIGTERM)  # worker 1's node is drained


def _free_ports(count: int) -> list[int]:
    from components.train.launch_local import free_ports

    return free_ports(count)


@pytest.mark.slow
@pytest.mark.parametrize("release", ["1.11", "trainer-2.3"])  # v2.2 builds its pods as v2.3 does
def test_real_workers_with_the_trainjob_pods_env_train_identically_and_resume_after_a_preemption(
    release, tmp_path, s3_bucket, caplog
):
    from components.common import storage
    from components.prepare_data.config import PrepareDataConfig
    from components.prepare_data.prepare import prepare_data
    from tests.builders import tiny_train_config

    data = f"s3://{s3_bucket}/private-artifacts/{NAMESPACE}/datasets/synthetic"
    prepare_data(PrepareDataConfig(output=data, source="synthetic", synthetic_train_per_class=20,
                                   synthetic_eval_per_class=5))  # fmt: skip
    model_dir = f"s3://{s3_bucket}/private-artifacts/{NAMESPACE}/v2/artifacts/cifar10-pipeline/run-1/model-directory"
    train = tiny_train_config(data, model_dir, workers=2, train_steps=30, log_every_steps=5, launcher="trainjob",
                              checkpoint_every_steps=100)  # fmt: skip
    controller = TrainerController(tmp_path, preempt_at_step=10)
    with FakeKubernetesApi(None, release=release, on_create=controller) as api, caplog.at_level("INFO"):
        api.add_secret(
            NAMESPACE,
            "mlpipeline-minio-artifact",
            {"accesskey": os.environ["AWS_ACCESS_KEY_ID"], "secretkey": os.environ["AWS_SECRET_ACCESS_KEY"]},
        )
        install_runtime(api)
        try:
            outcome = trainjob_launcher(api, poll_seconds=0.5).run(
                train, launch(gpus_per_worker=0, worker_cpu="1", worker_memory="2Gi"), name="cifar10-e2e"
            )
        finally:
            controller.done.wait(timeout=60)
            for process in controller.processes:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGKILL)
    logs = "".join(line for record in api.pods.values() for line in record.logs.get(0, []))
    assert outcome.succeeded, (controller.attempts, logs[-4000:])
    first, second = controller.attempts
    assert first["codes"] == {0: 143, 1: 143}, logs[-4000:]  # worker 1 preempted: both saved at one step, 143
    assert (first["action"], first["rule"]) == ("RestartJobSetAndIgnoreMaxRestarts", "Preempted")
    assert second["codes"] == {0: 0, 1: 0}
    assert "resuming from" in logs and "step 30/30" in logs
    # TF_CONFIG came from the pod's identity, and both workers end with the same weights.
    assert "TF_CONFIG from the TrainJob's pod identity" in logs
    digests = {line.split("weights sha256 ")[1].split()[0] for line in logs.splitlines() if "at step 30" in line}
    assert len(digests) == 1, logs[-4000:]
    assert json.loads(storage.read_bytes(f"{model_dir}/train_metrics.json"))["step"] == 30
    assert api.deleted == [(NAMESPACE, "cifar10-e2e")]
    # The launcher streamed worker 0's log from both of its pods.
    assert "[cifar10-e2e-node-0-0-a1]" in caplog.text and "[cifar10-e2e-node-0-0-a0]" in caplog.text


def test_the_trainjob_cli_launches_without_tensorflow_through_a_kubeconfig(tmp_path):
    """The launching step runs in a small pod: the whole trainjob path, auto included, must not import TensorFlow."""
    with FakeKubernetesApi([Tick(TRAINJOB_RUNNING), Tick(TRAINJOB_COMPLETE, pod="Succeeded")], {0: "done\n"},
                           release="1.11") as api:  # fmt: skip
        install_runtime(api)
        kubeconfig = api.kubeconfig(tmp_path / "kubeconfig")
        program = (
            "import sys; sys.modules['tensorflow'] = None\n"  # any import of TensorFlow now fails
            "from components.train.__main__ import main\n"
            "sys.exit(main(sys.argv[1:]))"
        )
        completed = subprocess.run(
            [sys.executable, "-c", program, "--launcher", "trainjob", "--workers", "2", "--data", "s3://bkb/data",
             "--model-dir", "s3://bkb/model", "--job-namespace", NAMESPACE, "--job-name", "cli-job",
             "--worker-image", "registry.example/train:1", "--queue-name", "gpus", "--image-pull-secrets", "regcred"],
            cwd=REPOSITORY, env={**os.environ, "KUBECONFIG": str(kubeconfig)}, capture_output=True, text=True,
            timeout=120,
        )  # fmt: skip
    assert completed.returncode == 0, completed.stderr[-3000:]
    assert api.deleted == [(NAMESPACE, "cli-job")] and "TrainJob team-a/cli-job succeeded" in completed.stderr
    (body,) = api.created
    assert body["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "gpus"
    environment = {entry["name"]: entry.get("value") for entry in body["spec"]["trainer"]["env"]}
    assert environment[step_lease.LEASE_VARIABLE] == "cli-job-step"  # what its workers watch
    assert not api.lease_store.leases  # the step ended normally: its lease is gone with its job


def test_the_exit_handler_deletes_the_job_a_dead_launching_step_left(monkeypatch, caplog):
    from components.train import kfp_run

    run_id = "3f7c-run"
    name = cluster_job.job_name_for_run(run_id)
    with FakeKubernetesApi([Tick(TRAINJOB_RUNNING)], release="trainer-2.3") as api, caplog.at_level("INFO"):
        install_runtime(api)
        api.create_job(NAMESPACE, launch_trainjob.TrainJobKind().build(config(), launch(), name, NAMESPACE))
        monkeypatch.setattr(cluster_job, "kubernetes_apis", lambda: api.clients())
        monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
        assert kfp_run.delete_run_jobs(run_id) == []  # outside a cluster: nothing to do
        monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.0.0.1")
        assert kfp_run.delete_run_jobs(run_id) == [f"TrainJob {NAMESPACE}/{name}"]
        assert kfp_run.delete_run_jobs(run_id) == []  # already gone: a no-op (the launcher deleted it, usually)
    assert api.deleted == [(NAMESPACE, name)]
    assert "is still there after the run: deleting it" in caplog.text


def test_transient_api_errors_are_retried_and_never_delete_the_running_job(caplog):
    timeline = [Tick(TRAINJOB_RUNNING), Tick(error=503), Tick(error=500), Tick(TRAINJOB_RUNNING), Tick(error=429),
                Tick(TRAINJOB_COMPLETE)]  # fmt: skip
    with FakeKubernetesApi(timeline, {0: "one\n"}, release="1.11") as api, caplog.at_level("WARNING"):
        install_runtime(api)
        api.pod_errors = [500, 503, 500]
        assert trainjob_launcher(api).run(config(), launch(), name="flaky-api").succeeded
    assert api.deleted == [(NAMESPACE, "flaky-api")]  # once, at the end
    assert "transient API error" in caplog.text and api.pod_errors == []
    assert "stopped streaming" not in caplog.text


# -- workers that cannot start, and settings Kubernetes would refuse ----------------------------------------------

PULL_FAILS = ("ErrImagePull", 'failed to pull image "registry.example/cifar10/gpu:1.2.3": not found')


@pytest.mark.parametrize(
    ("tick", "expected"),
    [
        (Tick(TRAINJOB_RUNNING, pod="Pending", waiting=PULL_FAILS), r"cannot start node: ErrImagePull: failed to pull"),
        (Tick(TRAINJOB_RUNNING, pod="Pending", waiting=("ImagePullBackOff", "Back-off pulling image")),
         r"ImagePullBackOff"),
        (Tick(TRAINJOB_RUNNING, pod="Pending", waiting=("CreateContainerConfigError", 'secret "s3" not found')),
         r'CreateContainerConfigError: secret "s3" not found'),
        (Tick(TRAINJOB_RUNNING, pod="Pending", unschedulable="0/3 nodes are available: 3 Insufficient nvidia.com/gpu."),
         r"cannot be scheduled: 0/3 nodes are available"),
        (Tick(TRAINJOB_RUNNING, pod=None,
              events=(("Warning", "JobSetCreateFailed", "admission webhook denied the request: pod name too long"),)),
         r"the controller makes no pods: JobSetCreateFailed: admission webhook denied"),
    ],
    ids=["image pull", "pull back-off", "container config", "unschedulable", "no pods, a warning"],
)  # fmt: skip
def test_a_worker_that_cannot_start_fails_the_step_in_its_bound_naming_the_pod_and_deletes_the_job(tick, expected):
    with FakeKubernetesApi([tick], release="trainer-2.3") as api:
        install_runtime(api)
        started = time.monotonic()
        bounds = {"start_timeout_seconds": 1, "unschedulable_timeout_seconds": 1}
        with pytest.raises(cluster_job.JobError, match=rf"TrainJob team-a/job-s cannot run: .*{expected}.*deleted"):
            trainjob_launcher(api).run(config(), launch(**bounds), name="job-s")
        assert time.monotonic() - started < 30
        assert api.deleted == [(NAMESPACE, "job-s")]


def test_an_image_name_the_kubelet_cannot_parse_fails_at_once():
    tick = Tick(TRAINJOB_RUNNING, pod="Pending", waiting=("InvalidImageName", 'couldn\'t parse image name "A:b:c"'))
    with FakeKubernetesApi([tick], release="trainer-2.3") as api:
        install_runtime(api)
        with pytest.raises(cluster_job.JobError, match=r"InvalidImageName: .*\(for 0 s\)"):
            trainjob_launcher(api).run(config(), launch(start_timeout_seconds=3600), name="job-i")


def test_a_pull_error_that_clears_within_its_bound_is_waited_out():
    pulling = Tick(TRAINJOB_RUNNING, pod="Pending", waiting=PULL_FAILS)
    timeline = [pulling, pulling, Tick(TRAINJOB_RUNNING), Tick(TRAINJOB_COMPLETE)]
    with FakeKubernetesApi(timeline, release="trainer-2.3") as api:
        install_runtime(api)
        outcome = trainjob_launcher(api).run(config(), launch(start_timeout_seconds=60), name="job-p")
    assert outcome.succeeded


@pytest.mark.parametrize(
    ("setting", "message"),
    [
        ({"job_namespace": "team.a"}, r"job_namespace: 'team.a' is not a namespace name"),
        ({"job_namespace": "a" * 64}, r"job_namespace: .* is not a namespace name"),
        ({"queue_name": "q" * 64}, r"queue_name: .* is not a Kubernetes label value"),
        ({"worker_image": "registry.example/Cifar10/gpu:1"}, r"worker_image: .* is not an image reference"),
        ({"worker_image": "registry.example/cifar10/gpu:"}, r"worker_image: .* is not an image reference"),
        ({"worker_image": "registry.example/cifar10 gpu"}, r"worker_image: .* is not an image reference"),
    ],
)
def test_launch_settings_kubernetes_would_refuse_are_refused_before_anything_is_created(setting, message):
    with pytest.raises(ValueError, match=message):
        launch(**setting)


@pytest.mark.parametrize("workers", [4, 16])
def test_a_job_name_whose_jobset_pod_names_pass_63_characters_is_refused_before_creating_it(workers):
    longest_allowed = 63 - len(f"-node-0-{workers - 1}-abcde")
    with FakeKubernetesApi([Tick(TRAINJOB_COMPLETE)], release="trainer-2.3") as api:
        install_runtime(api)
        with pytest.raises(ValueError, match=rf"at most {longest_allowed} characters"):
            trainjob_launcher(api).run(config(workers=workers), launch(), name="j" * (longest_allowed + 1))
        assert api.created == []
        assert trainjob_launcher(api).run(config(workers=workers), launch(), name="j" * longest_allowed).succeeded


@pytest.mark.parametrize("installed", [True, False], ids=["profile-installed", "no-workers-binding"])
def test_a_worker_checks_its_own_rights_before_its_first_step_in_one_line(installed, tmp_path):
    """A job's worker reads its step's Lease and deletes its own job when that Lease lapses: its supervisor asks the
    API server for both before the worker starts, as the workers' service account; without manifests/rbac.yaml's
    binding the worker ends at once, exit 2 (a final error: no restart), in one line naming what is missing."""
    with FakeKubernetesApi(release="26.03", installed=installed, pod_folder=tmp_path / "pod") as api:
        (tmp_path / "pod" / "token").write_text("worker-token")  # the cifar10-pipeline service account's pod
        environment = {**os.environ, **api.pod_environment(), step_lease.LEASE_VARIABLE: "rights-job-step",
                       step_lease.SECONDS_VARIABLE: "90",
                       step_lease.JOB_VARIABLE: "trainer.kubeflow.org/v1alpha1/trainjobs/rights-job"}  # fmt: skip
        program = "import logging, sys; from components.train.supervisor import Supervisor\n" \
                  "logging.basicConfig(level=logging.INFO, format='%(levelname)s %(message)s')\n" \
                  "sys.exit(Supervisor([sys.executable, '-c', 'print(\"trained\")'], 60).run())"  # fmt: skip
        done = subprocess.run([sys.executable, "-c", program], cwd=REPOSITORY, env=environment, capture_output=True,
                              text=True, timeout=120)  # fmt: skip
        reviews = {(verb, resource) for _user, verb, _group, resource in api.access_reviews}
    assert reviews == {("get", "leases"), ("delete", "trainjobs")}
    if installed:
        assert done.returncode == 0 and "trained" in done.stdout, done.stderr
        return
    assert done.returncode == 2 and "trained" not in done.stdout
    (line,) = [line for line in done.stderr.splitlines() if line.startswith("ERROR")]
    assert "may not get leases rights-job-step (coordination.k8s.io), delete trainjobs rights-job" in line, line
    assert "manifests/rbac.yaml" in line


def test_a_trainjob_deletes_itself_when_the_step_that_launched_it_ends_abruptly(tmp_path):
    """The step's pod ends (SIGKILL: a cancelled run, an eviction): its lease lapses, and a worker's supervisor,
    with the job's own environment and the workers' service account, deletes the job. While the step lives, its
    lease is renewed and nothing is deleted."""
    seconds = 5  # the shortest lease allowed
    with FakeKubernetesApi([Tick(TRAINJOB_RUNNING)], release="1.11") as api:
        install_runtime(api)
        step = subprocess.Popen(
            [sys.executable, "-m", "components.train", "--launcher", "trainjob", "--workers", "2", "--data",
             "s3://bkb/data", "--model-dir", "s3://bkb/model", "--job-namespace", NAMESPACE, "--job-name", "lapse-job",
             "--step-lease-seconds", str(seconds)],
            cwd=REPOSITORY, env={**os.environ, "KUBECONFIG": str(api.kubeconfig(tmp_path / "step-kubeconfig"))},
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
        )  # fmt: skip
        worker = None
        try:
            deadline = time.monotonic() + 60
            while (NAMESPACE, "lapse-job") not in api.jobs and time.monotonic() < deadline:
                assert step.poll() is None, "the launching step ended"
                time.sleep(0.2)
            (body,) = api.created
            environment = {e["name"]: e["value"] for e in body["spec"]["trainer"]["env"] if "value" in e}
            worker_kubeconfig = api.kubeconfig(tmp_path / "worker-kubeconfig", token="worker-token")
            program = "import logging, sys; from components.train.supervisor import Supervisor\n" \
                      "logging.basicConfig(level=logging.INFO)\n" \
                      "sys.exit(Supervisor(['sleep', '600'], 60).run())"  # fmt: skip
            worker_log = tmp_path / "worker.log"
            with worker_log.open("w") as worker_output:
                worker = subprocess.Popen(
                    [sys.executable, "-c", program], cwd=REPOSITORY, stdout=worker_output, stderr=subprocess.STDOUT,
                    env={**os.environ, **environment, "KUBECONFIG": str(worker_kubeconfig)},
                )  # fmt: skip
            time.sleep(3 * seconds)  # the step renews its lease: the job stays
            assert (NAMESPACE, "lapse-job") in api.jobs
            os.killpg(step.pid, signal.SIGKILL)  # the step's pod ends
            ended = time.monotonic()
            while (NAMESPACE, "lapse-job") in api.jobs and time.monotonic() < ended + 30:
                time.sleep(0.2)
            took = time.monotonic() - ended
            # the supervisor says what it did once the API has answered the deletion: wait for its words
            while "deleted this job" not in worker_log.read_text() and time.monotonic() < ended + 60:
                time.sleep(0.2)
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(step.pid, signal.SIGKILL)
            if worker is not None:
                worker.kill()
                worker.wait(timeout=30)
        log = worker_log.read_text()
    assert api.deleted == [(NAMESPACE, "lapse-job")], log
    # the lease was last renewed up to one renewal before the kill; a worker sees it lapse within a check after
    assert (
        seconds - step_lease.check_every(seconds) - 0.5 <= took <= seconds + 2 * step_lease.check_every(seconds) + 3
    ), took
    assert "lapse-job-step of the step that launched this job was not renewed for" in log
    assert f"deleted this job {NAMESPACE}/lapse-job" in log
