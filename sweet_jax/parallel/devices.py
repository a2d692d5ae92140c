"""What the accelerator is: the one description every kernel choice reads (`models.kernel_choice`).

    device = devices.current()           # platform, kind, compute capability, cuDNN and jax versions
    with devices.simulate(devices.preset("a100")):
        text = jax.jit(step).trace(*args).lower(lowering_platforms=("cuda",)).as_text()

A kernel that a device cannot compile must never be traced for it: `lax.cond` and `lax.switch` trace every branch.
So each path is chosen in Python, from a `Device`, before the program is traced. `current()` reads the first local
device, or the simulated one inside `simulate`: a CPU host then builds the program an A100, an L4, an H100 or a TPU
would run, and jax's own cuDNN checks (compute capability, cuDNN version) answer for the simulated device too.
With `interpret=True` the simulated device's Pallas kernels run in interpret mode, so their results can be checked
on the CPU; without it the program is for lowering only.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import functools
import re

import jax

# Shared memory one thread block may use, by compute capability (CUDA's per-block opt-in maximum, bytes)
SHARED_MEMORY = {(7, 0): 96 << 10, (7, 5): 64 << 10, (8, 0): 163 << 10, (8, 6): 99 << 10, (8, 7): 163 << 10,
                 (8, 9): 99 << 10, (9, 0): 227 << 10, (10, 0): 227 << 10, (12, 0): 99 << 10}


def jax_version() -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", jax.__version__)[:3])


@dataclasses.dataclass(frozen=True)
class Device:
    """An accelerator as the kernel choices see it.

    platform: "cpu", "gpu" or "tpu" (jax's names). kind: jax's `device_kind` ("NVIDIA H100 80GB HBM3", "TPU v5
    lite"). compute_capability: (major, minor) on an NVIDIA GPU. cudnn_version: cuDNN's integer version (9.10.0 is
    92800), None without cuDNN (ROCm, CPU, TPU). jax: the jax version the program is built with. simulated: a preset
    standing in for the real device; interpret: the simulated device's Pallas kernels run in interpret mode here."""

    platform: str
    kind: str
    compute_capability: tuple[int, int] | None = None
    cudnn_version: int | None = None
    jax: tuple[int, ...] = dataclasses.field(default_factory=jax_version)
    simulated: bool = False
    interpret: bool = False

    @property
    def nvidia(self) -> bool:
        return self.platform == "gpu" and self.compute_capability is not None

    def at_least(self, major: int, minor: int = 0) -> bool:
        """An NVIDIA GPU of this compute capability or newer."""
        return self.nvidia and self.compute_capability >= (major, minor)

    @property
    def shared_memory(self) -> int:
        """Shared memory one thread block may use (bytes; 0 off NVIDIA GPUs). An unlisted capability takes the
        nearest listed one below it."""
        if not self.nvidia:
            return 0
        known = [cc for cc in SHARED_MEMORY if cc <= self.compute_capability]
        return SHARED_MEMORY[max(known)] if known else 48 << 10

    def describe(self) -> str:
        parts = [self.kind]
        if self.compute_capability:
            parts.append("sm%d%d" % self.compute_capability)
        if self.cudnn_version:
            parts.append(f"cuDNN {cudnn_text(self.cudnn_version)}")
        parts.append("jax " + ".".join(map(str, self.jax)))
        return ", ".join(parts) + (" (simulated)" if self.simulated else "")


def cudnn_text(version: int) -> str:
    """91000 -> "9.10.0" (cuDNN 9's integer versions are major * 10000 + minor * 100 + patch)."""
    return f"{version // 10000}.{version % 10000 // 100}.{version % 100}"


# Devices that tests and plans stand in for, with the cuDNN that `pip install "sweet_jax[cuda12]"` brings at the
# pinned jax (nvidia-cudnn-cu12 9.28, resolved on 2026-12-06).
PRESETS = {
    "cpu": Device("cpu", "cpu"),
    "v100": Device("gpu", "Tesla V100-SXM2-32GB", (7, 0), 92800),
    "a100": Device("gpu", "NVIDIA A100-SXM4-80GB", (8, 0), 92800),
    "l4": Device("gpu", "NVIDIA L4", (8, 9), 92800),
    "rtx4090": Device("gpu", "NVIDIA GeForce RTX 4090", (8, 9), 92800),
    "h100": Device("gpu", "NVIDIA H100 80GB HBM3", (9, 0), 92800),
    "h200": Device("gpu", "NVIDIA H200", (9, 0), 92800),
    "tpu-v5e": Device("tpu", "TPU v5 lite"),
    "tpu-v5p": Device("tpu", "TPU v5"),
}


def preset(name: str, **changes) -> Device:
    """A simulated device by name (`PRESETS`), with fields replaced, e.g. preset("h100", cudnn_version=90500)."""
    try:
        base = PRESETS[name]
    except KeyError:
        raise ValueError(f"unknown device {name!r}; known: {', '.join(PRESETS)}") from None
    return dataclasses.replace(base, simulated=True, jax=jax_version(), **changes)


_SIMULATED: contextvars.ContextVar[Device | None] = contextvars.ContextVar("sweet_jax_device", default=None)


def current() -> Device:
    """The device programs are built for: the simulated one inside `simulate`, else the first local device."""
    return _SIMULATED.get() or _local_device()


@functools.lru_cache(maxsize=1)
def _local_device() -> Device:
    d = jax.local_devices()[0]
    cc = getattr(d, "compute_capability", None)
    capability = tuple(int(x) for x in str(cc).split(".")[:2]) if d.platform == "gpu" and cc else None
    return Device(d.platform, d.device_kind, capability, _cudnn_version() if capability else None)


def _cudnn_version() -> int | None:
    try:
        from jax._src.lib import cuda_versions
    except ImportError:
        return None
    try:
        return int(cuda_versions.cudnn_get_version()) if cuda_versions is not None else None
    except Exception:  # no cuDNN library loaded
        return None


@contextlib.contextmanager
def simulate(device: Device | str, *, interpret: bool = False):
    """Build programs for `device` (a `Device` or a preset name) inside this block, on whatever host this is. jax's
    cuDNN attention checks the compute capability and cuDNN version of the local GPU at trace time; inside the
    block they see the simulated device's, so a path the device cannot run fails here as it would there. jit caches a
    function's trace by its arguments' shapes, not by this context: jit a new function inside the block."""
    device = preset(device) if isinstance(device, str) else device
    device = dataclasses.replace(device, simulated=True, interpret=interpret)
    token = _SIMULATED.set(device)
    undo = _patch_device_queries(device)
    try:
        yield device
    finally:
        undo()
        _SIMULATED.reset(token)


def _patch_device_queries(device: Device):
    """Point jax's own device queries at `device` (cuDNN attention's compute-capability and cuDNN-version checks;
    the GPU that Pallas's Triton lowering targets, from jax 0.11); returns the function that puts them back."""
    undo = [_patch_cudnn_checks(device)]
    try:
        from jax._src.pallas.triton import gpu_info
    except ImportError:
        gpu_info = None
    if gpu_info is not None and hasattr(gpu_info, "get_device_kind") and device.nvidia:
        saved = gpu_info.get_device_kind
        gpu_info.get_device_kind = lambda: device.kind
        undo.append(lambda: setattr(gpu_info, "get_device_kind", saved))

    def undo_all():
        for fn in reversed(undo):
            fn()

    return undo_all


def _patch_cudnn_checks(device: Device):
    """Point jax's cuDNN attention checks at `device`; returns the function that puts them back."""
    try:
        from jax._src.cudnn import fused_attention_stablehlo as cudnn
    except ImportError:
        return lambda: None

    def parse(capability: str) -> tuple[int, int]:
        return tuple(int(x) for x in capability.split(".")[:2])

    def check_cudnn_version():
        if device.cudnn_version is None:
            raise RuntimeError(f"cuDNN is not detected (simulated {device.describe()}).")
        return device.cudnn_version

    replacements = {
        "check_cudnn_version": check_cudnn_version,
        "check_compute_capability": lambda capability: device.at_least(*parse(capability)),
        "is_cuda_compute_capability_equal": lambda capability: device.nvidia and (
            device.compute_capability == parse(capability)),
    }
    saved = {name: getattr(cudnn, name) for name in replacements if hasattr(cudnn, name)}
    for name in saved:
        setattr(cudnn, name, replacements[name])

    def undo():
        for name, fn in saved.items():
            setattr(cudnn, name, fn)

    return undo
