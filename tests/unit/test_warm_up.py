"""A peer's warm-up micro-batch leaves nothing behind: the state it will sync over, its
gradients and the process's random stream are as they were."""

import torch

from engine.peer.training_loop import warm_up
from engine.tasks import create_task, initial_model
from tests.collab.harness import TINY


def test_the_warm_up_leaves_parameters_buffers_gradients_and_randomness_as_they_were():
    task = create_task("demo-lm", dict(TINY), None)
    model = initial_model(task, 7)
    model.register_buffer("seen", torch.zeros(3))  # stands for batch norm's running statistics

    def count(module, inputs) -> None:
        module.seen.add_(1)

    model.register_forward_pre_hook(count)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    rng = torch.random.get_rng_state()
    warm_up(task, model, "fp32", seed=1)
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())
    assert all(p.grad is None for p in model.parameters())
    assert torch.equal(torch.random.get_rng_state(), rng)
