"""The prepare_data KFP component, run for real through kfp.local's SubprocessRunner."""

from __future__ import annotations

import json
from pathlib import Path

from components.common.dataset import open_dataset
from components.images import image
from components.prepare_data.component import prepare_data_component


def test_component_writes_the_dataset_artifact_with_data_identifying_metadata(tmp_path):
    from kfp import local

    local.init(runner=local.SubprocessRunner(use_venv=False), pipeline_root=str(tmp_path / "root"))
    task = prepare_data_component(source="synthetic", synthetic_train_per_class=6, synthetic_eval_per_class=3)

    artifact = task.outputs["dataset"]
    manifest_path = Path(artifact.path) / "manifest.json"
    import hashlib

    assert artifact.metadata["manifest_sha256"] == hashlib.sha256(manifest_path.read_bytes()).hexdigest()
    # 6 training images per class, 20% (1 per class) held out; KFP metadata carries numbers as floats.
    assert artifact.metadata["num_examples"] == {"train": 50.0, "validation": 10.0, "eval": 30.0}
    assert artifact.metadata["synthetic"] is True and artifact.metadata["dataset"] == "synthetic"
    assert artifact.metadata["num_classes"] == 10.0
    assert json.loads(manifest_path.read_text())["source"]["uri"] == "synthetic"
    verified = open_dataset(artifact.path)
    assert verified.manifest.splits["train"].num_examples == 50
    page = Path(task.outputs["statistics"].path).read_text()  # the step's Markdown page in the KFP UI
    assert (
        "## Class balance" in page
        and "| train | 50 |" in page
        and artifact.metadata["leakage"]
        == {
            "eval": 0.0,
            "validation": 0.0,
        }
    )


def test_component_interface_is_typed_and_keeps_the_documented_defaults():
    spec = prepare_data_component.component_spec
    assert set(spec.outputs) == {"dataset", "statistics"}
    assert spec.outputs["dataset"].type == "system.Dataset@0.0.1"
    assert spec.outputs["statistics"].type == "system.Markdown@0.0.1"
    assert spec.inputs["source"].default == "https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz"
    assert spec.inputs["validation_fraction"].default == -1.0
    assert spec.implementation.container.image == image("prepare_data")
