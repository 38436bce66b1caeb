"""Every message kind of every channel: it survives the wire, and whatever bytes arrive instead
(random, truncated, hostile fields, deep nesting, another release's) are refused with
ProtocolError and a reason -- never another exception."""

import json

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine.governor.limits import Limits
from engine.project import Catalog
from engine.wire import WIRE_VERSION, ProtocolError, control, frames, rest
from engine.wire.codec import Codec, encode
from engine.wire.tensors import StateIndex
from engine.worker import protocol
from tests.wire_values import structs_of, valid

API_BODIES = [cls for cls in vars(rest).values()
              if isinstance(cls, type) and issubclass(cls, msgspec.Struct)
              and cls.__module__ == rest.__name__]
CHANNELS: dict[str, Codec] = {
    "peer -> backbone": control.from_peer,
    "backbone -> peer": control.from_backbone,
    "frame headers": frames.headers,
    "app -> worker": protocol.commands,
    "worker -> app": protocol.events,
    "state file index": Codec(StateIndex, "index", 1 << 20),
    "catalog": Codec(Catalog, "catalog", 1 << 20),
    "limits": Codec(Limits, "limits", 1 << 20),
    **{f"HTTP {cls.__name__}": rest.reply_codec(cls) for cls in API_BODIES},
}
KINDS = [(channel, cls) for channel, codec in CHANNELS.items() for cls in structs_of(codec._decoder.type)]
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4),
    max_leaves=20,
)
PROPERTY = settings(max_examples=20, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much,
                                           HealthCheck.data_too_large])


def test_every_channel_has_its_kinds():
    kinds = {channel: {cls.__name__ for c, cls in KINDS if c == channel} for channel in CHANNELS}
    assert kinds["peer -> backbone"] >= {"Progress", "SyncRequest", "Ready", "RoundDone", "Signal", "Ping"}
    assert kinds["backbone -> peer"] >= {"SyncPlan", "RoundStart", "Step", "Resync", "Status", "IceServers"}
    assert kinds["frame headers"] >= {"Part", "Result", "StateRequest", "StateReply", "Goodbye"}
    assert kinds["worker -> app"] >= {"Hello", "Stats", "EpochCompleted", "GovernorDecided", "Problem"}
    assert len(KINDS) > 60


@pytest.mark.parametrize("channel, kind", KINDS, ids=[f"{c}: {k.__name__}" for c, k in KINDS])
@PROPERTY
@given(data=st.data())
def test_every_message_kind_round_trips_and_is_refused_truncated(channel, kind, data):
    message = data.draw(valid(kind))
    encoded = encode(message)
    assert CHANNELS[channel].decode(encoded) == message
    cut = data.draw(st.integers(0, len(encoded) - 1))
    with pytest.raises(ProtocolError):
        CHANNELS[channel].decode(encoded[:cut])


@pytest.mark.parametrize("channel", CHANNELS)
@PROPERTY
@given(raw=st.binary(max_size=300))
def test_random_bytes_raise_only_protocol_error(channel, raw):
    try:
        CHANNELS[channel].decode(raw)
    except ProtocolError as exc:
        assert str(exc)


@pytest.mark.parametrize("channel, kind", KINDS, ids=[f"{c}: {k.__name__}" for c, k in KINDS])
@settings(max_examples=15, deadline=None)
@given(fields=st.dictionaries(st.text(max_size=12), json_values, max_size=8), data=st.data())
def test_hostile_fields_are_refused_or_read_as_the_kind_claimed(channel, kind, fields, data):
    """A message of a real kind with fields of any JSON shape (some of them real names)."""
    real = {f: data.draw(json_values) for f in kind.__struct_fields__ if data.draw(st.booleans())}
    tag = {"type": kind.__struct_config__.tag} if kind.__struct_config__.tag else {}
    try:
        message = CHANNELS[channel].decode(json.dumps({**fields, **real, **tag}))
    except ProtocolError as exc:
        assert str(exc)
    else:
        assert isinstance(message, kind)


def test_bounds_are_checked_with_a_reason():
    cases = [
        ('{"type":"progress","epoch":-1,"samples":1,"samples_per_second":1}', "epoch"),
        ('{"type":"progress","epoch":1,"samples":1,"samples_per_second":NaN}', "not valid JSON"),
        ('{"type":"progress","epoch":1,"samples":1,"samples_per_second":1e400}', "out of range"),
        ('{"type":"progress","epoch":true,"samples":1,"samples_per_second":1}', "int"),
        ('{"type":"progress","epoch":1}', "samples"),
        ('{"type":"launch_missiles"}', "launch_missiles"),
        ('{"type":"ready","epoch":1,"state_sha256":"not a hash"}', "state_sha256"),
        ('{"type":"sync_request","exclude":["' + "x" * 65 + '"]}', "exclude"),
        ('{"type":"signal","peer":"b","data":{"kind":"offer","conn":"c","sdp":"' + "s" * 40_000 + '"}}',
         "sdp"),
        ('{"type":"signal","peer":"b","data":{"kind":"hello","conn":"c","sdp":""}}', "kind"),
        ("[]", "object"),
    ]
    for text, reason in cases:
        with pytest.raises(ProtocolError, match=reason):
            control.from_peer.decode(text)


def test_a_peer_may_not_speak_for_the_backbone():
    start = control.RoundStart(7, 1, ["a", "b"], [1.0, 1.0], 30.0)
    assert control.from_backbone.decode(encode(start)) == start
    with pytest.raises(ProtocolError, match="round_start"):
        control.from_peer.decode(encode(start))


def test_round_start_cross_checks_its_fields():
    for group, shares, reason in ((["a", "a"], [1, 1], "twice"), (["a"], [1, 1], "equal length"),
                                  (["a", "b"], [0, 0], "positive sum")):
        text = json.dumps({"type": "round_start", "round_id": 1, "epoch": 0, "group": group, "shares": shares,
                           "timeout": 5})
        with pytest.raises(ProtocolError, match=reason):
            control.from_backbone.decode(text)


def test_another_release_is_told_who_must_update():
    older = json.dumps({"type": "progress", "epoch": 1, "samples": 1, "samples_per_second": 1.0,
                        "v": WIRE_VERSION - 1})
    with pytest.raises(ProtocolError, match=rf"please update Cotrain \(wire v{WIRE_VERSION - 1}, "
                                            rf"backbone speaks v{WIRE_VERSION}\)"):
        control.from_peer.decode(older)
    newer = json.dumps({"type": "status", "epoch": 1, "v": WIRE_VERSION + 1})
    with pytest.raises(ProtocolError, match="please update Cotrain"):
        control.from_backbone.decode(newer)


def test_deep_nesting_and_huge_messages_are_refused():
    deep = '{"type":"ping","nonce":1,"x":' + "[" * 50_000 + "]" * 50_000 + "}"
    with pytest.raises(ProtocolError):
        control.from_peer.decode(deep)
    huge = '{"type":"ping","nonce":1,"x":"' + "a" * control.MAX_CONTROL_MESSAGE + '"}'
    with pytest.raises(ProtocolError, match="larger than"):
        control.from_peer.decode(huge)


def test_numbers_written_as_integers_read_as_floats():
    msg = control.from_peer.decode('{"type":"progress","epoch":1,"samples":2,"samples_per_second":3}')
    assert msg == control.Progress(1, 2, 3.0) and isinstance(msg.samples_per_second, float)
