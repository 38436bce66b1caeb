import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.wire import ProtocolError
from engine.wire.messages import (
    CONTROL_TYPES,
    Progress,
    RoundStart,
    SyncPlan,
    decode,
    encode,
)

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4),
    max_leaves=20,
)


def test_messages_survive_the_wire():
    start = RoundStart(5, 3, ["a", "b"], [1.0, 1.0], 30.0, "a")
    assert decode(encode(start)) == start
    plan = decode(encode(SyncPlan(4, "peer", peer="b")))
    assert plan.peer == "b" and plan.checkpoint is None


@pytest.mark.parametrize(
    "payload, message",
    [
        ({"v": 1, "type": "progress", "epoch": "3", "samples": 1, "samples_per_second": 1.0}, "integer"),
        ({"v": 1, "type": "progress", "epoch": -1, "samples": 1, "samples_per_second": 1.0}, "negative"),
        ({"v": 1, "type": "progress", "epoch": 1}, "missing field"),
        ({"v": 2, "type": "progress"}, "version"),
        ({"v": 1, "type": "launch_missiles"}, "unknown message type"),
        ({"v": 1, "type": "round_start", "round_id": 1, "epoch": 0, "group": ["a", "a"],
          "shares": [1, 1], "timeout": 5}, "twice"),
        ({"v": 1, "type": "progress", "epoch": True, "samples": 1, "samples_per_second": 1.0}, "integer"),
        ({"v": 1, "type": "ice_servers", "servers": [{"urls": []}]}, "needs urls"),
        ({"v": 1, "type": "ice_servers", "servers": [{"urls": "turn:x", "credential": 5}]}, "strings"),
        ({"v": 1, "type": "ice_servers", "servers": ["stun:x"]}, "expected an object"),
    ],
)
def test_bad_messages_are_refused_with_a_reason(payload, message):
    with pytest.raises(ProtocolError, match=message):
        decode(json.dumps(payload))


def test_non_finite_numbers_are_refused():
    text = '{"v":1,"type":"progress","epoch":1,"samples":1,"samples_per_second":NaN}'
    with pytest.raises(ProtocolError, match="finite"):
        decode(text)


@given(st.sampled_from(sorted(CONTROL_TYPES)), st.dictionaries(st.text(max_size=12), json_values, max_size=8))
@settings(max_examples=400)
def test_hostile_fields_only_ever_raise_protocol_error(kind, fields):
    try:
        msg = decode(json.dumps({"v": 1, "type": kind, **fields}))
    except ProtocolError as exc:
        assert str(exc)  # refused with a reason a log reader can use
    else:
        assert isinstance(msg, CONTROL_TYPES[kind])  # accepted only as the message it claims to be


def test_progress_accepts_integers_for_floats():
    msg = decode('{"v":1,"type":"progress","epoch":1,"samples":2,"samples_per_second":3}')
    assert msg == Progress(1, 2, 3.0)
