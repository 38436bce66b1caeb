"""A project may keep weight decay off biases and normalization weights (BERT's and
sahajBERT's recipe): their values then move by their gradients alone, and the state with
two parameter groups travels between peers and checks out as one group's did."""

import pytest
import torch

from engine.project import OptimizerSpec
from engine.training.lr_schedule import build_optimizer
from engine.training.state import load_state, pack_state, state_sha256
from engine.wire.tensors import decode_file, encode_file


def small_model(seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.LayerNorm(5), torch.nn.Linear(5, 2))


def one_step(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
    model(torch.ones(3, 6)).sum().backward()
    for p in model.parameters():
        p.grad.zero_()  # (no gradient: what moves a weight is its decay alone)
    optimizer.step()


@pytest.mark.parametrize("name", ["adamw", "sgd", "lamb"])
def test_without_decay_on_norms_and_biases_only_matrices_shrink(name):
    spec = OptimizerSpec(name=name, lr=0.1, weight_decay=0.5, decay_norms_and_biases=False)
    model = small_model()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    one_step(model, build_optimizer(spec, model.parameters()))
    for key, value in model.state_dict().items():
        if value.ndim > 1:
            assert value.abs().sum() < before[key].abs().sum(), key
        else:
            assert torch.equal(value, before[key]), key
    everyone = small_model()
    decayed = OptimizerSpec(name=name, lr=0.1, weight_decay=0.5)
    one_step(everyone, build_optimizer(decayed, everyone.parameters()))
    assert not torch.equal(everyone[0].bias, before["0.bias"]), "by default every parameter decays"


def test_a_state_of_two_groups_loads_into_another_peer_and_hashes_alike():
    spec = OptimizerSpec(lr=0.01, weight_decay=0.1, decay_norms_and_biases=False)
    model = small_model()
    optimizer = build_optimizer(spec, model.parameters())
    assert [len(g["params"]) for g in optimizer.param_groups] == [2, 4]
    for _ in range(3):
        model(torch.randn(4, 6)).pow(2).sum().backward()
        optimizer.step()
        optimizer.zero_grad()
    state = decode_file(encode_file(*pack_state(model, optimizer, 3, "p")))
    joiner = small_model(seed=1)
    theirs = build_optimizer(spec, joiner.parameters())
    assert load_state(state, joiner, theirs, "p") == 3
    assert state_sha256(joiner, theirs, 3) == state_sha256(model, optimizer, 3) == state.meta.state_sha256
    assert [g["weight_decay"] for g in theirs.param_groups] == [0.1, 0.0]
