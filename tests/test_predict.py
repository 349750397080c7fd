"""Batch prediction with the promoted model: a folder of good, bad and oddly sized images, a prepared dataset (whose
predictions must be the evaluate stage's), and a stopped job that continues without scoring anything twice."""

from __future__ import annotations

import json
import os
import threading
import time
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
    for left in (".ipynb_checkpoints/0-checkpoint.png", "__MACOSX/._0.png", "Thumbs.db", ".DS_Store"):  # not scored
        (images / left).parent.mkdir(exist_ok=True)
        (images / left).write_bytes((images / "0.png").read_bytes())
    output = tmp_path / "predictions.jsonl"

    arguments = ["--model", str(root), "--images", str(images), "--output", str(output), "--top-k", "2"]
    assert predict_main(arguments) == 0  # an image of another size is skipped and counted, as a broken one is
    assert "large.jpg: image is 64x48, the model takes 32x32 (--resize 32x32 includes it)" in capsys.readouterr().err
    first = json.loads((tmp_path / "predictions.summary.json").read_text())
    assert (first["scored"], first["skipped"]) == (5, 3)
    assert predict_main([*arguments, "--resize", "64x64"]) == 2  # resize takes prepare_data's form: the model's size
    assert "resize: 64x64 is not the model's input size; it takes 32x32" in capsys.readouterr().err
    assert predict_main([*arguments, "--resize", "32x32"]) == 2  # another job (other options) on the same file
    assert 'holds the output of another predictions job (resize null (now "32x32"))' in capsys.readouterr().err
    output = tmp_path / "resized.jsonl"
    arguments = ["--model", str(root), "--images", str(images), "--output", str(output), "--top-k", "2"]
    assert predict_main([*arguments, "--resize", "32x32"]) == 0
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
    summary = json.loads((tmp_path / "resized.summary.json").read_text())
    assert summary["scored"] == 6 and summary["skipped"] == 2 and sum(summary["per_class"].values()) == 6
    assert sum(summary["confidence_histogram"].values()) == 6
    report = (tmp_path / "resized.html").read_text()
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
    lines = lines_of(output)
    images = [line["image"] for line in lines]
    assert len(images) == len(set(images)) == 50 and summary["scored"] == 50
    # The summary (counted as lines were read back and written, not from a second reading) is the whole file's.
    best = [line["top"][0] for line in lines]
    per_class = {name: sum(entry["class"] == name for entry in best) for name in summary["per_class"]}
    assert summary["per_class"] == per_class and sum(per_class.values()) == 50
    assert sum(summary["confidence_histogram"].values()) == 50
    ranked = sorted((entry["probability"], line["image"]) for entry, line in zip(best, lines, strict=True))
    least = [(entry["probability"], entry["image"]) for entry in summary["least_confident"]]
    assert [probability for probability, _ in least] == [probability for probability, _ in ranked[: len(least)]]
    assert least and {image for _, image in least} <= set(images)


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
    # the root copied as it is, pointer included (it names its version relative to itself: it travels)
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


def test_an_output_is_the_jobs_own_and_never_mixes_two_jobs(promoted, tmp_path, capsys):
    """Other images, another model version, a file no job wrote, a folder, a FIFO, a report over the predictions,
    two jobs at once: each refused in one line, and nothing written."""
    import os
    import shutil
    import threading

    from components.common import outputs

    root, _evaluation = promoted
    rng = np.random.default_rng(1)
    folders = [tmp_path / "a", tmp_path / "b"]
    for folder in folders:
        folder.mkdir()
        for index in range(3):
            (folder / f"{index}.png").write_bytes(tf.io.encode_png(rng.integers(0, 256, (32, 32, 3), np.uint8)).numpy())
    output = tmp_path / "out.jsonl"

    def run(*extra: str, images: Path = folders[0], model: Path = root, target: Path = output) -> tuple[int, str]:
        code = predict_main(["--model", str(model), "--images", str(images), "--output", str(target), *extra])
        return code, capsys.readouterr().err

    assert run()[0] == 0
    before = output.read_bytes()
    code, said = run(images=folders[1])
    assert code == 2 and f'holds the output of another predictions job (images "{folders[0]}"' in said
    assert run()[0] == 0 and output.read_bytes() == before  # the same job: nothing new to score
    # another version of the root's
    second = tmp_path / "models"
    shutil.copytree(root, second)
    shutil.copytree(second / "1", second / "2")
    assert run(model=second / "2", target=tmp_path / "v.jsonl")[0] == 0
    code, said = run(model=second / "1", target=tmp_path / "v.jsonl")
    assert code == 2 and "model_version 2 (now 1)" in said
    # a file of the user's, without the job's record: never emptied, never appended to
    mine = tmp_path / "mine.jsonl"
    mine.write_bytes(b"my own notes, no trailing newline")
    code, said = run(target=mine)
    assert code == 2 and "was not written by a predictions job" in said and mine.read_bytes().endswith(b"newline")
    # a folder, a FIFO, a link: refused at once, nothing blocks
    code, said = run(target=tmp_path / "b")
    assert code == 2 and "a folder, not a file" in said
    os.mkfifo(tmp_path / "fifo.jsonl")
    code, said = run(target=tmp_path / "fifo.jsonl")
    assert code == 2 and "a FIFO, not a file" in said
    (tmp_path / "link.jsonl").symlink_to(output)
    assert "a link" in run(target=tmp_path / "link.jsonl")[1]
    # the report over the predictions it summarizes
    code, said = run("--report", str(output))
    assert code == 2 and "the report would overwrite" in said and output.read_bytes() == before
    # two jobs on one output: the second is refused naming the first
    holding, release = threading.Event(), threading.Event()

    def first_job():
        with outputs.continued_file(tmp_path / "busy.jsonl", "predictions", {"images": "x"}):
            holding.set()
            release.wait(30)

    thread = threading.Thread(target=first_job)
    thread.start()
    holding.wait(30)
    code, said = run(target=tmp_path / "busy.jsonl")
    release.set()
    thread.join()
    assert code == 2 and f"is being written by another predictions job (pid {os.getpid()}" in said
    # a place no file can be made (a pseudo file system; even root cannot): one line, not a traceback
    code, said = run(target=Path("/proc/cifar10-pipeline-predictions.jsonl"))
    assert code == 2 and "the predictions cannot be written there (No such file or directory" in said


def test_a_split_given_for_a_folder_of_images_is_refused_not_ignored(promoted, tmp_path, capsys):
    """--split chooses a prepared dataset's split; a folder has none (every image below it is scored), so a split
    given with one is one line naming it, exit 2, and nothing is written."""
    root, _evaluation = promoted
    images = tmp_path / "images"
    images.mkdir()
    (images / "one.png").write_bytes(tf.io.encode_png(np.zeros((32, 32, 3), np.uint8)).numpy())
    output = tmp_path / "predictions.jsonl"
    code = predict_main(["--model", str(root), "--images", str(images), "--output", str(output), "--split", "train"])
    assert code == 2
    assert f"split: 'train' chooses a prepared dataset's split, and {images} is a folder" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == [images]


def test_an_image_files_bound_given_for_a_prepared_dataset_is_refused_not_ignored(promoted, synthetic_data, tmp_path,
                                                                                     capsys):  # fmt: skip
    """--max-image-megabytes bounds an image file's bytes; a prepared dataset has records, not files: one line."""
    root, _evaluation = promoted
    output = tmp_path / "predictions.jsonl"
    arguments = ["--model", str(root), "--images", str(synthetic_data), "--output", str(output)]
    assert predict_main([*arguments, "--max-image-megabytes", "8"]) == 2
    assert "max_image_megabytes: bounds an image file's bytes, and " in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


def test_each_line_is_what_json_writes_for_any_name_and_probability(tmp_path):
    """The lines are written directly, not by json.dumps: they must be its lines, whatever the image's name or the
    classes' (quotes, backslashes, control characters, non-ASCII, an undecodable byte kept as a surrogate) and
    whatever the probabilities (ties, zeros, tiny values, values that round up)."""
    names = ["plain", 'a "quoted" class', "back\\slash", "tab\tand\nnewline", "caf\u00e9", "\U0001f600", "", "7"]
    keys = ['dir/"odd" name.png', "back\\slash.png", "caf\udce9.png", "\u00fcber.png", "ctrl\x01.png", "plain.png"]
    rows = np.random.default_rng(7).dirichlet(np.full(len(names), 0.3), size=len(keys)).astype(np.float32)
    rows[1] = 1.0 / len(names)  # ties: kept in class order
    rows[2] = np.eye(len(names), dtype=np.float32)[3]
    rows[3, :2] = [0.4999995, 1e-12]
    written, expected = predicting.Tally(3), predicting.Tally(3)
    lines = predicting._lines(keys, rows, names, 5, written)
    for key, row, line in zip(keys, rows, lines, strict=True):
        order = np.argsort(-row, kind="stable")[:5]
        top = [{"class": names[i], "index": int(i), "probability": round(float(row[i]), 6)} for i in order]
        expected.add(key, top[0]["class"], top[0]["probability"])
        assert line == json.dumps({"image": key, "top": top}) + "\n"
    assert written == expected
    output = tmp_path / "lines.jsonl"
    output.write_text("".join(lines))
    assert [line["image"] for line in predicting.read_predictions(str(output))] == keys  # each passes the schema


def test_a_model_that_gives_no_numbers_stops_the_job_with_one_line_and_keeps_what_it_scored(
    promoted, synthetic_data, tmp_path, monkeypatch, capsys
):
    """A damaged or diverged model whose probabilities are NaN: exit 2 naming the model and the first image, and
    the batches scored before it stay in the output for the next run to continue."""
    root, _evaluation = promoted
    opened = predicting.open_model

    def damaged(location):
        model = opened(location)
        calls, served = [], model.serve

        def serve(images):
            calls.append(len(images))
            probabilities = served(images)
            if len(calls) == 2:
                probabilities[3, 1] = np.nan
            return probabilities

        model.serve = serve
        return model

    monkeypatch.setattr(predicting, "open_model", damaged)
    output = tmp_path / "predictions.jsonl"
    arguments = ["--model", str(root), "--images", str(synthetic_data), "--output", str(output), "--batch-size", "8"]
    assert predict_main(arguments) == 2
    error = [line for line in capsys.readouterr().err.splitlines() if " INFO " not in line]
    from components.common.dataset import open_dataset

    ids = [
        i.decode()
        for _x, _y, batch in open_dataset(synthetic_data).tf_dataset("eval", 1000, True)
        for i in batch.numpy()
    ]
    assert len(error) == 1 and str(root) in error[0]
    assert f"gives probabilities that are not numbers (NaN or infinite) for {ids[8 + 3]};" in error[0]
    kept = lines_of(output)
    assert [line["image"] for line in kept] == ids[:8]


def test_any_file_name_can_be_reported(promoted, tmp_path):
    root, _evaluation = promoted
    images = tmp_path / "images"
    images.mkdir()
    odd = os.fsencode(images) + b"/caf\xe9 <b>.png"  # not UTF-8, and markup
    with open(odd, "wb") as handle:
        handle.write(tf.io.encode_png(np.zeros((32, 32, 3), np.uint8)).numpy())
    output = tmp_path / "odd.jsonl"
    summary = predicting.predict(PredictConfig(model=str(root), images=str(images), output=str(output)))
    assert summary["scored"] == 1
    report = (tmp_path / "odd.html").read_text()
    assert "caf\\xe9 &lt;b&gt;.png" in report and "<b>" not in report


@pytest.mark.parametrize("count", [1, 11, "ten cats"])
@pytest.mark.parametrize("names_in", ["the SavedModel's asset", "the pointer", "the pointer, counted"])
def test_class_names_that_do_not_match_the_models_outputs_are_refused(promoted, tmp_path, capsys, count, names_in):
    """Names of each wrong length, or ten names all "cat", where a model's names come from: its asset, or its
    promotion root's pointer (which since this release also says how many there are: a pointer whose count and names
    differ is damaged)."""
    import shutil

    root, _evaluation = promoted
    names = ["cat"] * 10 if count == "ten cats" else [f"class {index}" for index in range(count)]
    if names_in == "the SavedModel's asset":
        model = tmp_path / "saved_model"
        shutil.copytree(root / "1", model)
        named_by = model / "assets" / "label_names.json"
        named_by.write_text(json.dumps({"label_names": names}))
        expected = f"{named_by}: lists {count} class names, but the model {model} scores 10 classes"
        if count == "ten cats":
            expected = f"{named_by}: names 'cat' more than once: each class needs a name of its own"
    else:
        model = tmp_path / "root"
        shutil.copytree(root, model)
        pointer = json.loads((model / "current.json").read_text())
        pointer["label_names"] = names
        if names_in == "the pointer":
            pointer.pop("num_classes")  # as an earlier release wrote it
            expected = f"{model}/current.json (label_names): lists {count} class names, but the model "
        else:
            expected = f"label_names: {count} names, but num_classes is 10; the pointer is damaged"
        if count == "ten cats":
            expected = f"{model}/current.json (label_names): names 'cat' more than once"
        (model / "current.json").write_text(json.dumps(pointer))
    code = predict_main(["--model", str(model), "--images", str(tmp_path), "--output", str(tmp_path / "p.jsonl")])
    assert code == 2
    said = capsys.readouterr().err
    assert expected in said and "Traceback" not in said
    assert not (tmp_path / "p.jsonl").exists()


def test_the_pointer_and_the_registration_carry_the_class_count(promoted):
    from components.evaluate import registry

    root, _evaluation = promoted
    pointer = json.loads((root / "current.json").read_text())
    assert pointer["num_classes"] == len(pointer["label_names"]) == 10
    registration = registry.registration_of("cifar10", pointer, str(root), registry.Lineage())
    assert registration.properties["num_classes"] == 10


@pytest.mark.parametrize("kind", ["folder", "FIFO", "link", "one of the images", "the model"])
def test_a_report_that_cannot_be_the_jobs_own_file_is_refused_before_anything_is_scored(promoted, tmp_path, capsys,
                                                                                          kind):  # fmt: skip
    import os

    root, _evaluation = promoted
    images = tmp_path / "images"
    images.mkdir()
    image = images / "0.png"
    image.write_bytes(tf.io.encode_png(np.zeros((32, 32, 3), np.uint8)).numpy())
    report = {"folder": tmp_path / "a-folder", "FIFO": tmp_path / "fifo.html", "link": tmp_path / "link.html",
              "one of the images": image, "the model": root / "current.json"}[kind]  # fmt: skip
    if kind == "folder":
        report.mkdir()
    elif kind == "FIFO":
        os.mkfifo(report)
    elif kind == "link":
        report.symlink_to(tmp_path / "elsewhere.html")
    before = {path: path.read_bytes() for path in (image, root / "current.json")}
    output = tmp_path / "p.jsonl"
    code = predict_main(["--model", str(root), "--images", str(images), "--output", str(output), "--report",
                         str(report)])  # fmt: skip
    said = capsys.readouterr().err
    assert code == 2 and str(report) in said and "Traceback" not in said
    assert not output.exists() or output.read_bytes() == b""
    assert before == {path: path.read_bytes() for path in before}


def test_reading_ahead_keeps_the_order_and_holds_at_most_its_depth_of_batches():
    from components.predict.predict import ahead

    produced = []

    def pieces():
        for number in range(50):
            produced.append(number)
            yield number

    seen = []
    for piece in ahead(pieces(), depth=2):
        time.sleep(0.002)
        # what the reader has made beyond what was consumed: the queue (2) plus the one it is handing over
        assert len(produced) - len(seen) <= 2 + 2
        seen.append(piece)
    assert seen == list(range(50))


def test_a_reading_error_comes_out_where_its_piece_would_have_and_an_early_stop_ends_the_reader():
    from components.predict.predict import ahead

    def failing():
        yield 1
        yield 2
        raise OSError("shard-00003: read failed")

    seen = []
    with pytest.raises(OSError, match="shard-00003"):
        for piece in ahead(failing()):
            seen.append(piece)
    assert seen == [1, 2]

    produced = []

    def endless():
        number = 0
        while True:
            produced.append(number)
            yield number
            number += 1

    for piece in ahead(endless(), depth=2):
        if piece == 3:
            break
    count = len(produced)
    time.sleep(0.3)
    assert len(produced) == count <= 3 + 4  # the reader stopped with the consumer
    assert not [thread for thread in threading.enumerate() if thread.name == "predict-reader"]


def test_the_predict_pipeline_runs_on_this_machine_as_compiled(promoted, tmp_path, capfd):
    """`python -m pipeline.pipeline predict local-run`: the compiled predict pipeline through kfp.local, its one step
    scoring a folder as `make predict` does, and the run saying where its predictions are (it had failed with a
    traceback: local-run assumed a training pipeline)."""
    from pipeline import commands
    from pipeline.predict_pipeline import predict_pipeline

    root, _evaluation = promoted
    images = tmp_path / "images"
    images.mkdir()
    for index in range(3):
        pixels = np.full((32, 32, 3), 80 * index, np.uint8)
        (images / f"{index}.png").write_bytes(tf.io.encode_png(pixels).numpy())
    output = tmp_path / "runs"
    arguments = ["local-run", "--output-root", str(output), "--model", str(root), "--images", str(images)]
    assert commands.main(predict_pipeline, arguments) == 0
    said = capfd.readouterr().err
    (predictions,) = output.glob("cifar10-predict-*/predict-component*/predictions")
    assert f"predictions: {predictions}" in said and "Traceback" not in said
    scored = lines_of(predictions)
    direct = tmp_path / "direct.jsonl"
    predicting.predict(PredictConfig(model=str(root), images=str(images), output=str(direct)))
    assert [line["top"] for line in scored] == [line["top"] for line in lines_of(direct)] and len(scored) == 3
