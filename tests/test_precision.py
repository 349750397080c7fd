"""--precision auto: bfloat16 only where the hardware that runs the step multiplies it natively."""

from __future__ import annotations

import pytest

from components.common.config import config_from_mapping
from components.train import precision
from components.train.config import TrainConfig


@pytest.mark.parametrize(
    ("gpus", "flags", "expected"),
    [
        ([(8, 0), (9, 0)], set(), "GPUs of compute capability 8.0 or later"),
        ([(8, 6)], {"amx_bf16"}, "GPUs of compute capability 8.6 or later"),
        ([(7, 5)], {"amx_bf16"}, None),  # a T4 computes: its bfloat16 is emulated, whatever the CPU has
        ([(8, 0), (7, 0)], set(), None),  # one older GPU in the set decides
        ([], {"avx2", "amx_bf16", "amx_tile"}, "the CPU's amx_bf16"),
        ([], {"avx512f", "avx512_bf16"}, "the CPU's avx512_bf16"),
        ([], {"avx2", "avx512f", "fma"}, None),
        ([], set(), None),
    ],
)
def test_bfloat16_is_chosen_only_where_it_is_native(gpus, flags, expected):
    assert precision.bfloat16_unit(gpus, flags) == expected


def test_cpu_flags_are_read_from_the_kernels_list_and_missing_ones_are_none(tmp_path):
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nmodel name\t: Some CPU\nflags\t\t: fpu sse2 avx512_bf16 amx_bf16\n\n")
    assert precision.cpu_flags(cpuinfo) == {"fpu", "sse2", "avx512_bf16", "amx_bf16"}
    assert precision.cpu_flags(tmp_path / "absent") == set()


def test_auto_resolves_by_the_hardware_and_other_precisions_are_kept(monkeypatch, caplog):
    monkeypatch.setattr(precision, "gpu_capabilities", lambda: [])
    monkeypatch.setattr(precision, "cpu_flags", lambda: {"amx_bf16"})
    with caplog.at_level("INFO", logger="components.train.precision"):
        assert precision.resolve("auto") == "mixed_bfloat16"
    assert "precision auto: mixed_bfloat16 (bfloat16 on the CPU's amx_bf16)" in caplog.text
    monkeypatch.setattr(precision, "cpu_flags", lambda: {"avx2"})
    assert precision.resolve("auto") == "float32"
    for given in ("float32", "mixed_float16", "mixed_bfloat16"):
        assert precision.resolve(given) == given
    config = config_from_mapping(TrainConfig, {"data": "d", "model_dir": "m", "precision": "auto"}, "test")
    assert config.precision == "auto"
    with pytest.raises(ValueError, match="precision"):
        config_from_mapping(TrainConfig, {"data": "d", "model_dir": "m", "precision": "bfloat16"}, "test")
