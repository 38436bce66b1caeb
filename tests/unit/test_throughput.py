"""A peer's pace is read on the event loop while micro-batches add to it on the compute
thread: reading must never meet an append (before: "deque mutated during iteration", which
stopped the peer's training loop)."""

import threading

from engine.training.throughput import Throughput


def test_reading_the_pace_while_micro_batches_add_to_it_never_fails():
    meter = Throughput(window=60.0)
    stop = threading.Event()
    errors: list[BaseException] = []

    def add() -> None:
        while not stop.is_set():
            meter.add(1)

    adder = threading.Thread(target=add)
    adder.start()
    try:
        for _ in range(300):
            try:
                assert meter.rate() >= 0
            except RuntimeError as exc:
                errors.append(exc)
                break
    finally:
        stop.set()
        adder.join(timeout=10)
    assert not errors, errors
    assert meter.rate() > 0


def test_the_pace_counts_only_the_samples_inside_its_window_as_time_goes_on():
    now = [0.0]
    meter = Throughput(window=10.0, clock=lambda: now[0])
    for second in range(30):  # 8 samples a second for 20 s, then 2 a second
        now[0] = float(second)
        meter.add(8 if second < 20 else 2)
    now[0] = 29.5
    assert meter.rate() == 2 * 10 / 10.0  # seconds 20-29: 2 a second
    now[0] = 100.0
    assert meter.rate() == 0.0  # everything slid out
    meter.add(5)
    assert meter.rate() == 5 / 10.0
