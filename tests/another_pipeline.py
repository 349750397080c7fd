"""Another team's pipeline that reuses a stage of this project from its published component YAML, as
docs/development.md shows (no `from __future__ import annotations` here: KFP reads the annotations as types)."""

from kfp import components, dsl

from pipeline.commands import COMPONENTS_ROOT

prepare = components.load_component_from_file(str(COMPONENTS_ROOT / "prepare_data" / "component.yaml"))


@dsl.component(base_image="python:3.11-slim")
def count_training_images(data: dsl.Input[dsl.Dataset]) -> int:
    import json
    import os

    with open(os.path.join(data.path, "manifest.json")) as handle:
        return json.load(handle)["splits"]["train"]["num_examples"]


@dsl.pipeline
def my_pipeline() -> int:
    prepared = prepare(
        source="synthetic", synthetic_train_per_class=3, synthetic_eval_per_class=1, validation_fraction=0.0
    )
    return count_training_images(data=prepared.outputs["dataset"]).output


@dsl.pipeline
def prepared_only() -> dsl.Dataset:
    return prepare(source="synthetic", synthetic_train_per_class=2, validation_fraction=0.0).outputs["dataset"]


@dsl.pipeline
def from_a_prepared_dataset(dataset_uri: str) -> int:
    """An existing prepared dataset passed in as an artifact: no prepare step runs."""
    imported = dsl.importer(artifact_uri=dataset_uri, artifact_class=dsl.Dataset, reimport=False)
    return count_training_images(data=imported.output).output
