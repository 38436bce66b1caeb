import json

import pytest
import torch

from engine.training.state import contents, load_state, pack, pack_state, state_sha256, tensors_of
from engine.wire import ProtocolError
from engine.wire.tensors import FILE_MAGIC, ITEM_SIZES, StateFile, StateMeta, decode_file, encode_file

META = StateMeta(3, "p", "0" * 64)


def test_state_files_keep_every_dtype_and_shape():
    tensors = {
        "w": torch.randn(3, 4),
        "h": torch.randn(5).half(),
        "step": torch.tensor(7.0),
        "ids": torch.arange(6, dtype=torch.int64).reshape(2, 3),
        "empty": torch.zeros(0, 3),
    }
    index, payload = pack(list(tensors.items()), META)
    state = decode_file(encode_file(index, payload))
    assert state.meta == META
    loaded = tensors_of(state)
    for name, tensor in tensors.items():
        assert torch.equal(loaded[name], tensor) and loaded[name].dtype == tensor.dtype


def test_every_dtype_the_format_names_has_a_size():
    from engine.training.state import DTYPES

    assert set(DTYPES) == set(ITEM_SIZES)
    for name, size in ITEM_SIZES.items():
        assert torch.empty((), dtype=DTYPES[name]).element_size() == size


def test_the_backbone_hashes_a_state_as_peers_do_without_torch():
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.LayerNorm(3))
    optimizer = torch.optim.AdamW(model.parameters())
    model(torch.randn(2, 4)).sum().backward()
    optimizer.step()
    index, payload = pack_state(model, optimizer, 5, "p")
    state = decode_file(encode_file(index, payload))
    assert state.state_sha256() == state_sha256(model, optimizer, 5) == state.meta.state_sha256


def test_a_state_file_loads_into_a_fresh_model_and_optimizer():
    model = torch.nn.Linear(4, 3)
    optimizer = torch.optim.AdamW(model.parameters())
    model(torch.randn(2, 4)).sum().backward()
    optimizer.step()
    state = decode_file(encode_file(*pack_state(model, optimizer, 9, "p")))
    fresh = torch.nn.Linear(4, 3)
    fresh_optimizer = torch.optim.AdamW(fresh.parameters())
    assert load_state(state, fresh, fresh_optimizer, "p") == 9
    assert state_sha256(fresh, fresh_optimizer, 9) == state_sha256(model, optimizer, 9)
    moments = fresh_optimizer.state[fresh.weight]["exp_avg"], optimizer.state[model.weight]["exp_avg"]
    assert torch.equal(*moments)
    with pytest.raises(ProtocolError, match="project"):
        load_state(state, fresh, fresh_optimizer, "q")


@pytest.mark.parametrize(
    "change, reason",
    [
        ({"offset": 10**9}, "out of place"),
        ({"nbytes": 20}, "does not fit its shape"),
        ({"dtype": "object"}, "dtype"),
        ({"shape": [-1]}, "shape"),
        ({"shape": "big"}, "shape"),
        ({"name": None}, "name"),
    ],
)
def test_forged_indexes_are_refused(change, reason):
    index, payload = pack([("w", torch.randn(4))], META)
    data = encode_file(index, payload)
    head = len(FILE_MAGIC) + 1  # then the index's length, then the index
    parsed = json.loads(data[head + 4 : head + 4 + int.from_bytes(data[head : head + 4], "big")])
    parsed["tensors"][0].update(change)
    forged = json.dumps(parsed).encode()
    with pytest.raises(ProtocolError, match=reason):
        decode_file(data[:head] + len(forged).to_bytes(4, "big") + forged + bytes(payload))


@pytest.mark.parametrize("value", [2**63, -(2**63) - 1, 2**64])
def test_a_number_the_hash_cannot_hold_is_refused(value):
    """A donor's optimizer step count past 64 bits would crash whoever hashes it."""
    index, payload = pack([("w", torch.randn(4))], META)
    data = encode_file(index, payload)
    head = len(FILE_MAGIC) + 1
    parsed = json.loads(data[head + 4 : head + 4 + int.from_bytes(data[head : head + 4], "big")])
    parsed["meta"]["numbers"]["optimizer/step"] = value
    forged = json.dumps(parsed).encode()
    with pytest.raises(ProtocolError, match="numbers"):
        decode_file(data[:head] + len(forged).to_bytes(4, "big") + forged + bytes(payload))


def test_a_tensor_named_twice_is_refused():
    index, payload = pack([("w", torch.randn(2)), ("w", torch.randn(2))], META)
    with pytest.raises(ProtocolError, match="twice"):
        StateFile(index, memoryview(payload))


@pytest.mark.parametrize("data", [b"", b"garbage" * 10, b"COTRAIN-STATE\0\x01\xff\xff\xff\xff"])
def test_files_that_are_not_state_files_are_refused(data):
    with pytest.raises(ProtocolError):
        decode_file(data)


def trained(epoch_steps: int = 1):
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 3)
    optimizer = torch.optim.AdamW(model.parameters())
    for _ in range(epoch_steps):
        model(torch.randn(2, 4)).sum().backward()
        optimizer.step()
    return model, optimizer


def test_the_state_hash_covers_optimizer_state_and_epoch_not_just_parameters():
    """A donor that serves the right weights with forged moments, or another epoch's state,
    is caught by the hash a joiner checks."""
    model, optimizer = trained()
    digest = state_sha256(model, optimizer, 1)
    assert state_sha256(model, optimizer, 2) != digest
    optimizer.state[model.weight]["exp_avg"].mul_(2)
    assert state_sha256(model, optimizer, 1) != digest


def forged_state(change) -> StateFile:
    """A state of ``trained()`` whose tensors and numbers ``change`` edits, packed as a donor
    would send it (its own hash in the meta: only the contents are wrong)."""
    model, optimizer = trained()
    tensors, numbers = contents(model, optimizer)
    named = dict(tensors)
    change(named, numbers)
    index, payload = pack(list(named.items()), StateMeta(1, "p", "0" * 64, numbers))
    return decode_file(encode_file(index, payload))


@pytest.mark.parametrize("change, reason", [
    (lambda t, n: t.update({"optim/0/exp_avg": torch.tensor(0.0)}), "wrong shape"),
    (lambda t, n: t["optim/0/exp_avg_sq"].fill_(float("nan")), "not finite"),
    (lambda t, n: t["optim/1/exp_avg_sq"].fill_(-1.0), "negative"),
    (lambda t, n: t.pop("optim/1/exp_avg"), "some of a parameter's slots"),
    (lambda t, n: t.update({"optim/0/momentum": torch.zeros(3, 4)}), "bad optimizer state entry"),
    (lambda t, n: t.update({"optim/7/exp_avg": torch.zeros(3)}), "bad optimizer state entry"),
    (lambda t, n: t.update({"optim/0/exp_avg": torch.zeros(3, 4, dtype=torch.float64)}),
     "wrong shape or type"),
    (lambda t, n: t.update({"model/weight": torch.zeros(4, 3)}), "wrong shape"),
    (lambda t, n: t.pop("model/bias"), "does not match this project's model"),
])
def test_a_state_that_would_crash_or_corrupt_a_joiner_is_refused_untouched(change, reason):
    state = forged_state(change)
    model, optimizer = trained(epoch_steps=2)
    before = state_sha256(model, optimizer, 2)
    with pytest.raises(ProtocolError, match=reason):
        load_state(state, model, optimizer, "p")
    assert state_sha256(model, optimizer, 2) == before


def test_bytes_after_the_last_tensor_are_refused():
    index, payload = pack([("w", torch.randn(4))], META)
    with pytest.raises(ProtocolError, match="beyond its tensors"):
        StateFile(index, memoryview(bytes(payload) + b"x" * 1000))
