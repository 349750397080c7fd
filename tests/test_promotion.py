"""Promotion as the pointer's readers and TF Serving see it: only ready versions, never a numeric folder without a
complete SavedModel (a promotion killed at each of its steps, or out of disk), concurrent promotions (the loser
decides again), warm starts that outlive the run's model directory, the serving release's ops, the encoded-image
signature, and canary requests in a fresh process."""

from __future__ import annotations

import json
import shutil
import threading
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf

from components.common import documents, filesystem, storage
from components.common.model import build_model, model_spec_of
from components.common.model_directory import checkpoint_files
from components.evaluate import canary, promote
from components.evaluate.export import export_saved_model
from components.evaluate.gate import Decision
from components.evaluate.restore import read_train_config, restore_weights
from components.train import loop
from tests.builders import tiny_train_config

LABELS = [f"class-{index}" for index in range(10)]


@pytest.fixture(scope="module")
def trained(synthetic_data, tmp_path_factory):
    model_dir = tmp_path_factory.mktemp("promotion") / "model"
    loop.train(tiny_train_config(synthetic_data, model_dir, train_steps=10, checkpoint_every_steps=5))
    return model_dir


def model_at(trained: Path, step: int):
    model = build_model(model_spec_of(read_train_config(trained, str(trained))))
    restore_weights(model, str(trained / f"ckpt-{step}"), "raw")
    return model


def candidate(trained: Path, step: int, accuracy: float = 0.5, **options) -> promote.Candidate:
    record = {"metrics": {"accuracy": accuracy}, "checkpoint": f"{trained}/ckpt-{step}", "label_names": LABELS}
    return promote.Candidate(
        model_at(trained, step), LABELS, record, checkpoint_files=checkpoint_files(trained / f"ckpt-{step}"), **options
    )


@pytest.fixture(params=["local", "s3", "s3-kubernetes"])
def root(request, tmp_path):
    """A promotion root: a folder; on an S3 store that honours conditional writes; on one that ignores them, from a
    step in a pod (the pointer swapped as a Kubernetes Lease)."""
    if request.param == "local":
        return str(tmp_path / "models")
    if request.param == "s3-kubernetes":
        request.getfixturevalue("pod")
        return f"{request.getfixturevalue('unsafe_s3')}/private/team-a/cifar10/models"
    return f"s3://{request.getfixturevalue('s3_bucket')}/private/team-a/cifar10/models"


def names_under(root: str) -> list[str]:
    if filesystem.is_remote(root):
        return storage.publisher_for(root).list()
    base = Path(root)
    return sorted(p.relative_to(base).as_posix() for p in base.rglob("*") if p.is_file()) if base.exists() else []


def numeric_folders(root: str) -> dict[int, set[str]]:
    folders: dict[int, set[str]] = {}
    for name in names_under(root):
        first, _, rest = name.partition("/")
        if first.isdigit() and rest:
            folders.setdefault(int(first), set()).add(rest)
    return folders


def assert_every_numeric_folder_is_a_complete_saved_model(root: str) -> None:
    for version, files in numeric_folders(root).items():
        assert {"saved_model.pb", "variables/variables.index"} <= files, (version, sorted(files))


def promote_once(trained, root, step=10, accuracy=0.5, **options) -> promote.PromotionOutcome:
    _pointer, seen = promote.read_pointer(root)
    return promote.promote(candidate(trained, step, accuracy), root, seen, **options)


def test_a_promotion_writes_the_serving_layout_with_the_checkpoint_beside_it(trained, root):
    first = promote_once(trained, root).promotion
    second = promote_once(trained, root, step=5).promotion
    assert (first.version, second.version) == (1, 2)
    ready = promote.read_ready(root)
    assert ready["version"] == 2 and ready["state"] == "ready" and "promoting" not in ready
    assert ready["warm_start"] == filesystem.join(root, "2/checkpoint/ckpt-5")
    assert ready["serving"]["loads_in_tensorflow_serving"] == ["2.21.0"]  # what this TensorFlow wrote
    assert "DisableCopyOnRead" in " ".join(ready["serving"]["not_in"]["2.6.2"])
    assert_every_numeric_folder_is_a_complete_saved_model(root)
    assert not [name for name in names_under(root) if name.startswith(".staging/")]  # staging is gone
    assert "checkpoint/ckpt-5.index" in numeric_folders(root)[2]


class Killed(BaseException):
    """Raised where the promotion is killed; the clean-up of the killed promotion is switched off with it."""


KILL_POINTS = ["export", "stage", "claim", "make_visible", "mid_copy", "mark_ready"]


@pytest.mark.parametrize("point", KILL_POINTS)
def test_a_promotion_killed_at_any_step_leaves_only_ready_versions_and_the_next_one_cleans_up(
    trained, root, point, monkeypatch
):
    promote_once(trained, root, step=5)  # version 1, ready
    publisher_class = type(storage.publisher_for(root))
    with monkeypatch.context() as patch:
        patch.setattr(promote, "remove", lambda *_args: None)  # a killed process cleans nothing up
        patch.setattr(promote, "_withdraw_claim", lambda *_args: None)  # nor withdraws its claim
        if point == "export":

            def out_of_disk(*_args, **_kwargs):
                raise Killed("No space left on device")

            patch.setattr(promote, "export_saved_model", out_of_disk)
        elif point == "stage":
            original_stage = promote.stage

            def stage_then_die(*arguments):
                original_stage(*arguments)
                raise Killed()

            patch.setattr(promote, "stage", stage_then_die)
        elif point in ("claim", "mark_ready"):
            original_swap = publisher_class.swap_document

            def die_at_the_pointer(self, name, data, expected_version):
                claim = name == promote.POINTER and "promoting" in json.loads(data)
                if name == promote.POINTER and claim == (point == "claim"):
                    if point == "claim":
                        original_swap(self, name, data, expected_version)  # the claim is written, then the kill
                    raise Killed()
                return original_swap(self, name, data, expected_version)

            patch.setattr(publisher_class, "swap_document", die_at_the_pointer)
        elif point == "make_visible":
            original_visible = promote.make_visible

            def visible_then_die(*arguments):
                original_visible(*arguments)
                raise Killed()

            patch.setattr(promote, "make_visible", visible_then_die)
        elif point == "mid_copy":
            if not filesystem.is_remote(root):
                pytest.skip("a local root becomes visible with one rename: there is no middle")
            original_copy = publisher_class.copy

            def copy_some_then_die(self, source, destination):
                if destination.endswith("variables.index"):
                    raise Killed()
                return original_copy(self, source, destination)

            patch.setattr(publisher_class, "copy", copy_some_then_die)
        with pytest.raises(Killed):
            promote_once(trained, root)

    # What readers see: the last ready version, whatever the pointer holds besides.
    assert promote.read_ready(root)["version"] == 1
    assert promote.warm_start_checkpoint("", root, True) == filesystem.join(root, "1/checkpoint/ckpt-5")
    if point != "mid_copy":  # a remote copy's middle is the one moment a folder is incomplete (docs/evaluate.md)
        assert_every_numeric_folder_is_a_complete_saved_model(root)
    if point == "mark_ready":
        assert 2 in numeric_folders(root)  # complete, but never ready: the next promotion removes it

    # The next promotion (here: a retry of the same one) cleans up and succeeds.
    outcome = promote_once(trained, root)
    assert outcome.promotion.version >= 2 and promote.read_ready(root)["version"] == outcome.promotion.version
    assert sorted(numeric_folders(root)) == [1, outcome.promotion.version]
    assert_every_numeric_folder_is_a_complete_saved_model(root)
    assert not [name for name in names_under(root) if name.startswith(".staging/")]


@pytest.mark.parametrize("ready_before", [True, False], ids=["a version ready", "nothing ready"])
def test_a_promotion_that_fails_while_staging_withdraws_its_claim_at_once(
    trained, root, monkeypatch, ready_before, caplog
):
    """A failure the process lives through (a full disk, a store error) leaves the root as it was: no claim for the
    next promotion to wait out, nothing staged, no half-visible version."""
    if ready_before:
        promote_once(trained, root, step=5)
    before = promote.read_pointer(root)[0]
    original_stage = promote.stage

    def stage_then_fail(*arguments):
        original_stage(*arguments)
        raise OSError(28, "No space left on device")

    with monkeypatch.context() as patch:
        patch.setattr(promote, "stage", stage_then_fail)
        with pytest.raises(OSError, match="No space left"):
            promote_once(trained, root)
    assert promote.read_pointer(root)[0] == before  # no "promoting" left behind
    assert not [name for name in names_under(root) if name.startswith(".staging/")]
    assert sorted(numeric_folders(root)) == ([1] if ready_before else [])
    caplog.clear()
    assert promote_once(trained, root).promotion.version == (2 if ready_before else 1)
    assert "is being promoted by" not in caplog.text  # no claim to wait out


DAMAGED_POINTERS = {
    "exporting by hand": lambda ready: {**ready, "state": "exporting"},
    "a list": lambda ready: [1, 2, 3],
    "NaN accuracy": lambda ready: {**ready, "metrics": {"accuracy": float("nan")}},
    "accuracy above 1": lambda ready: {**ready, "metrics": {"accuracy": 2}},
    "a huge version": lambda ready: {**ready, "version": 10**30},
    "a version of true": lambda ready: {**ready, "version": True},
    "a warm start outside": lambda ready: {**ready, "warm_start": "/etc/passwd"},
    "a warm start climbing out": lambda ready: {**ready, "warm_start": ready["saved_model"] + "/../../elsewhere"},
    "a saved model elsewhere": lambda ready: {**ready, "saved_model": "s3://another-bucket/models/1"},
    "half a ready version": lambda ready: {key: value for key, value in ready.items() if key != "saved_model"},
    "a claim below the version": lambda ready: {
        **ready,
        "promoting": {"version": 1, "claimed_at": 0, "staging": "0-x"},
    },
}


@pytest.mark.parametrize("damage", sorted(DAMAGED_POINTERS))
def test_a_damaged_pointer_is_refused_in_one_line_and_nothing_under_the_root_is_removed(trained, tmp_path, damage):
    """A pointer edited by hand or damaged is refused by every reader (the gate, the warm start, the promotion),
    naming the file and the field: never read as a baseline or a warm start, and no version is cleaned away."""
    root = tmp_path / "models"
    promote_once(trained, str(root), step=5)
    promote_once(trained, str(root), step=10)
    ready = json.loads((root / "current.json").read_text())
    damaged = DAMAGED_POINTERS[damage](ready)
    (root / "current.json").write_text(json.dumps(damaged, allow_nan=True))
    before = numeric_folders(str(root))
    for read in (
        lambda: promote.read_ready(str(root)),
        lambda: promote.warm_start_checkpoint("", str(root), True),
        lambda: promote_once(trained, str(root)),
    ):
        with pytest.raises(ValueError) as refused:
            read()
        message = str(refused.value)
        assert message.startswith(f"{root}/current.json: not a valid promotion pointer") and "\n" not in message
        assert "the pointer is damaged" in message
    assert numeric_folders(str(root)) == before  # versions 1 and 2, both complete, untouched
    assert_every_numeric_folder_is_a_complete_saved_model(str(root))


@pytest.mark.parametrize("still_better", [False, True])
def test_of_two_concurrent_promotions_the_loser_decides_again_and_never_fails(trained, root, still_better):
    """Both read the same pointer; one claims first. The other decides again against the winner (on its own
    evaluation images) and ends promoted after it, or not promoted: never a failed run, never a mixed folder."""
    _pointer, seen = promote.read_pointer(root)
    barrier = threading.Barrier(2)
    original_read = promote.read_pointer
    raced = set()

    def read_together(where):
        found = original_read(where)
        if threading.current_thread().name not in raced:  # both have exported and read the pointer: now they race
            raced.add(threading.current_thread().name)
            barrier.wait(timeout=120)
        return found

    decisions = []

    def decide_again(promoted):
        decisions.append(promoted["version"])
        if still_better:
            return Decision(True, [f"accuracy 0.6 >= baseline of version {promoted['version']}"])
        return Decision(False, [f"accuracy 0.5 is below the baseline of version {promoted['version']}"])

    outcomes = {}

    def run(step):
        outcomes[step] = promote.promote(candidate(trained, step), root, seen, decide_again)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(promote, "read_pointer", read_together)
        threads = [threading.Thread(target=run, args=(step,), name=f"promotion-{step}") for step in (5, 10)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=300)
    promoted = {step: outcome.promotion for step, outcome in outcomes.items() if outcome.promotion}
    assert len(outcomes) == 2 and decisions == [1]  # exactly one decided again, against version 1
    ready = promote.read_ready(root)
    if still_better:
        assert sorted(p.version for p in promoted.values()) == [1, 2] and ready["version"] == 2
    else:
        (winner,) = promoted
        assert ready["version"] == 1 and ready["checkpoint"].endswith(f"ckpt-{winner}")
        loser = next(outcome for outcome in outcomes.values() if outcome.promotion is None)
        assert not loser.decision.blessed and sorted(numeric_folders(root)) == [1]
    assert_every_numeric_folder_is_a_complete_saved_model(root)


def test_a_retried_step_whose_first_attempt_promoted_then_ended_reports_that_version(trained, tmp_path):
    """The pod ended after its promotion was marked ready but before the step said so: the retry, with the pointer
    version its evaluation read, finds its own model ready and reports it, instead of weighing the model against
    itself and ending "not promoted" (0) with its version standing."""
    root = str(tmp_path / "models")
    _pointer, read_by_the_evaluation = promote.read_pointer(root)
    first = promote.promote(candidate(trained, 10), root, read_by_the_evaluation).promotion

    def decide_again(promoted):
        raise AssertionError(f"the model was weighed against version {promoted['version']}, itself")

    retried = promote.promote(candidate(trained, 10), root, read_by_the_evaluation, decide_again)
    assert retried.promotion == first and first.version == 1 and sorted(numeric_folders(root)) == [1]
    assert retried.pointer["checkpoint"].endswith("ckpt-10") and promote.read_ready(root)["version"] == 1
    # another model, evaluated against the same pointer, still decides again against it
    other = promote.promote(candidate(trained, 5), root, read_by_the_evaluation, lambda _ready: Decision(False, ["no"]))
    assert other.promotion is None and sorted(numeric_folders(root)) == [1]


def test_a_warm_start_survives_the_run_model_directory_expiring(synthetic_data, tmp_path, s3_bucket):
    """KFP's artifact retention expires private-artifacts/*, the run's model directory with it; the promoted version
    carries its own checkpoint, which the next (scheduled) run warm-starts from."""
    from components.common.config import config_to_dict
    from components.evaluate.config import EvaluateConfig
    from components.evaluate.evaluate import evaluate

    run = f"s3://{s3_bucket}/private-artifacts/team-a/v2/artifacts/cifar10-pipeline/run-1/model-directory"
    models = f"s3://{s3_bucket}/private/team-a/cifar10/models"
    loop.train(tiny_train_config(synthetic_data, run, train_steps=4, cache_dir=str(tmp_path / "a")))
    evaluate(EvaluateConfig(data=synthetic_data, model_dir=run, promote_to=models, cache_dir=str(tmp_path / "b")))
    publisher = storage.publisher_for(run)
    for name in publisher.list():
        publisher.withdraw(name)  # the lifecycle rule ran
    assert publisher.list() == []

    start = promote.warm_start_checkpoint("", models, from_promoted=True)
    assert start.startswith(f"{models}/1/checkpoint/ckpt-4")
    second = tiny_train_config(synthetic_data, tmp_path / "second", train_steps=2, warm_start=start,
                               cache_dir=str(tmp_path / "c"))  # fmt: skip
    loop.train(second)
    written = json.loads((tmp_path / "second" / "config.json").read_text())
    assert written["warm_start"] == start and config_to_dict(second)["warm_start"] == start


def test_a_root_served_by_an_older_release_refuses_a_model_it_cannot_load(trained, tmp_path):
    root = str(tmp_path / "models")
    with pytest.raises(promote.IncompatibleServingError) as refused:
        promote_once(trained, root, serving_version="2.6.2")
    message = str(refused.value)
    assert "TensorFlow Serving 2.6.2" in message and "DisableCopyOnRead" in message and "'debug_name'" in message
    assert numeric_folders(root) == {} and promote.read_ready(root) is None
    assert json.loads(Path(root, "serving.json").read_text()) == {"tensorflow_serving": "2.6.2"}  # declared
    with pytest.raises(promote.IncompatibleServingError):
        promote_once(trained, root)  # the root's declaration holds for later promotions
    assert promote_once(trained, root, serving_version="2.21.0").promotion.version == 1


def test_an_unknown_serving_release_is_a_clear_error_before_anything_is_written(trained, tmp_path):
    from components.evaluate.serving_ops import UnknownServingVersionError

    with pytest.raises(UnknownServingVersionError, match=r"no op definitions of TensorFlow 2\.99\.0 .*known: 2\.6\.2"):
        promote_once(trained, str(tmp_path / "models"), serving_version="2.99.0")
    assert not (tmp_path / "models").exists() or not list((tmp_path / "models").rglob("*.pb"))


def test_encoded_png_and_jpeg_images_give_the_classes_of_the_uint8_path(trained, tmp_path):
    export_saved_model(model_at(trained, 10), LABELS, tmp_path / "plain", "mirror_translate")
    export_saved_model(model_at(trained, 10), LABELS, tmp_path / "resizing", "none", resize=True)
    images = np.random.default_rng(3).integers(0, 256, size=(12, 32, 32, 3), dtype=np.uint8)
    served = tf.saved_model.load(str(tmp_path / "plain")).signatures
    by_pixels = served["serving_default"](images=tf.constant(images))
    png = [tf.io.encode_png(image).numpy() for image in images]
    by_png = served["serving_image_bytes"](image_bytes=tf.constant(png))
    np.testing.assert_array_equal(by_png["classes"].numpy(), by_pixels["classes"].numpy())
    np.testing.assert_allclose(by_png["probabilities"].numpy(), by_pixels["probabilities"].numpy(), atol=1e-6)
    jpeg = [tf.io.encode_jpeg(image, quality=90).numpy() for image in images]
    decoded = np.stack([tf.io.decode_jpeg(content, channels=3).numpy() for content in jpeg])
    by_jpeg = served["serving_image_bytes"](image_bytes=tf.constant(jpeg))
    np.testing.assert_array_equal(
        by_jpeg["classes"].numpy(), served["serving_default"](images=tf.constant(decoded))["classes"].numpy()
    )
    assert [name.decode() for name in by_jpeg["class_names"].numpy()] == [LABELS[i] for i in by_jpeg["classes"]]

    large = np.repeat(np.repeat(images[:2], 2, axis=1), 2, axis=2)  # 64x64
    large_png = [tf.io.encode_png(image).numpy() for image in large]
    with pytest.raises(tf.errors.InvalidArgumentError, match="not 32x32"):
        served["serving_image_bytes"](image_bytes=tf.constant(large_png))  # the data's images were never resized
    from components.common.pixels import resize_images

    resizing = tf.saved_model.load(str(tmp_path / "resizing")).signatures
    expected = resizing["serving_default"](images=resize_images(large, 32, 32))["classes"].numpy()
    got = resizing["serving_image_bytes"](image_bytes=tf.constant(large_png))["classes"].numpy()
    np.testing.assert_array_equal(got, expected)


def test_canary_requests_in_a_fresh_process_refuse_a_model_that_answers_otherwise(trained, tmp_path, synthetic_data):
    from components.common.dataset import open_dataset

    images, labels = next(iter(open_dataset(synthetic_data).tf_dataset("eval", batch_size=16)))
    images, labels = images.numpy(), labels.numpy()
    model = model_at(trained, 10)
    probabilities = tf.nn.softmax(model(images, training=False)).numpy()
    right = canary.Canary.from_evaluation(images, probabilities, labels, LABELS)
    wrong = canary.Canary.from_evaluation(images, np.roll(probabilities, 1, axis=1), labels, LABELS)
    root = str(tmp_path / "models")
    _pointer, seen = promote.read_pointer(root)
    refused = candidate(trained, 10)
    refused.canary = wrong
    with pytest.raises(canary.InfraValidationError, match="uint8 answers differ from the evaluation's"):
        promote.promote(refused, root, seen)
    assert numeric_folders(root) == {}
    accepted = candidate(trained, 10)
    accepted.canary = right
    outcome = promote.promote(accepted, root, seen)
    assert promote.read_ready(root)["canary"]["accuracy"] == right.accuracy(right.expected_classes)
    assert outcome.promotion.version == 1


def test_the_gate_compares_like_with_like_on_this_runs_images(trained, synthetic_data, tmp_path):
    """New data at the same source: the promoted model is evaluated on this run's images, not trusted for a number
    measured on other data; a model of other classes (the synthetic demo's) is no baseline at all, and the first model
    of real data replaces it (the demo gives way; another task's model never replaces a real one)."""
    from components.common.dataset import open_dataset
    from components.evaluate.config import EvaluateConfig
    from components.evaluate.evaluate import evaluate
    from components.prepare_data.config import PrepareDataConfig
    from components.prepare_data.prepare import prepare_data
    from tests.builders import write_class_folders

    root = tmp_path / "models"
    first = evaluate(EvaluateConfig(data=synthetic_data, model_dir=str(trained), promote_to=str(root)))
    assert first.promotion.version == 1
    newer = str(tmp_path / "newer")  # the same classes, other images: another seed of the same source
    prepare_data(PrepareDataConfig(output=newer, source="synthetic", seed=7, synthetic_train_per_class=20,
                                   synthetic_eval_per_class=8))  # fmt: skip
    again = evaluate(EvaluateConfig(data=newer, model_dir=str(trained), compare_with=str(root), weights="raw"))
    assert again.decision.reasons == ["already promoted as version 1 (the same weights)"]  # it is that model
    served = tf.saved_model.load(str(root / "1")).signatures["serving_default"]
    images, labels = next(iter(open_dataset(newer).tf_dataset("eval", batch_size=1000)))
    expected = float(np.mean(served(images=images)["classes"].numpy() == labels.numpy()))
    assert again.baseline_accuracy == pytest.approx(expected)
    assert "baseline" in again.report_html and "evaluated on the same 80 images" in again.report_html

    write_class_folders(tmp_path / "images", {"train": 12, "test": 4})  # cat, dog, frog: real images
    real = str(tmp_path / "real")
    prepare_data(PrepareDataConfig(output=real, source=str(tmp_path / "images")))
    model_dir = tmp_path / "real-model"
    loop.train(tiny_train_config(real, model_dir, train_steps=2))
    other = evaluate(EvaluateConfig(data=real, model_dir=str(model_dir), compare_with=str(root)))
    assert other.baseline_accuracy is None and other.decision.blessed
    assert "it is not a baseline for this model" in " ".join(other.decision.reasons)
    promoted = evaluate(EvaluateConfig(data=real, model_dir=str(model_dir), promote_to=str(root), weights="raw"))
    assert promoted.promotion.version == 2  # the demo's synthetic model gave way to the first of real data
    demo = evaluate(EvaluateConfig(data=synthetic_data, model_dir=str(trained), compare_with=str(root)))
    assert not demo.decision.blessed and "is a model of other classes" in " ".join(demo.decision.reasons)


def test_a_kserve_v1_request_for_encoded_images_gets_the_classes_of_the_uint8_path(trained, tmp_path):
    """The request the docs show, answered by the promoted SavedModel as TensorFlow Serving's REST API would."""
    from components.evaluate import serving_request

    root = str(tmp_path / "models")
    promote_once(trained, root)
    images = np.random.default_rng(5).integers(0, 256, size=(3, 32, 32, 3), dtype=np.uint8)
    body = serving_request.request_body([tf.io.encode_png(image).numpy() for image in images])
    assert body["signature_name"] == "serving_image_bytes" and set(body["instances"][0]) == {"image_bytes"}
    assert set(body["instances"][0]["image_bytes"]) == {"b64"}
    answered = serving_request.answer(root, json.loads(json.dumps(body)))["predictions"]
    served = tf.saved_model.load(str(Path(root, "1"))).signatures["serving_default"]
    expected = served(images=tf.constant(images))["classes"].numpy().tolist()
    assert [row["classes"] for row in answered] == expected
    assert [row["class_names"] for row in answered] == [LABELS[index] for index in expected]
    assert all(abs(sum(row["probabilities"]) - 1) < 1e-4 for row in answered)


@pytest.mark.parametrize("ready_before", [True, False], ids=["a version ready", "nothing ready"])
def test_a_promotion_whose_last_write_fails_leaves_the_root_as_it_was_and_no_claim(
    trained, root, monkeypatch, ready_before, caplog
):
    """The store refuses the pointer's final write (a 503 that outlasted the retries): the new version's folder is
    removed, the pointer is the last ready one again, and the next promotion starts at once (no claim to wait out)."""
    if ready_before:
        promote_once(trained, root, step=5)
    before = promote.read_pointer(root)[0]
    publisher_class = type(storage.publisher_for(root))
    original_swap = publisher_class.swap_document

    def refuse_the_ready_mark(self, name, data, expected_version):
        document = json.loads(data) if name == promote.POINTER else {}
        ready_mark = document.get("state") == "ready" and "promoting" not in document
        if ready_mark and document.get("checkpoint", "").endswith("ckpt-10"):
            raise filesystem.StorageError(f"{self.uri(name)}: 503 SlowDown after 5 attempts")
        return original_swap(self, name, data, expected_version)

    with monkeypatch.context() as patch:
        patch.setattr(publisher_class, "swap_document", refuse_the_ready_mark)
        with pytest.raises(filesystem.StorageError, match="SlowDown"):
            promote_once(trained, root, step=10)
    assert promote.read_pointer(root)[0] == before
    assert sorted(numeric_folders(root)) == ([1] if ready_before else [])
    caplog.clear()
    assert promote_once(trained, root, step=10).promotion.version == (2 if ready_before else 1)
    assert "is being promoted by" not in caplog.text


def test_a_claim_is_taken_over_only_when_its_holder_is_gone_or_it_was_watched_long_enough(monkeypatch):
    """client-go's rule: what the watcher saw on its own clock decides, never a timestamp another machine wrote."""
    import os
    import socket
    import subprocess
    import time

    gone = subprocess.Popen(["true"])
    gone.wait()
    now = time.time()
    fresh = {"version": 2, "claimed_at": now - 5, "staging": "x", "holder": "another machine"}
    assert not promote._abandoned(fresh, None, watched_seconds=0)
    days_old = {**fresh, "claimed_at": now - 10 * 86400}  # its writer's clock is days behind, or it is old: unknown
    assert not promote._abandoned(days_old, None, watched_seconds=promote.CLAIM_LEASE_SECONDS - 1)
    assert promote._abandoned(fresh, None, watched_seconds=promote.CLAIM_LEASE_SECONDS)
    here = {**fresh, "host": socket.gethostname()}
    assert promote._abandoned({**here, "pid": gone.pid}, None, watched_seconds=0)  # its process is gone
    assert not promote._abandoned({**here, "pid": os.getpid()}, None, watched_seconds=0)  # alive
    assert promote._abandoned({**fresh, "checkpoint": "m/ckpt-10"}, "m/ckpt-10", watched_seconds=0)  # a retry
    assert promote.claim_deadline() < promote.CLAIM_LEASE_SECONDS  # the holder gives up first


def test_a_lost_promotions_claim_is_taken_over_after_the_claims_lease_not_half_an_hour(trained, tmp_path, monkeypatch):
    """A promotion pod lost after its claim (another host's: no process to look for): the next promotion watches the
    claim unchanged for the claim's lease and takes it over, removing what it left; a live one renews its claim while
    it stages, so it is never taken over however long staging takes."""
    import json
    import time

    monkeypatch.setattr(promote, "CLAIM_LEASE_SECONDS", 3.0)
    monkeypatch.setattr(promote, "WAIT_POLL_SECONDS", 0.2)
    root = tmp_path / "models"
    promote_once(trained, root, step=5)
    pointer = json.loads((root / "current.json").read_text())
    claim = {"version": 2, "holder": "pid 7 on a lost pod", "host": "a-lost-pod", "pid": 7, "claimed_at": time.time(),
             "staging": "1-lost", "checkpoint": "elsewhere"}  # fmt: skip
    (root / "current.json").write_text(json.dumps({**pointer, "promoting": claim}))
    (root / "2").mkdir()  # what it had made visible
    started = time.monotonic()
    outcome = promote_once(trained, root, step=10)
    assert 3.0 <= time.monotonic() - started < 60.0 and outcome.promotion.version == 3
    assert not (root / "2").exists()


@pytest.mark.parametrize("kept", [0.1, 0.5])
def test_a_checkpoint_cut_short_is_refused_in_one_line_by_the_warm_start_and_the_evaluation(trained, tmp_path, kept):
    import shutil

    from components.common.model_directory import CheckpointError
    from components.evaluate.restore import EvaluationError
    from components.train import checkpoints

    for path in checkpoint_files(trained / "ckpt-10"):
        shutil.copy(path, tmp_path / path.name)
    (data,) = tmp_path.glob("ckpt-10.data-*")
    data.write_bytes(data.read_bytes()[: int(data.stat().st_size * kept)])
    model = build_model(model_spec_of(read_train_config(trained, str(trained))))
    with pytest.raises(CheckpointError, match=rf"warm start: {tmp_path}/ckpt-10: a damaged checkpoint"):
        checkpoints.warm_start(model.variables, str(tmp_path / "ckpt-10"), (".*",), (), [])
    with pytest.raises(EvaluationError, match=rf"^{tmp_path}/ckpt-10: a damaged checkpoint \("):
        restore_weights(model, str(tmp_path / "ckpt-10"), "raw")


def test_a_damaged_warm_start_fails_training_unless_from_scratch_is_asked(trained, synthetic_data, tmp_path, caplog):
    import shutil

    from components.common.model_directory import CheckpointError

    for path in checkpoint_files(trained / "ckpt-10"):
        shutil.copy(path, tmp_path / path.name)
    (data,) = tmp_path.glob("ckpt-10.data-*")
    data.write_bytes(data.read_bytes()[: data.stat().st_size // 10])
    damaged = str(tmp_path / "ckpt-10")
    with pytest.raises(CheckpointError, match="a damaged checkpoint"):
        loop.train(tiny_train_config(synthetic_data, tmp_path / "refused", train_steps=2, warm_start=damaged))
    assert not list((tmp_path / "refused").glob("ckpt-*"))
    caplog.set_level("WARNING")
    asked = tiny_train_config(synthetic_data, tmp_path / "fresh", train_steps=2, warm_start=damaged,
                              warm_start_if_damaged="from_scratch")  # fmt: skip
    assert loop.train(asked).step == 2
    assert "training from scratch, as warm_start_if_damaged=from_scratch asks" in caplog.text


@pytest.mark.parametrize("problem", ["another size", "no such file", "not an image", "a cut GIF", "a folder"])
def test_the_serving_request_tool_ends_bad_input_in_one_line_naming_the_image(trained, tmp_path, problem, capfd):
    from components.evaluate import serving_request

    root = str(tmp_path / "models")
    promote_once(trained, root)
    good = tmp_path / "good.png"
    good.write_bytes(tf.io.encode_png(np.zeros((32, 32, 3), np.uint8)).numpy())
    bad = tmp_path / "bad.png"
    if problem == "another size":
        bad.write_bytes(tf.io.encode_png(np.zeros((64, 48, 3), np.uint8)).numpy())
    elif problem == "not an image":
        bad.write_text("not an image")
    elif problem == "a cut GIF":
        bad.write_bytes(b"GIF89a")  # the decoder's own words, not TensorFlow's node and op names
    elif problem == "a folder":
        bad.mkdir()
    assert serving_request.main([str(good), str(bad), "--answer-from", root]) == 2
    errors = [line for line in capfd.readouterr().err.splitlines() if " ERROR " in line]
    assert len(errors) == 1 and f"serving_request: {bad}: " in errors[0], errors
    assert "{{" not in errors[0] and "[Op:" not in errors[0] and errors[0].count(str(bad)) == 1, errors
    if problem == "another size":
        assert "the image is 48x64, the served model takes 32x32 images (width x height)" in errors[0], errors
    if problem == "a cut GIF":
        assert "the served model cannot take this image (Invalid GIF data (size 6)" in errors[0], errors
    if problem == "a folder":
        assert errors[0].endswith(f"{bad}: a folder, not an image"), errors
    assert serving_request.main([str(good), "--answer-from", root]) == 0


def test_a_runs_summary_says_what_stays_promoted_what_the_data_check_found_and_what_leakage_removed(
    trained, synthetic_data, tmp_path
):
    """The lines local-run ends with, for a run whose model was not promoted: never "promoted model" for the earlier
    version; the data check's counts, the block and where its findings are; what --leakage removed."""
    from pipeline import local_run

    root = tmp_path / "models"
    promote_once(trained, str(root))
    run = tmp_path / "cifar10-pipeline-2026-01-01-00-00-00-000000"
    model_dir = run / "launch-training-job-component" / "model"
    model_dir.mkdir(parents=True)
    dataset = tmp_path / "dataset"
    dataset.mkdir()
    removed = {"mode": "drop_from_train", "leakage_before": {"eval": 3}, "images_removed": {"train": 4}}
    statistics = json.loads((Path(synthetic_data) / "statistics.json").read_text())
    (dataset / "statistics.json").write_text(json.dumps({**statistics, "leakage_removed": removed}))
    (model_dir / "config.json").write_text(json.dumps({"data": str(dataset)}))
    reason = "promotion blocked by the data check (data_check block): train: the red channel's mean moved"
    (model_dir / "eval_metrics.json").write_text(json.dumps(
        {"blessed": False, "reasons": [reason], "metrics": {"accuracy": 0.5}, "step": 10}
    ))  # fmt: skip
    findings = run / "check-data-component" / "findings"
    findings.parent.mkdir()
    findings.write_text(json.dumps({
        "mode": "block", "reference": "the training data of promoted version 1", "blocking": "data check: moved",
        "findings": [{"kind": "brightness", "severity": "error", "message": "moved"},
                     {"kind": "image_sizes", "severity": "warning", "message": "sizes"}],
    }))  # fmt: skip
    lines = local_run.describe_run(run, root, run / "local-run.log")
    assert lines[0] == f"accuracy 0.5000: NOT BLESSED ({reason})"
    assert lines[1] == (
        "data check against the training data of promoted version 1: 1 error (brightness), 1 warning (image_sizes); it "
        "blocked the "
        f"promotion (data check: moved); the findings (JSON): {findings}"
    )
    assert lines[2] == (
        "leakage drop_from_train: removed 4 from the train split (training images with a near-duplicate among the "
        "test or validation images)"
    )
    assert lines[3] == f"still promoted: version 1 at {root / '1'} (this run's model was not promoted)"


def test_a_promotion_root_moved_or_copied_is_read_promoted_into_and_warm_started_from(trained, tmp_path, s3_bucket):
    """State that travels: a root moved with mv, and one copied to another S3 prefix; a pointer of an earlier release
    (absolute locations of the root's old place) is mapped to the new place, or refused naming what to copy."""
    from components.predict.config import PredictConfig
    from components.predict.predict import predict

    old = tmp_path / "old" / "models"
    promote_once(trained, str(old), step=5)
    moved = tmp_path / "new" / "models"
    moved.parent.mkdir()
    old.rename(moved)  # mv
    ready = promote.read_ready(str(moved))
    assert ready["saved_model"] == str(moved / "1") and ready["warm_start"] == str(moved / "1/checkpoint/ckpt-5")
    assert promote.warm_start_checkpoint("", str(moved), from_promoted=True) == ready["warm_start"]
    images = tmp_path / "images"
    images.mkdir()
    (images / "a.png").write_bytes(tf.io.encode_png(np.zeros((32, 32, 3), np.uint8)).numpy())
    assert predict(PredictConfig(model=str(moved), images=str(images), output=str(tmp_path / "p.jsonl")))["scored"] == 1
    assert promote_once(trained, str(moved), step=10).promotion.version == 2  # a second promotion into it

    copied = f"s3://{s3_bucket}/elsewhere/models"  # the moved root copied to an S3 prefix, as it is
    target = storage.publisher_for(copied)
    for path in sorted(moved.rglob("*")):
        if path.is_file():
            target.publish(path.relative_to(moved).as_posix(), path.read_bytes())
    remote = promote.read_ready(copied)
    assert remote["version"] == 2 and remote["saved_model"] == f"{copied}/2"
    assert promote.warm_start_checkpoint("", copied, from_promoted=True) == f"{copied}/2/checkpoint/ckpt-10"
    scored = predict(PredictConfig(model=copied, images=str(images), output=str(tmp_path / "remote.jsonl")))
    assert scored["scored"] == 1
    assert promote_once(trained, copied, step=5).promotion.version == 3

    earlier = json.loads((moved / "current.json").read_text())  # as an earlier release wrote it, at the old place
    earlier.update(saved_model=str(old / "2"), warm_start=str(old / "2/checkpoint/ckpt-10"))
    (moved / "current.json").write_text(json.dumps(earlier))
    mapped = promote.read_ready(str(moved))
    assert (mapped["saved_model"], mapped["warm_start"]) == (str(moved / "2"), str(moved / "2/checkpoint/ckpt-10"))
    shutil.rmtree(moved / "2")
    with pytest.raises(documents.DocumentError) as refused:
        promote.read_ready(str(moved))
    line = str(refused.value)
    assert f"saved_model {old / '2'} is outside this root" in line and f"copy {old / '2'} to {moved / '2'}" in line
    assert "remove" not in line and "\n" not in line


def test_a_live_promotion_renews_its_claim_while_it_stages_and_is_never_taken_over(trained, tmp_path, monkeypatch,
                                                                                  caplog):  # fmt: skip
    """Staging takes longer than the claim's lease: the renewals show the waiting promotion it is alive, which waits
    and then promotes the next version; nobody's claim is taken over."""
    import threading
    import time

    monkeypatch.setattr(promote, "CLAIM_LEASE_SECONDS", 1.5)
    monkeypatch.setattr(promote, "CLAIM_RENEW_SECONDS", 0.2)
    monkeypatch.setattr(promote, "WAIT_POLL_SECONDS", 0.1)
    root = tmp_path / "models"
    promote_once(trained, root, step=5)
    slow_stage = promote.stage

    staging = threading.Event()  # the first promotion holds the claim (it stages after claiming)
    watching = threading.Event()  # the second promotion found the first's claim and watches it
    real_abandoned = promote._abandoned

    def abandoned(*arguments, **options):
        watching.set()
        return real_abandoned(*arguments, **options)

    def stage(*arguments):
        if threading.current_thread().name == "first":
            staging.set()
            assert watching.wait(120), "the second promotion never met the claim"
            time.sleep(3.0)  # twice the lease while the second watches: only the renewals keep the claim
        return slow_stage(*arguments)

    monkeypatch.setattr(promote, "_abandoned", abandoned)
    monkeypatch.setattr(promote, "stage", stage)
    outcomes = {}

    def first():
        outcomes["first"] = promote_once(trained, root, step=10)

    thread = threading.Thread(target=first, name="first")
    thread.start()
    assert staging.wait(120), "the first promotion never claimed"  # else the second may claim first: another story
    with caplog.at_level("INFO", logger="components.evaluate.promote"):
        second = promote_once(trained, root, step=5, decide_again=lambda ready: promote.Decision(True, ["again"]))
    thread.join()
    said = [record.getMessage() for record in caplog.records]
    assert not [line for line in said if "taking over the claim" in line], said
    assert [line for line in said if "is being promoted by" in line], said
    assert {outcomes["first"].promotion.version, second.promotion.version} == {2, 3}


def test_a_paused_promotion_taken_over_withdraws_nothing_of_the_next_ones(trained, root, monkeypatch, caplog):
    """The first promotion into an empty root is paused after its claim (SIGSTOP: its staging and its renewals
    stop); the next takes the claim over once it has watched it unchanged for the claim's lease, and promotes; the
    first, continued, gives up for silence. Its withdrawal carries the version it claimed: the pointer, now the next
    one's, stays, and readers and serving see that promotion."""
    import time

    monkeypatch.setattr(promote, "CLAIM_LEASE_SECONDS", 1.5)
    monkeypatch.setattr(promote, "CLAIM_RENEW_SECONDS", 0.2)
    monkeypatch.setattr(promote, "WAIT_POLL_SECONDS", 0.1)
    paused, second_done = threading.Event(), threading.Event()
    real_init, real_renew, real_stage = promote.ClaimRenewal.__init__, promote.ClaimRenewal._renew, promote.stage

    def init(self, *arguments):
        self.owner = threading.current_thread().name  # the promotion whose claim it renews
        real_init(self, *arguments)

    def renew(self):  # the paused process renews nothing (after it is continued, its check comes first)
        if self.owner != "paused":
            real_renew(self)

    def stage(*arguments):
        if threading.current_thread().name == "paused":
            paused.set()
            assert second_done.wait(120), "the next promotion never finished"
            time.sleep(promote.claim_deadline() + 0.5)  # continued: its claim went unrenewed past its deadline
        return real_stage(*arguments)

    monkeypatch.setattr(promote.ClaimRenewal, "__init__", init)
    monkeypatch.setattr(promote.ClaimRenewal, "_renew", renew)
    monkeypatch.setattr(promote, "stage", stage)
    failures = []

    def first():
        try:
            failures.append(f"promoted {promote_once(trained, root, step=10).promotion}")
        except promote.PromotionConflictError as error:
            failures.append(str(error))

    thread = threading.Thread(target=first, name="paused")
    thread.start()
    assert paused.wait(120), "the first promotion never claimed"
    with caplog.at_level("INFO"):
        second = promote_once(trained, root, step=5, decide_again=lambda ready: promote.Decision(True, ["again"]))
    second_done.set()
    thread.join(180)
    assert failures and "could not be renewed" in failures[0], failures
    pointer, _version = promote.read_pointer(root)
    assert pointer is not None and pointer["state"] == "ready", pointer
    assert pointer["version"] == second.promotion.version
    assert second.promotion.version in numeric_folders(root)
    assert_every_numeric_folder_is_a_complete_saved_model(root)
    assert "the pointer moved while version" in caplog.text
