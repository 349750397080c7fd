"""The train KFP component, run for real through kfp.local: prepare -> train, with the Model artifact's metadata."""

from pathlib import Path

from components.prepare_data.component import prepare_data_component
from components.train.component import train_component


def test_component_trains_and_describes_the_model(tmp_path):
    from kfp import dsl, local

    local.init(runner=local.SubprocessRunner(use_venv=False), pipeline_root=str(tmp_path / "root"))

    @dsl.pipeline
    def prepare_and_train() -> dsl.Model:
        data = prepare_data_component(source="synthetic", synthetic_train_per_class=8, synthetic_eval_per_class=2)
        trained = train_component(
            dataset=data.outputs["dataset"],
            depth=8,
            batch_size=16,
            train_steps=4,
            options={"width_multiplier": 0.25, "log_every_steps": 2},
        )
        return trained.outputs["model"]

    model = prepare_and_train().output
    assert model.metadata["step"] == 4.0
    assert model.metadata["checkpoint"].endswith("ckpt-4")
    assert Path(model.metadata["checkpoint"] + ".index").exists()
    assert len(model.metadata["dataset_manifest_sha256"]) == 64
    assert set(model.metadata["metrics"]) >= {"loss", "accuracy", "learning_rate"}
    import tensorflow as tf

    assert model.metadata["framework"] == "tensorflow" and model.metadata["framework_version"] == tf.__version__
    assert (Path(model.path) / "config.json").exists() and (Path(model.path) / "train").is_dir()
