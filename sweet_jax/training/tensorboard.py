"""TensorBoard scalars without TensorBoard: an event file (`events.out.tfevents.*`) of TFRecords holding `Event`
protos, written by hand. Importing tensorboardX imports torch whenever torch is installed (4 s of every training
job's start on a CPU); this writes the same file format with the standard library alone. Imports no JAX.

    writer = ScalarWriter("runs/x/tb")
    writer.add_scalar("train/loss", 0.69, step=10)
    writer.close()

The record framing is TFRecord's (length, masked CRC-32C of the length, data, masked CRC-32C of the data); an
`Event` is {1: wall_time (double), 2: step (int64), 3: file_version (string), 5: summary}; a `Summary` holds
values {1: tag, 2: simple_value (float)}.
"""

from __future__ import annotations

import os
import socket
import struct
import time


def _crc32c_table() -> list[int]:
    table = []
    for n in range(256):
        c = n
        for _ in range(8):
            c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
        table.append(c)
    return table


_TABLE = _crc32c_table()


def crc32c(data: bytes) -> int:
    """CRC-32C (Castagnoli), as TFRecord frames its records."""
    crc = 0xFFFFFFFF
    for b in data:
        crc = _TABLE[(crc ^ b) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


def _masked_crc(data: bytes) -> int:
    crc = crc32c(data)
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte, n = n & 0x7F, n >> 7
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _field(number: int, payload: bytes) -> bytes:
    """A length-delimited protobuf field (a string or a message)."""
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def _event(step: int, *, file_version: str = "", summary: bytes = b"") -> bytes:
    out = b"\x09" + struct.pack("<d", time.time()) + b"\x10" + _varint(step)
    if file_version:
        out += _field(3, file_version.encode())
    if summary:
        out += _field(5, summary)
    return out


def _scalar(tag: str, value: float) -> bytes:
    return _field(1, _field(1, tag.encode()) + b"\x15" + struct.pack("<f", value))


class ScalarWriter:
    """Appends scalars to a new event file in `logdir` (made if missing), flushed after every `add_scalar`."""

    def __init__(self, logdir: str):
        os.makedirs(logdir, exist_ok=True)
        name = f"events.out.tfevents.{int(time.time())}.{socket.gethostname()}.{os.getpid()}"
        self.path = os.path.join(logdir, name)
        self._fh = open(self.path, "ab")
        self._write(_event(0, file_version="brain.Event:2"))

    def _write(self, record: bytes) -> None:
        length = struct.pack("<Q", len(record))
        crcs = struct.pack("<I", _masked_crc(length)), struct.pack("<I", _masked_crc(record))
        self._fh.write(length + crcs[0] + record + crcs[1])
        self._fh.flush()

    def add_scalar(self, tag: str, value: float, step: int) -> None:
        if step < 0:
            raise ValueError(f"TensorBoard step {step} of {tag!r}: steps are >= 0")
        self._write(_event(int(step), summary=_scalar(tag, float(value))))

    def close(self) -> None:
        self._fh.close()
