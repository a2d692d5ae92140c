"""`training.tensorboard`: the event files it writes, read back with tensorboardX's own protos and CRC-32C."""

import struct

import pytest
from tensorboardX.crc32c import crc32c as reference_crc32c
from tensorboardX.proto.event_pb2 import Event

from sweet_jax.training.tensorboard import ScalarWriter, crc32c


def read_events(path: str) -> list[Event]:
    """Every record of a TFRecord event file, its two masked CRC-32Cs checked with tensorboardX's implementation."""
    def masked(data: bytes) -> int:
        crc = reference_crc32c(data)
        return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF

    events, data = [], open(path, "rb").read()
    while data:
        header, data = data[:12], data[12:]
        (n,), (header_crc,) = struct.unpack("<Q", header[:8]), struct.unpack("<I", header[8:])
        assert header_crc == masked(header[:8])
        record, (record_crc,), data = data[:n], struct.unpack("<I", data[n:n + 4]), data[n + 4:]
        assert record_crc == masked(record)
        events.append(Event.FromString(record))
    return events


def test_crc32c_matches_the_reference_on_the_standard_check_value_and_random_bytes():
    import random

    assert crc32c(b"123456789") == 0xE3069283  # CRC-32C's published check value
    rng = random.Random(0)
    for n in (0, 1, 7, 64, 1000):
        data = bytes(rng.randrange(256) for _ in range(n))
        assert crc32c(data) == reference_crc32c(data)


def test_scalars_read_back_with_their_tags_steps_and_values(tmp_path):
    writer = ScalarWriter(str(tmp_path / "tb"))
    writer.add_scalar("train/loss", 0.6931, 10)
    writer.add_scalar("eval/accuracy", 1.0, 300)
    writer.add_scalar("train/loss", -2.5e-3, 2**40)  # a step past 32 bits takes a long varint
    writer.close()
    assert writer.path.startswith(str(tmp_path / "tb" / "events.out.tfevents."))
    events = read_events(writer.path)
    assert events[0].file_version == "brain.Event:2"
    got = [(e.step, v.tag, v.simple_value) for e in events[1:] for v in e.summary.value]
    assert got == [(10, "train/loss", pytest.approx(0.6931)), (300, "eval/accuracy", 1.0),
                   (2**40, "train/loss", pytest.approx(-2.5e-3))]
    assert all(e.wall_time > 1.7e9 for e in events)
    with pytest.raises(ValueError, match="steps are >= 0"):
        ScalarWriter(str(tmp_path / "tb")).add_scalar("x", 1.0, -1)
