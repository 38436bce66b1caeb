import contextlib
import os

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.wire import ProtocolError
from engine.wire.frames import Goodbye, Header, Part, StateReply
from engine.wire.framing import MAX_CHUNK, Reassembler, encode

PART = Part(round_id=3, epoch=1, index=0, samples=8, loss_sum=2.5)


def _roundtrip(payload: bytes, header: Header) -> list:
    reassembler = Reassembler(max_payload=1 << 30)
    frames = []
    for chunk in encode(7, header, payload):
        assert len(chunk) <= MAX_CHUNK
        frame, _ = reassembler.feed(chunk)
        if frame is not None:
            frames.append(frame)
    return frames


@pytest.mark.parametrize("size", [0, 1, MAX_CHUNK - 100, MAX_CHUNK, 3 * MAX_CHUNK + 17])
def test_messages_of_any_size_come_back_whole(size):
    payload = os.urandom(size)
    (frame,) = _roundtrip(payload, PART)
    assert frame.header == PART
    assert bytes(frame.payload) == payload


def test_interleaved_messages_are_reassembled_separately():
    a, b = os.urandom(2 * MAX_CHUNK), os.urandom(3 * MAX_CHUNK)
    header_a, header_b = PART, StateReply(request_id=2, epoch=1, state_sha256="0" * 64)
    chunks_a, chunks_b = list(encode(1, header_a, a)), list(encode(2, header_b, b))
    reassembler = Reassembler(max_payload=1 << 30)
    done = {}
    for i in range(max(len(chunks_a), len(chunks_b))):
        for chunks in (chunks_a, chunks_b):
            if i < len(chunks):
                frame, _ = reassembler.feed(chunks[i])
                if frame:
                    done[type(frame.header).__name__] = bytes(frame.payload)
    assert done == {"Part": a, "StateReply": b}


def test_progress_is_reported_while_a_message_arrives():
    reassembler = Reassembler(max_payload=1 << 30)
    seen = []
    for chunk in encode(1, PART, os.urandom(3 * MAX_CHUNK)):
        _, incoming = reassembler.feed(chunk)
        if incoming:
            seen.append(incoming.received / incoming.expected)
    assert seen == sorted(seen) and 0 < seen[0] < 1


def test_oversized_payload_is_refused_before_any_allocation():
    reassembler = Reassembler(max_payload=1000)
    first = next(encode(1, PART, b"x" * 2000))
    with pytest.raises(ProtocolError, match="exceeds"):
        reassembler.feed(first)


def test_a_message_longer_than_declared_is_refused():
    chunks = list(encode(1, PART, b"x" * (MAX_CHUNK * 2)))
    reassembler = Reassembler(max_payload=1 << 30)
    reassembler.feed(chunks[0])
    forged = chunks[1][:8] + b"y" * MAX_CHUNK * 2
    with pytest.raises(ProtocolError):
        reassembler.feed(forged)


@given(st.binary(max_size=2048))
@settings(max_examples=300)
def test_garbage_raises_protocol_error_and_nothing_else(blob):
    reassembler = Reassembler(max_payload=1 << 20)
    with contextlib.suppress(ProtocolError):
        reassembler.feed(blob)


def test_wrong_version_is_named_in_the_error():
    chunk = bytearray(next(encode(1, Goodbye(), b"")))
    chunk[2] = 99
    with pytest.raises(ProtocolError, match="wire v99"):
        Reassembler(1 << 20).feed(bytes(chunk))


def test_a_header_that_is_no_frame_kind_is_refused_at_the_first_chunk():
    chunk = bytearray(next(encode(1, Goodbye(), b"")))
    forged = bytes(chunk).replace(b'"goodbye"', b'"goodbyX"')
    with pytest.raises(ProtocolError, match="goodbyX"):
        Reassembler(1 << 20).feed(forged)


def test_a_peer_may_have_only_a_few_messages_under_way():
    reassembler = Reassembler(max_payload=1 << 30, max_open=4)
    for msg_id in range(4):
        reassembler.feed(next(encode(msg_id, PART, b"x" * (2 * MAX_CHUNK))))
    with pytest.raises(ProtocolError, match="too many messages"):
        reassembler.feed(next(encode(99, PART, b"x" * (2 * MAX_CHUNK))))


def test_messages_under_way_together_hold_a_bounded_number_of_bytes():
    """Each within the per-message cap, but not all of them at once."""
    reassembler = Reassembler(max_payload=3 * MAX_CHUNK, max_open=4, max_buffered=4 * MAX_CHUNK)
    chunks = [list(encode(msg_id, PART, b"x" * (3 * MAX_CHUNK))) for msg_id in range(3)]
    with pytest.raises(ProtocolError, match="more than"):
        for step in range(3):
            for message in chunks:
                reassembler.feed(message[step])


def test_bytes_are_released_as_messages_complete():
    reassembler = Reassembler(max_payload=3 * MAX_CHUNK, max_open=4, max_buffered=4 * MAX_CHUNK)
    for msg_id in range(10):
        frames = [reassembler.feed(chunk)[0] for chunk in encode(msg_id, PART, b"x" * (3 * MAX_CHUNK))]
        assert frames[-1] is not None
    assert reassembler.open == 0
