import pytest
import torch

from engine.wire import ProtocolError
from engine.wire.tensors import decode_file, encode_file, pack, unpack


def test_bundle_roundtrip_keeps_every_dtype_and_shape():
    tensors = {
        "w": torch.randn(3, 4),
        "h": torch.randn(5).half(),
        "step": torch.tensor(7.0),
        "ids": torch.arange(6, dtype=torch.int64).reshape(2, 3),
        "empty": torch.zeros(0, 3),
    }
    index, payload = pack(tensors.items(), {"epoch": 3})
    bundle = decode_file(encode_file(index, payload))
    assert bundle.meta == {"epoch": 3}
    for name, tensor in tensors.items():
        assert torch.equal(bundle.tensors[name], tensor) and bundle.tensors[name].dtype == tensor.dtype


@pytest.mark.parametrize(
    "mutate",
    [
        lambda e: e.update(offset=10**9),
        lambda e: e.update(nbytes=e["nbytes"] + 4),
        lambda e: e.update(dtype="object"),
        lambda e: e.update(shape=[-1]),
        lambda e: e.update(shape="big"),
        lambda e: e.update(name=None),
    ],
)
def test_forged_indexes_are_refused(mutate):
    index, payload = pack([("w", torch.randn(4))], {})
    mutate(index["tensors"][0])
    with pytest.raises(ProtocolError):
        unpack(index, payload)


@pytest.mark.parametrize("data", [b"", b"garbage" * 10, b"COTRAIN-STATE\0\x01\xff\xff\xff\xff"])
def test_files_that_are_not_state_files_are_refused(data):
    with pytest.raises(ProtocolError):
        decode_file(data)
