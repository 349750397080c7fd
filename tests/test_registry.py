"""Registration of promoted versions in Kubeflow's Model Registry, through the real `model-registry` client against a
stand-in that serves the registry's published OpenAPI document and validates every request against it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import requests

from components.evaluate import registry
from components.evaluate.config import EvaluateConfig
from components.evaluate.evaluate import Evaluator
from components.train import loop
from pipeline.parameters import CommandError, check_parameters
from pipeline.training_pipeline import cifar10_pipeline
from tests.builders import self_signed_certificate, tiny_train_config
from tests.fake_model_registry import FakeModelRegistry

LINEAGE = registry.Lineage(
    run_id="4f2a9c1e-run", run_name="nightly-retrain", namespace="team-a", image="ghcr.io/cifar10-pipeline/gpu:abc123"
)


@pytest.fixture(scope="module")
def trained(synthetic_data, tmp_path_factory):
    model_dir = tmp_path_factory.mktemp("registry") / "model"
    loop.train(tiny_train_config(synthetic_data, model_dir, train_steps=6, checkpoint_every_steps=6))
    return model_dir


@pytest.fixture
def token(tmp_path, monkeypatch):
    """The bearer token the registry asks for, where a KFP step finds it (the client's convention)."""
    path = tmp_path / "token"
    path.write_text("sa-token-123\n")
    monkeypatch.setenv(registry.TOKEN_PATH_VARIABLE, str(path))
    monkeypatch.setattr(registry, "RETRY_SECONDS", 0.05)
    return "sa-token-123"


@pytest.fixture
def model_registry(token):
    server = FakeModelRegistry(token=token)
    yield server
    server.stop()
    assert server.problems == [], server.problems  # the stand-in answered only what its document allows
    invalid = [line for line in server.refusals if not line.startswith(("404", "503"))]
    assert invalid == [], invalid  # the client sent nothing the document refuses


def promote_and_register(synthetic_data, trained, root, address, name="cifar10"):
    config = EvaluateConfig(
        data=synthetic_data, model_dir=str(trained), promote_to=str(root), model_registry=address,
        registered_model_name=name,
    )  # fmt: skip
    return Evaluator(config, LINEAGE).run()


def property_values(entity: dict) -> dict:
    """The custom properties as values (the API wraps each in a typed MetadataValue; ints travel as strings)."""
    values = {}
    for name, wrapped in entity["customProperties"].items():
        kind = wrapped["metadataType"]
        raw = next(value for key, value in wrapped.items() if key != "metadataType")
        values[name] = int(raw) if kind == "MetadataIntValue" else raw
    return values


def test_a_promotion_registers_its_version_with_the_artifact_kserve_reads_and_its_lineage(
    synthetic_data, trained, tmp_path, model_registry
):
    root = tmp_path / "models"
    result = promote_and_register(synthetic_data, trained, root, model_registry.address, "cifar10-demo")

    pointer = json.loads((root / "current.json").read_text())
    assert result.promotion.version == 1 and result.registration.registered, result.registration
    model, version, artifacts = model_registry.registered("cifar10-demo", "1")
    (artifact,) = artifacts
    assert artifact["uri"] == f"{tmp_path / 'registered-models' / '1'}/"  # the version's own serving folder
    served = sorted(path.relative_to(tmp_path / "registered-models" / "1") for path in (tmp_path / "registered-models"
                    / "1").rglob("*") if path.is_file())  # fmt: skip
    assert served == sorted(Path("1") / path.relative_to(root / "1") for path in (root / "1").rglob("*")
                            if path.is_file())  # its only child: the version folder, as promoted  # fmt: skip
    assert artifact["modelFormatName"] == "tensorflow"
    assert artifact["modelFormatVersion"] == pointer["serving"]["written_by_tensorflow"]  # nothing declared
    assert (artifact["modelSourceKind"], artifact["modelSourceClass"]) == ("kfp", "pipelinerun")
    assert (artifact["modelSourceId"], artifact["modelSourceName"]) == (LINEAGE.run_id, LINEAGE.run_name)
    assert artifact["modelSourceGroup"] == "team-a"
    lineage = property_values(version)
    assert lineage["accuracy"] == pytest.approx(result.final.metrics.accuracy)
    assert lineage["gate_decision"] == result.decision.summary() and "blessed" in lineage["gate_decision"].lower()
    assert lineage["dataset_manifest_sha256"] == pointer["dataset_manifest_sha256"]
    assert lineage["dataset"] == synthetic_data
    assert json.loads(lineage["dataset_source"]) == pointer["dataset"]["source"]
    settings = json.loads(lineage["train_settings"])
    assert settings["train_steps"] == 6 and lineage["train_batch_size"] == settings["batch_size"]
    assert (lineage["image"], lineage["kfp_run_id"], lineage["kfp_run_name"]) == (
        LINEAGE.image, LINEAGE.run_id, LINEAGE.run_name
    )  # fmt: skip
    assert lineage["promotion_root"] == str(root) and lineage["weights_sha256"] == pointer["weights_sha256"]
    assert version["author"] and model["name"] == "cifar10-demo"
    # What the evaluation's summary says of it.
    summary = json.loads((trained / "eval_metrics.json").read_text())["registration"]
    assert summary["registered"] and summary["version_id"] == version["id"]

    # Registering again (a retried step, or the command) finds it: nothing made twice.
    created = sum(1 for method, *_ in model_registry.requests if method == "POST")
    again = registry.main(
        ["--promotion-root", str(root), "--model-registry", model_registry.address, "--registered-model-name",
         "cifar10-demo"]
    )  # fmt: skip
    assert again == 0
    assert sum(1 for method, *_ in model_registry.requests if method == "POST") == created


def test_a_registry_that_is_down_leaves_the_promotion_standing_and_it_is_registered_later(
    synthetic_data, trained, tmp_path, model_registry, caplog
):
    root = tmp_path / "models"
    model_registry.unavailable = True  # 503 to everything
    result = promote_and_register(synthetic_data, trained, root, model_registry.address)

    assert result.promotion.version == 1 and json.loads((root / "current.json").read_text())["version"] == 1
    assert not result.registration.registered
    line = result.registration.line
    assert "version 1 was promoted, but not registered" in line and "503" in line and "promotion stands" in line
    assert "python -m components.evaluate.registry" in line and "\n" not in line
    assert any(record.getMessage() == line for record in caplog.records)
    assert model_registry.registered_models == {}

    command = ["--promotion-root", str(root), "--model-registry", model_registry.address]
    assert registry.main(command) == 145  # still down: retryable, says so
    model_registry.unavailable = False
    assert registry.main(command) == 0
    _model, version, (artifact,) = model_registry.registered("cifar10", "1")
    assert artifact["uri"] == f"{root.parent / 'registered-models' / '1'}/" and property_values(version)["accuracy"] > 0


def test_a_registry_that_cannot_be_reached_at_all_is_one_line_too(synthetic_data, trained, tmp_path, token):
    server = FakeModelRegistry(token=token)
    server.stop()  # nothing listens on its port any more
    result = promote_and_register(synthetic_data, trained, tmp_path / "models", server.address)
    assert result.promotion.version == 1 and not result.registration.registered
    assert server.address in result.registration.line and "\n" not in result.registration.line
    assert f"the Model Registry at {server.address}: cannot be reached" in result.registration.line
    assert f"{server.address}: the Model Registry at" not in result.registration.line  # said once, not twice


def test_a_version_registered_from_another_root_is_refused_not_overwritten(model_registry):
    pointer = {
        "version": 3, "saved_model": "s3://bucket/team-a/models/3", "metrics": {"accuracy": 0.9},
        "serving": {"tensorflow_serving": "2.21.0"},
    }  # fmt: skip
    first = registry.registration_of("shared", pointer, "s3://bucket/team-a/models", registry.Lineage())
    assert first.format_version == "2.21.0"  # the release the root declares
    assert registry.register(model_registry.address, first).registered
    other = registry.registration_of(
        "shared", {**pointer, "saved_model": "s3://bucket/team-b/models/3"}, "s3://bucket/team-b/models",
        registry.Lineage(),
    )  # fmt: skip
    with pytest.raises(registry.RegistrationError, match="is registered with s3://bucket/team-a/registered-models/3/"):
        registry.register(model_registry.address, other)
    (artifact,) = model_registry.registered("shared", "3")[2]
    assert artifact["uri"] == "s3://bucket/team-a/registered-models/3/"


def test_an_answer_that_is_not_the_registrys_is_one_line_too_never_a_failed_step(model_registry, tmp_path):
    root = tmp_path / "models"
    (root / "2").mkdir(parents=True)
    (root / "2" / "saved_model.pb").write_bytes(b"a model")
    pointer = {"version": 2, "saved_model": str(root / "2"), "metrics": {"accuracy": 0.9}}
    registration = registry.registration_of("cifar10", pointer, str(root), registry.Lineage())
    model_registry.garbled = True
    outcome = registry.register_promotion(model_registry.address, registration)
    assert not outcome.registered and "version 2 was promoted, but not registered" in outcome.line
    assert "ValidationError" in outcome.line and "\n" not in outcome.line


def test_the_stand_in_refuses_what_the_registry_document_does_not_allow(model_registry, token):
    api = f"{model_registry.address}/api/model_registry/v1alpha3"
    bearer = {"Authorization": f"Bearer {token}"}
    refused = {
        "unknown field": requests.post(f"{api}/registered_models", json={"name": "a", "colour": "red"}, headers=bearer),
        "read-only field": requests.post(f"{api}/registered_models", json={"name": "a", "id": "7"}, headers=bearer),
        "wrong type": requests.post(f"{api}/registered_models", json={"name": 5}, headers=bearer),
        "missing required": requests.post(f"{api}/model_versions", json={"name": "1"}, headers=bearer),
        "unknown query": requests.get(f"{api}/registered_model?nom=a", headers=bearer),
        "no token": requests.get(f"{api}/registered_models"),
        "no such path": requests.get(f"{api}/registered_modelz", headers=bearer),
    }
    statuses = {why: answer.status_code for why, answer in refused.items()}
    assert statuses == {
        "unknown field": 400, "read-only field": 400, "wrong type": 400, "missing required": 400,
        "unknown query": 400, "no token": 401, "no such path": 404,
    }  # fmt: skip
    assert model_registry.registered_models == {}
    model_registry.refusals.clear()  # refused on purpose


@pytest.mark.parametrize(
    ("parameters", "expected"),
    [
        ({"model_registry": "model-registry:8080"}, "model_registry: 'model-registry:8080' is not a Model Registry"),
        ({"model_registry": "http://registry:80a"}, "has a port that is not a port"),
        ({"model_registry": "http://registry:99999"}, "has a port that is not a port"),
        ({"registered_model_name": " "}, "registered_model_name: ' ' is not a registered model name"),
    ],
)
def test_a_bad_registry_setting_is_refused_before_anything_runs(parameters, expected):
    with pytest.raises(CommandError, match=expected.replace("(", r"\(")):
        check_parameters(cifar10_pipeline, parameters)
    with pytest.raises(ValueError, match=expected.split(":")[0]):
        EvaluateConfig(data="/d", model_dir="/m", **parameters)


def registration_of_version(version: int = 4) -> registry.Registration:
    pointer = {"version": version, "saved_model": f"s3://bucket/models/{version}", "metrics": {"accuracy": 0.9}}
    return registry.registration_of("cifar10", pointer, "s3://bucket/models", registry.Lineage())


def test_a_registration_that_loses_a_race_finds_the_winners_and_completes(model_registry):
    """Two promotions register at once: each create that finds the entity made just before it (409) looks it up
    again, and one model, one version and one artifact result."""
    model_registry.racing = {"createRegisteredModel", "createModelVersion", "upsertModelVersionArtifact"}
    outcome = registry.register(model_registry.address, registration_of_version())
    assert outcome.registered and model_registry.racing == set(), outcome.line
    _model, _version, (artifact,) = model_registry.registered("cifar10", "4")
    assert artifact["uri"] == "s3://bucket/registered-models/4/" and len(model_registry.registered_models) == 1
    conflicts = [line for line in model_registry.refusals if line.startswith("409")]
    assert len(conflicts) == 3  # each create lost once, and the registration went on
    model_registry.refusals.clear()


def test_a_registry_of_another_api_version_is_one_line_naming_the_api_expected(token):
    server = FakeModelRegistry(token=token, api_version="v1")
    try:
        with pytest.raises(registry.RegistrationError) as refused:
            registry.register(server.address, registration_of_version())
    finally:
        server.stop()
    line = str(refused.value)
    assert "does not serve /api/model_registry/v1alpha3 (404 from its router)" in line and "another API" in line
    assert not refused.value.transient and len(server.refusals) == 1  # asked once, not per entity


def test_a_registry_retiring_this_api_is_said_in_one_warning_and_registration_goes_on(model_registry, caplog):
    """A newer server keeps v1alpha3 beside v1 for a while and says when it goes (Deprecation, Sunset headers)."""
    model_registry.retirement = {"Deprecation": "@1798761600", "Sunset": "Thu, 01 Jul 2027 00:00:00 GMT\x1b[31m"}
    with caplog.at_level("WARNING", logger="components.evaluate.registry"):
        registered = registry.register(model_registry.address, registration_of_version())
    assert registered.version_id
    (line,) = [record.getMessage() for record in caplog.records if "being retired" in record.getMessage()]
    assert "/api/model_registry/v1alpha3" in line and "Deprecation: @1798761600" in line
    assert "Sunset: Thu, 01 Jul 2027 00:00:00 GMT[31m" in line and "\x1b" not in line


def test_the_stand_in_refuses_a_search_by_name_without_its_parent_as_the_server_does(model_registry, token):
    api = f"{model_registry.address}/api/model_registry/v1alpha3"
    bearer = {"Authorization": f"Bearer {token}"}
    for path in ("model_version", "model_artifact"):
        answer = requests.get(f"{api}/{path}?name=1", headers=bearer)
        assert answer.status_code == 400 and "parentResourceId" in answer.json()["message"]
    model_registry.refusals.clear()


def test_an_https_registry_with_a_private_ca_is_reached_once_its_ca_is_given(token, tmp_path, monkeypatch):
    certificate, key = self_signed_certificate(tmp_path)
    server = FakeModelRegistry(token=token, tls=(certificate, key))
    try:
        with pytest.raises(registry.RegistrationError, match="its TLS certificate is not trusted") as refused:
            registry.register(server.address, registration_of_version())
        assert registry.CA_BUNDLE_VARIABLE in str(refused.value)
        monkeypatch.setenv(registry.CA_BUNDLE_VARIABLE, str(certificate))
        assert registry.register(server.address, registration_of_version()).registered
    finally:
        server.stop()
    assert server.problems == []


@pytest.mark.parametrize("kind", ["fifo", "large", "two words"])
def test_the_registry_token_file_is_read_as_the_kfp_one_is(tmp_path, monkeypatch, kind):
    import os
    import time

    path = tmp_path / "token"
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "large":
        path.write_bytes(b"x" * (1 << 20))
    else:
        path.write_text("two words\n")
    monkeypatch.setenv(registry.TOKEN_PATH_VARIABLE, str(path))
    started = time.monotonic()
    with pytest.raises(registry.RegistrationError) as refused:
        registry.register("http://127.0.0.1:9", registration_of_version())
    assert time.monotonic() - started < 5
    assert f"{registry.TOKEN_PATH_VARIABLE}: {path} is not a token" in str(refused.value)
