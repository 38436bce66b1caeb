"""Decoding untrusted messages: microseconds per message of every kind, checked in full
(types, ranges, sizes, kind, version), next to json.loads of the same bytes, which only
parses them: the floor any validating decoder stands on.

    python -m tests.bench.wire [--quick]

The ratio to json.loads is what to compare across machines and days. Before the wire moved
to msgspec (a hand-made validator over json.loads), the median ratio was 3.1x on this
project's machines (engine/docs/benchmarks.md).
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from collections.abc import Callable

from engine.governor.limits import Limits
from engine.governor.policy import GovernorState
from engine.peer.events import EpochCompleted
from engine.wire import control as c
from engine.wire import frames as f
from engine.wire.codec import Codec, encode
from engine.wire.types import SignalKind, StateSource
from engine.worker import protocol as p

PEERS = [f"{i:016x}" for i in range(4)]
HASH = "ab" * 32


def samples() -> list[tuple[Codec, object]]:
    step = c.Step(epoch=4, round_id=7, loss=5.1, samples=512, peers=4, round_seconds=0.8, state_sha256=HASH)
    control = [
        c.Progress(3, 120, 14.5, 5.2, 8.1, False), c.SyncRequest([PEERS[0]]), c.Ready(3, HASH),
        c.RoundDone(7, 3, True, HASH, 512, 5.1, 0.8, None, {q: 128 for q in PEERS}, []),
        c.Signal(PEERS[0], c.SignalData(kind=SignalKind.OFFER, conn="c" * 32, sdp="v=0\r\n" * 120)),
        c.Ping(5), c.Availability(True),
    ]
    backbone = [
        c.Pong(5), c.SyncPlan(3, StateSource.PEER, PEERS[0]), c.RoundStart(7, 3, PEERS, [1.0] * 4, 60.0),
        step, c.Resync(4, "the collaboration is at epoch 4"), c.Status(3, 256, 512, 4, 60.0, 4.2),
        c.IceServers([c.IceServer(urls=["stun:x:3478"]),
                      c.IceServer(urls=["turn:x:3478"], username="1:p", credential="c" * 28)]),
    ]
    headers = [
        f.Part(round_id=7, epoch=3, index=1, samples=128, loss_sum=640.0),
        f.Result(round_id=7, epoch=3, index=1, samples=512, loss=5.1, received={q: 128 for q in PEERS}),
        f.StateRequest(request_id=1), f.StateReply(request_id=1, epoch=3, state_sha256=HASH),
        f.StateUnavailable(request_id=1, reason="busy"), f.Goodbye(), f.PathView(view=None),
        f.ReceiveLimit(bytes_per_second=1e6),
    ]
    limits = Limits(threads=2, cpu_percent=50)
    commands = [p.Start(backbone="local", project="demo-lm", name="me"), p.SetLimits(limits=limits),
                p.Pause(), p.Snooze(until=1.7e9)]
    events = [
        p.Hello(version=p.VERSION, pid=4242),
        p.GovernorDecided(running=True, state=GovernorState.RUNNING, reason="Contributing", limits=limits),
        p.Stats(samples_per_second=14.5, my_samples_session=1200, my_samples_total=54000, collab_samples=256,
                collab_target=512, eta_seconds=4.2, epoch=3, peers=4, upload_bps=1.2e6, download_bps=1.1e6,
                loss=5.1, device="the CPU"),
        EpochCompleted(step=step, my_samples=128), p.Problem(message="x"),
    ]
    return ([(c.from_peer, m) for m in control] + [(c.from_backbone, m) for m in backbone]
            + [(f.headers, m) for m in headers] + [(p.commands, m) for m in commands]
            + [(p.events, m) for m in events])


def per_message(decode: Callable[[bytes], object], data: bytes, count: int) -> float:
    best = float("inf")
    for _ in range(5):
        began = time.perf_counter()
        for _ in range(count):
            decode(data)
        best = min(best, (time.perf_counter() - began) / count)
    return best * 1e6


def main(quick: bool) -> None:
    count = 300 if quick else 3000
    rows = []
    print(f"{'channel':<18} {'kind':<18} {'bytes':>6} {'decode µs':>10} {'json.loads µs':>14} {'ratio':>6}")
    for codec, message in samples():
        data = encode(message)
        assert codec.decode(data) == message
        checked, parsed = per_message(codec.decode, data, count), per_message(json.loads, data, count)
        rows.append(checked / parsed)
        print(f"{codec.what:<18.18} {type(message).__name__:<18} {len(data):>6} {checked:>10.2f} "
              f"{parsed:>14.2f} {checked / parsed:>6.2f}")
    print(f"{len(rows)} kinds; median decode / json.loads = {statistics.median(rows):.2f}x "
          f"(the hand-made validator this replaced: 3.1x)")


if __name__ == "__main__":
    main("--quick" in sys.argv[1:])
