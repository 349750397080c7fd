"""The Kubernetes manifests parse and hang together; every pod they define meets the restricted Pod Security profile."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

MANIFESTS = Path(__file__).resolve().parents[1] / "manifests"
VENDOR = Path(__file__).resolve().parent / "vendor"
TFJOB_TEMPLATE = Path(__file__).resolve().parents[1] / "components" / "train" / "tfjob.yaml"  # package data
FOLDERS = (MANIFESTS, MANIFESTS / "admin", MANIFESTS / "admin" / "trainer", MANIFESTS / "single-user",
           MANIFESTS / "serving")  # fmt: skip
PROFILE_RELEASES = ("1.9", "1.10", "1.11", "26.03")
JOB_KINDS = {"1.9": ("kubeflow.org", "tfjobs"), "1.10": ("kubeflow.org", "tfjobs"),
             "1.11": ("trainer.kubeflow.org", "trainjobs"), "26.03": ("trainer.kubeflow.org", "trainjobs")}  # fmt: skip
LEASE_VERBS = {"get", "list", "create", "update", "delete"}


def documents():
    for path in [*(path for folder in FOLDERS for path in sorted(folder.glob("*.yaml"))), TFJOB_TEMPLATE]:
        for document in yaml.safe_load_all(path.read_text()):
            if document:
                yield path.name, document


def pod_specs():
    """Every pod template in the manifests: TFJob replica templates, the TrainJob runtime's jobs, workloads."""
    for name, document in documents():
        if document["kind"] == "TFJob":
            for replica, spec in document["spec"]["tfReplicaSpecs"].items():
                yield f"{name}:{replica}", spec["template"]["spec"]
        if document["kind"] == "ClusterTrainingRuntime":
            for job in document["spec"]["template"]["spec"]["replicatedJobs"]:
                yield f"{name}:{job['name']}", job["template"]["spec"]["template"]["spec"]
            continue
        template = document.get("spec", {}).get("template") if isinstance(document.get("spec"), dict) else None
        if template:
            yield name, template["spec"]


def test_every_manifest_parses_and_has_a_kind_and_name():
    found = list(documents())
    assert {document["kind"] for _, document in found} >= {
        "TFJob",
        "ClusterTrainingRuntime",
        "ServiceAccount",
        "Role",
        "RoleBinding",
        "Deployment",
        "Service",
        "ConfigMap",
    }
    for name, document in found:
        assert document.get("apiVersion"), name
        assert document["kind"] == "Kustomization" or document.get("metadata", {}).get("name"), name


@pytest.mark.parametrize(("where", "pod"), list(pod_specs()))
def test_pods_meet_the_restricted_pod_security_profile(where, pod):
    security = pod.get("securityContext", {})
    assert security.get("runAsNonRoot") is True, where
    assert security.get("runAsUser", 1) != 0, where
    assert security.get("seccompProfile", {}).get("type") == "RuntimeDefault", where
    volumes = {volume["name"]: volume for volume in pod.get("volumes", [])}
    assert not any("hostPath" in volume for volume in volumes.values()), where
    assert not pod.get("hostNetwork") and not pod.get("hostPID") and not pod.get("hostIPC"), where
    for container in pod["containers"] + pod.get("initContainers", []):
        context = container.get("securityContext", {})
        assert context.get("allowPrivilegeEscalation") is False, (where, container["name"])
        assert context.get("capabilities", {}).get("drop") == ["ALL"], (where, container["name"])
        assert not context.get("capabilities", {}).get("add"), (where, container["name"])
        assert not context.get("privileged"), (where, container["name"])
        assert context.get("readOnlyRootFilesystem") is True, (where, container["name"])
        mounts = {mount["mountPath"]: mount["name"] for mount in container.get("volumeMounts", [])}
        assert "/tmp" in mounts and "emptyDir" in volumes[mounts["/tmp"]], (where, "a writable /tmp emptyDir")


def test_tfjob_template_retries_preemption_and_injects_tf_config():
    (tfjob,) = [document for _, document in documents() if document["kind"] == "TFJob"]
    worker = tfjob["spec"]["tfReplicaSpecs"]["Worker"]
    assert worker["restartPolicy"] == "ExitCode"  # exit 143 (preempted) is retried, 1-127 are final
    assert tfjob["spec"]["runPolicy"]["cleanPodPolicy"] in ("Running", "All")
    assert [c["name"] for c in worker["template"]["spec"]["containers"]] == ["tensorflow"]  # gets TF_CONFIG


def lease_verbs(rbac, user: str) -> set[str]:
    from tests.fake_rbac import NAMESPACE

    return {verb for verb in LEASE_VERBS if rbac.allows(user, verb, "coordination.k8s.io", "leases", NAMESPACE)}


@pytest.mark.parametrize("release", PROFILE_RELEASES)
def test_a_profile_owner_installs_the_pipeline_with_kubeflow_admin_alone(release):
    """The cluster admin applies manifests/admin/ once; the profile owner, who holds kubeflow-admin in the profile
    and nothing more, then applies manifests/ there, on every release, and everything a step and a worker do is
    held: the release's job kind, pods and logs, Leases; the owner may list and remove the Leases."""
    from tests.fake_rbac import ADMIN, EDITOR, NAMESPACE, OWNER, WORKERS, Rbac

    rbac = Rbac(release)
    rbac.apply(ADMIN, MANIFESTS / "admin", None)
    applied = rbac.apply(OWNER, MANIFESTS, NAMESPACE)
    assert {document["kind"] for document in applied} >= {"ServiceAccount", "RoleBinding", "ConfigMap", "Deployment"}
    group, jobs = JOB_KINDS[release]
    for verb in ("create", "get", "list", "watch", "delete"):
        assert rbac.allows(EDITOR, verb, group, jobs, NAMESPACE), (verb, jobs)
    for verb, resource in (("get", "pods"), ("list", "pods"), ("get", "pods/log"), ("list", "events")):
        assert rbac.allows(EDITOR, verb, "", resource, NAMESPACE), (verb, resource)
    assert lease_verbs(rbac, EDITOR) == LEASE_VERBS  # the steps
    assert lease_verbs(rbac, WORKERS) == LEASE_VERBS - {"list"}  # the training workers, and their own job:
    assert rbac.allows(WORKERS, "delete", group, jobs, NAMESPACE) and not rbac.allows(
        WORKERS, "create", group, jobs, NAMESPACE
    )
    assert {"list", "delete"} <= lease_verbs(rbac, OWNER)  # the documented clean-up, by the owner
    assert lease_verbs(rbac, "system:serviceaccount:team-b:default-editor") == set()  # another profile: none here


@pytest.mark.parametrize("release", PROFILE_RELEASES)
def test_the_profile_owner_mints_the_default_editors_token_once_the_admins_set_is_applied(release):
    """`kubectl -n <profile> create token default-editor` (docs/cluster.md) is a create on serviceaccounts/token of
    that name: no release's Kubeflow roles grant it; manifests/admin/ grants it to every profile owner, for that one
    service account, and to nobody else."""
    from tests.fake_rbac import ADMIN, EDITOR, NAMESPACE, OWNER, Forbidden, Rbac

    def create_token(rbac, user, account, namespace=NAMESPACE):
        rbac.authorize(user, "create", "", "serviceaccounts/token", namespace, account)

    rbac = Rbac(release)
    with pytest.raises(Forbidden, match=r'cannot create resource "serviceaccounts/token"'):
        create_token(rbac, OWNER, "default-editor")
    rbac.apply(ADMIN, MANIFESTS / "admin", None)
    create_token(rbac, OWNER, "default-editor")
    for user, account, namespace in (
        (OWNER, "default-viewer", NAMESPACE),
        (OWNER, "cifar10-pipeline", NAMESPACE),
        (OWNER, "default-editor", "team-b"),
        (EDITOR, "default-editor", NAMESPACE),
    ):
        with pytest.raises(Forbidden):
            create_token(rbac, user, account, namespace)  # fmt: skip


@pytest.mark.parametrize("release", PROFILE_RELEASES)
def test_before_the_admins_set_the_owners_install_is_refused_naming_the_role(release):
    from tests.fake_rbac import NAMESPACE, OWNER, Forbidden, Rbac

    with pytest.raises(
        Forbidden, match=r'clusterroles\.rbac\.authorization\.k8s\.io "cifar10-pipeline-workers" not found'
    ):
        Rbac(release).apply(OWNER, MANIFESTS, NAMESPACE)


@pytest.mark.parametrize("release", PROFILE_RELEASES)
def test_the_stand_in_refuses_a_role_that_grants_what_the_owner_lacks(release):
    """The escalation check the profile's manifests must pass, shown refusing: a Role with the job kind the release
    does not serve, or with Leases before the admin's set, is refused as the API server refuses it; the single-user
    set (both job kinds) is the cluster admin's to apply."""
    from tests.fake_rbac import ADMIN, NAMESPACE, OWNER, Forbidden, Rbac

    rbac = Rbac(release)
    other = {"1.9": "trainjobs", "1.10": "trainjobs", "1.11": "tfjobs", "26.03": "tfjobs"}[release]
    group = "trainer.kubeflow.org" if other == "trainjobs" else "kubeflow.org"
    for rule in ({"apiGroups": [group], "resources": [other], "verbs": ["create"]},
                 {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["get"]}):  # fmt: skip
        role = {"kind": "Role", "metadata": {"name": "x"}, "rules": [rule]}
        with pytest.raises(Forbidden, match=r'"x" is forbidden: user "alice@example.com" .* not currently held'):
            rbac.create(OWNER, role, NAMESPACE)
    with pytest.raises(Forbidden, match="not currently held"):
        rbac.apply(OWNER, MANIFESTS / "single-user", NAMESPACE)
    rbac.apply(ADMIN, MANIFESTS / "admin", None)
    rbac.apply(ADMIN, MANIFESTS / "single-user", NAMESPACE)
    assert rbac.allows("system:serviceaccount:team-a:pipeline-runner", "create", group, other, NAMESPACE)


def test_the_profiles_manifests_name_no_job_kind_and_grant_leases_only_through_the_admins_role():
    profile = [yaml.safe_load_all(path.read_text()) for path in MANIFESTS.glob("*.yaml")]
    assert not [d for documents_ in profile for d in documents_ if d and d["kind"] in ("Role", "ClusterRole")]
    roles = {document["metadata"]["name"]: document for _, document in documents() if document["kind"] == "ClusterRole"}
    role = roles["cifar10-pipeline-coordination"]
    assert role["metadata"]["labels"]["rbac.authorization.kubeflow.org/aggregate-to-kubeflow-edit"] == "true"
    assert [(rule["apiGroups"], rule["resources"]) for rule in role["rules"]] == [(["coordination.k8s.io"], ["leases"])]
    (bind,) = roles["cifar10-pipeline-bind-workers"]["rules"]  # owners may bind the workers' role and no other
    assert (bind["verbs"], bind["resourceNames"]) == (["bind"], ["cifar10-pipeline-workers"])


def test_no_credentials_anywhere():
    """No key material and no key files: Workload Identity for gs://, and for s3:// only references to the optional
    KFP MinIO secret that the cluster already holds."""
    for path in [*MANIFESTS.glob("**/*.yaml"), TFJOB_TEMPLATE]:
        text = path.read_text().lower()
        for marker in ("private_key", "google_application_credentials", "kind: secret", "user-gcp-sa", "minio123"):
            assert marker not in text, (path.name, marker)
    for _name, document in documents():
        for reference in _secret_references(document):
            assert reference == {"name": "mlpipeline-minio-artifact", "key": reference["key"], "optional": True}
    account = next(document for _, document in documents() if document["kind"] == "ServiceAccount")
    assert "iam.gke.io/gcp-service-account" in account["metadata"]["annotations"]  # Workload Identity


def _secret_references(node) -> list[dict]:
    if isinstance(node, dict):
        found = [node["secretKeyRef"]] if "secretKeyRef" in node else []
        return found + [reference for value in node.values() for reference in _secret_references(value)]
    if isinstance(node, list):
        return [reference for item in node for reference in _secret_references(item)]
    return []


def test_tensorboard_runs_as_the_pipelines_service_account_and_reads_the_object_store():
    (deployment,) = [document for _, document in documents() if document["kind"] == "Deployment"]
    pod = deployment["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == "cifar10-pipeline"  # not `default`: Workload Identity applies
    (container,) = pod["containers"]
    assert container["command"] == ["python", "-m", "components.common.tensorboard"]
    environment = {variable["name"] for variable in container["env"]}
    assert {"AWS_ENDPOINT_URL", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"} <= environment
    (service,) = [document for _, document in documents() if document["kind"] == "Service"]
    assert service["spec"]["selector"] == deployment["spec"]["selector"]["matchLabels"]


@pytest.mark.parametrize("folder", FOLDERS)
def test_kustomization_lists_existing_files(folder):
    kustomization = yaml.safe_load((folder / "kustomization.yaml").read_text())
    for resource in kustomization["resources"]:
        assert (folder / resource).exists(), resource
    listed = {path.name for path in folder.glob("*.yaml")} - {"kustomization.yaml"}
    assert listed == set(kustomization["resources"])  # nothing left out


def inference_service() -> dict:
    (service,) = [document for _, document in documents() if document["kind"] == "InferenceService"]
    return service


def test_the_inference_service_is_valid_against_the_vendored_kserve_crd():
    from tests.fake_kubernetes_api import crd_schema, unknown_fields, validator

    crd = "serving.kserve.io_inferenceservices-v0.16.0.yaml"
    service = inference_service()
    problems = [error.message for error in validator(crd).iter_errors(service)]
    assert problems == [] and unknown_fields(crd_schema(crd), service) == []
    broken = {**service, "spec": {"predictor": {"model": {"modelFormat": {"name": "tensorflow"}, "storageURI": "x"}}}}
    assert list(validator(crd).iter_errors(broken)), "the schema check would let a misspelt field through"


def test_the_inference_service_serves_the_promotion_root_with_the_exporting_tensorflow():
    """KServe's TensorFlow runtime (vendored) runs tensorflow/serving:<runtimeVersion>, else 2.6.2, which cannot load
    what this TensorFlow exports: the runtime version is the exporting release, and its op list ships."""
    import tensorflow as tf

    from components.evaluate import serving_ops

    runtime = yaml.safe_load((VENDOR / "kserve-v0.16.0-tensorflow-serving-runtime.yaml").read_text())
    formats = {entry["name"] for entry in runtime["spec"]["supportedModelFormats"]}
    model = inference_service()["spec"]["predictor"]["model"]
    assert model["modelFormat"]["name"] in formats
    assert "--model_base_path=/mnt/models" in runtime["spec"]["containers"][0]["args"]
    assert model["runtimeVersion"] == tf.__version__ and model["runtimeVersion"] in serving_ops.known_versions()
    assert model["storageUri"] == "s3://mlpipeline/private/NAMESPACE/cifar10/models/"  # the documented root, a prefix
    predictor = inference_service()["spec"]["predictor"]
    (account,) = [
        document
        for _, document in documents()
        if document["kind"] == "ServiceAccount" and document["metadata"]["name"] == predictor["serviceAccountName"]
    ]
    assert account["kind"] == "ServiceAccount" and account["secrets"] == [{"name": "cifar10-pipeline-serving-s3"}]


def test_a_registered_version_is_served_from_its_artifact_uri_as_exactly_that_version():
    """The template docs/serving.md fills from the Model Registry: valid against KServe v0.16.0's CRD once filled, the
    artifact URI (the version's serving folder, whose only child is the version) as a plain storageUri, which KServe
    v0.15 and v0.16 reconcile in both modes (not storageUris: kserve/kserve#4819), copied into the runtime's model
    base path."""
    from tests.fake_kubernetes_api import crd_schema, unknown_fields, validator

    template = (MANIFESTS / "serving" / "registered-version" / "inference-service.yaml").read_text()
    uri = "s3://mlpipeline/private/team-a/registered-m/7/"
    filled = template.replace("NAMESPACE", "team-a").replace("ARTIFACT_URI", uri)
    service = yaml.safe_load(filled.replace("VERSION", "7"))
    crd = "serving.kserve.io_inferenceservices-v0.16.0.yaml"
    assert [error.message for error in validator(crd).iter_errors(service)] == []
    assert unknown_fields(crd_schema(crd), service) == []
    predictor = service["spec"]["predictor"]
    assert predictor["model"]["storageUri"] == uri and "storageUris" not in predictor
    runtime = yaml.safe_load((VENDOR / "kserve-v0.16.0-tensorflow-serving-runtime.yaml").read_text())
    assert "--model_base_path=/mnt/models" in runtime["spec"]["containers"][0]["args"]
    main = inference_service()["spec"]["predictor"]
    assert predictor["model"]["runtimeVersion"] == main["model"]["runtimeVersion"]
    assert predictor["serviceAccountName"] == main["serviceAccountName"]
    assert service["metadata"]["name"] == "cifar10-v7" and main["model"]["storageUri"].endswith("/")
