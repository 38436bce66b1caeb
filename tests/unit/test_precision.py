"""fp16 micro-batches with a loss scaler: what joins the accumulator is the fp32 gradient,
whatever the scale; an overflow adds nothing and lowers the scale."""

import torch

from engine.training.precision import INITIAL_SCALE, LossScaler, autocast


def model_and_batch():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 4))
    return model, torch.randn(8, 16), torch.randint(0, 4, (8,))


def loss_of(model, x, y, precision):
    with autocast(precision, None):
        return torch.nn.functional.cross_entropy(model(x), y, reduction="sum").float()


def test_an_overflowing_micro_batch_adds_nothing_and_halves_the_scale():
    model, x, y = model_and_batch()
    scaler = LossScaler()
    params = list(model.parameters())
    # 2^16 is past float16's largest number: the first backward pass overflows, as with
    # torch.amp.GradScaler; a few halvings later one goes through.
    assert not scaler.backward(loss_of(model, x, y, "fp16"), params)
    assert all(p.grad is None for p in params) and scaler.scale == INITIAL_SCALE / 2
    for skipped in range(2, 16):
        if scaler.backward(loss_of(model, x, y, "fp16"), params):
            break
        assert all(p.grad is None for p in params) and scaler.scale == INITIAL_SCALE / 2**skipped
    assert scaler.skipped == skipped - 1
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in params)


def test_the_unscaled_fp16_gradient_is_the_fp32_one_to_half_precision():
    model, x, y = model_and_batch()
    params = list(model.parameters())
    loss_of(model, x, y, "fp32").backward()
    exact = [p.grad.clone() for p in params]
    model.zero_grad(set_to_none=True)
    scaler = LossScaler(scale=2.0**10)
    assert scaler.backward(loss_of(model, x, y, "fp16"), params)
    assert scaler.backward(loss_of(model, x, y, "fp16"), params)  # accumulates, like .backward()
    for p, g in zip(params, exact, strict=True):
        assert p.grad.dtype == torch.float32
        torch.testing.assert_close(p.grad, 2 * g, rtol=1e-2, atol=1e-2 * float(g.abs().max()))


def test_the_scale_grows_after_clean_micro_batches():
    model, x, y = model_and_batch()
    scaler = LossScaler(scale=2.0**8, growth_interval=3)
    for _ in range(3):
        assert scaler.backward(loss_of(model, x, y, "fp16"), list(model.parameters()))
    assert scaler.scale == 2.0**9


def test_bf16_autocast_runs_the_passes_in_bfloat16_and_leaves_gradients_fp32():
    model, x, y = model_and_batch()
    with autocast("bf16", None):
        assert model(x).dtype == torch.bfloat16
    loss_of(model, x, y, "bf16").backward()
    assert all(p.grad.dtype == torch.float32 for p in model.parameters())
