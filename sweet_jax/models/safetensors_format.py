"""The safetensors file format, read and written without torch: a validating, mmap-backed reader (bf16 included,
which safetensors' numpy API lacks) and an atomic writer that materialises one tensor at a time. The home of the
format for HF checkpoints (`hf_checkpoint`) and PEFT adapters (`lora`).
"""

from __future__ import annotations

import dataclasses
import json
import os
import struct
from typing import Callable

import ml_dtypes
import numpy as np

from sweet_jax.files.atomic import atomic_file

_ST_DTYPES = {
    "F64": np.dtype(np.float64),
    "F32": np.dtype(np.float32),
    "F16": np.dtype(np.float16),
    "BF16": np.dtype(ml_dtypes.bfloat16),
    "I64": np.dtype(np.int64),
    "I32": np.dtype(np.int32),
    "I16": np.dtype(np.int16),
    "I8": np.dtype(np.int8),
    "U8": np.dtype(np.uint8),
    "BOOL": np.dtype(np.bool_),
}
_ST_NAMES = {v: k for k, v in _ST_DTYPES.items()}


class CheckpointError(ValueError):
    """A checkpoint that is missing, corrupt, or does not match the config. The message names file and tensor."""


# --------------------------------------------------------------------------------------------- safetensors format
class SafetensorsFile:
    """Minimal, validating, mmap-backed safetensors reader (supports bf16, which safetensors' numpy API does not)."""

    def __init__(self, path: str):
        self.path = path
        try:
            size = os.path.getsize(path)
            with open(path, "rb") as fh:
                head = fh.read(8)
                if len(head) < 8:
                    raise CheckpointError(f"{path}: corrupt safetensors file: shorter than its 8-byte header length")
                (n,) = struct.unpack("<Q", head)
                if n > size - 8:
                    raise CheckpointError(f"{path}: corrupt safetensors file: header length {n} exceeds file size {size}")
                raw = fh.read(n)
        except FileNotFoundError:
            raise CheckpointError(f"{path}: file not found") from None
        try:
            header = json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise CheckpointError(f"{path}: corrupt safetensors file: header is not valid JSON ({e})") from None
        if not isinstance(header, dict):
            raise CheckpointError(f"{path}: corrupt safetensors file: header is not a JSON object")
        self.metadata = header.pop("__metadata__", None) or {}
        self._data_start = 8 + n
        data_len = size - self._data_start
        self._entries: dict[str, tuple[np.dtype, tuple[int, ...], int, int]] = {}
        for name, info in header.items():
            try:
                dtype = _ST_DTYPES[info["dtype"]]
                shape = tuple(int(s) for s in info["shape"])
                begin, end = (int(o) for o in info["data_offsets"])
            except (KeyError, TypeError, ValueError):
                raise CheckpointError(f"{path}: tensor '{name}': malformed header entry {info!r}") from None
            expected = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
            if end - begin != expected or begin < 0 or end > data_len:
                raise CheckpointError(
                    f"{path}: tensor '{name}': corrupt data offsets [{begin}, {end}) for shape {shape} "
                    f"{info['dtype']} in a data section of {data_len} bytes (truncated file?)")
            self._entries[name] = (dtype, shape, begin, end)
        self._mmap = None

    def keys(self) -> list[str]:
        return list(self._entries)

    def shape(self, name: str) -> tuple[int, ...]:
        return self._entries[name][1]

    def get(self, name: str) -> np.ndarray:
        """A read-only memory-mapped view of one tensor (no copy)."""
        if self._mmap is None:
            self._mmap = np.memmap(self.path, dtype=np.uint8, mode="r")
        dtype, shape, begin, end = self._entries[name]
        start = self._data_start + begin
        return self._mmap[start:start + (end - begin)].view(dtype).reshape(shape)


def write_safetensors(path: str, tensors: dict[str, np.ndarray | "LazyTensor"],
                      metadata: dict[str, str] | None = None) -> None:
    """Write tensors atomically. Values are numpy arrays or `LazyTensor`s, materialised one at a time while writing."""
    specs = [t if isinstance(t, LazyTensor) else LazyTensor(tuple(t.shape), np.dtype(t.dtype), lambda t=t: t)
             for t in tensors.values()]
    header: dict = {"__metadata__": dict(metadata or {"format": "pt"})}
    offset = 0
    for name, spec in zip(tensors, specs):
        if spec.dtype not in _ST_NAMES:
            raise CheckpointError(f"{path}: tensor '{name}': dtype {spec.dtype} cannot be stored in safetensors")
        header[name] = {"dtype": _ST_NAMES[spec.dtype], "shape": list(spec.shape),
                        "data_offsets": [offset, offset + spec.nbytes]}
        offset += spec.nbytes
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)  # align the data section to 8 bytes
    with atomic_file(path, "wb") as fh:
        fh.write(struct.pack("<Q", len(raw)))
        fh.write(raw)
        for name, spec in zip(tensors, specs):
            arr = np.ascontiguousarray(spec.make())
            if arr.shape != spec.shape or arr.dtype != spec.dtype:
                raise CheckpointError(f"{path}: tensor '{name}': produced {arr.shape} {arr.dtype}, "
                                      f"declared {spec.shape} {spec.dtype}")
            fh.write(arr.tobytes())


@dataclasses.dataclass(frozen=True)
class LazyTensor:
    shape: tuple[int, ...]
    dtype: np.dtype
    make: Callable[[], np.ndarray]

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) * self.dtype.itemsize
