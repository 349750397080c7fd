"""The Katib examples (manifests/katib/) as Katib v0.19 makes trials of them: each trial's spec rendered by the rules
of Katib's trial generator (kubeflow/katib v0.19.0 pkg/controller.v1beta1/experiment/manifest/generator.go,
applyParameters, and its constants in pkg/controller.v1beta1/consts/const.go), then given to the stand-in API of the
release the example is for, and its workers' pods made as the Trainer controller makes them.

Katib's rules, as its source has them: the trial template is the trialSpec serialized to JSON; each trial parameter
whose reference matches `\\$\\{trialSpec\\.(.+?)\\}` takes the trial's metadata (Name, Namespace, Kind, APIVersion,
Labels[k], Annotations[k]), any other takes the assignment of the search parameter it names (an unknown one is an
error, and every assignment must be used); then every `${trialParameters.<name>}` is replaced by its value, and the
result, parsed, gets the trial's name and namespace. Nothing else is substituted."""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path

import pytest
import yaml

from components.common.config import parse_configs
from components.train.config import TrainConfig
from components.train.launch_config import LaunchConfig
from tests.fake_kubernetes_api import NAMESPACE, FakeKubernetesApi, trainjob_pods

REPOSITORY = Path(__file__).resolve().parents[1]
KATIB = REPOSITORY / "manifests" / "katib"
RUNTIME = yaml.safe_load((REPOSITORY / "manifests" / "admin" / "trainer" / "trainjob-runtime.yaml").read_text())
META_REFERENCE = re.compile(r"\$\{trialSpec\.(.+?)\}")  # consts.TrialTemplateMetaReplaceFormatRegex
META_INDEX = re.compile(r"(.+)\[(.+)]")  # consts.TrialTemplateMetaParseFormatRegex
EXAMPLES = {"experiment.yaml": ("1.11", "26.03"), "experiment-tfjob.yaml": ("1.9", "1.10")}


def katib_trial(experiment: dict, trial_name: str, namespace: str, assignments: dict[str, str]) -> dict:
    """The trial's job, as Katib v0.19's GetRunSpecWithHyperParameters makes it."""
    template = experiment["spec"]["trialTemplate"]
    trial_spec = template["trialSpec"]
    text = json.dumps(trial_spec)
    values: dict[str, str] = {}
    used = 0
    for parameter in template["trialParameters"]:
        meta = META_REFERENCE.search(parameter["reference"])
        if meta is None:
            if parameter["reference"] not in assignments:
                raise ValueError(f"parameter {parameter['reference']} not found in the assignments {assignments}")
            values[parameter["name"]] = assignments[parameter["reference"]]
            used += 1
            continue
        key, index = meta.group(1), None
        if indexed := META_INDEX.search(key):
            key, index = indexed.group(1), indexed.group(2)
        metadata = trial_spec.get("metadata") or {}
        if key in ("Annotations", "Labels"):
            values[parameter["name"]] = (metadata.get(key.lower()) or {})[index]
        else:
            values[parameter["name"]] = {"Name": trial_name, "Namespace": namespace, "Kind": trial_spec["kind"],
                                         "APIVersion": trial_spec["apiVersion"]}[key]  # fmt: skip
    if used != len(assignments):
        raise ValueError("every assignment must be a trial parameter")
    for name, value in values.items():
        text = text.replace("${trialParameters.%s}" % name, value)  # noqa: UP031 (Katib's own format)
    job = json.loads(text)
    job.setdefault("metadata", {}).update(name=trial_name, namespace=namespace)
    return job


def experiment_of(name: str) -> dict:
    return yaml.safe_load((KATIB / name).read_text())


def trial_arguments(job: dict) -> list[str]:
    if job["kind"] == "TrainJob":
        return job["spec"]["trainer"]["args"]
    (container,) = job["spec"]["tfReplicaSpecs"]["Worker"]["template"]["spec"]["containers"]
    return container["args"]


@pytest.mark.parametrize(("example", "release"), [(e, r) for e, releases in EXAMPLES.items() for r in releases])
def test_each_trial_is_a_job_the_release_takes_with_a_model_folder_of_its_own(example, release):
    experiment = experiment_of(example)
    rates = (("cifar10-learning-rate-x7k2pq9d", "0.05"), ("cifar10-learning-rate-m4n8zt2v", "0.2"))
    trials = {name: katib_trial(experiment, name, NAMESPACE, {"learning_rate": rate}) for name, rate in rates}
    folders = set()
    with FakeKubernetesApi(release=release) as api:
        custom, _core = api.clients(token="admin-token")
        if release in ("1.11", "26.03"):
            custom.create_cluster_custom_object("trainer.kubeflow.org", "v1alpha1", "clustertrainingruntimes",
                                                copy.deepcopy(RUNTIME), field_validation="Strict")  # fmt: skip
        for name, job in trials.items():
            assert "${" not in json.dumps(job)  # nothing left as written
            api.create_job(NAMESPACE, job)  # the CRD's schema and the admission webhook of the release
            arguments = trial_arguments(job)
            (train, _launch), _ = parse_configs((TrainConfig, LaunchConfig), arguments, "katib trial")
            assert train.model_dir.endswith(f"/katib/{name}") and train.learning_rate in (0.05, 0.2)
            folders.add(train.model_dir)
            if job["kind"] == "TrainJob":
                environment = {entry["name"]: entry.get("value") for entry in job["spec"]["trainer"]["env"]}
                assert environment["TRAINJOB_NAME"] == name == job["metadata"]["name"]  # the workers' TF_CONFIG
                assert int(environment["TRAINJOB_NUM_NODES"]) == job["spec"]["trainer"]["numNodes"] == train.workers
                for plan in trainjob_pods(job, RUNTIME, release="1.11"):
                    assert plan.annotations.get("sidecar.istio.io/inject") == "false"
                    assert plan.pod_spec.get("serviceAccountName") == "cifar10-pipeline"
            else:
                template = job["spec"]["tfReplicaSpecs"]["Worker"]["template"]
                assert template["metadata"]["annotations"]["sidecar.istio.io/inject"] == "false"
                assert template["spec"]["serviceAccountName"] == "cifar10-pipeline"
                assert job["spec"]["tfReplicaSpecs"]["Worker"]["replicas"] == train.workers
    assert len(folders) == 2  # no trial resumes another's checkpoints


def test_katibs_rules_leave_a_trial_spec_name_written_in_the_spec_as_it_is():
    """Why the examples name the trial through a trial parameter: Katib does not substitute ${trialSpec.Name} in the
    spec itself (the earlier example's every trial shared one folder)."""
    experiment = experiment_of("experiment.yaml")
    experiment["spec"]["trialTemplate"]["trialSpec"]["spec"]["trainer"]["args"].append("--x=${trialSpec.Name}")
    job = katib_trial(experiment, "trial-a", NAMESPACE, {"learning_rate": "0.1"})
    assert "--x=${trialSpec.Name}" in job["spec"]["trainer"]["args"]
    with pytest.raises(ValueError, match="not found in the assignments"):
        katib_trial(experiment, "trial-a", NAMESPACE, {"momentum": "0.9"})


def test_the_trainjob_example_runs_as_the_launcher_runs_its_own_jobs():
    """The example's TrainJob is the one the launcher builds (the same runtime, command, identity, service account,
    store keys), so what the pipeline's own jobs are tested for holds for a Katib trial."""
    from components.train import launch_trainjob
    from components.train.launch_config import LaunchConfig as Launch

    (example,) = [katib_trial(experiment_of("experiment.yaml"), "t1", NAMESPACE, {"learning_rate": "0.1"})]
    built = launch_trainjob.TrainJobKind(spec_fields=frozenset({"podTemplateOverrides"})).build(
        TrainConfig(data="d", model_dir="m", workers=2), Launch(gpus_per_worker=1), "t1", NAMESPACE
    )
    for field in ("runtimeRef",):
        assert example["spec"][field] == built["spec"][field]
    assert example["spec"]["trainer"]["command"] == built["spec"]["trainer"]["command"]
    names = {entry["name"] for entry in example["spec"]["trainer"]["env"]}
    assert {"TRAINJOB_NAME", "TRAINJOB_NUM_NODES", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"} <= names
    (override,) = example["spec"]["podTemplateOverrides"]
    (built_override,) = built["spec"]["podTemplateOverrides"]
    assert override["spec"]["serviceAccountName"] == built_override["spec"]["serviceAccountName"]
    assert override["spec"]["tolerations"] == built_override["spec"]["tolerations"]


def test_both_examples_search_and_collect_alike():
    trainjob, tfjob = experiment_of("experiment.yaml")["spec"], experiment_of("experiment-tfjob.yaml")["spec"]
    for field in ("objective", "algorithm", "parameters", "metricsCollectorSpec", "maxTrialCount"):
        assert trainjob[field] == tfjob[field], field
    assert trainjob["trialTemplate"]["trialParameters"] == tfjob["trialTemplate"]["trialParameters"]
    assert trial_arguments(trainjob["trialTemplate"]["trialSpec"]) == trial_arguments(
        tfjob["trialTemplate"]["trialSpec"]
    )
