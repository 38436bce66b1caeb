import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.averaging.compression import BLOCK, decode, encode, encoded_size, error_bound
from engine.averaging.recheck import part_digest, recheck, result_digest
from engine.averaging.robust import Contribution, aggregate
from engine.project import AggregationSpec
from engine.wire.commitments import Committed

METHODS = ["fp16", "uint8"]


@pytest.mark.parametrize("method, ratio", [("none", 1.0), ("fp16", 2.0), ("uint8", 4.0)])
def test_sizes_shrink_two_and_about_four_times(method, ratio):
    n = 1_000_000
    assert 4 * n / encoded_size(n, method) == pytest.approx(ratio, rel=0.01)
    assert len(encode(torch.randn(n), method)) == encoded_size(n, method)


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 3 * BLOCK + 5), st.floats(1e-6, 1e6), st.integers(0, 2**31), st.sampled_from(METHODS))
def test_decoding_lands_within_the_stated_bound_and_is_the_same_bits_everywhere(n, scale, seed, method):
    values = torch.randn(n, generator=torch.Generator().manual_seed(seed)) * scale
    payload = encode(values, method)
    decoded = decode(payload, n, method)
    assert decoded.dtype == torch.float32 and decoded.numel() == n
    assert float((decoded - values).norm()) <= error_bound(values, method) * (1 + 1e-6) + 1e-30
    assert torch.equal(decode(bytes(payload), n, method), decoded)


def test_sums_of_many_samples_do_not_overflow_half_precision():
    big = torch.full((3000,), 1e6)  # gradient x samples: far beyond fp16's 65504
    decoded = decode(encode(big, "fp16"), 3000, "fp16")
    assert torch.isfinite(decoded).all()
    torch.testing.assert_close(decoded, big, rtol=1e-3, atol=0)


@pytest.mark.parametrize("method", METHODS)
def test_a_payload_that_cannot_be_the_part_is_refused(method):
    n = 2000
    payload = bytearray(encode(torch.randn(n), method))
    with pytest.raises(ValueError, match="bytes"):
        decode(payload[:-1], n, method)
    payload[-4:] = torch.tensor([math.nan]).numpy().tobytes()  # the last block's scale or step
    with pytest.raises(ValueError, match="not finite"):
        decode(payload, n, method)
    payload[-4:] = torch.tensor([-1.0]).numpy().tobytes()
    with pytest.raises(ValueError, match="negative"):
        decode(payload, n, method)


@pytest.mark.parametrize("method", METHODS)
def test_a_checker_passes_an_honest_compressed_result_and_catches_a_shaded_one(method):
    parts = [torch.randn(5000) * (i + 1) for i in range(3)]
    inputs = [(Committed(sender=f"p{i}", samples=4, sha256=part_digest(4, v)), v)
              for i, v in enumerate(parts)]
    spec = AggregationSpec()
    exact = aggregate([Contribution(c.sender, v, c.samples) for c, v in inputs], spec, 10**9).values
    honest = decode(encode(exact, method), exact.numel(), method)
    assert recheck(inputs, honest, result_digest(honest), spec, 10**9, method).ok
    shaded = honest * 1.05
    verdict = recheck(inputs, shaded, result_digest(shaded), spec, 10**9, method)
    assert not verdict.ok and "away from the average" in verdict.reason
