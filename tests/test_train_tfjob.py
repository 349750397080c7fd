"""The tfjob launcher, driven through the real `kubernetes` client against a strict stand-in of the Kubernetes API
(training-operator v1.9's CRD schema and webhook rules): the TFJob sent, multi-user namespaces, worker resources,
object-store settings, transient API errors, Pending and restarted pods, failure, timeout and cancellation."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from components.train import cluster_job, launch_tfjob
from components.train.config import TrainConfig
from components.train.launch_config import LaunchConfig
from tests.fake_kubernetes_api import FAILED, RUNNING, SUCCEEDED, FakeKubernetesApi, Tick

REPOSITORY = Path(__file__).resolve().parents[1]
CHIEF_LOG = {
    0: "step 10/40 loss 2.1\nstep 20/40 loss 1.7\n" + "x" * 70_000 + "\npreempted: saving\n",
    1: "resumed at step 20\nstep 40/40 loss 0.9\n",
}


def config(**overrides) -> TrainConfig:
    values = {
        "data": "s3://bucket/datasets/cifar10",
        "model_dir": "s3://bucket/runs/42/model-directory",
        "workers": 4,
        "batch_size": 512,
        "launcher": "tfjob",
        "train_steps": 1000,
    }
    values.update(overrides)
    return TrainConfig(**values)


def launch(**overrides) -> LaunchConfig:
    values = {
        "gpus_per_worker": 2,
        "worker_cpu": "8",
        "worker_memory": "30Gi",
        "worker_image": "registry.example/cifar10/train:1.2.3",
    }
    values.update(overrides)
    return LaunchConfig(**values)


@pytest.fixture
def namespace_file(tmp_path, monkeypatch):
    """This pod's namespace, as a KFP step in a profile namespace sees it."""
    path = tmp_path / "namespace"
    path.write_text("team-a\n")
    monkeypatch.setattr(cluster_job, "SERVICE_ACCOUNT_NAMESPACE", path)
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://minio-service.kubeflow:9000")
    monkeypatch.delenv("AWS_REGION", raising=False)
    monkeypatch.setenv("CIFAR10_PIPELINE_COMPILED_KERNELS", "on")  # set on the step: the workers take it too
    return path


def launcher(api: FakeKubernetesApi) -> cluster_job.ClusterJobLauncher:
    custom, core = api.clients()
    return launch_tfjob.tfjob_launcher(custom, core, poll_seconds=0.3, backoff_seconds=0.01, log_poll_seconds=0.02)


def logged_lines(caplog, pod: str) -> list[str]:
    prefix = f"[{pod}] "
    return [r.getMessage()[len(prefix) :] for r in caplog.records if r.getMessage().startswith(prefix)]


@pytest.mark.parametrize("release", ["1.9", "1.10"])
def test_the_tfjob_sent_passes_the_crd_and_webhook_and_the_chiefs_log_survives_pending_and_a_restart(
    namespace_file, caplog, release
):
    """On each release that serves TFJobs, with the permissions its profile owner could install (tests/fake_rbac.py)."""
    timeline = [
        Tick(RUNNING[:1], pod="Pending"),
        Tick(RUNNING, pod="Pending"),
        Tick(RUNNING),
        Tick(RUNNING),
        Tick(RUNNING, restarts=1),
        Tick(RUNNING, restarts=1),
        Tick(SUCCEEDED, pod="Succeeded", restarts=1),
    ]
    with FakeKubernetesApi(timeline, CHIEF_LOG, release=release) as api, caplog.at_level("INFO"):
        outcome = launcher(api).run(config(), launch(), name="cifar10-train-run42")
    assert outcome.succeeded and api.refused == []
    (body,) = api.created
    assert body["metadata"] == {
        "name": "cifar10-train-run42",
        "namespace": "team-a",  # the pod's own namespace, not "kubeflow"
        "labels": {"app.kubernetes.io/name": "cifar10-pipeline", "app.kubernetes.io/component": "train"},
    }
    worker = body["spec"]["tfReplicaSpecs"]["Worker"]
    assert worker["replicas"] == 4 and worker["restartPolicy"] == "ExitCode"
    pod = worker["template"]["spec"]
    (container,) = pod["containers"]
    assert container["name"] == "tensorflow" and container["image"] == "registry.example/cifar10/train:1.2.3"
    assert container["resources"] == {
        "requests": {"cpu": "8", "memory": "30Gi"},
        "limits": {"memory": "30Gi", "nvidia.com/gpu": 2},
    }
    assert pod["tolerations"] == [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
    environment = {variable["name"]: variable for variable in container["env"]}
    assert environment["AWS_ENDPOINT_URL"]["value"] == "http://minio-service.kubeflow:9000"
    assert environment["CIFAR10_PIPELINE_COMPILED_KERNELS"]["value"] == "on"
    assert environment["AWS_ACCESS_KEY_ID"]["valueFrom"]["secretKeyRef"] == {
        "name": "mlpipeline-minio-artifact",
        "key": "accesskey",
        "optional": True,
    }
    assert environment["CIFAR10_PIPELINE_STEP_LEASE"]["value"] == "cifar10-train-run42-step"  # what workers watch
    assert environment["CIFAR10_PIPELINE_TRAINING_JOB"]["value"] == "kubeflow.org/v1/tfjobs/cifar10-train-run42"
    worker_config = json.loads(container["args"][1])
    assert worker_config["launcher"] == "worker" and worker_config["data"] == "s3://bucket/datasets/cifar10"
    assert api.deleted == [("team-a", "cifar10-train-run42")]
    # Every line of both container instances, whole (one is longer than the client's 64 KiB reads), once, in order.
    expected = [line for instance in (0, 1) for line in CHIEF_LOG[instance].splitlines()]
    assert logged_lines(caplog, "cifar10-train-run42-worker-0") == expected
    assert "cifar10-train-run42-worker-0 was restarted (restart 1)" in caplog.text


def test_cpu_workers_neither_request_nor_tolerate_gpus(namespace_file):
    with FakeKubernetesApi([Tick(SUCCEEDED, pod="Succeeded")]) as api:
        launcher(api).run(config(), launch(gpus_per_worker=0), name="cpu-job")
    pod = api.created[0]["spec"]["tfReplicaSpecs"]["Worker"]["template"]["spec"]
    assert "tolerations" not in pod and "nvidia.com/gpu" not in pod["containers"][0]["resources"]["limits"]


def test_transient_api_errors_are_retried_and_never_delete_the_running_job(namespace_file, caplog):
    timeline = [Tick(RUNNING), Tick(error=503), Tick(error=500), Tick(RUNNING), Tick(error=503), Tick(SUCCEEDED)]
    with FakeKubernetesApi(timeline, {0: "one\n"}) as api, caplog.at_level("WARNING"):
        api.pod_errors = [500, 500]
        assert launcher(api).run(config(), launch(), name="flaky-api").succeeded
    assert api.deleted == [("team-a", "flaky-api")]  # once, at the end
    assert "transient API error" in caplog.text


def test_an_api_that_stays_down_fails_the_step_but_leaves_the_job_for_the_retry(namespace_file):
    timeline = [Tick(RUNNING)] + [Tick(error=503)] * (cluster_job.READ_ATTEMPTS + 1)
    with FakeKubernetesApi(timeline) as api, pytest.raises(Exception, match="503"):
        launcher(api).run(config(), launch(), name="api-down")
    assert api.deleted == [] and ("team-a", "api-down") in api.jobs


def test_a_failed_job_fails_the_step_and_is_deleted(namespace_file):
    with (
        FakeKubernetesApi([Tick(RUNNING), Tick(FAILED, pod="Failed")]) as api,
        pytest.raises(cluster_job.JobError, match=r"TFJob team-a/job-1 failed: TFJobFailed: .*1 Worker"),
    ):
        launcher(api).run(config(), launch(), name="job-1")
    assert api.deleted == [("team-a", "job-1")]


def test_succeeded_with_status_false_is_not_success(namespace_file):
    not_yet = [*RUNNING, {"type": "Succeeded", "status": "False", "reason": "", "message": ""}]
    with (
        FakeKubernetesApi([Tick(not_yet), Tick(not_yet), Tick(FAILED)]) as api,
        pytest.raises(cluster_job.JobError, match="failed"),
    ):
        launcher(api).run(config(), launch(), name="job-2")


def test_a_job_that_never_ends_times_out_and_is_deleted(namespace_file):
    with (
        FakeKubernetesApi([Tick(RUNNING)]) as api,
        pytest.raises(cluster_job.JobError, match=r"did not finish within 1 s; it was deleted"),
    ):
        launcher(api).run(config(), launch(job_timeout_seconds=1), name="job-3")
    assert api.deleted == [("team-a", "job-3")]


def test_sigterm_cancels_the_step_and_deletes_the_job(namespace_file):
    with FakeKubernetesApi([Tick(RUNNING)]) as api:
        api.on_job_get = lambda tick: tick == 2 and os.kill(os.getpid(), signal.SIGTERM)
        with pytest.raises(cluster_job.Cancelled):
            launcher(api).run(config(), launch(), name="cancelled")
    assert api.deleted == [("team-a", "cancelled")]
    assert signal.getsignal(signal.SIGTERM) is not None  # the previous handler is back


def test_a_retried_step_follows_the_job_its_earlier_attempt_started(namespace_file, caplog):
    name = cluster_job.job_name_for_run("8d3f2a10-run-of-the-pipeline")
    with FakeKubernetesApi([Tick(RUNNING), Tick(SUCCEEDED)]) as api, caplog.at_level("WARNING"):
        api.create_job(
            "team-a", launch_tfjob.TFJobKind().build(config(), launch(), name, "team-a")
        )  # the first attempt's
        assert launcher(api).run(config(), launch(), name=name).succeeded
    assert "exists already (an earlier attempt of this step): following it" in caplog.text
    assert len(api.created) == 1 and api.deleted == [("team-a", name)]


def _worker(job):
    return job["spec"]["tfReplicaSpecs"]["Worker"]


def _container(job):
    return _worker(job)["template"]["spec"]["containers"][0]


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda job: _worker(job)["template"]["spec"].update(tolerations="gpu"), "is not of type 'array'"),
        (
            lambda job: _worker(job).update(restartPolicies="ExitCode"),
            'unknown field "spec.tfReplicaSpecs.Worker.restartPolicies"',
        ),
        (lambda job: _container(job).update(name="tf"), "container with name tensorflow"),
        (lambda job: _container(job).update(image=""), "image: Required value"),
        (lambda job: job["metadata"].update(name="1st-job"), "DNS-1035"),
        (lambda job: _worker(job).update(restartPolicy="Sometimes"), "Unsupported value"),
    ],
)
def test_the_stand_in_refuses_what_the_api_server_or_webhook_would(namespace_file, change, message):
    from tests.fake_kubernetes_api import Refused

    job = launch_tfjob.TFJobKind().build(config(), launch(), "good-name", "team-a")
    change(job)
    with FakeKubernetesApi([Tick(RUNNING)]) as api, pytest.raises(Refused, match=message):
        api.create_job("team-a", job)


def test_a_refused_tfjob_fails_clearly_with_the_apis_reason(namespace_file, monkeypatch):
    original = launch_tfjob.template

    def broken_template():
        job = original()
        job["spec"]["runPolicy"]["cleanPodPolicies"] = "All"  # a misspelled setting
        return job

    monkeypatch.setattr(launch_tfjob, "template", broken_template)
    with (
        FakeKubernetesApi([Tick(RUNNING)]) as api,
        pytest.raises(
            cluster_job.JobError,
            match=r'could not create TFJob team-a/job-9: .*unknown field "spec.runPolicy.cleanPodPolicies"',
        ),
    ):
        launcher(api).run(config(), launch(), name="job-9")


def test_job_names_are_dns_1035_labels():
    first = cluster_job.job_name_for_run("run-1")
    assert first == cluster_job.job_name_for_run("run-1") != cluster_job.job_name_for_run("run-2")
    assert len({cluster_job.unique_job_name() for _ in range(50)}) == 50
    for bad in ("1st-run", "Bad_Name", "x" * 60, "trailing-"):
        with pytest.raises(ValueError, match=r"job_name: .* is not a DNS-1035 label"):
            launch(job_name=bad)


def test_pod_local_locations_are_refused_for_a_tfjob_at_once():
    with pytest.raises(ValueError, match=r"model_dir: /minio/mlpipeline/.* is a local path, and a tfjob's workers"):
        config(model_dir="/minio/mlpipeline/v2/artifacts/run/model")


def test_outside_a_pod_the_namespace_must_be_given(tmp_path, monkeypatch):
    monkeypatch.setattr(cluster_job, "SERVICE_ACCOUNT_NAMESPACE", tmp_path / "missing")
    monkeypatch.delenv("POD_NAMESPACE", raising=False)
    with pytest.raises(ValueError, match="give --job-namespace"):
        cluster_job.own_namespace()
    monkeypatch.setenv("POD_NAMESPACE", "team-b")
    assert cluster_job.own_namespace() == "team-b"


def test_the_tfjob_cli_launches_without_tensorflow_through_a_kubeconfig(tmp_path):
    """The launching step runs in a small image without TensorFlow: the whole tfjob path must not import it."""
    with FakeKubernetesApi([Tick(RUNNING), Tick(SUCCEEDED, pod="Succeeded")], {0: "done\n"}) as api:
        kubeconfig = api.kubeconfig(tmp_path / "kubeconfig")
        program = (
            "import sys; sys.modules['tensorflow'] = None\n"  # any import of TensorFlow now fails
            "from components.train.__main__ import main\n"
            "sys.exit(main(sys.argv[1:]))"
        )
        completed = subprocess.run(
            [sys.executable, "-c", program, "--launcher", "tfjob", "--workers", "2", "--data", "s3://bkb/data",
             "--model-dir", "s3://bkb/model", "--job-namespace", "team-a", "--job-name", "cli-job",
             "--worker-image", "registry.example/train:1"],
            cwd=REPOSITORY, env={**os.environ, "KUBECONFIG": str(kubeconfig)}, capture_output=True, text=True,
            timeout=120,
        )  # fmt: skip
    assert completed.returncode == 0, completed.stderr
    assert api.deleted == [("team-a", "cli-job")] and "TFJob team-a/cli-job succeeded" in completed.stderr


def test_the_workers_pod_settings_docs_cluster_md_names_are_set_through_the_train_options():
    """`termination_grace_seconds`, `service_account`, `job_timeout_seconds` and `step_lease_seconds` are not
    pipeline parameters of their own: the train options carry them to the job, checked before submission."""
    from kfp import dsl

    from components.train.kfp_run import training_configs
    from pipeline.parameters import CommandError, check_parameters
    from pipeline.training_pipeline import cifar10_pipeline

    options = {"termination_grace_seconds": 60, "service_account": "trainer", "job_timeout_seconds": 3600.0,
               "step_lease_seconds": 30.0, "ema_decay": 0.999}  # fmt: skip
    check_parameters(cifar10_pipeline, {"train_options": options})
    dataset = dsl.Dataset(name="dataset", uri="s3://bucket/data", metadata={})
    model = dsl.Model(name="model", uri="s3://bucket/run/model", metadata={})
    train, launch = training_configs(dataset, model, "tfjob", options=dict(options), workers=2, model_dir="")
    assert (launch.termination_grace_seconds, launch.service_account, launch.step_lease_seconds) == (60, "trainer", 30)
    assert launch.job_timeout_seconds == 3600 and train.ema_decay == 0.999
    with pytest.raises(CommandError, match=r"step_lease_seconds: 1(\.0)? is not in \[5, 86400\]"):
        check_parameters(cifar10_pipeline, {"train_options": {"step_lease_seconds": 1}})
