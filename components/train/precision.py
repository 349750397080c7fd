"""`--precision auto`: bfloat16 arithmetic (float32 variables, Keras's mixed_bfloat16) where the hardware that runs
the step multiplies bfloat16 natively, float32 elsewhere (emulated bfloat16 is slower than float32).

Natively: every GPU the process sees is of compute capability 8.0 or later (A100, L4, H100, ...); with no GPU, the
CPU has AMX-BF16 or AVX512-BF16 (Intel Sapphire Rapids and later, AMD Zen 4 and later)."""

from __future__ import annotations

import logging

from components.common.compiled_kernels import cpu_flags

logger = logging.getLogger(__name__)

CPU_BFLOAT16_FLAGS = ("amx_bf16", "avx512_bf16")


def bfloat16_unit(gpu_capabilities: list[tuple[int, int]], flags: frozenset[str]) -> str | None:
    """What multiplies bfloat16 natively here, or None: the GPUs (all of capability >= 8.0) when there are any,
    else the CPU's flags."""
    if gpu_capabilities:
        if all(capability >= (8, 0) for capability in gpu_capabilities):
            return f"GPUs of compute capability {min(gpu_capabilities)[0]}.{min(gpu_capabilities)[1]} or later"
        return None
    found = [flag for flag in CPU_BFLOAT16_FLAGS if flag in flags]
    return f"the CPU's {found[0]}" if found else None


def gpu_capabilities() -> list[tuple[int, int]]:
    import tensorflow as tf

    capabilities = []
    for device in tf.config.list_physical_devices("GPU"):
        capability = tf.config.experimental.get_device_details(device).get("compute_capability")
        capabilities.append(tuple(capability) if capability else (0, 0))
    return capabilities


def resolve(precision: str) -> str:
    """The Keras policy `precision` means here: itself, or for auto, mixed_bfloat16 or float32 by the hardware."""
    if precision != "auto":
        return precision
    unit = bfloat16_unit(gpu_capabilities(), cpu_flags())
    resolved = "mixed_bfloat16" if unit else "float32"
    logger.info("precision auto: %s (%s)", resolved, f"bfloat16 on {unit}" if unit else "no native bfloat16 here")
    return resolved
