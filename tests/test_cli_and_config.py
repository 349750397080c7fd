"""The command line and configuration every stage shares, shown on prepare_data."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from components.common.config import config_from_mapping, config_to_dict, parse_config
from components.prepare_data.__main__ import main
from components.prepare_data.config import PrepareDataConfig

REPOSITORY = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Example:
    name: str = field(metadata={"help": "a name"})
    count: int = 3
    ratio: float | None = None
    enabled: bool = True
    tags: tuple[str, ...] = ()


def test_options_parse_to_typed_fields_and_file_values_are_overridden_by_the_command_line(tmp_path):
    config_file = tmp_path / "config.json"
    config_file.write_text(json.dumps({"name": "from-file", "count": 7, "tags": ["a", "b"]}))

    config, _ = parse_config(
        Example, ["--config", str(config_file), "--count", "9", "--no-enabled", "--ratio", "0.5"], "test"
    )

    assert config == Example(name="from-file", count=9, ratio=0.5, enabled=False, tags=("a", "b"))
    assert config_to_dict(config)["tags"] == ["a", "b"]


def test_unknown_field_in_a_config_file_names_the_file_and_the_field(tmp_path):
    config_file = tmp_path / "config.json"
    config_file.write_text(json.dumps({"name": "x", "cuont": 1}))
    with pytest.raises(ValueError, match=rf"{config_file}.*unknown configuration field\(s\) \['cuont'\]"):
        parse_config(Example, ["--config", str(config_file)], "test")


def test_missing_required_field_is_an_error_that_names_it():
    with pytest.raises(ValueError, match="name"):
        config_from_mapping(Example, {}, "command line")


def test_cli_help_lists_the_options():
    result = subprocess.run(
        [sys.executable, "-m", "components.prepare_data", "--help"],
        cwd=REPOSITORY,
        capture_output=True,
        text=True,
        check=True,
    )
    for option in ("--source", "--output", "--validation-fraction", "--examples-per-shard", "--compression"):
        assert option in result.stdout


def test_cli_bad_input_exits_2_with_one_clear_line_and_publishes_nothing(tmp_path, capsys):
    junk = tmp_path / "cifar.tar.gz"
    junk.write_bytes(b"not an archive")
    code = main(["--source", str(junk), "--output", str(tmp_path / "out")])
    assert code == 2
    assert f"{junk}: not a readable tar archive" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_cli_bad_option_value_names_the_field(tmp_path, capsys):
    code = main(["--source", "synthetic", "--output", str(tmp_path / "out"), "--validation-fraction", "2"])
    assert code == 2
    assert "validation_fraction: 2.0 is not in [0, 1)" in capsys.readouterr().err


def test_cli_runs_the_stage(tmp_path):
    code = main(["--source", "synthetic", "--output", str(tmp_path / "out"), "--synthetic-train-per-class", "3"])
    assert code == 0
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert manifest["parameters"]["synthetic_train_per_class"] == 3
    assert PrepareDataConfig(output="x").source.startswith("https://")
