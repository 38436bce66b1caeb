import itertools

import pytest
import torch

from engine.project import OptimizerSpec, ScheduleSpec
from engine.training.lr_schedule import build_optimizer, lr_at
from engine.wire import ProtocolError
from engine.wire.codec import convert


def test_warmup_ramps_up_to_the_base_rate():
    spec = ScheduleSpec(type="constant", warmup_epochs=3)
    assert [lr_at(spec, 1.0, e) for e in range(5)] == [0.25, 0.5, 0.75, 1.0, 1.0]


@pytest.mark.parametrize("kind", ["linear", "cosine"])
def test_decay_reaches_the_floor_at_the_end_and_stays(kind):
    spec = ScheduleSpec(type=kind, warmup_epochs=0, total_epochs=10, min_ratio=0.1)
    rates = [lr_at(spec, 2.0, e) for e in range(15)]
    assert rates[0] == pytest.approx(2.0)
    assert rates[10] == pytest.approx(0.2) and rates[14] == pytest.approx(0.2)
    assert all(a >= b for a, b in itertools.pairwise(rates))


@pytest.mark.parametrize("bad", [dict(name="lbfgs"), dict(lr=-1), dict(betas=[0.9]), dict(momentum=1.5)])
def test_bad_optimizer_specs_are_refused(bad):
    with pytest.raises(ProtocolError):
        convert(bad, OptimizerSpec, "optimizer")


def test_optimizers_are_built_from_specs():
    params = [torch.nn.Parameter(torch.zeros(2))]
    assert isinstance(build_optimizer(OptimizerSpec(name="sgd", momentum=0.9), params), torch.optim.SGD)
    assert isinstance(build_optimizer(OptimizerSpec(name="adamw"), params), torch.optim.AdamW)
