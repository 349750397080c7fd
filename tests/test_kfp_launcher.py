"""The artifact store the KFP way: a step in a pod takes the endpoint, region and keys the namespace's kfp-launcher
ConfigMap gives its location (`providers`, as KFP's launcher reads them: backend/src/v2/config/s3.go), before any
guess, and says which source it used."""

from __future__ import annotations

import pytest

from components.common import filesystem, kfp_launcher, object_stores, storage
from components.train.config import TrainConfig
from components.train.launch_config import LaunchConfig
from components.train.launch_trainjob import TrainJobKind
from tests.fake_kubernetes_api import NAMESPACE, FakeKubernetesApi

# The shape of kubeflow/pipelines #10625's example, the providers' text as an admin writes it.
PROVIDERS = """
s3:
  default:
    endpoint: s3.amazonaws.com
    region: us-west-2
    disableSSL: false
    credentials:
      fromEnv: true
  Overrides:
    - bucketName: team-data
      keyPrefix: private/
      endpoint: store.team.example:9000
      disableSSL: true
      region: eu-west-1
      credentials:
        secretRef: {secretName: team-keys, accessKeyKey: access, secretKeyKey: secret}
    - bucketName: team-data
      keyPrefix: ""
      credentials: {fromEnv: true}
"""


def secrets(name: str) -> dict[str, str]:
    return {"team-keys": {"access": "AKIA-TEAM", "secret": "team-secret"}}[name]


@pytest.mark.parametrize(
    ("bucket", "key", "expected"),
    [("team-data", "private/models", ("http://store.team.example:9000", "eu-west-1", ("AKIA-TEAM", "team-secret"),
                                      "providers.s3.overrides[0]")),
     ("team-data", "shared/x", (None, "us-west-2", None, "providers.s3.overrides[1]")),  # s3.amazonaws.com: dropped
     ("other", "private/models", (None, "us-west-2", None, "providers.s3.default"))],
)  # fmt: skip
def test_the_first_override_of_the_bucket_and_prefix_wins_over_the_default(bucket, key, expected):
    settings = kfp_launcher.settings_from({"providers": PROVIDERS}, bucket, key, secrets)
    assert (settings.endpoint, settings.region, settings.keys, settings.source.split("'s ")[-1]) == expected


def test_a_configmap_without_providers_gives_nothing_and_a_broken_one_is_named():
    assert kfp_launcher.settings_from({"defaultPipelineRoot": "minio://mlpipeline/v2"}, "b", "k", secrets) is None
    reference = "{secretName: team-keys, accessKeyKey: id, secretKeyKey: secret}"
    broken = f"s3:\n  default:\n    endpoint: x\n    credentials: {{secretRef: {reference}}}"
    with pytest.raises(
        kfp_launcher.LauncherConfigError, match=r"providers\.s3\.default: the secret team-keys has no key 'id'"
    ):
        kfp_launcher.settings_from({"providers": broken}, "b", "k", secrets)
    yaml_false = broken.replace("accessKeyKey: id", "accessKeyKey: no")  # YAML 1.1's false, as KFP's decoder reads it
    with pytest.raises(kfp_launcher.LauncherConfigError, match=r"secretRef\.accesskeykey is not a string"):
        kfp_launcher.settings_from({"providers": yaml_false}, "b", "k", secrets)
    with pytest.raises(kfp_launcher.LauncherConfigError, match="the kfp-launcher ConfigMap's providers"):
        kfp_launcher.settings_from({"providers": "s3: [unclosed"}, "b", "k", secrets)


def test_a_step_in_a_pod_reaches_the_store_the_launcher_config_names_with_its_secrets_keys(
    s3_server, s3_bucket, tmp_path, monkeypatch, caplog
):
    """No AWS_ENDPOINT_URL and no keys in the step's environment: the endpoint and the keys come from the
    namespace's kfp-launcher ConfigMap (its override for this bucket) and the secret it names, and the step says so."""
    providers = (
        f"minio:\n  default:\n    endpoint: seaweedfs.kubeflow:9000\n    disableSSL: true\n"
        f"    credentials: {{fromEnv: true}}\n  overrides:\n    - bucketName: {s3_bucket}\n"
        f"      endpoint: {s3_server}\n      credentials:\n        secretRef: {{secretName: store-keys, "
        f"accessKeyKey: accesskey, secretKeyKey: secretkey}}\n"
    )
    with FakeKubernetesApi(release="26.03", pod_folder=tmp_path / "pod") as api:
        api.add_config_map(NAMESPACE, "kfp-launcher", {"defaultPipelineRoot": f"minio://{s3_bucket}/v2",
                                                       "providers": providers})  # fmt: skip
        api.add_secret(NAMESPACE, "store-keys", {"accesskey": "minio", "secretkey": "minio123"})
        for name, value in api.pod_environment().items():
            monkeypatch.setenv(name, value)
        for name in ("AWS_ENDPOINT_URL", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
            monkeypatch.delenv(name, raising=False)
        monkeypatch.setenv(filesystem.ASSUME_SINGLE_WRITER, "1")  # the store's own check is not this test's
        object_stores.reset_clients()
        try:
            with caplog.at_level("INFO", logger="components.common.kfp_launcher"):
                publisher = storage.publisher_for(f"s3://{s3_bucket}/models")
                publisher.publish("note.txt", b"hello")
                assert publisher.read("note.txt") == b"hello"
            # the training job's workers may read neither the ConfigMap nor the secret: the step passes them on
            job = TrainJobKind().build(TrainConfig(data="d", model_dir=f"s3://{s3_bucket}/models"), LaunchConfig(),
                                       "job-1", NAMESPACE)  # fmt: skip
            environment = {entry["name"]: entry for entry in job["spec"]["trainer"]["env"]}
            assert environment["AWS_ENDPOINT_URL"]["value"] == s3_server
            assert environment["AWS_ACCESS_KEY_ID"]["valueFrom"]["secretKeyRef"] == {
                "name": "store-keys", "key": "accesskey", "optional": True}  # fmt: skip
        finally:
            object_stores.reset_clients()
    assert f"object store for s3://{s3_bucket}/models: {s3_server} (the kfp-launcher ConfigMap's " in caplog.text
    assert "providers.minio.overrides[0], its secret's keys)" in caplog.text
    assert caplog.text.count("object store for") == 1  # said once


# What KFP's launcher reads for each scheme (backend/src/v2/config/env.go GetStoreSessionInfo): a minio:// pipeline
# root's bucket reads providers.minio, any other location providers.s3.
BOTH = """
minio:
  default: {endpoint: seaweedfs.kubeflow:9000, disableSSL: true, credentials: {secretRef: {secretName: team-keys,
            accessKeyKey: access, secretKeyKey: secret}}}
s3:
  default: {endpoint: s3.eu-west-1.amazonaws.com, region: eu-west-1, credentials: {fromEnv: true}}
"""


@pytest.mark.parametrize(
    ("root", "bucket", "expected"),
    [("minio://mlpipeline/v2/artifacts", "mlpipeline", ("http://seaweedfs.kubeflow:9000", "providers.minio.default")),
     ("minio://mlpipeline/v2/artifacts", "team-data", ("https://s3.eu-west-1.amazonaws.com", "providers.s3.default")),
     ("s3://mlpipeline/v2/artifacts", "mlpipeline", ("https://s3.eu-west-1.amazonaws.com", "providers.s3.default"))],
)  # fmt: skip
def test_the_provider_is_the_locations_scheme_as_kfp_reads_it(root, bucket, expected):
    settings = kfp_launcher.settings_from({"providers": BOTH, "defaultPipelineRoot": root}, bucket, "k", secrets)
    assert (settings.endpoint, settings.source.split("'s ")[-1]) == expected


@pytest.mark.parametrize(
    ("providers", "refusal"),
    [("s3:\n  overrides:\n    - {bucketName: b, credentials: {fromEnv: true}}", "overrides without a default"),
     ("s3:\n  default: {endpoint: x}", r"providers\.s3\.default: no credentials"),
     ("s3:\n  default: {endpoint: x, credentials: {fromEnv: false}}", "neither fromEnv: true nor a secretRef"),
     ("s3:\n  default: {credentials: {fromEnv: true}}\n  overrides:\n    - {bucketName: b, endpoint: y}",
      r"providers\.s3\.overrides\[0\]: no credentials"),
     ("s3:\n  default: {credentials: {fromEnv: true}}\n  overrides:\n    - {bucketName: b, credentials: {}}",
      r"providers\.s3\.overrides\[0\]: no credentials"),
     ("s3:\n  default: {credentials: {fromEnv: true}}\n  overrides: {bucketName: b}", "overrides is not a list"),
     ("s3:\n  default: {endpoint: [a, b], credentials: {fromEnv: true}}", r"default\.endpoint is not a string")],
)  # fmt: skip
def test_what_kfps_launcher_refuses_is_refused_naming_the_field(providers, refusal):
    with pytest.raises(kfp_launcher.LauncherConfigError, match=refusal):
        kfp_launcher.settings_from({"providers": providers}, "b", "k", secrets)


@pytest.mark.parametrize(("release", "kept"), [("2.5.0", False), ("2.15.0", False), ("2.16.0", False),
                                                ("2.17.0", True)])  # fmt: skip
def test_from_env_credentials_keep_the_providers_endpoint_from_kfp_2_17_only(release, kept):
    providers = "s3:\n  default: {endpoint: store.team.example:9000, disableSSL: true, credentials: {fromEnv: true}}"
    settings = kfp_launcher.settings_from({"providers": providers}, "b", "k", secrets, release)
    assert (settings is not None and settings.endpoint == "http://store.team.example:9000") is kept
    if not kept:
        assert settings is None  # the step takes the environment's store, as that release's launcher does


@pytest.mark.parametrize("image", ["ghcr.io/kubeflow/kfp-launcher:2.15.0", "ghcr.io/kubeflow/kfp-launcher:latest"])
def test_the_pods_kfp_release_is_read_from_its_launcher_image(image, tmp_path, monkeypatch):
    from tests.fake_kubernetes_api import PodRecord

    with FakeKubernetesApi(release="26.03", pod_folder=tmp_path / "pod") as api:
        api.add_pod(PodRecord(NAMESPACE, "step-pod", {}, {}, "main", phase="Running",
                              init_containers=[{"name": "kfp-launcher", "image": image}]))  # fmt: skip
        for name, value in api.pod_environment().items():
            monkeypatch.setenv(name, value)
        monkeypatch.setenv("KFP_POD_NAME", "step-pod")
        kfp_launcher.forget()
        try:
            assert kfp_launcher.kfp_release() == ("2.15.0" if image.endswith("2.15.0") else kfp_launcher.NEWEST_RELEASE)
        finally:
            kfp_launcher.forget()
