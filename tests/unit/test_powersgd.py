"""PowerSGD's tensor work without a network (engine/averaging/powersgd.py): the layout, the
bits every member computes alike whatever its CPU, threads or arrival order, how close
rank r comes, and error feedback carrying what compression left out into later steps."""

import itertools
import math
import random
import struct

import pytest
import torch

from engine.averaging.powersgd import (
    DEPENDENT,
    Layout,
    bases,
    compression_ratio,
    decompress,
    dot,
    orthonormal,
    outer_sum,
    project,
    rademacher,
    residual,
    sketch,
    starting_q,
)
from engine.averaging.round_plan import RoundPlan
from engine.averaging.tensor_parts import TensorPartReducer
from engine.project import AggregationSpec

SHAPES = [(64, 32), (64,), (48, 8, 3, 3), (4, 3), (5,)]  # a conv and a too-small matrix among them


def low_rank(rows: int, cols: int, rank: int, noise: float, g: torch.Generator) -> torch.Tensor:
    return (torch.randn(rows, rank, generator=g) @ torch.randn(rank, cols, generator=g)
            + noise * torch.randn(rows, cols, generator=g))


def gradient(layout: Layout, g: torch.Generator, noise: float = 0.1) -> torch.Tensor:
    """A flat gradient sum whose matrices are nearly of rank 3, as gradients often are."""
    flat = torch.randn(layout.numel, generator=g)
    for mat in layout.matrices:
        layout.m(flat, mat).copy_(low_rank(mat.rows, mat.cols, 3, noise, g))
    return flat


def step_of(layout: Layout, sums: list[torch.Tensor], samples: list[int], epoch: int = 0,
            order: list[int] | None = None, spec: AggregationSpec | None = None) -> tuple:
    """One PowerSGD step of several members, as the round runs it: each phase's vector
    reduced by a reducer (in group order, whatever order the parts come in), P^ and the
    step computed by each member from the results. Returns (step, [residuals])."""
    names = [f"m{i}" for i in range(len(sums))]
    order = order if order is not None else list(range(len(sums)))
    plan = RoundPlan(1, epoch, names, [1.0] * len(names), names[0], aggregation=spec or AggregationSpec())
    reducer = TensorPartReducer(plan)
    q0 = rademacher(layout, 7, epoch)
    sketches = [sketch(layout, m, q0) for m in sums]
    p_avg = reducer.reduce(0, {names[i]: (sketches[i], samples[i], 0.0) for i in order}).values
    basis = bases(layout, p_avg)
    qs = [project(layout, m, basis) for m in sums]
    q_avg = reducer.reduce(0, {names[i]: (qs[i], samples[i], 0.0) for i in order}).values
    step = decompress(layout, p_avg, basis, q_avg)
    return step, [residual(layout, m.clone(), basis, q) for m, q in zip(sums, qs, strict=True)]


def test_the_layout_compresses_the_matrices_rank_r_shrinks_and_sends_the_rest_whole():
    layout = Layout.of(SHAPES, rank=2)
    assert layout.numel == sum(math.prod(s) for s in SHAPES)
    assert [(m.rows, m.cols) for m in layout.matrices] == [(64, 32), (48, 72)]
    assert [p.numel for p in layout.plain] == [64, 12, 5]  # 2 * (4 + 3) >= 12: whole
    assert layout.p_numel == 2 * (64 + 48) + 64 + 12 + 5 and layout.q_numel == 2 * (32 + 72)
    assert compression_ratio(layout) > 5
    assert not Layout.of([(7,), (2, 2)], rank=1).compressed  # 1 * (2 + 2) >= 4


def test_q0_is_plus_or_minus_one_the_same_for_a_seed_and_epoch_and_new_for_the_next_epoch():
    layout = Layout.of(SHAPES, rank=4)
    first, again, later = rademacher(layout, 3, 5), rademacher(layout, 3, 5), rademacher(layout, 3, 6)
    for a, b, c in zip(first, again, later, strict=True):
        assert torch.equal(a, b) and not torch.equal(a, c)
        assert set(a.unique().tolist()) == {-1.0, 1.0}
    ones = torch.cat([q.view(-1) for q in first]).eq(1).float().mean()
    assert 0.4 < float(ones) < 0.6


def test_orthonormal_columns_and_the_same_bits_as_a_reference_in_plain_python():
    g = torch.Generator().manual_seed(0)
    p = torch.randn(300, 4, generator=g) * 1e3
    p[:, 3] = p[:, 0] * 2  # dependent: nothing left once the others are removed, but rounding
    out = orthonormal(p)
    gram = out[:, :3].double().T @ out[:, :3].double()
    torch.testing.assert_close(gram, torch.eye(3, dtype=torch.float64), atol=1e-6, rtol=0)
    assert not out[:, 3].any()
    assert torch.equal(out, reference_orthonormal(p))
    near = p.clone()
    near[:, 3] = p[:, 0] * 2 + torch.randn(300, generator=g) * 10  # nearly dependent, yet not: kept
    out = orthonormal(near)
    gram = out.double().T @ out.double()
    torch.testing.assert_close(gram, torch.eye(4, dtype=torch.float64), atol=1e-6, rtol=0)
    assert torch.equal(out, reference_orthonormal(near))


def reference_orthonormal(p: torch.Tensor) -> torch.Tensor:
    """The same algorithm on Python floats alone: no torch kernel, no vector unit."""
    rows, rank = p.shape
    out: list[list[float]] = []
    for j in range(rank):
        v = [float(x) for x in p[:, j].tolist()]
        before = math.fsum(a * a for a in v)
        for _ in range(2):
            for u in out:
                c = math.fsum(a * b for a, b in zip(v, u, strict=True))
                if c != 0.0:
                    v = [f32(a - b * c) for a, b in zip(v, u, strict=True)]
        squared = math.fsum(a * a for a in v)
        if math.isfinite(squared) and squared > 0.0 and squared > DEPENDENT**2 * before:
            inv = 1.0 / math.sqrt(squared)
            out.append([f32(a * inv) for a in v])
        else:
            out.append([0.0] * rows)
    return torch.tensor(out, dtype=torch.float32).T.contiguous()


def f32(x: float) -> float:
    return struct.unpack("f", struct.pack("f", x))[0]


def test_a_rank_beyond_the_gradients_own_gives_orthonormal_columns_or_none():
    """Rank 8 on a rank-4 matrix: the last four columns of P hold only rounding once the
    first four are taken out; they become zeros, not noise blown up to length 1."""
    g = torch.Generator().manual_seed(10)
    m = low_rank(256, 192, 4, 0.0, g)
    layout = Layout.of([(256, 192)], rank=8)
    basis = bases(layout, sketch(layout, m.view(-1), rademacher(layout, 1, 0)))[0]
    kept = basis[:, basis.norm(dim=0) > 0]
    assert kept.shape[1] == 4
    gram = kept.double().T @ kept.double()
    torch.testing.assert_close(gram, torch.eye(4, dtype=torch.float64), atol=1e-6, rtol=0)
    q = project(layout, m.view(-1), [basis])
    step = decompress(layout, torch.zeros(layout.p_numel), [basis], q)
    assert float((step - m.view(-1)).norm() / m.norm()) < 1e-5


def test_a_basis_and_a_step_are_the_same_bits_whatever_the_threads_or_the_order_parts_came_in():
    layout = Layout.of(SHAPES, rank=4)
    g = torch.Generator().manual_seed(1)
    sums = [gradient(layout, g) * n for n in (3, 5, 8)]
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one, _ = step_of(layout, sums, [3, 5, 8], order=[0, 1, 2])
        torch.set_num_threads(max(threads, 2))
        other, _ = step_of(layout, sums, [3, 5, 8], order=[2, 0, 1])
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(one, other)


def test_dot_is_correctly_rounded_whatever_the_order():
    g = torch.Generator().manual_seed(2)
    a, b = torch.randn(10_001, generator=g) * 1e4, torch.randn(10_001, generator=g)
    shuffled = list(range(a.numel()))
    random.Random(0).shuffle(shuffled)
    index = torch.tensor(shuffled)
    assert dot(a, b) == dot(a[index], b[index])


def test_outer_sum_in_blocks_is_the_same_bits_as_at_once(monkeypatch):
    g = torch.Generator().manual_seed(3)
    p, q = torch.randn(50, 3, generator=g), torch.randn(40, 3, generator=g)
    whole = torch.empty(50, 40)
    outer_sum(p, q, whole)
    monkeypatch.setattr("engine.averaging.powersgd.OUTER_CHUNK", 7 * 40)
    blocked = torch.empty(50, 40)
    outer_sum(p, q, blocked)
    assert torch.equal(whole, blocked)
    torch.testing.assert_close(whole, p @ q.T)


def test_a_higher_rank_comes_closer_to_the_average_gradient():
    g = torch.Generator().manual_seed(4)
    shapes = [(96, 80)]
    errors = []
    for rank in (1, 2, 4, 8, 16):
        layout = Layout.of(shapes, rank)
        g.manual_seed(4)
        common = low_rank(96, 80, 6, 0.0, g)  # what the members' gradients share
        sums = [(common + 0.3 * torch.randn(96, 80, generator=g)).view(-1) * 4 for _ in range(3)]
        step, _ = step_of(layout, sums, [4, 4, 4])
        exact = sum(sums) / 12
        errors.append(float((step - exact).norm() / exact.norm()))
    assert all(later < earlier for earlier, later in itertools.pairwise(errors)), errors
    assert errors[-1] < 0.2 < errors[0]


def test_the_values_of_1d_tensors_are_averaged_exactly_and_leave_no_residual():
    layout = Layout.of(SHAPES, rank=2)
    g = torch.Generator().manual_seed(5)
    sums = [gradient(layout, g) * 2, gradient(layout, g) * 6]
    step, residuals = step_of(layout, sums, [2, 6])
    for part in layout.plain:
        window = slice(part.offset, part.offset + part.numel)
        torch.testing.assert_close(step[window], (sums[0][window] + sums[1][window]) / 8)
        assert all(not r[window].any() for r in residuals)


def test_each_members_residual_is_what_its_own_compression_left_out():
    layout = Layout.of([(40, 30)], rank=2)
    g = torch.Generator().manual_seed(6)
    sums = [gradient(layout, g) for _ in range(2)]
    step, residuals = step_of(layout, sums, [1, 1])
    # With equal weights the step is the members' mean minus the mean of what each left out.
    torch.testing.assert_close(step, (sums[0] + sums[1] - residuals[0] - residuals[1]) / 2,
                               atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("feedback", [True, False])
def test_error_feedback_makes_the_applied_steps_add_up_to_the_gradients(feedback):
    """Steps x samples, summed over rounds, approach the gradient sums brought: what rank 1
    leaves out of one step is sent in the next (without feedback it is lost for good)."""
    layout = Layout.of([(60, 50), (60,)], rank=1)
    g = torch.Generator().manual_seed(7)
    trend = gradient(layout, g)  # what the gradients share from step to step, noise aside
    kept = [torch.zeros(layout.numel) for _ in range(3)]
    applied, brought, gaps = torch.zeros(layout.numel), torch.zeros(layout.numel), []
    for epoch in range(60):
        grads = [(trend + 0.5 * gradient(layout, g)) * 4 for _ in range(3)]
        sums = [gr + e for gr, e in zip(grads, kept, strict=True)] if feedback else grads
        step, residuals = step_of(layout, sums, [4, 4, 4], epoch=epoch)
        if feedback:
            kept = residuals
        applied += step * 12
        brought += sum(grads)
        gaps.append(float((applied - brought).norm() / brought.norm()))
    if feedback:
        assert gaps[-1] < 0.1 and gaps[-1] < gaps[9] / 3, gaps[::10]
    else:
        assert gaps[-1] > 0.3, gaps[::10]


def test_a_poisoned_sketch_can_turn_the_step_but_never_against_the_gradient():
    """A minority's P decides the subspace the step lies in, not its length or sign: with
    honest Qs the step is the honest average projected onto that subspace."""
    layout = Layout.of([(64, 48)], rank=2)
    g = torch.Generator().manual_seed(8)
    honest = [gradient(layout, g) for _ in range(3)]
    mean = sum(honest) / 3
    for trial in range(20):
        bad_p = torch.randn(layout.p_numel, generator=g) * 10 ** (trial % 5)
        basis = bases(layout, bad_p)
        q_avg = sum(project(layout, m, basis) for m in honest) / 3
        step = decompress(layout, bad_p, basis, q_avg)
        assert float(step @ mean) >= 0 and float(step.norm()) <= float(mean.norm()) * (1 + 1e-5)


def poisoned_basis_error(method: str) -> float:
    """How far a P-poisoner among four honest members turns P^ (the sine of the largest
    angle between the honest basis and the one the round arrives at)."""
    layout = Layout.of([(64, 48)], rank=2)
    g = torch.Generator().manual_seed(9)
    common = gradient(layout, g, noise=0.0)
    honest = [common + 0.05 * torch.randn(layout.numel, generator=g) for _ in range(4)]
    q0 = rademacher(layout, 1, 0)
    sketches = [sketch(layout, m, q0) for m in honest]
    # The poisoner's sketch is as long as an honest one (so no norm check leaves it out)
    # and points where the honest ones do not.
    length = float(sketches[0].norm())
    bad = torch.randn(layout.p_numel, generator=g)
    bad = bad / bad.norm() * length
    names = ["h0", "h1", "h2", "h3", "x"]
    plan = RoundPlan(1, 0, names, [1.0] * 5, "h0", aggregation=AggregationSpec(method=method))
    arrived = {n: (s * 4, 4, 0.0) for n, s in zip(names, [*sketches, bad], strict=True)}
    p_avg = TensorPartReducer(plan).reduce(0, arrived).values
    clean = bases(layout, sum(sketches) / 4)[0].double()
    got = bases(layout, p_avg)[0].double()
    return float(torch.linalg.matrix_norm(got - clean @ (clean.T @ got), ord=2))


def test_centered_clip_keeps_a_poisoned_sketch_from_turning_the_basis():
    assert poisoned_basis_error("centered_clip") < 0.5 * poisoned_basis_error("mean")


def test_q0_starts_from_the_warm_q_a_state_holds_and_draws_only_its_dead_columns_afresh():
    layout = Layout.of(SHAPES, rank=3)
    fresh = rademacher(layout, 7, 2)
    warm = [torch.full((mat.cols, 3), 0.5) for mat in layout.matrices]
    warm[0][:, 1] = 0.0  # a basis column dropped as dependent left this column at zero
    q0 = starting_q(layout, [warm[0], None], 7, 2)
    assert torch.equal(q0[0][:, 0], warm[0][:, 0]) and torch.equal(q0[0][:, 2], warm[0][:, 2])
    assert torch.equal(q0[0][:, 1], fresh[0][:, 1]), "a zero column would stay zero for ever"
    assert torch.equal(q0[1], fresh[1])
    other = torch.ones(layout.matrices[1].cols, 3, dtype=torch.float64)
    wrong = starting_q(layout, [torch.ones(2, 3), other], 7, 2)
    assert all(torch.equal(a, b) for a, b in zip(wrong, fresh, strict=True)), \
        "a wrong shape or type is not warm"


def test_a_warm_start_tracks_a_persistent_gradient_subspace_a_fresh_q0_misses(report_figure):
    """Vogels et al.'s warm start: four members whose gradients share a rank-4 trend under
    noise, rank 4, twenty steps. From the last step's Q the step comes within a few
    percent of the best rank-4 approximation (the SVD's); from a fresh Q0 each step it
    stays far off."""
    layout = Layout.of([(256, 192)], rank=4)
    g = torch.Generator().manual_seed(1)
    trend = low_rank(256, 192, 4, 0.0, g).reshape(-1)
    errors, best = {}, []
    for warm in (False, True):
        g.manual_seed(5)
        held, errs = [None], []
        for epoch in range(20):
            sums = [(trend + 0.5 * torch.randn(layout.numel, generator=g)) * 4 for _ in range(4)]
            exact = sum(sums) / 16
            q0 = starting_q(layout, held if warm else [None], 7, epoch)
            p_avg = sum(sketch(layout, m, q0) for m in sums) / 16
            basis = bases(layout, p_avg)
            q_avg = sum(project(layout, m, basis) for m in sums) / 16
            step = decompress(layout, p_avg, basis, q_avg)
            held = [layout.q(q_avg, mat).clone() for mat in layout.matrices]
            errs.append(float((step - exact).norm() / exact.norm()))
            if warm:
                u, sv, v = torch.linalg.svd(exact.view(256, 192), full_matrices=False)
                optimum = (u[:, :4] * sv[:4]) @ v[:4]
                best.append(float((optimum.reshape(-1) - exact).norm() / exact.norm()))
        errors[warm] = sum(errs[5:]) / 15
    optimum = sum(best[5:]) / 15
    report_figure(f"rank 4, steps 6-20: relative error fresh Q0 {errors[False]:.3f}, "
                  f"warm {errors[True]:.3f}, best rank-4 {optimum:.3f}")
    assert errors[True] <= 1.1 * optimum
    assert errors[False] >= 2 * errors[True]


def test_a_warm_q_near_the_largest_float_starts_a_finite_sketch_in_the_same_directions():
    """A wrong reducer in an undrawn round can leave a finite but huge average Q in the
    state; the next round's sketches must not overflow (every honest part would be left
    out, every round after)."""
    layout = Layout.of(SHAPES, rank=3)
    g = torch.Generator().manual_seed(3)
    huge = [torch.randn(mat.cols, 3, generator=g) * 1e38 for mat in layout.matrices]
    q0 = starting_q(layout, huge, 7, 2)
    for held, q in zip(huge, q0, strict=True):
        assert bool(((q.abs().amax(dim=0) >= 0.5) & (q.abs().amax(dim=0) < 1)).all())
        assert torch.equal(torch.sign(q), torch.sign(held))  # scaled by powers of two only
    assert bool(torch.isfinite(sketch(layout, gradient(layout, g) * 1e3, q0)).all())
