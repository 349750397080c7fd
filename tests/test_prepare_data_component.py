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


def test_a_parallel_for_of_workers_merged_by_the_prepare_step_publishes_what_one_step_does(tmp_path, monkeypatch):
    """The pipeline's fan-out, as it wires it (pipeline/training_pipeline.py), run by kfp.local: the worker pods of a
    ParallelFor each publish their share into their own artifact, the prepare step merges them (dsl.Collected)."""
    from kfp import dsl, local
    from kfp.local import logging_utils

    from components.prepare_data.component import prepare_part_component, prepare_worker_indices_component
    from pipeline.step_processes import IndentedPrint

    monkeypatch.setattr(logging_utils, "indented_print", IndentedPrint())  # as local-run's (the steps run on threads)

    local.init(runner=local.SubprocessRunner(use_venv=False), pipeline_root=str(tmp_path / "root"))
    options = {"source": "synthetic", "synthetic_train_per_class": 30, "examples_per_shard": 40}

    def fanned_out(prepare_workers):
        indices = prepare_worker_indices_component(prepare_workers=prepare_workers)
        with dsl.ParallelFor(indices.output) as index:
            part = prepare_part_component(index=index, prepare_workers=prepare_workers, **options)
        merged = prepare_data_component(prepare_workers=prepare_workers, parts=dsl.Collected(part.outputs["Output"]),
                                        **options)  # fmt: skip
        return merged.outputs["dataset"]

    fanned_out.__annotations__ = {"prepare_workers": int, "return": dsl.Dataset}  # types, not this module's strings
    fanned_out = dsl.pipeline(name="fanned-out-prepare")(fanned_out)
    datasets = {workers: Path(fanned_out(prepare_workers=workers).output.path) for workers in (1, 3)}
    one, three = ({path.relative_to(root).as_posix(): path.read_bytes() for path in root.rglob("*")
                   if path.is_file() and not path.name.startswith(".")} for root in datasets.values())  # fmt: skip
    assert sorted(one) == sorted(three) and len([name for name in one if name.endswith(".tfrecord")]) > 3
    assert [name for name in one if one[name] != three[name]] == []
    parts = sorted((tmp_path / "root").rglob("prepare-part-component*/**/.parts/*/*.json"))
    assert len(parts) == len([name for name in one if name.endswith(".tfrecord")]), "not every shard came from a part"
