"""PowerSGD's tensor work (Vogels, Karimireddy, Jaggi 2019): pure functions, no network.

Each trainable parameter of two or more dimensions that rank ``r`` makes smaller is viewed
as a matrix M (rows: its first dimension; columns: the rest). With E the peer's error
feedback, in gradient-sum units like the accumulator's:

    M <- G + E                                 (local)
    P_i = M Q0                                 phase P all-reduces [P_i ..., 1-D values ...]
    P^ = orthonormal(avg P)                    on every peer: the same bits (below)
    Q_i = M^T P^                               phase Q all-reduces [Q_i ...]
    step = P^ (avg Q)^T                        on every peer: the same bits (below)
    E <- M - P^ Q_i^T                          (local: this peer's own compression error)

Parameters that rank r would not shrink (1-D tensors: biases, norms; small matrices)
travel whole in phase P and need no error feedback.

Same bits everywhere. The averaged P and Q are results of the all-reduce: each part is
reduced once and everyone applies its bytes. What every peer then computes from them must
not depend on its CPU, its thread count or its torch version (``torch>=2.2`` is all the
project pins): ``orthonormal`` forms each dot product as exact float64 products of fp32
values summed by ``math.fsum`` (correctly rounded, so order-free), and everything else
is one IEEE operation per element (multiply, add, subtract; no matmul, no reduction,
nothing torch may fuse). What a peer computes only for itself (P_i, Q_i, E) may round
as its CPU likes: nobody else needs those bits.

Q0 is the last step's average Q (Vogels et al.'s warm start: one power iteration per
step then tracks the gradient's slowly turning subspace; on a rank-4 trend under noise,
rank 4 came as close as the SVD's best, 0.11 relative error, against 0.34 from a fresh
random Q0 each step). Every holder of a state holds the same bits of it: it travels with
the state, as a slot of each matrix's optimizer state (engine/training/state.py), and a
joiner downloads it with the rest. Where there is none yet (epoch 0, a column that died
out), Q0 is Rademacher (+-1) from SHAKE-256 of (project seed, epoch): exact in fp32 and
the same on every machine, unlike torch's generators, whose streams may change between
releases.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from engine.project import ProjectSpec

OUTER_CHUNK = 1 << 20  # elements of a matrix formed at once by ``outer_sum``: bounds its temporaries
# A column of P with less than this share of its length outside the earlier columns' span
# is taken as dependent on them (fp32 rounding leaves about 1e-6 of it).
DEPENDENT = 1e-4


@dataclass(frozen=True)
class Matrix:
    """A parameter compressed as a matrix: where it lies in the flat gradient, and where
    its P and Q lie in the phases' vectors."""

    param: int  # which parameter (of the shapes the layout was made from)
    offset: int  # in the flat gradient
    rows: int
    cols: int
    p_offset: int  # of its P (rows x rank, row-major) in phase P's vector
    q_offset: int  # of its Q (cols x rank, row-major) in phase Q's vector

    @property
    def numel(self) -> int:
        return self.rows * self.cols


@dataclass(frozen=True)
class Plain:
    """A parameter that travels whole in phase P."""

    offset: int  # in the flat gradient
    numel: int
    p_offset: int  # in phase P's vector


@dataclass(frozen=True)
class Layout:
    """How the flat gradient (trainable parameters in order, each flattened) maps onto the
    two phases' vectors. Derived from shapes alone, so an auxiliary peer that holds no
    model builds the same one from the task built on the meta device."""

    numel: int
    rank: int
    matrices: tuple[Matrix, ...]
    plain: tuple[Plain, ...]
    p_numel: int
    q_numel: int

    @classmethod
    def of(cls, shapes: Sequence[Sequence[int]], rank: int) -> Layout:
        if rank < 1:
            raise ValueError("PowerSGD's rank is at least 1")
        matrices: list[Matrix] = []
        plain: list[tuple[int, int]] = []
        offset = p = q = 0
        for index, shape in enumerate(shapes):
            n = math.prod(shape)
            rows = shape[0] if len(shape) >= 2 else 0
            cols = n // rows if rows else 0
            # Worth it only if P and Q together are smaller than M (which also means the
            # rank is below both sides, so P^ can have orthonormal columns).
            if rows and rank * (rows + cols) < rows * cols:
                matrices.append(Matrix(index, offset, rows, cols, p, q))
                p, q = p + rows * rank, q + cols * rank
            else:
                plain.append((offset, n))
            offset += n
        plains = []
        for start, n in plain:  # 1-D values come after every matrix's P
            plains.append(Plain(start, n, p))
            p += n
        return cls(offset, rank, tuple(matrices), tuple(plains), p, q)

    def warm_shapes(self) -> dict[int, tuple[int, int]]:
        """The shape of each compressed parameter's warm Q, by parameter index."""
        return {mat.param: (mat.cols, self.rank) for mat in self.matrices}

    @property
    def compressed(self) -> bool:
        """Whether any parameter is compressed (if not, phase Q is empty and skipped)."""
        return bool(self.matrices)

    def m(self, flat: torch.Tensor, mat: Matrix) -> torch.Tensor:
        return flat[mat.offset:mat.offset + mat.numel].view(mat.rows, mat.cols)

    def p(self, p_vector: torch.Tensor, mat: Matrix) -> torch.Tensor:
        return p_vector[mat.p_offset:mat.p_offset + mat.rows * self.rank].view(mat.rows, self.rank)

    def q(self, q_vector: torch.Tensor, mat: Matrix) -> torch.Tensor:
        return q_vector[mat.q_offset:mat.q_offset + mat.cols * self.rank].view(mat.cols, self.rank)


def warm_shapes_of(project: ProjectSpec, params: Sequence[torch.nn.Parameter]) -> dict[int, tuple[int, int]]:
    """The warm Q slots a state of ``project`` holds, by index in ``params`` (its trainable
    parameters): none unless it compresses with PowerSGD."""
    if project.compression != "powersgd":
        return {}
    return Layout.of([tuple(p.shape) for p in params], project.powersgd.rank).warm_shapes()


def rademacher(layout: Layout, seed: int, epoch: int) -> list[torch.Tensor]:
    """Q0 for each matrix (cols x rank): +-1 from SHAKE-256 of the project's seed and the
    epoch, the same bits on every machine and every torch release."""
    total = sum(mat.cols for mat in layout.matrices) * layout.rank
    key = b"cotrain/powersgd/q0" + seed.to_bytes(8, "little") + epoch.to_bytes(8, "little")
    stream = hashlib.shake_256(key).digest(max(-(-total // 8), 1))
    raw = torch.frombuffer(bytearray(stream), dtype=torch.uint8)
    bits = ((raw[:, None] >> torch.arange(8, dtype=torch.uint8)) & 1).view(-1)[:total]
    signs = bits.to(torch.float32) * 2 - 1
    out, at = [], 0
    for mat in layout.matrices:
        n = mat.cols * layout.rank
        out.append(signs[at:at + n].view(mat.cols, layout.rank))
        at += n
    return out


def starting_q(layout: Layout, warm: Sequence[torch.Tensor | None], seed: int,
               epoch: int) -> list[torch.Tensor]:
    """Q0 for each matrix: the state's warm Q where it has one of the right shape, with
    any column that is all zeros (a basis column dropped as dependent leaves one, and a
    zero column would stay zero) drawn afresh; Rademacher elsewhere. Each warm column is
    scaled by a power of two to a largest magnitude in [0.5, 1): exact, and the basis does
    not depend on a column's scale, but a warm Q a wrong reducer left near fp32's largest
    value would otherwise overflow every honest sketch, every round after. Exact tests
    and operations on bits every member holds alike: every member starts from one Q0."""
    fresh = rademacher(layout, seed, epoch)
    out = []
    for mat, q, held in zip(layout.matrices, fresh, warm, strict=True):
        if held is None or tuple(held.shape) != (mat.cols, layout.rank) or held.dtype != torch.float32:
            out.append(q)
            continue
        dead = (held == 0).all(dim=0)
        largest = held.abs().amax(dim=0)
        _, exponent = torch.frexp(torch.where(dead, torch.ones_like(largest), largest))
        out.append(torch.where(dead, q, torch.ldexp(held, -exponent)))
    return out


def sketch(layout: Layout, m: torch.Tensor, q0: Sequence[torch.Tensor]) -> torch.Tensor:
    """Phase P's vector of this peer: M Q0 for each matrix, then the 1-D values as they are.
    (Local: only this peer needs its bits.)"""
    out = torch.empty(layout.p_numel, dtype=torch.float32)
    for mat, q in zip(layout.matrices, q0, strict=True):
        torch.matmul(layout.m(m, mat), q, out=layout.p(out, mat))
    for part in layout.plain:
        out[part.p_offset:part.p_offset + part.numel] = m[part.offset:part.offset + part.numel]
    return out


def bases(layout: Layout, p_avg: torch.Tensor) -> list[torch.Tensor]:
    """P^ for each matrix from the averaged phase P: the same bits on every peer."""
    return [orthonormal(layout.p(p_avg, mat)) for mat in layout.matrices]


def project(layout: Layout, m: torch.Tensor, basis: Sequence[torch.Tensor]) -> torch.Tensor:
    """Phase Q's vector of this peer: M^T P^ for each matrix. (Local.)"""
    out = torch.empty(layout.q_numel, dtype=torch.float32)
    for mat, b in zip(layout.matrices, basis, strict=True):
        torch.matmul(layout.m(m, mat).t(), b, out=layout.q(out, mat))
    return out


def decompress(layout: Layout, p_avg: torch.Tensor, basis: Sequence[torch.Tensor],
               q_avg: torch.Tensor | None) -> torch.Tensor:
    """The averaged gradient every member applies: P^ (avg Q)^T for each matrix, the 1-D
    values as phase P averaged them. The same bits on every peer."""
    out = torch.empty(layout.numel, dtype=torch.float32)
    for mat, b in zip(layout.matrices, basis, strict=True):
        assert q_avg is not None
        outer_sum(b, layout.q(q_avg, mat), layout.m(out, mat))
    for part in layout.plain:
        out[part.offset:part.offset + part.numel] = p_avg[part.p_offset:part.p_offset + part.numel]
    return out


def residual(layout: Layout, m: torch.Tensor, basis: Sequence[torch.Tensor],
             q_local: torch.Tensor) -> torch.Tensor:
    """This peer's error feedback after a round that took its parts: M - P^ Q_i^T for each
    matrix (what its own compression left out), zero where values travelled whole.
    Overwrites and returns ``m``. (Local.)"""
    for mat, b in zip(layout.matrices, basis, strict=True):
        view = layout.m(m, mat)
        view.sub_(b @ layout.q(q_local, mat).t())
    for part in layout.plain:
        m[part.offset:part.offset + part.numel] = 0.0
    return m


def dot(a: torch.Tensor, b: torch.Tensor) -> float:
    """a . b for fp32 vectors, correctly rounded to float64: each product of two fp32
    values is exact in float64 and ``math.fsum`` rounds the exact sum once, so no order,
    vector width or thread count can change a bit."""
    return math.fsum((a.double() * b.double()).tolist())


def orthonormal(p: torch.Tensor) -> torch.Tensor:
    """Modified Gram-Schmidt on the columns of ``p`` (rows x r, fp32), each column
    orthogonalised twice ("twice is enough": one pass leaves a nearly dependent column far
    from orthogonal); every scalar from ``dot``, every element from one IEEE operation in
    float64 rounded once to fp32. A column with less than DEPENDENT of its length left
    once the earlier ones are taken out becomes zeros: it carries no step rather than
    rounding noise blown up to length 1."""
    out = torch.zeros(p.shape, dtype=torch.float32)
    for j in range(p.shape[1]):
        v = p[:, j].contiguous()
        before = dot(v, v)
        for _ in range(2):
            for k in range(j):
                u = out[:, k]
                c = dot(v, u)
                if c != 0.0:
                    v = (v.double() - u.double() * c).to(torch.float32)
        squared = dot(v, v)
        if math.isfinite(squared) and squared > 0.0 and squared > DEPENDENT**2 * before:
            out[:, j] = (v.double() * (1.0 / math.sqrt(squared))).to(torch.float32)
    return out


def outer_sum(p: torch.Tensor, q: torch.Tensor, out: torch.Tensor) -> None:
    """out = p q^T as r outer products added in order, each element one fp32 multiply per
    term and one add per term after the first: the same bits anywhere. In row blocks, so
    a large matrix needs no temporary of its own size."""
    rows, rank = p.shape
    block = max(1, OUTER_CHUNK // max(q.shape[0], 1))
    qt = q.t().contiguous()  # rank x cols
    for lo in range(0, rows, block):
        hi = min(rows, lo + block)
        target = out[lo:hi]
        torch.mul(p[lo:hi, 0:1], qt[0:1], out=target)
        for j in range(1, rank):
            target.add_(p[lo:hi, j:j + 1] * qt[j:j + 1])


def compression_ratio(layout: Layout) -> float:
    """Values of the gradient per value on the wire (both phases)."""
    return layout.numel / max(layout.p_numel + layout.q_numel, 1)
