"""Batch prediction: a promoted model scores a folder, a prepared dataset or an object-store prefix of images.

    python -m components.predict --model outputs/models --images new-images/ --output predictions.jsonl

The model is a promotion root (its current version), a version folder, or a SavedModel folder this project exported;
it is called through its `serving_default` signature, exactly as TF Serving and KServe call it. The images stream
in batches (memory holds one batch, whatever their count), with progress and an ETA. Each image becomes one line of
JSON Lines, written as its batch is scored:

    {"image": "new-images/cat/0001.png", "top": [{"class": "cat", "index": 3, "probability": 0.91}, ...]}

A file that cannot be read or decoded, or an image of another size than the model's (unless `--resize HxW`, the
model's size, as prepare_data resizes), is skipped with one line in the log and a line `{"image": ..., "skipped":
reason}`, never the end of the job; a job none of whose images can be scored is refused. The output is the job's
(components/common/outputs.py): the same job run again continues it (its images are not scored again; a last line
cut short is dropped), and a file of another job (other images, another model version, other options) or of no job
is refused, never appended to. At the end, a summary (`.summary.json`) and an HTML report: images per predicted
class, the confidence distribution, and the least confident images.
"""

from __future__ import annotations

import heapq
import html
import json
import logging
import os
import queue
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from components.common import documents, filesystem, outputs, storage
from components.common.config import changed_fields
from components.common.dataset import MANIFEST_NAME
from components.common.model import LabelCountError, check_label_count
from components.common.progress import Progress
from components.evaluate.export import LABEL_NAMES_ASSET
from components.predict.config import PredictConfig
from components.prepare_data.sources import left_by_a_tool

logger = logging.getLogger(__name__)

IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png")
CONFIDENCE_BINS = 10


class PredictError(ValueError):
    """A setting or input that stops the job (exit 2): one line naming the file or option."""


@dataclass
class ServedModel:
    location: str
    serve: Callable  # uint8 [n, H, W, 3] -> float [n, classes]
    label_names: list[str]
    height: int
    width: int
    version: int | None = None  # the promoted version (a promotion root or a version folder), else None


# -- the model ------------------------------------------------------------------------------------------------------


def open_model(location: str) -> ServedModel:
    """The SavedModel `location` names (a promotion root, a version folder, a SavedModel), with its class names."""
    import tensorflow as tf

    from components.evaluate.pointer import read_ready

    folder, names, version = location.rstrip("/"), None, None
    if not filesystem.is_remote(folder) and not Path(folder).exists():
        raise PredictError(
            f"{folder}: no such folder; give a promotion root (make local-run promotes into OUTPUT/models), a version "
            "folder under one, or a SavedModel"
        )
    if _exists(filesystem.join(folder, "current.json")):
        ready = read_ready(folder)
        if ready is None:
            raise PredictError(f"{folder}: nothing is promoted there yet (current.json names no ready version)")
        folder, names, version = ready["saved_model"].rstrip("/"), ready.get("label_names"), ready["version"]
    elif Path(folder).name.isdigit() and _exists(
        filesystem.join(filesystem.parent_and_name(folder)[0], "current.json")
    ):
        version = int(Path(folder).name)  # a version folder of a promotion root
    if not _exists(filesystem.join(folder, "saved_model.pb")):
        raise PredictError(f"{folder}: not a SavedModel (no saved_model.pb), a version folder or a promotion root")
    local = _local_copy(folder)
    names_from = f"{location.rstrip('/')}/current.json (label_names)" if names else None
    names, names_from = (names, names_from) if names else _label_names(local, folder)
    try:
        loaded = tf.saved_model.load(str(local))
        signature = loaded.signatures["serving_default"]
    except (KeyError, OSError, ValueError, tf.errors.OpError) as error:
        raise PredictError(
            f"{folder}: the SavedModel does not load with a serving_default signature ({error})"
        ) from error
    spec = signature.structured_input_signature[1].get("images")
    if spec is None or spec.shape.rank != 4:
        raise PredictError(f"{folder}: serving_default takes no uint8 images [N, H, W, 3]; not a model of this project")
    height, width = int(spec.shape[1]), int(spec.shape[2])
    outputs = signature.structured_outputs.get("probabilities")
    classes = int(outputs.shape[-1]) if outputs is not None and outputs.shape.rank == 2 else None
    if classes is not None:
        try:
            check_label_count(classes, names, folder, names_from)
        except LabelCountError as error:
            raise PredictError(str(error)) from None
    logger.info("model %s: %d classes, %dx%d images", folder, len(names), width, height)
    return ServedModel(folder, lambda images: signature(images=tf.constant(images))["probabilities"].numpy(), names,
                       height, width, version)  # fmt: skip


def _exists(location: str) -> bool:
    if filesystem.is_remote(location):
        parent, name = filesystem.parent_and_name(location)
        return storage.publisher_for(parent).checksum(name) is not None
    return Path(location).is_file()


def _local_copy(folder: str) -> Path:
    """The SavedModel as a local folder (a remote one is downloaded once into the cache)."""
    if not filesystem.is_remote(folder):
        return Path(folder)
    publisher = storage.publisher_for(folder)
    target = filesystem.scratch_directory("predict-model")
    for name in publisher.list():
        storage.download_file(publisher.uri(name), target / name)
    return target


def _label_names(local: Path, folder: str) -> tuple[list[str], str]:
    """The class names a SavedModel of this project carries: its asset, else its version's data statistics."""
    from components.common.data_statistics import PROMOTED_STATISTICS

    schema = documents.Fields({"label_names": documents.Items(documents.Text(max_length=1024))}, ("label_names",))
    for candidate in (local / "assets" / LABEL_NAMES_ASSET, local / PROMOTED_STATISTICS):
        if candidate.is_file():
            names = storage.document(candidate, schema, "list of class names", max_bytes=8 << 20)["label_names"]
            return list(names), f"{folder}/{candidate.relative_to(local).as_posix()}"
    raise PredictError(f"{folder}: the SavedModel does not say its class names (assets/{LABEL_NAMES_ASSET})")


# -- the images -----------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Images:
    keys: list[str] | DatasetKeys  # in the order they are scored
    pixels: Callable[[list[str]], Iterator[tuple[str, np.ndarray | None, str]]]  # (key, image or None, why skipped)
    # A prepared dataset's images of one size, all of them in whole batches: (batch size) -> (keys, pixels) in order.
    batches: Callable[[int], Iterator[tuple[list[str], np.ndarray]]] | None = None
    shape: tuple[int, ...] | None = None  # every image's [height, width, channels], where all have one


def find_images(config: PredictConfig) -> Images:
    source = config.images.rstrip("/")
    if _exists(filesystem.join(source, MANIFEST_NAME)):
        if changed_fields(config, ("max_image_megabytes",)):
            raise PredictError(
                f"max_image_megabytes: bounds an image file's bytes, and {source} is a prepared dataset (its records "
                "were bounded and checked when it was prepared): leave it out"
            )
        return _dataset_images(source, config.split)
    if changed_fields(config, ("split",)):  # a folder has no splits: every image below it is scored
        raise PredictError(
            f"split: {config.split!r} chooses a prepared dataset's split, and {source} is a folder of images (every "
            "image below it is scored): leave it out"
        )
    if filesystem.is_remote(source):
        publisher = storage.publisher_for(source)
        keys = sorted(publisher.uri(name) for name in publisher.list() if not left_by_a_tool(name))
    else:
        if not Path(source).is_dir():
            raise PredictError(f"images: {source} is not a folder, a prepared dataset or a gs:// / s3:// prefix")
        keys = _files_below(Path(source))
    limit = config.max_image_megabytes << 20

    def decoded(wanted: list[str]) -> Iterator[tuple[str, np.ndarray | None, str]]:
        from components.prepare_data.safe_io import SourceError
        from components.prepare_data.sources import decode_image

        for key in wanted:
            try:
                image, _colour = decode_image(storage.read_bounded(key, limit), key, None)
            except (SourceError, filesystem.FileReadError, OSError) as error:
                yield key, None, str(error).removeprefix(f"{key}: ")
                continue
            yield key, image, ""

    return Images(keys, decoded)


def _files_below(root: Path) -> list[str]:
    """Every file below `root` but what a tool or an operating system left there (hidden files and folders,
    __MACOSX/, Thumbs.db), in a stable order (each is scored, or skipped if not an image)."""
    found = []
    for directory, folders, names in os.walk(root):
        folders[:] = sorted(folder for folder in folders if not left_by_a_tool(folder))
        found += [str(Path(directory, name)) for name in sorted(names) if not left_by_a_tool(name)]
    return found


def _dataset_images(dataset: str, split: str) -> Images:
    from components.common.dataset import open_dataset

    opened = open_dataset(dataset, splits=(split,))
    keys = DatasetKeys(opened, split)

    def records(wanted: list[str]) -> Iterator[tuple[str, np.ndarray | None, str]]:
        wanted_set = set(wanted)
        for images, _labels, ids in opened.tf_dataset(split, 1024, with_ids=True):
            for image, example_id in zip(images.numpy(), ids.numpy(), strict=True):
                if example_id.decode() in wanted_set:
                    yield example_id.decode(), image, ""

    def batches(batch_size: int) -> Iterator[tuple[list[str], np.ndarray]]:
        for images, _labels, ids in opened.tf_dataset(split, batch_size, with_ids=True):
            yield [example_id.decode() for example_id in ids.numpy()], images.numpy()

    return Images(keys, records, batches, tuple(opened.manifest.image_shape))


class DatasetKeys:
    """A prepared split's image ids, in order, read from its shards as they are iterated (never all held: at a
    million images they were 80 MB and a pass of their own); its length is the manifest's count."""

    def __init__(self, opened, split: str):
        self.opened, self.split = opened, split
        self.count = opened.manifest.splits[split].num_examples

    def __len__(self) -> int:
        return self.count

    def __iter__(self) -> Iterator[str]:
        for _images, _labels, ids in self.opened.tf_dataset(self.split, 4096, with_ids=True):
            yield from (example_id.decode() for example_id in ids.numpy())


# -- the output, continued ------------------------------------------------------------------------------------------

LINE_SCHEMA = documents.Fields(
    {
        "image": documents.Text(max_length=4096),
        "top": documents.Items(
            documents.Fields(
                {"class": documents.Text(max_length=1024), "index": documents.Number("[0, 1e6]", integer=True),
                 "probability": documents.Number("[0, 1]")},
                ("class", "index", "probability"),
            )
        ),
        "skipped": documents.Text(),
    },
    ("image",),
)  # fmt: skip


def read_predictions(output: str) -> Iterator[dict]:
    """The lines of an output, each checked; a last line cut short (a job stopped mid-write) is not a line."""
    for number, line in filesystem.whole_lines(output):
        yield documents.parse(line, f"{output} line {number}", LINE_SCHEMA, "prediction")


def _continue(output: str, tally: Tally) -> set[str]:
    """The images an earlier run of this job already wrote (the file is cut back to its last whole line); each of
    their lines is added to `tally`."""
    path = Path(output)
    if not path.exists():
        return set()
    done = set()
    for prediction in read_predictions(output):
        done.add(prediction["image"])
        tally.add_line(prediction)
    dropped = filesystem.cut_to_whole_lines(path)
    if dropped:
        logger.warning("%s: dropped a last line cut short (%d bytes)", output, dropped)
    if done:
        logger.info("%s holds %d images of this job already: continuing after them", output, len(done))
    return done


# -- scoring --------------------------------------------------------------------------------------------------------


def _fitted(image: np.ndarray, model: ServedModel, resize: bool) -> tuple[np.ndarray | None, str]:
    """The image at the model's size, or (None, why it is skipped)."""
    if image.shape[:2] == (model.height, model.width):
        return image, ""
    if not resize:
        return None, (
            f"image is {image.shape[1]}x{image.shape[0]}, the model takes {model.width}x{model.height} (--resize "
            f"{model.height}x{model.width} includes it)"
        )
    from components.common.pixels import resize_images

    return resize_images(image[None], model.height, model.width).numpy()[0], ""


def _lines(keys: list[str], probabilities: np.ndarray, names: list[str], top_k: int, tally: Tally) -> list[str]:
    """One JSON line per image, its top `top_k` classes; each added to `tally` as its line says it."""
    order = np.argsort(-probabilities, axis=1, kind="stable")[:, :top_k]
    classes = [json.dumps(name) for name in names]
    lines = []
    # The line json.dumps would write ({"image": ..., "top": [{"class": ..., "index": ..., "probability": ...}]}),
    # written directly: half the time, a tenth of a second in 20,000 images.
    for key, row, chosen in zip(keys, probabilities.tolist(), order.tolist(), strict=True):
        top = [(index, round(row[index], 6)) for index in chosen]
        tally.add(key, names[top[0][0]], top[0][1])
        entries = ", ".join(
            f'{{"class": {classes[index]}, "index": {index}, "probability": {probability!r}}}'
            for index, probability in top
        )
        lines.append(f'{{"image": {json.dumps(key)}, "top": [{entries}]}}\n')
    return lines


def job_of(config: PredictConfig, model: ServedModel) -> dict:
    """What makes a predictions file this job's: the images, the model and its version, the options that change a
    line (a continued file must hold nothing else)."""
    images = config.images if filesystem.is_remote(config.images) else os.path.abspath(config.images)
    return {"images": images.rstrip("/"), "split": config.split, "model": model.location, "model_version":
            model.version, "top_k": config.top_k, "resize": config.resize}  # fmt: skip


def predict(config: PredictConfig) -> dict:
    """Score every image of the job not yet in the output; returns the summary."""
    model = open_model(config.model)
    if config.image_size is not None and config.image_size != (model.height, model.width):
        raise PredictError(
            f"resize: {config.resize} is not the model's input size; it takes {model.height}x{model.width}"
        )
    images = find_images(config)
    if not images.keys:
        raise PredictError(f"images: {config.images} holds no file to score")
    inputs = [config.images, config.model]
    outputs.check_destination(config.report_path, "report", [*inputs, config.output, config.summary_path])
    outputs.check_destination(config.summary_path, "summary", [*inputs, config.output, config.report_path])
    with outputs.continued_file(config.output, "predictions", job_of(config, model),
                                [*inputs, config.report_path, config.summary_path]):  # fmt: skip
        summary, skipped, seconds, pending = _score(config, model, images)
    if summary["scored"] == 0:
        raise PredictError(
            f"images: none of the {summary['skipped']:,} images of {config.images} could be scored (the log and "
            f"{config.output} say why for each)"
        )
    summary["this_run"] = {"images": pending, "skipped": skipped, "seconds": round(seconds, 3)}
    outputs.write_json(config.summary_path, summary, "summary", [*inputs, config.output, config.report_path])
    logger.info(
        "%d images scored, %d skipped (%d in this run); predictions: %s; report: %s",
        summary["scored"], summary["skipped"], skipped, config.output, config.report_path,
    )  # fmt: skip
    return summary


def _pieces(config: PredictConfig, model: ServedModel, images: Images, pending: list[str]) -> Iterator[tuple]:
    """The pending images in order, read and fitted to the model: ("batch", keys, stacked pixels) for each full
    batch (and the last), ("skipped", key, why) for each image that cannot be scored, where it falls. A dataset
    whose images are all pending and all of the model's size is read in whole batches, with no work per image."""
    if images.batches and len(pending) == len(images.keys) and images.shape[:2] == (model.height, model.width):
        for keys, pixels in images.batches(config.batch_size):
            yield "batch", keys, pixels
        return
    batch_keys: list[str] = []
    batch: list[np.ndarray] = []
    for key, image, why in images.pixels(pending):
        fitted, why = _fitted(image, model, config.image_size is not None) if image is not None else (None, why)
        if fitted is None:
            yield "skipped", key, why
            continue
        batch_keys.append(key)
        batch.append(fitted)
        if len(batch) == config.batch_size:
            yield "batch", batch_keys, np.stack(batch)
            batch_keys, batch = [], []
    if batch:
        yield "batch", batch_keys, np.stack(batch)


def ahead(pieces: Iterator, depth: int = 2) -> Iterator:
    """`pieces`, produced on a thread of their own at most `depth` ahead of the consumer: reading and decoding the
    next batch overlap the model's call on this one (which releases the GIL), and memory holds `depth` + 1 batches
    whatever the input's size. An error of the producer is raised here, where its piece would have come; a consumer
    that stops early stops the producer."""
    handoff: queue.Queue = queue.Queue(maxsize=depth)
    stop = threading.Event()
    end = object()

    def offer(item) -> bool:
        """Hand `item` over, waiting while the queue is full; False once the consumer has stopped."""
        while not stop.is_set():
            try:
                handoff.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def produce() -> None:
        try:
            for piece in pieces:
                if not offer((piece, None)):
                    return
            offer((end, None))
        except BaseException as error:  # handed to the consumer, raised there
            offer((end, error))

    producer = threading.Thread(target=produce, name="predict-reader", daemon=True)
    producer.start()
    try:
        while True:
            piece, error = handoff.get()
            if piece is end:
                if error is not None:
                    raise error
                return
            yield piece
    finally:
        stop.set()
        producer.join()


def _score(config: PredictConfig, model: ServedModel, images: Images) -> tuple[dict, int, float, int]:
    tally = Tally(config.least_confident)
    done = _continue(config.output, tally)
    pending = [key for key in images.keys if key not in done] if done else images.keys  # all: not listed again
    progress = Progress("predict", len(pending), unit="images", logger=logger)
    skipped, started = 0, time.monotonic()
    with filesystem.open_for_append(config.output, text=True) as output:
        for kind, keys, detail in ahead(_pieces(config, model, images, pending)):
            if kind == "skipped":
                logger.warning("skipping %s: %s", outputs.printable(keys), detail)
                output.write(json.dumps({"image": keys, "skipped": detail}) + "\n")
                tally.skipped += 1
                progress.advance(1)
                skipped += 1
                continue
            probabilities = model.serve(detail)
            finite = np.isfinite(probabilities).all(axis=1)
            if not finite.all():
                first = keys[int(np.argmin(finite))]
                raise PredictError(
                    f"model: {model.location} gives probabilities that are not numbers (NaN or infinite) for "
                    f"{outputs.printable(first)}; a damaged or diverged model (the images scored before it are kept)"
                )
            output.writelines(_lines(keys, probabilities, model.label_names, config.top_k, tally))
            output.flush()
            progress.advance(len(keys))
    seconds = time.monotonic() - started
    return summarize(config, model, images, tally), skipped, seconds, len(pending)


# -- the summary and the report -------------------------------------------------------------------------------------


@dataclass
class Tally:
    """What the summary counts, line by line as the output holds them: the earlier runs' lines as they are read
    back, this run's as they are written (the output is not read again)."""

    least_kept: int  # how many of the least confident images to keep
    classes: Counter = field(default_factory=Counter)
    histogram: list[int] = field(default_factory=lambda: [0] * CONFIDENCE_BINS)
    least: list[tuple[float, str, str]] = field(default_factory=list)  # a heap of (-confidence, image, class)
    scored: int = 0
    skipped: int = 0

    def add(self, image: str, best_class: str, probability: float) -> None:
        self.scored += 1
        self.classes[best_class] += 1
        self.histogram[min(int(probability * CONFIDENCE_BINS), CONFIDENCE_BINS - 1)] += 1
        entry = (-probability, image, best_class)
        if len(self.least) < self.least_kept:
            heapq.heappush(self.least, entry)
        elif self.least_kept and entry > self.least[0]:
            heapq.heapreplace(self.least, entry)

    def add_line(self, prediction: dict) -> None:
        if "skipped" in prediction:
            self.skipped += 1
        else:
            best = prediction["top"][0]
            self.add(prediction["image"], best["class"], best["probability"])


def summarize(config: PredictConfig, model: ServedModel, images: Images, tally: Tally) -> dict:
    """Counts per predicted class, the confidence histogram and the least confident images of the whole output."""
    least_confident = [
        {"image": key, "class": name, "probability": -negative}
        for negative, key, name in sorted(tally.least, reverse=True)
    ]
    summary = {
        "model": model.location,
        "model_version": model.version,
        "images": config.images,
        "scored": tally.scored,
        "skipped": tally.skipped,
        "per_class": {name: tally.classes.get(name, 0) for name in model.label_names},
        "confidence_histogram": {
            f"{index / CONFIDENCE_BINS:.1f}-{(index + 1) / CONFIDENCE_BINS:.1f}": count
            for index, count in enumerate(tally.histogram)
        },
        "least_confident": least_confident,
    }
    others = [config.images, config.model, config.output, config.summary_path]
    outputs.write_text(config.report_path, _report(summary, _pictures(least_confident, images)), "report", others)
    return summary


def _pictures(least_confident: list[dict], images: Images) -> dict[str, np.ndarray]:
    wanted = [entry["image"] for entry in least_confident]
    return {key: image for key, image, _why in images.pixels(wanted) if image is not None}


def _report(summary: dict, pictures: dict[str, np.ndarray]) -> str:
    from components.evaluate.report import STYLE, data_uri, encode_png, enlarged

    widest = max([*summary["per_class"].values(), 1])
    classes = "".join(
        f"<tr><th>{html.escape(name)}</th><td>{count:,}</td><td><span class='bar' "
        f"style='width:{240 * count / widest:.0f}px'></span></td></tr>"
        for name, count in summary["per_class"].items()
    )
    tallest = max([*summary["confidence_histogram"].values(), 1])
    confidence = "".join(
        f"<tr><th>{band}</th><td>{count:,}</td><td><span class='bar' style='width:{240 * count / tallest:.0f}px'>"
        "</span></td></tr>"
        for band, count in summary["confidence_histogram"].items()
    )
    tiles = "".join(
        f"<figure><img src='{data_uri(encode_png(enlarged(pictures[entry['image']])))}' "
        f"alt='{html.escape(entry['class'])}'>"
        f"<figcaption>{html.escape(outputs.printable(Path(entry['image']).name))}<br>{html.escape(entry['class'])} "
        f"({entry['probability']:.2f})</figcaption></figure>"
        for entry in summary["least_confident"]
        if entry["image"] in pictures
    )
    version = f" (version {summary['model_version']})" if summary.get("model_version") is not None else ""
    title = f"Predictions of {html.escape(outputs.printable(summary['model']))}{version}"
    return (
        f"<!doctype html><html><head><meta charset='utf-8'><title>{title}</title><style>{STYLE}</style></head><body>"
        f"<h1>{title}</h1><p>{summary['scored']:,} images scored, {summary['skipped']:,} skipped, from "
        f"{html.escape(outputs.printable(summary['images']))}.</p><h2>Predicted classes</h2><table>{classes}</table>"
        f"<h2>Confidence of the top class</h2><table>{confidence}</table>"
        f"<h2>The least confident images</h2><div class='grid'>{tiles}</div></body></html>"
    )
