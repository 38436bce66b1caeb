"""DeDLOC's load balancing: how much of the vector each reducer takes, so the round ends soonest.

Pure functions over measured links, no network: the tracker calls ``balance`` for every
round it opens. A round moves, for member i with share g_i of a vector of M bytes,

    load_i = a_i * M * (1 - b_i * g_i)  +  b_i * g_i * M * (|S| - a_i)

bytes each way (a_i: it sends a gradient, b_i: it may reduce; first term its own parts out
and their results back, second the others' parts in and the results out), and lasts
max_i load_i / min(upload_i, download_i) under the fluid model. Minimising that over the
shares is a linear program (Diskin et al. 2021, section 3.2); equal links give an all-reduce,
one fat link a parameter server, peers that may not reduce (client mode, auxiliary-only
senders) give BytePS-like layouts. Latency is left out: rounds here move megabytes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

# Shares below this are dropped: the tie-break's slack leaves shares of a few millionths
# (solver noise, and in a small model a part of no element at all), and a reducer taking a
# thousandth of the vector changes the round's time by about as much.
NEGLIGIBLE_SHARE = 1e-3
# The tie-break may give up this much of the optimum for balance across reducers.
TIE_SLACK = 1e-6


@dataclass(frozen=True)
class Member:
    """What the balance needs of one member: measured bytes per second each way, and role."""

    upload: float
    download: float
    sends: bool = True  # brings a gradient (auxiliary peers do not)
    reduces: bool = True  # may take a share (client-mode and probation peers may not)

    def __post_init__(self) -> None:
        if not (self.upload > 0 and self.download > 0) or not np.isfinite([self.upload, self.download]).all():
            raise ValueError(f"bandwidth must be positive and finite, not {self.upload}/{self.download}")


@dataclass(frozen=True)
class Balance:
    shares: list[float]  # one per member, summing to 1
    seconds: float  # the round's predicted transfer time


def loads(shares: Sequence[float], members: Sequence[Member], nbytes: float) -> list[float]:
    """Bytes each member moves each way in a round with these shares."""
    senders = sum(m.sends for m in members)
    total = float(sum(shares))
    out = []
    for g, m in zip(shares, members, strict=True):
        g = g / total if m.reduces else 0.0
        out.append(m.sends * nbytes * (1 - g) + g * nbytes * (senders - m.sends))
    return out


def round_time(shares: Sequence[float], members: Sequence[Member], nbytes: float) -> float:
    """The round's transfer time under the fluid model: its most loaded link's."""
    return max((load / min(m.upload, m.download) for load, m in zip(loads(shares, members, nbytes), members,
                                                                      strict=True)), default=0.0)


def equal_shares(members: Sequence[Member]) -> list[float]:
    return [1.0 if m.reduces else 0.0 for m in members]


def balance(members: Sequence[Member], nbytes: float) -> Balance:
    """The shares that minimise the round time; raise ValueError if nobody may reduce."""
    n = len(members)
    if not any(m.reduces for m in members):
        raise ValueError("no member may reduce")
    if nbytes <= 0:
        return Balance(_normalised(equal_shares(members)), 0.0)
    # Unit vector and unit fastest link keep the LP well scaled whatever the sizes.
    scale = max(max(m.upload, m.download) for m in members)
    capacity = np.array([min(m.upload, m.download) / scale for m in members])
    sends = np.array([float(m.sends) for m in members])
    reduces = np.array([float(m.reduces) for m in members])
    # Member i's constraint: sends_i + reduces_i * (|S| - 2 sends_i) * g_i <= capacity_i * T.
    per_share = reduces * (sends.sum() - 2 * sends)
    rows = np.zeros((n, n + 1))
    rows[np.arange(n), np.arange(n)] = per_share
    rows[:, n] = -capacity
    bounds = [(0.0, 1.0 if m.reduces else 0.0) for m in members]
    sum_to_one = np.concatenate([np.ones(n), [0.0]])[None, :]
    fastest = solve_lp(np.eye(n + 1)[n], rows, -sends, sum_to_one, [1.0], [*bounds, (0.0, None)])
    best = fastest[n]
    # Many shares may tie at the optimum (whenever a slow sender's own parts set the pace).
    # Among them take the one closest to proportional to capacity: min z with g_j <= cap_j * z.
    at_best = np.hstack([rows[:, :n], np.zeros((n, 1))])
    proportional = np.hstack([np.eye(n), -capacity[:, None]])
    spread = solve_lp(np.eye(n + 1)[n], np.vstack([at_best, proportional]),
                      np.concatenate([capacity * best * (1 + TIE_SLACK) - sends, np.zeros(n)]),
                      sum_to_one, [1.0], [*bounds, (0.0, None)])
    shares = _normalised([g if g > NEGLIGIBLE_SHARE else 0.0 for g in spread[:n]])
    return Balance(shares, round_time(shares, members, nbytes))


def solve_lp(cost: np.ndarray, a_ub: np.ndarray, b_ub: np.ndarray, a_eq: np.ndarray,
             b_eq: Sequence[float] | np.ndarray, bounds: list[tuple[float, float | None]]) -> np.ndarray:
    """min cost @ x subject to a_ub @ x <= b_ub, a_eq @ x = b_eq, by HiGHS."""
    from scipy.optimize import linprog  # 0.3 s to import: when the first round is planned

    result = linprog(cost, A_ub=a_ub, b_ub=b_ub, A_eq=a_eq, b_eq=b_eq, bounds=bounds, method="highs")
    if result.status != 0:
        raise ArithmeticError(f"load balancing LP failed: {result.message}")
    return np.asarray(result.x)


def _normalised(shares: Sequence[float]) -> list[float]:
    total = float(sum(shares))
    return [float(s) / total for s in shares]
