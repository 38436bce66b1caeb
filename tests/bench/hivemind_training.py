"""One hivemind 1.1.12 peer training a Cotrain task with hivemind.Optimizer, for
tests/bench/collaboration.py to run beside `cotrain peer` processes on the same links, model,
data and target batch. It runs under hivemind's own interpreter (a separate venv: hivemind
pins old protobuf and pydantic) with this repository on its path; of Cotrain it imports the
task alone (the model and its batches), nothing of the engine's training or networking.

Prints JSON lines: its DHT addresses first (the bench hands them to the other peers), then
one line per epoch of the collaboration it stepped in before its time ran out, then (with
--evaluate) the held-out loss of the parameters it held when it did. A step can block for
as long as hivemind's averaging timeout, so that loss is taken at the deadline on a copy,
beside the training thread, not after the step under way ends.

    python tests/bench/hivemind_training.py --address 100.64.0.10 --seconds 300 --params '{...}'

Set up once: python3 -m venv ~/hivemind-venv &&
~/hivemind-venv/bin/pip install torch==2.13.0 hivemind==1.1.12 msgspec aiohttp
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import threading
import time
from functools import partial
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


def say(**fields) -> None:
    print(json.dumps(fields), flush=True)


def arguments() -> argparse.Namespace:
    """The command line tests/bench/collaboration.py gives each peer: the same for all four
    but for the address, data seed and uplink hint, and the first peer's DHT to join."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--address", required=True)
    parser.add_argument("--initial-peers", nargs="*", default=[])
    parser.add_argument("--seconds", type=float, required=True)
    parser.add_argument("--params", required=True, help="the demo-lm task's parameters, JSON")
    parser.add_argument("--seed", type=int, default=7, help="the project's: the initial model")
    parser.add_argument("--data-seed", type=int, default=0, help="this peer's order of examples")
    parser.add_argument("--target-batch", type=int, required=True)
    parser.add_argument("--lr", type=float, required=True)
    parser.add_argument("--fp16", action="store_true", help="gradients and state in fp16 on the wire")
    parser.add_argument("--delayed", action="store_true",
                        help="delay_optimizer_step and delay_grad_averaging")
    parser.add_argument("--averaging-timeout", type=float, default=300.0)
    parser.add_argument("--next-chunk-timeout", type=float, default=60.0,
                        help="its default (matchmaking_time, 15 s) drops a 5 Mbit/s peer's parts midway")
    parser.add_argument("--bandwidth", type=float, default=None, help="uplink Mbit/s, for part sizes")
    parser.add_argument("--heldout-seed", type=int, default=10**6)
    parser.add_argument("--heldout-batches", type=int, default=16)
    parser.add_argument("--evaluate", action="store_true", help="print the held-out loss at the end")
    return parser.parse_args()


def main() -> None:
    args = arguments()

    import hivemind
    import torch
    from hivemind.compression import Float16Compression, NoCompression
    from hivemind.optim.grad_averager import GradientAverager

    from engine.tasks import create_task, initial_model

    torch.set_num_threads(1)
    dht = hivemind.DHT(host_maddrs=[f"/ip4/{args.address}/tcp/0"], initial_peers=args.initial_peers,
                       start=True)
    say(maddrs=[str(a) for a in dht.get_visible_maddrs()])
    task = create_task("demo-lm", json.loads(args.params))
    model = initial_model(task, args.seed)
    compression = Float16Compression() if args.fp16 else NoCompression()
    opt = hivemind.Optimizer(
        dht=dht, run_id="cotrain-bench", params=model.parameters(),
        optimizer=partial(torch.optim.AdamW, lr=args.lr), target_batch_size=args.target_batch,
        batch_size_per_step=task.batch(args.data_seed, 0).size, averaging_timeout=args.averaging_timeout,
        next_chunk_timeout=args.next_chunk_timeout,
        grad_compression=compression, state_averaging_compression=compression,
        delay_optimizer_step=args.delayed, delay_grad_averaging=args.delayed, verbose=False,
        # averager_opts reaches the state averager only (optim/optimizer.py:263-267 in 1.1.12).
        averager_opts={"bandwidth": args.bandwidth},
        grad_averager_factory=partial(GradientAverager, bandwidth=args.bandwidth),
    )
    resynced = []  # samples accumulated before a download of the state are thrown away
    download = opt.load_state_from_peers

    def load_state_from_peers(**kwargs):
        resynced.append(True)
        return download(**kwargs)

    opt.load_state_from_peers = load_state_from_peers

    def evaluate() -> None:
        held = {name: tensor.detach().clone() for name, tensor in model.state_dict().items()}
        epoch = opt.local_epoch
        copy = initial_model(task, args.seed)
        copy.load_state_dict(held)
        with torch.no_grad():
            losses = [float(task.loss(copy, task.batch(args.heldout_seed, i)))
                      for i in range(args.heldout_batches)]
        say(final=True, epoch=epoch, loss=statistics.mean(losses))

    say(ready=True)
    sys.stdin.readline()  # every peer built and linked: the bench says go to all at once
    # Samples count once an epoch of the collaboration took them: a step of one epoch after
    # ours. A jump of more (this peer fell behind and downloaded the state) threw them away.
    epoch, pending, applied = opt.local_epoch, 0, 0
    deadline, index = time.monotonic() + args.seconds, 0
    if args.evaluate:
        threading.Timer(args.seconds, evaluate).start()
    while time.monotonic() < deadline:
        batch = task.batch(args.data_seed, index)
        index += 1
        task.loss(model, batch).backward()
        opt.step()
        opt.zero_grad()
        pending += batch.size
        if opt.local_epoch != epoch and time.monotonic() < deadline:
            if opt.local_epoch == epoch + 1 and not resynced:
                applied += pending
            epoch, pending = opt.local_epoch, 0
            resynced.clear()
            say(epoch=epoch, applied=applied, time=time.time())
    # Done, but still a member until the bench stops every peer: the others' last rounds may
    # still need this one's averagers.
    say(done=True)
    sys.stdin.readline()
    opt.shutdown()
    dht.shutdown()


if __name__ == "__main__":
    main()
