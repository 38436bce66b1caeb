"""A project may train with LAMB, sahajBERT's large-batch optimizer: each weight tensor
moves by the learning rate times its own length, however large or small its gradient, and
its state travels to a joiner and checks out as Adam's does."""

import msgspec
import pytest
import torch

from engine.project import ProjectSpec
from engine.training.lr_schedule import collaboration_optimizer
from engine.training.state import load_state, pack_state, state_sha256
from engine.wire import ProtocolError
from engine.wire.tensors import decode_file, encode_file


def project(**optimizer) -> ProjectSpec:
    return msgspec.convert({"id": "p", "title": "P", "task": "t",
                            "optimizer": {"name": "lamb", "lr": 0.01, **optimizer}}, ProjectSpec)


def model(seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 3))


def test_each_tensor_steps_the_learning_rate_times_its_own_length_whatever_its_gradient():
    net = model()
    optimizer = collaboration_optimizer(project(weight_decay=0.0), net)
    before = [p.detach().clone() for p in net.parameters()]
    for scale, param in zip([1e-4, 1.0, 1e3, 1e-2], net.parameters(), strict=True):
        param.grad = torch.randn_like(param) * scale
    optimizer.step()
    for old, new in zip(before, net.parameters(), strict=True):
        moved = float((new.detach() - old).norm())
        assert moved == pytest.approx(0.01 * float(old.norm()), rel=1e-4)


def test_training_with_lamb_lowers_the_loss():
    net = model()
    optimizer = collaboration_optimizer(project(lr=0.02), net)
    x = torch.randn(256, 8)
    y = x[:, :3] * 2 - x[:, 3:6]

    def loss() -> torch.Tensor:
        return torch.nn.functional.mse_loss(net(x), y)

    first = float(loss())
    for _ in range(100):
        optimizer.zero_grad()
        loss().backward()
        optimizer.step()
    assert float(loss()) < first / 4


def test_a_lamb_state_reaches_a_joiner_whole_and_a_foreign_slot_is_refused():
    spec = project(weight_decay=0.1, decay_norms_and_biases=False)
    net = model()
    optimizer = collaboration_optimizer(spec, net)
    for _ in range(3):
        net(torch.randn(4, 8)).pow(2).sum().backward()
        optimizer.step()
        optimizer.zero_grad()
    state = decode_file(encode_file(*pack_state(net, optimizer, 3, "p")))
    joiner = model(seed=1)
    theirs = collaboration_optimizer(spec, joiner)
    assert load_state(state, joiner, theirs, "p") == 3
    assert state_sha256(joiner, theirs, 3) == state_sha256(net, optimizer, 3) == state.meta.state_sha256
    optimizer.state[next(net.parameters())]["momentum_buffer"] = torch.zeros(16, 8)
    foreign = decode_file(encode_file(*pack_state(net, optimizer, 3, "p")))
    with pytest.raises(ProtocolError, match="bad optimizer state entry"):
        load_state(foreign, model(seed=2), collaboration_optimizer(spec, model(seed=2)), "p")
