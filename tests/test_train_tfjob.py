"""The tfjob launcher against a fake Kubernetes API (no API server can run here): the exact TFJob sent,
success only on a true Succeeded condition, failure and timeout fail the step, the job is always deleted."""

from __future__ import annotations

import json

import pytest

from components.train import launch_tfjob
from components.train.config import TrainConfig


class FakeCustomObjects:
    """Records calls; `get` returns the next status in `statuses` (the last one repeats)."""

    def __init__(self, statuses):
        self.statuses = list(statuses)
        self.created = []
        self.deleted = []
        self.gets = 0

    def create_namespaced_custom_object(self, group, version, namespace, plural, body):
        self.created.append((group, version, namespace, plural, body))
        return body

    def get_namespaced_custom_object(self, group, version, namespace, plural, name):
        self.gets += 1
        status = self.statuses[min(self.gets - 1, len(self.statuses) - 1)]
        return {"metadata": {"name": name}, "status": status}

    def delete_namespaced_custom_object(self, group, version, namespace, plural, name):
        self.deleted.append((namespace, name))


class FakeLogStream:
    def __init__(self, lines):
        self.lines = lines

    def stream(self):
        yield from self.lines


class FakeCore:
    def __init__(self):
        self.requests = []

    def read_namespaced_pod_log(self, name, namespace, **options):
        self.requests.append((name, namespace, options))
        return FakeLogStream([b"step 10/20 loss 1.0\n", b"step 20/20 loss 0.5\n"])


def condition(kind, status="True", reason="", message=""):
    return {"type": kind, "status": status, "reason": reason, "message": message}


RUNNING = {"conditions": [condition("Created"), condition("Running")]}
SUCCEEDED = {
    "conditions": [condition("Created"), condition("Running", "False"), condition("Succeeded", reason="TFJobSucceeded")]
}
FAILED = {
    "conditions": [
        condition("Created"),
        condition("Running", "False"),
        condition(
            "Failed", reason="TFJobFailed", message="TFJob cifar/x has failed because 1 Worker replica(s) failed."
        ),
    ]
}


def config(**overrides):
    values = {
        "data": "gs://bucket/datasets/cifar10",
        "model_dir": "gs://bucket/runs/42/model",
        "workers": 4,
        "batch_size": 512,
        "gpus_per_worker": 2,
        "tfjob_namespace": "team-a",
        "tfjob_image": "registry.example/cifar10/train:1.2.3",
        "launcher": "tfjob",
        "train_steps": 1000,
    }
    values.update(overrides)
    return TrainConfig(**values)


def launcher(custom, core=None):
    return launch_tfjob.TFJobLauncher(custom, core or FakeCore(), poll_seconds=0.0)


def test_the_exact_tfjob_sent_and_success(caplog):
    custom, core = FakeCustomObjects([{}, RUNNING, RUNNING, SUCCEEDED]), FakeCore()
    with caplog.at_level("INFO"):
        outcome = launcher(custom, core).run(config(), name="cifar10-train-run42")

    assert outcome.succeeded
    ((group, version, namespace, plural, body),) = custom.created
    assert (group, version, namespace, plural) == ("kubeflow.org", "v1", "team-a", "tfjobs")
    worker_config = json.loads(body["spec"]["tfReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0]["args"][1])
    assert worker_config["launcher"] == "worker" and worker_config["workers"] == 4
    assert worker_config["data"] == "gs://bucket/datasets/cifar10" and worker_config["train_steps"] == 1000
    expected = {
        "apiVersion": "kubeflow.org/v1",
        "kind": "TFJob",
        "metadata": {
            "name": "cifar10-train-run42",
            "namespace": "team-a",
            "labels": {"app.kubernetes.io/name": "cifar10-pipeline", "app.kubernetes.io/component": "train"},
        },
        "spec": {
            "runPolicy": {"cleanPodPolicy": "Running", "backoffLimit": 3},
            "tfReplicaSpecs": {
                "Worker": {
                    "replicas": 4,
                    "restartPolicy": "ExitCode",
                    "template": {
                        "metadata": {
                            "labels": {
                                "app.kubernetes.io/name": "cifar10-pipeline",
                                "app.kubernetes.io/component": "train-worker",
                            },
                            "annotations": {"sidecar.istio.io/inject": "false"},
                        },
                        "spec": {
                            "serviceAccountName": "cifar10-pipeline",
                            "securityContext": {
                                "runAsNonRoot": True,
                                "runAsUser": 10001,
                                "runAsGroup": 10001,
                                "fsGroup": 10001,
                                "seccompProfile": {"type": "RuntimeDefault"},
                            },
                            "containers": [
                                {
                                    "name": "tensorflow",
                                    "image": "registry.example/cifar10/train:1.2.3",
                                    "command": ["python", "-m", "components.train"],
                                    "args": ["--config", json.dumps(worker_config, sort_keys=True)],
                                    "env": [{"name": "XDG_CACHE_HOME", "value": "/tmp/cache"}],
                                    "ports": [{"name": "tfjob-port", "containerPort": 2222}],
                                    "resources": {
                                        "requests": {"cpu": "4", "memory": "16Gi"},
                                        "limits": {"memory": "16Gi", "nvidia.com/gpu": 2},
                                    },
                                    "securityContext": {
                                        "allowPrivilegeEscalation": False,
                                        "readOnlyRootFilesystem": True,
                                        "capabilities": {"drop": ["ALL"]},
                                    },
                                    "volumeMounts": [{"name": "tmp", "mountPath": "/tmp"}],
                                }
                            ],
                            "volumes": [{"name": "tmp", "emptyDir": {}}],
                        },
                    },
                }
            },
        },
    }
    assert body == expected
    assert custom.deleted == [("team-a", "cifar10-train-run42")]
    assert core.requests[0][0] == "cifar10-train-run42-worker-0" and core.requests[0][2]["container"] == "tensorflow"
    assert "[cifar10-train-run42-worker-0] step 20/20 loss 0.5" in caplog.text


def test_a_failed_job_fails_the_step_and_is_deleted():
    custom = FakeCustomObjects([RUNNING, FAILED])
    with pytest.raises(launch_tfjob.TFJobError, match=r"TFJob team-a/job-1 failed: TFJobFailed: .*1 Worker replica"):
        launcher(custom).run(config(), name="job-1")
    assert custom.deleted == [("team-a", "job-1")]


def test_succeeded_with_status_false_is_not_success():
    not_yet = {"conditions": [condition("Running"), condition("Succeeded", status="False")]}
    custom = FakeCustomObjects([not_yet, not_yet, FAILED])
    with pytest.raises(launch_tfjob.TFJobError, match="failed"):
        launcher(custom).run(config(), name="job-2")


def test_a_job_that_never_ends_times_out_and_is_deleted():
    ticks = iter(range(0, 10_000, 100))
    custom = FakeCustomObjects([RUNNING])
    slow = launch_tfjob.TFJobLauncher(custom, FakeCore(), poll_seconds=0.0, clock=lambda: next(ticks))
    with pytest.raises(launch_tfjob.TFJobError, match=r"did not finish within 300 s; it was deleted"):
        slow.run(config(tfjob_timeout_seconds=300), name="job-3")
    assert custom.deleted == [("team-a", "job-3")]


def test_job_names_are_unique_and_valid():
    names = {launch_tfjob.unique_job_name() for _ in range(50)}
    assert len(names) == 50
    for name in names:
        assert launch_tfjob.valid_job_name(name) == name
    with pytest.raises(ValueError, match="not a valid Kubernetes name"):
        launch_tfjob.valid_job_name("Bad_Name")


class ConflictError(Exception):
    status = 409  # what kubernetes.client.ApiException carries when the object exists


def test_a_retried_step_follows_the_job_its_earlier_attempt_started(caplog):
    custom = FakeCustomObjects([RUNNING, SUCCEEDED])

    def exists(*_arguments):
        raise ConflictError("AlreadyExists")

    custom.create_namespaced_custom_object = exists
    name = launch_tfjob.job_name_for_run("8d3f2a10-run-of-the-pipeline")
    with caplog.at_level("WARNING"):
        assert launcher(custom).run(config(), name=name).succeeded
    assert "exists already (an earlier attempt of this step): following it" in caplog.text
    assert custom.deleted == [("team-a", name)]


def test_job_names_are_stable_per_pipeline_run_and_valid():
    first = launch_tfjob.job_name_for_run("run-1")
    assert first == launch_tfjob.job_name_for_run("run-1") != launch_tfjob.job_name_for_run("run-2")
    assert launch_tfjob.valid_job_name(first) == first


def test_other_create_errors_fail_clearly():
    custom = FakeCustomObjects([RUNNING])

    def forbidden(*_arguments):
        raise PermissionError("tfjobs.kubeflow.org is forbidden")

    custom.create_namespaced_custom_object = forbidden
    with pytest.raises(launch_tfjob.TFJobError, match=r"could not create TFJob team-a/job-9: .*forbidden"):
        launcher(custom).run(config(), name="job-9")
