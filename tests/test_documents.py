"""Every document the project reads back goes through one reader (components/common/documents.py): special files,
sizes, JSON that is too deep, too long or not finite, values outside the intervals of the fields they mirror, and
paths leading out of their root are refused in one line naming the file and the field, in seconds."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from components.common import documents, storage
from components.common.model import ModelSpec, model_spec_of
from components.common.model_directory import RESOLVED_CONFIG
from components.evaluate import gate, pointer
from components.train.config import TrainConfig
from pipeline import run_record

HOSTILE_CONTENT = {
    "a list": b"[]",
    "a string": b'"config"',
    "a number": b"7",
    "null": b"null",
    "true": b"true",
    "empty": b"",
    "not JSON": b"{'single': 'quotes'}",
    "cut short": b'{"a": [1, 2',
    "nested 100,000 deep": b"[" * 100_000 + b"]" * 100_000,
    "nested 40 deep in an object": b'{"a": ' + b"[" * 40 + b"]" * 40 + b"}",
    "a 5,001-digit integer": b'{"a": ' + b"9" * 5001 + b"}",
    "a 200-digit float": b'{"a": 0.' + b"1" * 200 + b"}",
    "NaN": b'{"a": NaN}',
    "Infinity": b'{"a": [1, Infinity]}',
    "-Infinity": b'{"a": {"b": -Infinity}}',
    "a float that overflows": b'{"a": 1e999}',
    "a key given twice": b'{"a": 1, "a": 2}',
    "a 2,000,000-character value": b'{"a": "' + b"x" * 2_000_000 + b'"}',
    "a long field name": b'{"' + b"k" * 10_000 + b'": 1}',
    "not UTF-8": b'{"a": "\xff\xfe"}',
}


@pytest.mark.parametrize("form", sorted(HOSTILE_CONTENT))
def test_hostile_json_is_refused_in_one_short_line_naming_the_file(tmp_path, form):
    path = tmp_path / "config.json"
    path.write_bytes(HOSTILE_CONTENT[form])
    started = time.monotonic()
    with pytest.raises(documents.DocumentError) as refused:
        storage.document(path, documents.ANY_OBJECT, "configuration file")
    message = str(refused.value)
    assert message.startswith(f"{path}: ") and "\n" not in message and len(message) < 300, message
    assert time.monotonic() - started < 5


def test_a_refused_value_names_its_field_path(tmp_path):
    path = tmp_path / "doc.json"
    path.write_bytes(b'{"outer": {"items": [1, {"deep": NaN}]}}')
    with pytest.raises(documents.DocumentError, match=r"outer\.items\[1\]\.deep: NaN is not a finite number"):
        storage.document(path, documents.ANY_OBJECT, "document")


@pytest.mark.parametrize("kind", ["fifo", "device", "folder", "link out", "too large"])
def test_special_files_links_out_and_large_files_are_refused_without_blocking_or_reading_them(tmp_path, kind):
    root = tmp_path / "root"
    root.mkdir()
    path = root / "config.json"
    if kind == "fifo":
        os.mkfifo(path)  # nobody writes to it: opening it to read would block forever
    elif kind == "device":
        path.symlink_to("/dev/zero")  # endless: reading it whole would never end
    elif kind == "folder":
        path.mkdir()
    elif kind == "link out":
        (tmp_path / "elsewhere.json").write_text("{}")
        path.symlink_to(tmp_path / "elsewhere.json")
    else:
        path.write_bytes(b'{"a": "' + b"x" * (2 << 20) + b'"}')
    started = time.monotonic()
    with pytest.raises(documents.DocumentError) as refused:
        storage.document(path, documents.ANY_OBJECT, "configuration file", root=root, max_bytes=1 << 20)
    assert str(refused.value).startswith(str(path)) and time.monotonic() - started < 5


def test_a_link_that_stays_inside_its_root_is_read(tmp_path):
    (tmp_path / "real.json").write_text('{"a": 1}')
    (tmp_path / "config.json").symlink_to("real.json")
    assert storage.document(tmp_path / "config.json", documents.ANY_OBJECT, "document", root=tmp_path) == {"a": 1}


SCHEMA = documents.Fields(
    {
        "count": documents.Number("[1, 100]", integer=True),
        "rate": documents.Number("(0, 1]"),
        "mode": documents.Text(choices=("fast", "slow")),
        "flag": documents.Flag(),
        "shape": documents.Items(documents.Number("[1, 4096]", integer=True), length=3),
        "where": documents.Location(nullable=True),
        "inner": documents.Fields({"size": documents.Number("[0, 10]")}, required=("size",)),
    },
    required=("count",),
)
WELL_FORMED = {"count": 3, "rate": 0.5, "mode": "fast", "flag": True, "shape": [32, 32, 3], "where": None}


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"count": 0}, "count"),
        ({"count": 3.5}, "count"),
        ({"count": True}, "count"),
        ({"count": "3"}, "count"),
        ({"count": None}, "count"),
        ({"rate": 0}, "rate"),
        ({"rate": [0.5]}, "rate"),
        ({"mode": "FAST"}, "mode"),
        ({"flag": 1}, "flag"),
        ({"shape": [32, 32]}, "shape"),
        ({"shape": [32, 32, 0]}, "shape[2]"),
        ({"where": "/etc/passwd"}, "where"),
        ({"where": "ROOT/../elsewhere"}, "where"),
        ({"where": "s3://another-bucket/models"}, "where"),
        ({"inner": []}, "inner"),
        ({"inner": {}}, "inner.size"),
        ({"inner": {"size": 11}}, "inner.size"),
    ],
)
def test_values_are_checked_against_the_schema_naming_the_field(tmp_path, change, field):
    document = {**WELL_FORMED, **change}
    if isinstance(document.get("where"), str):
        document["where"] = document["where"].replace("ROOT", str(tmp_path))
    path = tmp_path / "doc.json"
    path.write_text(json.dumps(document))
    with pytest.raises(documents.DocumentError, match=f"not a valid thing: {re.escape(field)}: "):
        storage.document(path, SCHEMA, "thing", root=tmp_path)
    path.write_text(json.dumps({key: value for key, value in WELL_FORMED.items() if key != "count"}))
    with pytest.raises(documents.DocumentError, match="count: missing"):
        storage.document(path, SCHEMA, "thing", root=tmp_path)


def test_a_location_inside_the_root_is_accepted_on_every_store():
    assert documents.confined("s3://bucket/models/1/checkpoint/ckpt-5", "s3://bucket/models")
    assert documents.confined("gs://bucket/models", "gs://bucket/models/")
    assert not documents.confined("s3://bucket/models-other/1", "s3://bucket/models")
    assert not documents.confined("gs://bucket/models/1", "s3://bucket/models")
    assert not documents.confined("s3://bucket/models/../secrets", "s3://bucket/models")
    assert not documents.confined("/models/1", "s3://bucket/models")
    assert documents.confined("/srv/models/1/../2", "/srv/models")
    assert not documents.confined("/srv/models-old/1", "/srv/models")


# -- each kind of document, through its own reader ---------------------------------------------------------------


def write_model_directory(folder: Path, **changes) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    document = {
        "model_spec": ModelSpec(depth=8).to_dict(),
        "resolved": {"num_classes": 10, "label_names": [str(index) for index in range(10)], "image_shape": [32, 32, 3]},
    }
    for dotted, value in changes.items():
        *parents, name = dotted.split("__")
        target = document
        for parent in parents:
            target = target[parent]
        target[name] = value
    (folder / RESOLVED_CONFIG).write_text(json.dumps(document, allow_nan=True))
    return folder


@pytest.mark.parametrize(
    ("changes", "named"),
    [
        ({"model_spec__width_multiplier": 400}, "model_spec.width_multiplier"),
        ({"model_spec__num_classes": 10**7}, "model_spec.num_classes"),
        ({"model_spec__depth": -8}, "model_spec.depth"),
        ({"model_spec__family": "vgg"}, "model_spec.family"),
        ({"model_spec__batch_norm_epsilon": float("nan")}, "model_spec.batch_norm_epsilon"),
        ({"model_spec__image_shape": [32, 32]}, "model_spec.image_shape"),
        ({"model_spec": []}, "model_spec"),
        ({"resolved": []}, "resolved"),
        ({"resolved__num_classes": 10**40}, "resolved.num_classes"),
        ({"resolved__label_names": "cat"}, "resolved.label_names"),
    ],
)
def test_a_model_directory_config_is_checked_as_train_checks_its_values(tmp_path, changes, named):
    from components.evaluate.restore import read_train_config

    folder = write_model_directory(tmp_path / "model", **changes)
    with pytest.raises(ValueError) as refused:
        read_train_config(folder, str(folder))
    message = str(refused.value)
    assert f"{folder}/{RESOLVED_CONFIG}" in message and named in message and "\n" not in message, message


def test_a_well_formed_model_directory_config_builds_its_spec(tmp_path):
    from components.evaluate.restore import read_train_config

    folder = write_model_directory(tmp_path / "model")
    assert model_spec_of(read_train_config(folder, str(folder))) == ModelSpec(depth=8)


def test_the_model_spec_accepts_what_train_accepts_and_no_more():
    """ModelSpec (what evaluate and serving build) and TrainConfig (what train is given) share their rules."""
    train_fields = {field.name: field for field in dataclasses.fields(TrainConfig)}
    for field in dataclasses.fields(ModelSpec):
        mirrored = train_fields.get("model" if field.name == "family" else field.name)
        if mirrored is None:
            continue
        for rule in ("range", "choices"):
            assert field.metadata.get(rule) == mirrored.metadata.get(rule), (field.name, rule)


@pytest.mark.parametrize(
    "content",
    [
        b"[]",
        b'{"tensorflow_serving": 5}',
        b'{"tensorflow_serving": "9.99.0"}',
        b'{"tensorflow_serving": "2.21.0", "x": 1}',
    ],
)
def test_a_damaged_serving_declaration_is_refused_naming_it(tmp_path, content):
    from components.common import storage
    from components.evaluate import promote

    (tmp_path / pointer.SERVING_DECLARATION).write_bytes(content)
    with pytest.raises(documents.DocumentError, match=rf"{tmp_path}/serving.json: not a valid serving declaration"):
        promote.declared_serving_version(storage.publisher_for(str(tmp_path)), None)


@pytest.mark.parametrize(
    "content", [b'{"accuracy": NaN}', b'{"metrics": {"accuracy": 1.5}}', b'{"metrics": []}', b"[0.5]", b"{}"]
)
def test_a_damaged_baseline_is_refused_naming_it(tmp_path, content):
    path = tmp_path / "baseline.json"
    path.write_bytes(content)
    with pytest.raises(ValueError, match=rf"^{path}: not a valid baseline"):
        gate.read_baseline_accuracy(str(path))


def test_a_baseline_that_is_a_device_is_refused_at_once():
    with pytest.raises(ValueError, match="/dev/zero: not a regular file"):
        gate.read_baseline_accuracy("/dev/zero")


@pytest.mark.parametrize(
    "change", [{"state": "paused"}, {"pid": True}, {"pid": 10**30}, {"started_at": None}, {"extra": 1}]
)
def test_a_damaged_run_record_is_refused_naming_it(tmp_path, change):
    record = run_record.started(tmp_path, {"source": "synthetic"}, "subprocess", None)
    (tmp_path / run_record.RECORD).write_text(json.dumps({**dataclasses.asdict(record), **change}))
    with pytest.raises(ValueError, match=rf"{tmp_path}/run.json: not a valid run record"):
        run_record.read(tmp_path)


@pytest.mark.parametrize(
    "config",
    ["fifo", "/dev/zero", "deep", "digits", "long"],
)
def test_a_stage_given_a_hostile_config_file_exits_2_in_one_line_and_seconds(tmp_path, config):
    path = tmp_path / "config.json"
    if config == "fifo":
        os.mkfifo(path)
    elif config == "deep":
        path.write_text('{"seed": ' + "[" * 100_000 + "]" * 100_000 + "}")
    elif config == "digits":
        path.write_text('{"seed": ' + "7" * 5001 + "}")
    elif config == "long":
        path.write_text(json.dumps({"seed": "x" * 2_000_000}))
    else:
        path = Path(config)
    started = time.monotonic()
    completed = subprocess.run(
        [sys.executable, "-m", "components.prepare_data", "--config", str(path), "--output", str(tmp_path / "out")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert completed.returncode == 2, completed.stderr[-2000:]
    lines = [line for line in completed.stderr.splitlines() if "ERROR" in line]
    assert len(lines) == 1 and str(path) in lines[0] and len(lines[0]) < 300, completed.stderr[-2000:]
    assert "Traceback" not in completed.stderr and time.monotonic() - started < 30
