"""The accelerator targets, in one place. `bench/gpu_suite.py` checks every figure against them, and
`bench/mfu.py` and `bench/decode_mbu.py` print their verdicts from them.

    figure: (target, "min" | "max")

MFU is model FLOPs over the device's dense bf16 peak (`mfu.PEAK_TFLOPS`), MBU the bytes a decode step must read
over its peak bandwidth (`decode_mbu.PEAK_GBS`). The peer ratios are HF + torch's time over sweet_jax's on the same
shape in the same run.
"""

from __future__ import annotations

TARGETS: dict[str, tuple[float, str]] = {
    "critic 1B 2x4096 MFU": (0.48, "min"),
    "critic 3B 2x4096 MFU": (0.50, "min"),
    "critic 1B vs HF+torch": (1.35, "min"),
    "backward / forward (1B)": (2.2, "max"),
    "8B decode batch 1 MBU": (0.80, "min"),
    "8B decode batch 64 prompt 2048 MBU": (0.60, "min"),
    "8B decode batch 1 MBU, paged": (0.80, "min"),
    "8B decode batch 64 prompt 2048 MBU, paged": (0.60, "min"),
}

# The targets a single run of mfu.py or decode_mbu.py is held to (by model; other models take the first one)
MFU_BY_MODEL = {"llama3.2-1b": TARGETS["critic 1B 2x4096 MFU"][0], "llama3.2-3b": TARGETS["critic 3B 2x4096 MFU"][0]}
MBU_BY_BATCH = {1: TARGETS["8B decode batch 1 MBU"][0], 64: TARGETS["8B decode batch 64 prompt 2048 MBU"][0]}


def verdict(figure: str, value: float | None) -> str:
    """'>= 0.48: PASS', '>= 0.48: below target', or '' (no target, or no value)."""
    target = TARGETS.get(figure)
    if target is None or value is None:
        return ""
    goal, sense = target
    good = value >= goal if sense == "min" else value <= goal
    return f"{'>=' if sense == 'min' else '<='} {goal:g}: {'PASS' if good else 'below target'}"


def mfu_target(preset: str) -> float:
    return MFU_BY_MODEL.get(preset, MFU_BY_MODEL["llama3.2-1b"])


def mbu_target(batch: int) -> float:
    """The MBU target of a decode batch: batch 1's up to batch 16, batch 64's from there."""
    return MBU_BY_BATCH[1] if batch < 64 else MBU_BY_BATCH[64]
