import json

import pytest
import torch

from engine.training.params import params_sha256
from engine.training.state import load_state, pack, pack_state, tensors_of
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


def test_the_backbone_hashes_parameters_as_peers_do_without_torch():
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.LayerNorm(3))
    optimizer = torch.optim.AdamW(model.parameters())
    model(torch.randn(2, 4)).sum().backward()
    optimizer.step()
    index, payload = pack_state(model, optimizer, 5, "p")
    state = decode_file(encode_file(index, payload))
    assert state.params_sha256() == params_sha256(model) == state.meta.params_sha256


def test_a_state_file_loads_into_a_fresh_model_and_optimizer():
    model = torch.nn.Linear(4, 3)
    optimizer = torch.optim.AdamW(model.parameters())
    model(torch.randn(2, 4)).sum().backward()
    optimizer.step()
    state = decode_file(encode_file(*pack_state(model, optimizer, 9, "p")))
    fresh = torch.nn.Linear(4, 3)
    fresh_optimizer = torch.optim.AdamW(fresh.parameters())
    assert load_state(state, fresh, fresh_optimizer, "p") == 9
    assert params_sha256(fresh) == params_sha256(model)
    moments = fresh_optimizer.state[fresh.weight]["exp_avg"], optimizer.state[model.weight]["exp_avg"]
    assert torch.equal(*moments)
    with pytest.raises(ProtocolError, match="project"):
        load_state(state, fresh, fresh_optimizer, "q")


@pytest.mark.parametrize(
    "change, reason",
    [
        ({"offset": 10**9}, "beyond the end"),
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


def test_a_tensor_named_twice_is_refused():
    index, payload = pack([("w", torch.randn(2)), ("w", torch.randn(2))], META)
    with pytest.raises(ProtocolError, match="twice"):
        StateFile(index, memoryview(payload))


@pytest.mark.parametrize("data", [b"", b"garbage" * 10, b"COTRAIN-STATE\0\x01\xff\xff\xff\xff"])
def test_files_that_are_not_state_files_are_refused(data):
    with pytest.raises(ProtocolError):
        decode_file(data)
