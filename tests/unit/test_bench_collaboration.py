"""The home-links bench's counts (tests/bench/collaboration.py): what its lines compare is
only as fair as these."""

from __future__ import annotations

from tests.bench.collaboration import HivemindPeer, hivemind_outcome
from tests.bench.home_cables import CableMeter


def test_a_window_of_steps_is_charged_the_bytes_read_around_it_not_those_after_it():
    meter = CableMeter([], "192.0.2.1")
    # (began, ended, bytes): a reading takes a while
    meter.readings = [(0.0, 0.1, 0), (1.0, 1.1, 100), (2.0, 2.1, 300), (3.0, 3.1, 600), (4.0, 4.1, 10_000)]
    assert meter.between(1.5, 2.5) == 600 - 100
    assert meter.between(1.1, 3.0) == 600 - 100
    assert meter.between(1.05, 2.05) == 600 - 0  # a reading under way at either end does not count
    assert meter.between(-5.0, 99.0) == 10_000  # past the readings: the first and the last


def peer(*lines: tuple[float, dict]) -> HivemindPeer:
    hivemind = HivemindPeer(process=None)  # type: ignore[arg-type]
    hivemind.lines = list(lines)
    return hivemind


def test_hivemind_is_credited_the_samples_of_epochs_after_the_first_one_seen():
    meter = CableMeter([], "192.0.2.1")
    meter.readings = [(t, t + 0.1, 1000 * t) for t in range(40)]
    first = peer((10.0, {"epoch": 1, "applied": 0}), (20.0, {"epoch": 2, "applied": 64}),
                 (30.0, {"epoch": 3, "applied": 128}), (31.0, {"final": True, "loss": 4.5}))
    # Its samples of epoch 1 were thrown away on a resync: its count did not grow then.
    second = peer((11.0, {"epoch": 1, "applied": 32}), (21.0, {"epoch": 2, "applied": 32}),
                  (29.0, {"epoch": 3, "applied": 96}))
    outcome = hivemind_outcome("defaults", [first, second], meter)
    assert outcome.steps == 2
    assert outcome.samples == 128 + (96 - 32)
    assert outcome.seconds == 20.0
    assert outcome.to_peers == 1000 * (30 - 9)  # the reading begun at 10 s ended after the first step
    assert outcome.loss == 4.5
    line = outcome.line()
    assert line["samples_per_s"] == round(192 / 20, 3) and line["steps_per_min"] == 6.0
