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
