"""Which kernel runs each attention, chosen in Python from the device (`parallel.devices`) before anything is traced.

`lax.cond` and `lax.switch` trace every branch, and a kernel that a device cannot compile fails the whole program
even on a branch never taken. So nothing here is traced: each function returns a static choice, and `attention`
and the paged decode build only what it names.

- `attention_impl`: what an attention setting ("auto", "reference", "xla", "cudnn", "splash") stands for on the
  device. "auto" picks the fastest the device runs; an explicit choice the device cannot run is a
  `KernelUnsupported` error that names the device and the reason.
- `segment_kernels`: on a GPU with cuDNN attention, the kernels for rows that hold several segments or a layout
  cuDNN's padding masks cannot express. cuDNN's packed (THD) layout needs Hopper (jax refuses it below sm90) and
  cuDNN >= 9.6; before jax 0.11.1 its wrapper scales the key/value offsets by the query heads, so grouped-query
  rows repeat their key/value heads first. Elsewhere (A100, L4, RTX 40xx) packed rows take a Pallas Triton flash
  kernel with segment ids, with blocks that fit the GPU's shared memory. No path passes a dense [B, 1, T, T] mask.
- `paged_decode`: the paged decode kernel ("auto", "on", "off") and its blocks: a page block that fits shared
  memory (a 128-token page is one block), the Triton kernel on NVIDIA GPUs from sm80, Mosaic on TPUs.
"""

from __future__ import annotations

import dataclasses
import re

import jax.numpy as jnp

from sweet_jax.parallel import devices

ATTENTION_SETTINGS = ("auto", "reference", "xla", "cudnn", "splash")
PAGED_SETTINGS = ("auto", "on", "off")
SPLASH_BLOCK = 128  # the splash kernel's tile: sequence lengths must be multiples of it
CUDNN_PACKED_MIN_VERSION = 90600  # cuDNN's ragged offsets for packed sequences
GQA_OFFSETS_FIXED_JAX = (0, 11, 1)  # first jax whose packed cuDNN wrapper scales key/value offsets by the KV heads


class KernelUnsupported(ValueError):
    """An explicit kernel choice that this device (or this jax) cannot run."""


def _half(dtype) -> bool:
    return jnp.dtype(dtype) in (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16))


def cudnn_unsupported(device: devices.Device, dtype, head_dim: int | None) -> str | None:
    """Why cuDNN's fused attention cannot run here (None when it can): an NVIDIA GPU from sm80 with cuDNN, bf16 or
    fp16, a head dim that is a multiple of 8 and at most 128 (256 from Hopper), as jax checks before lowering."""
    if not device.nvidia:
        return "cuDNN attention runs on NVIDIA GPUs only"
    if not device.at_least(8, 0):
        return "cuDNN flash attention needs sm80 (Ampere) or newer"
    if device.cudnn_version is None:
        return "no cuDNN library was found"
    if not _half(dtype):
        return f"cuDNN attention takes bf16 or fp16, not {jnp.dtype(dtype).name}"
    limit = 256 if device.at_least(9, 0) else 128
    if head_dim is not None and (head_dim > limit or head_dim % 8):
        return f"cuDNN attention needs a head dim that is a multiple of 8 and <= {limit} here, not {head_dim}"
    return None


def attention_impl(setting: str, dtype, lengths: tuple[int, ...] = (), head_dim: int | None = None,
                   device: devices.Device | None = None) -> str:
    """The implementation `setting` stands for on `device` (default: `devices.current()`), for these dtypes, (query,
    key) lengths and head dim. "auto": splash on a TPU when the lengths are whole 128-token tiles, cuDNN on a GPU
    that runs it, else the reference. An explicit setting the device cannot run raises `KernelUnsupported`."""
    device = device or devices.current()
    if setting not in ATTENTION_SETTINGS:
        raise KernelUnsupported(f"attention_impl={setting!r}; expected one of {ATTENTION_SETTINGS}")
    if setting == "auto":
        if device.platform == "tpu" and lengths and all(n % SPLASH_BLOCK == 0 for n in lengths):
            return "splash"
        if device.platform == "gpu" and cudnn_unsupported(device, dtype, head_dim) is None:
            return "cudnn"
        return "reference"
    if setting == "cudnn":
        why = cudnn_unsupported(device, dtype, head_dim)
        if why:
            raise KernelUnsupported(f"attention_impl='cudnn' cannot run on {device.describe()}: {why}; use 'auto'")
    if setting == "splash" and device.platform == "gpu":
        raise KernelUnsupported(f"attention_impl='splash' is a TPU kernel; {device.describe()} cannot run it "
                                f"(use 'auto' or 'cudnn')")
    return setting


# ----------------------------------------------------------------------------------------- segments on a GPU
@dataclasses.dataclass(frozen=True)
class TritonBlocks:
    """Tiles of the Pallas Triton flash kernel (`jax.experimental.pallas.ops.gpu.attention.mha`)."""

    block_q: int
    block_k: int
    block_q_bwd: int
    block_k_bwd: int
    num_warps: int
    num_stages: int


@dataclasses.dataclass(frozen=True)
class SegmentKernels:
    """The kernels of `attention.segment_attention` on one device, for one row length.

    packed: rows of several whole segments, each a run of rising ids with padding last: "cudnn" (its packed
    layout), "triton" (the flash kernel with segment ids) or None (the explicit mask). general: any other layout
    (left padding, ids that repeat, more segments than the packed path takes): "triton" or None. repeat_kv: the
    packed cuDNN path gets the key/value heads repeated to the query heads (jax before 0.11.1)."""

    packed: str | None
    general: str | None
    repeat_kv: bool = False
    triton: TritonBlocks | None = None
    note: str = ""


def triton_blocks(device: devices.Device, t: int, head_dim: int) -> TritonBlocks | None:
    """Flash-kernel tiles for rows of `t` tokens whose loads fit this GPU's shared memory (bf16, double-buffered
    key/value tiles), or None when no tile does (Triton's dot needs 16-row tiles that divide the rows)."""
    padded = 1 << max(4, (head_dim - 1).bit_length())
    budget = 0.9 * device.shared_memory

    def fits(bq, bk, stages):
        return 2 * padded * (bq + 2 * stages * bk) <= budget

    sizes = [b for b in (128, 64, 32, 16) if t % b == 0]
    for stages in (2, 1):
        for bq in sizes:
            for bk in sizes:
                if bk <= bq and fits(bq, bk, stages):
                    bwd = min(32, bk)
                    if not fits(bwd, bwd, stages):
                        continue
                    return TritonBlocks(bq, bk, bwd, bwd, 4 if head_dim <= 64 else 8, stages)
    return None


def segment_kernels(device: devices.Device, t: int, head_dim: int) -> SegmentKernels:
    """The kernels `segment_attention` may use on `device` (which runs cuDNN attention) for rows of `t` tokens."""
    triton = triton_blocks(device, t, head_dim) if device.at_least(8, 0) else None
    general = "triton" if triton else None
    if not device.at_least(9, 0):
        packed, note = general, "cuDNN's packed layout needs Hopper (sm90)"
    elif (device.cudnn_version or 0) < CUDNN_PACKED_MIN_VERSION:
        packed, note = general, f"cuDNN's packed layout needs cuDNN >= {devices.cudnn_text(CUDNN_PACKED_MIN_VERSION)}"
    else:
        packed, note = "cudnn", ""
    if general is None:
        note = (note + "; " if note else "") + f"no Triton flash tile divides {t} tokens: other layouts use a mask"
    return SegmentKernels(packed, general, packed == "cudnn" and device.jax < GQA_OFFSETS_FIXED_JAX, triton, note)


# ------------------------------------------------------------------------------------------------ paged decode
@dataclasses.dataclass(frozen=True)
class PagedDecode:
    """The paged decode kernel and its blocks. kernel: "triton" (`attention.paged_decode_attention` on an NVIDIA
    GPU), "mosaic" (JAX's TPU kernel) or None (the pages are gathered into rows and attended densely).
    pages_per_block: pages one kernel step reads; k_splits: partitions of a row's pages run side by side."""

    kernel: str | None
    pages_per_block: int = 1
    k_splits: int = 1
    num_warps: int = 4
    num_stages: int = 2
    interpret: bool = False
    note: str = ""


PAGED_BLOCK_TOKENS = 128  # tokens of one block of the paged kernel at most: JAX's default 8 pages of 16


def _largest_divisor(n: int, limit: int) -> int:
    return max(d for d in range(1, max(1, min(n, limit)) + 1) if n % d == 0)


def paged_decode(setting: str, page_size: int, pages_per_row: int, head_dim: int,
                 device: devices.Device | None = None) -> PagedDecode:
    """The paged decode kernel for `setting` ("auto": the kernel where the device has one that fits; "on": the
    kernel, or `KernelUnsupported`; "off": none) with pages of `page_size` tokens, `pages_per_row` table entries per
    row and this head dim. On a CPU "on" runs the GPU kernel in interpret mode (slow; for tests)."""
    device = device or devices.current()
    if setting not in PAGED_SETTINGS:
        raise KernelUnsupported(f"paged kernel setting {setting!r}; expected one of {PAGED_SETTINGS}")
    if setting == "off":
        return PagedDecode(None, note="off")
    per_block = _largest_divisor(pages_per_row, max(1, PAGED_BLOCK_TOKENS // page_size))
    splits = _largest_divisor(pages_per_row // per_block, 16)
    if device.platform == "tpu":
        return PagedDecode("mosaic", per_block, 1, interpret=device.interpret)
    if device.platform == "cpu" and not device.simulated:
        if setting == "auto":
            return PagedDecode(None, note="no paged kernel on a CPU (setting 'on' runs it in interpret mode)")
        return PagedDecode("triton", per_block, splits, interpret=True)
    why = None
    if not device.at_least(8, 0):
        why = "the Triton paged kernel needs an NVIDIA GPU of sm80 or newer"
    else:
        padded = 1 << max(4, (head_dim - 1).bit_length())
        budget = 0.9 * device.shared_memory
        block = per_block * page_size
        # keys and values of a block, multi-buffered, plus the 16-row query block
        stages = next((s for s in (2, 1) if 2 * padded * (2 * s * block + 16) <= budget), None)
        if stages is None:
            why = (f"a {page_size}-token page's keys and values ({block} x {head_dim}) do not fit the "
                   f"{device.shared_memory >> 10} KiB of shared memory")
    if why:
        if setting == "on":
            raise KernelUnsupported(f"the paged decode kernel cannot run on {device.describe()}: {why}; use 'auto' "
                                    f"or 'off'")
        return PagedDecode(None, note=why)
    return PagedDecode("triton", per_block, splits, 4 if head_dim <= 64 else 8, stages, interpret=device.interpret)


# ------------------------------------------------------------------------------------------ lowered programs
@dataclasses.dataclass(frozen=True)
class KernelCall:
    """One kernel custom call of a lowered program (StableHLO text): its target, a name (the Triton kernel's, or
    cuDNN's forward / backward), its operands' shapes, and for cuDNN attention the segments per row it packs."""

    target: str
    name: str
    operands: tuple[tuple[int, ...], ...]
    packed_segments: int = 1

    @property
    def family(self) -> str:
        if self.target.startswith("__cudnn$fmha"):
            return "cudnn"
        if "triton" in self.target:
            return "triton"
        if self.target == "tpu_custom_call":
            return "mosaic"
        return "other"


_CALL = re.compile(r"stablehlo\.custom_call @([\w$.]+)\(")
_SIGNATURE = re.compile(r":\s*\(([^()]*)\)\s*->")
_TENSOR = re.compile(r"tensor<([\dx]*?)x?([a-z]+\d*)>")


def kernel_calls(text: str) -> list[KernelCall]:
    """The kernel calls of a lowered program's StableHLO text (`jit(f).trace(...).lower(...).as_text()`)."""
    calls = []
    for line in text.splitlines():
        m = _CALL.search(line)
        if not m or not (m.group(1).startswith("__cudnn$") or "triton" in m.group(1)
                         or m.group(1) == "tpu_custom_call"):
            continue
        sig = _SIGNATURE.search(line[m.end():])
        operands = tuple(tuple(int(d) for d in dims.split("x") if d) if dims else ()
                         for dims, _ in _TENSOR.findall(sig.group(1))) if sig else ()
        name = re.search(r'name = "([^"]+)"', line)
        segments = re.search(r"max_seg_per_batch\\22: (\d+)", line)
        calls.append(KernelCall(m.group(1), name.group(1) if name else m.group(1), operands,
                                int(segments.group(1)) if segments else 1))
    return calls


def unsupported_kernels(text: str, device: devices.Device) -> list[str]:
    """Why each kernel call of a lowered program cannot run on `device` (empty: every kernel can): cuDNN attention
    needs an NVIDIA GPU from sm80 with cuDNN, its packed layout sm90 and cuDNN >= 9.6; Triton kernels need an
    NVIDIA GPU from sm80; Mosaic kernels a TPU."""
    problems = []
    for call in kernel_calls(text):
        if call.family == "cudnn":
            if not device.at_least(8, 0) or device.cudnn_version is None:
                problems.append(f"{call.target}: cuDNN attention on {device.describe()}")
            elif call.packed_segments > 1 and (not device.at_least(9, 0)
                                               or device.cudnn_version < CUDNN_PACKED_MIN_VERSION):
                problems.append(f"{call.target}: cuDNN's packed layout ({call.packed_segments} segments per row) "
                                f"on {device.describe()}")
        elif call.family == "triton" and not device.at_least(8, 0):
            problems.append(f"{call.name}: a Triton kernel on {device.describe()}")
        elif call.family == "mosaic" and device.platform != "tpu":
            problems.append(f"{call.name}: a Mosaic TPU kernel on {device.describe()}")
    return problems


def square_operands(text: str, length: int) -> list[str]:
    """Kernel calls that take a dense [.., T, T] operand (a mask or bias over `length` tokens), as 'target: shape'."""
    return [f"{call.target}: {list(shape)}" for call in kernel_calls(text) for shape in call.operands
            if len(shape) == 4 and shape[2] == shape[3] == length]
