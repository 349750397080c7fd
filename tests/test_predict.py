"""Batch prediction with the promoted model: a folder of good, bad and oddly sized images, a prepared dataset (whose
predictions must be the evaluate stage's), and a stopped job that continues without scoring anything twice."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf

from components.predict import predict as predicting
from components.predict.__main__ import main as predict_main
from components.predict.config import PredictConfig


@pytest.fixture(scope="module")
def promoted(synthetic_data, tmp_path_factory):
    """A promotion root whose current version was trained (briefly) on the synthetic data."""
    from components.evaluate.config import EvaluateConfig
    from components.evaluate.evaluate import evaluate
    from components.train import loop
    from tests.builders import tiny_train_config

    folder = tmp_path_factory.mktemp("predict")
    loop.train(tiny_train_config(synthetic_data, folder / "model", train_steps=6))
    result = evaluate(
        EvaluateConfig(data=synthetic_data, model_dir=str(folder / "model"), promote_to=str(folder / "models"))
    )
    assert result.promotion.version == 1
    return folder / "models", result


def lines_of(path) -> list[dict]:
    return [json.loads(line) for line in open(path)]


def test_a_folder_with_bad_and_oddly_sized_images(promoted, tmp_path, capsys):
    root, _evaluation = promoted
    images = tmp_path / "images"
    (images / "more").mkdir(parents=True)
    rng = np.random.default_rng(0)
    for index in range(5):
        (images / f"{index}.png").write_bytes(tf.io.encode_png(rng.integers(0, 256, (32, 32, 3), np.uint8)).numpy())
    (images / "notes.txt").write_text("not an image")
    (images / "cut.png").write_bytes((images / "0.png").read_bytes()[:60])
    (images / "more" / "large.jpg").write_bytes(tf.io.encode_jpeg(rng.integers(0, 256, (48, 64, 3), np.uint8)).numpy())
    output = tmp_path / "predictions.jsonl"

    arguments = ["--model", str(root), "--images", str(images), "--output", str(output), "--top-k", "2"]
    assert predict_main(arguments) == 2
    assert "large.jpg: image is 64x48, the model takes 32x32; give --resize" in capsys.readouterr().err

    assert predict_main([*arguments, "--resize"]) == 0
    predictions = {line["image"].removeprefix(f"{images}/"): line for line in lines_of(output)}
    assert sorted(predictions) == [
        "0.png",
        "1.png",
        "2.png",
        "3.png",
        "4.png",
        "cut.png",
        "more/large.jpg",
        "notes.txt",
    ]
    assert predictions["notes.txt"] == {"image": f"{images}/notes.txt", "skipped": "not a JPEG or PNG image"}
    assert "skipped" in predictions["cut.png"]
    top = predictions["more/large.jpg"]["top"]
    assert len(top) == 2 and top[0]["probability"] >= top[1]["probability"]
    assert top[0]["class"] == f"synthetic_class_{top[0]['index']}"
    summary = json.loads((tmp_path / "predictions.summary.json").read_text())
    assert summary["scored"] == 6 and summary["skipped"] == 2 and sum(summary["per_class"].values()) == 6
    assert sum(summary["confidence_histogram"].values()) == 6
    report = (tmp_path / "predictions.html").read_text()
    assert report.count("<figure>") == 6 and "6 images scored, 2 skipped" in report


def test_a_prepared_datasets_predictions_are_the_evaluate_stages(promoted, synthetic_data, tmp_path):
    root, evaluation = promoted
    output = tmp_path / "eval.jsonl"
    predicting.predict(PredictConfig(model=str(root), images=synthetic_data, output=str(output), top_k=10))
    from components.common.dataset import open_dataset

    ids = [
        i.decode()
        for _x, _y, batch in open_dataset(synthetic_data).tf_dataset("eval", 1000, True)
        for i in batch.numpy()
    ]
    scored = {line["image"]: line["top"] for line in lines_of(output)}
    assert list(scored) == ids
    served = np.zeros((len(ids), 10))
    for row, example_id in enumerate(ids):
        for entry in scored[example_id]:
            served[row, entry["index"]] = entry["probability"]
    np.testing.assert_allclose(served, evaluation.final.probabilities, atol=1e-5)


def test_a_stopped_job_continues_without_scoring_an_image_twice(promoted, synthetic_data, tmp_path, monkeypatch):
    root, _evaluation = promoted
    output = tmp_path / "stopped.jsonl"
    config = PredictConfig(model=str(root), images=synthetic_data, output=str(output), batch_size=8)
    scored: list[int] = []
    original = predicting.open_model

    def counting_model(location):
        model = original(location)
        serve = model.serve

        def counted(images):
            if len(scored) == 3:
                raise KeyboardInterrupt  # the job is stopped after three batches
            scored.append(len(images))
            return serve(images)

        model.serve = counted
        return model

    monkeypatch.setattr(predicting, "open_model", counting_model)
    with pytest.raises(KeyboardInterrupt):
        predicting.predict(config)
    assert len(lines_of(output)) == 24
    with open(output, "a") as handle:
        handle.write('{"image": "cut sh')  # a line the stop cut short
    scored.clear()
    monkeypatch.setattr(predicting, "open_model", original)
    summary = predicting.predict(config)
    images = [line["image"] for line in lines_of(output)]
    assert len(images) == len(set(images)) == 50 and summary["scored"] == 50


def test_the_component_scores_a_dataset_into_its_artifacts(promoted, synthetic_data, tmp_path):
    """The predict component, run for real through kfp.local's SubprocessRunner."""
    from kfp import local

    from components.predict.component import predict_component

    root, _evaluation = promoted
    local.init(runner=local.SubprocessRunner(use_venv=False), pipeline_root=str(tmp_path / "root"))
    task = predict_component(model=str(root), images=synthetic_data, top_k=1)
    assert task.outputs["Output"] == 50
    lines = lines_of(task.outputs["predictions"].path)
    assert len(lines) == 50 and all(len(line["top"]) == 1 for line in lines)
    assert "50 images scored, 0 skipped" in Path(task.outputs["report"].path).read_text()


def test_a_promotion_root_and_images_in_an_object_store(promoted, tmp_path, s3_bucket):
    """The model and the images under s3:// prefixes, as a scheduled predict pipeline has them."""
    from components.common import storage

    root, _evaluation = promoted
    bucket = f"s3://{s3_bucket}"
    models = storage.publisher_for(f"{bucket}/models")
    for path in sorted(Path(root).rglob("*")):
        if path.is_file():
            models.publish(path.relative_to(root).as_posix(), path.read_bytes())
    pointer = json.loads((Path(root) / "current.json").read_text())
    pointer["saved_model"] = f"{bucket}/models/1"  # the pointer as a promotion into s3:// writes it
    pointer["warm_start"] = f"{bucket}/models/1/checkpoint/ckpt-6"
    models.publish("current.json", json.dumps(pointer).encode())
    incoming = storage.publisher_for(f"{bucket}/incoming")
    rng = np.random.default_rng(3)
    for index in range(3):
        incoming.publish(f"{index}.png", tf.io.encode_png(rng.integers(0, 256, (32, 32, 3), np.uint8)).numpy())
    incoming.publish("broken.jpg", b"\xff\xd8\xff not really")
    output = tmp_path / "remote.jsonl"
    summary = predicting.predict(
        PredictConfig(model=f"{bucket}/models", images=f"{bucket}/incoming/", output=str(output))
    )
    assert summary["scored"] == 3 and summary["skipped"] == 1 and summary["model"] == f"{bucket}/models/1"
    names = ("0.png", "1.png", "2.png", "broken.jpg")
    assert sorted(line["image"] for line in lines_of(output)) == [f"{bucket}/incoming/{name}" for name in names]
