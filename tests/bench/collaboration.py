"""Cotrain against hivemind.Optimizer end to end on home links: four peers in network
namespaces, each on its own shaped cable (300/60, 100/20, 50/10 and 20/5 Mbit/s down/up,
10-20 ms one way, so 20-40 ms between any two: netem's delay, or where the kernel has no
netem, a delay line in user space, tests/nat/delay_line.py), training the same model from
the same initial state on the same data (each peer its own order) to the same target
batch, for the same wall time per configuration (Cotrain's from its processes' start,
hivemind's from the go its four get once their DHT and model are up: its start-up is not
charged), all four starting together. Each system is told its links its own way: hivemind
its uplink as its bandwidth hint, Cotrain both as the volunteer's caps (``--max-upload``,
``--max-download``) at LINK_SHARE of the cable, as a volunteer sets them in the app (its
traffic to the backbone is not shaped here, so its own link probes would read the
machine's, not the cable's; and paced below the cable, its data channels keep the home
router's queue short: unpaced, one of a congested uplink's SCTP associations could go 60 s
without a byte and lose its round). One JSON line per system and configuration:

- samples/s and steps per minute, from the collaboration's first step to its last (a
  configuration that steps less often takes larger batches: steps and the loss say what
  its samples bought);
- bytes per sample: what the peers' cables carried to each other between those steps (to
  the backbone's machine not: it is the project owner's, and its checkpoints are there for
  the measure);
- the held-out loss at the end (16 batches no peer trains on): for Cotrain, of the newest
  settled state its peers saved as they left (``--save-state``: a checkpoint of it could
  still be on its way up a home link); for hivemind, of its first peer's model.

    sudo python -m tests.bench.collaboration [--json] [--quick] [--seconds S] [--only TEXT ...]

The full run trains a 22M-parameter demo-lm (a round moves 90 MB in fp32) for 600 s per
configuration (about 80 minutes in all); ``--quick`` a 3.3M-parameter one for 150 s. hivemind
1.1.12 runs in its own venv (tests/bench/hivemind_training.py says how to make it;
``--hivemind PYTHON`` or $COTRAIN_HIVEMIND_PYTHON if not ~/hivemind-venv); without it its
lines say why they are missing. Every peer trains on one thread: four peers share this
machine's cores, so compute is a quarter of a real volunteer's and the links weigh less
than they would.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import statistics
import tempfile
import time
from collections.abc import Coroutine
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from engine.project import CompressionMethod, LocalSpec, OptimizerSpec, ProjectSpec, ScheduleSpec
from engine.wire.tensors import decode_file
from tests.bench.home_cables import CableMeter, shape
from tests.bench.local_mode import held_out_loss
from tests.collab.harness import TINY, tiny_project
from tests.collab.processes import PeerProcess, terminate, write_catalog
from tests.conftest import until
from tests.nat.network import nat_network
from tests.nat.services import REPO, spawn_peer_in
from tests.nat.topology import Host, missing_requirements

LINKS = [(300, 60, 10), (100, 20, 15), (50, 10, 20), (20, 5, 20)]  # Mbit/s down, up; ms one way
# demo-lm shares its layers' weights: 22M parameters whatever the depth.
FULL = dict(TINY, d_model=1536, heads=12, ff=4096, layers=2, embedding=128, seq_len=64, micro_batch=4)
QUICK = dict(FULL, d_model=512, heads=8, ff=2048)  # 3.3M
TARGET_BATCH = 128
# AdamW's, constant, for both systems. At 1e-3 the 22M model's sync steps already swung
# (training loss 4.01, 3.70, 4.22 at steps 2-4) and one-step-stale ones swung further.
LR = 3e-4
LINK_SHARE = 0.95  # Cotrain's caps, of each cable's rates
LOCAL_INNER_BATCH, LOCAL_INNER_STEPS = 16, 8  # DiLoCo: an outer step every 128 samples per peer
EVALUATION_SECONDS = 300  # hivemind's held-out loss, beside its training thread
HIVEMIND_PYTHON = Path.home() / "hivemind-venv" / "bin" / "python"


@dataclass
class Outcome:
    system: str
    config: str
    steps: int = 0  # after the first
    samples: int = 0  # the collaboration's, in those steps
    seconds: float = 0.0  # from the first step to the last
    to_peers: int = 0  # bytes the peers' cables carried to each other meanwhile
    loss: float | None = None
    error: str | None = None
    extra: dict = field(default_factory=dict)

    def line(self) -> dict:
        rate = self.samples / self.seconds if self.seconds > 0 else 0.0
        steps = self.steps / self.seconds * 60 if self.seconds > 0 else 0.0
        return {"system": self.system, "config": self.config, "samples_per_s": round(rate, 3),
                "steps_per_min": round(steps, 2),
                "bytes_per_sample": round(self.to_peers / self.samples) if self.samples else None,
                "heldout_loss": None if self.loss is None else round(self.loss, 4), "steps": self.steps,
                "samples": self.samples, "seconds": round(self.seconds, 1), "error": self.error, **self.extra}


def kilobytes(mbit: float) -> int:
    """LINK_SHARE of a cable of ``mbit`` Mbit/s, in kilobytes per second (the caps' unit)."""
    return int(mbit * 1e6 / 8 / 1000 * LINK_SHARE)


def cotrain_project(model: dict, compression: CompressionMethod = "none", overlap: bool = False,
                    local: bool = False) -> ProjectSpec:
    common = dict(id="home-lm", task_params=model, compression=compression, overlap=overlap,
                  optimizer=OptimizerSpec(name="adamw", lr=LR, clip_grad_norm=None, weight_decay=0.01),
                  schedule=ScheduleSpec(type="constant", warmup_epochs=0, total_epochs=10**6),
                  round_timeout=300, checkpoint_every=1, keep_checkpoints=2)
    if not local:
        return tiny_project(**common, target_batch_size=TARGET_BATCH)
    return tiny_project(**common, mode="local",
                        target_batch_size=len(LINKS) * LOCAL_INNER_BATCH * LOCAL_INNER_STEPS,
                        local=LocalSpec(inner_batch_size=LOCAL_INNER_BATCH, outer_lr=0.7, outer_momentum=0.9))


async def run_cotrain(net, hosts: list[Host], workdir: Path, config: str, spec: ProjectSpec, port: int,
                      budget: float) -> Outcome:
    server = net.public.address
    # No TURN: relayed bytes would bypass the shaping and the count (the hosts are public).
    catalog = write_catalog(workdir / f"catalog-{port}.json", spec)
    backbone, url = net.backbone(port, turn=False, catalog=catalog)
    peers: list[PeerProcess] = []
    began = time.monotonic()
    try:
        for i, host in enumerate(hosts):
            down, up, _ = LINKS[i]
            caps = ["--max-upload", str(kilobytes(up)), "--max-download", str(kilobytes(down))]
            name = f"{config.replace(' ', '-')}-{i}"
            peers.append(await spawn_peer_in(host, url, spec.id, name, workdir, "--data-seed", str(i),
                                             "--save-state", str(workdir / f"{name}.state"), *caps))
        async with CableMeter(hosts, server) as meter:
            await until(lambda: any(p.epochs for p in peers), budget, f"{config}: a first step")
            first = max(p.epoch for p in peers)
            await asyncio.sleep(max(budget - (time.monotonic() - began), 0))  # the budget is the measure
    finally:
        await terminate(*peers)
        backbone.stop()
    steps = {e["epoch"]: e["samples"] for p in peers for e in p.epochs}
    times = [t for p in peers for e, t in zip(p.epochs, p.arrivals, strict=True) if e["epoch"] >= first]
    outcome = Outcome("cotrain", config)
    outcome.steps = len([e for e in steps if e > first])
    outcome.samples = sum(s for e, s in steps.items() if e > first)
    outcome.seconds = max(times) - min(times) if times else 0.0
    outcome.to_peers = meter.between(min(times), max(times)) if times else 0
    # How soon each round's first byte left after its RoundStart, on these links (the
    # first round, its links opened then, aside), and how much of that was the micro-batch
    # under way (a round waits for it: its gradient belongs to the step).
    warm = [e for p in peers for e in p.epochs
            if e["epoch"] > first and e.get("first_byte_seconds") is not None]
    for key, seconds in (("first_byte", [e["first_byte_seconds"] for e in warm]),
                         ("micro_batch_under_way", [e["took_seconds"] for e in warm])):
        outcome.extra |= median_p95_ms(key, seconds)
    # The loss of the state the peers held as the time ran out (a checkpoint of it could
    # still be on its way up a home link), the newest that the collaboration settled on.
    settled = {(e["epoch"], e["state_sha256"]) for p in peers for e in p.epochs}
    final = [f for p in peers if (f := workdir / f"{p.name}.state").exists() and held_settled(f, settled)]
    if final:  # (none: no step was reached)
        outcome.extra["held_out_epoch"], outcome.loss = held_out_loss(final, spec)
    for p in peers:  # (hundreds of MB each)
        (workdir / f"{p.name}.state").unlink(missing_ok=True)
    return outcome


def median_p95_ms(key: str, seconds: list[float]) -> dict:
    if not seconds:
        return {}
    ordered = sorted(seconds)
    return {f"{key}_ms_median": round(1000 * statistics.median(ordered), 1),
            f"{key}_ms_p95": round(1000 * ordered[int(0.95 * (len(ordered) - 1))], 1)}


def held_settled(path: Path, settled: set[tuple[int, str]]) -> bool:
    state = decode_file(path.read_bytes())
    return (state.index.meta.epoch, state.state_sha256()) in settled


@dataclass
class HivemindPeer:
    process: asyncio.subprocess.Process
    lines: list[tuple[float, dict]] = field(default_factory=list)  # (arrival, line)
    reader: asyncio.Task | None = None

    @classmethod
    async def start(cls, python: Path, host: Host, args: list[str], log: Path) -> HivemindPeer:
        with open(log, "wb") as sink:
            # A session of its own: hivemind's DHT and averagers are child processes, and
            # p2pd a grandchild; all go with the group.
            process = await asyncio.create_subprocess_exec(
                *host.prefix(), str(python), str(REPO / "tests" / "bench" / "hivemind_training.py"), *args,
                stdout=asyncio.subprocess.PIPE, stderr=sink, stdin=asyncio.subprocess.PIPE, cwd=REPO,
                start_new_session=True)
        peer = cls(process)
        peer.reader = asyncio.ensure_future(peer._read())
        return peer

    async def _read(self) -> None:
        assert self.process.stdout is not None
        async for line in self.process.stdout:
            self.lines.append((time.monotonic(), json.loads(line)))

    def said(self, key: str) -> list[tuple[float, dict]]:
        return [(t, line) for t, line in self.lines if key in line]

    def go(self) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write(b"go\n")

    async def kill(self) -> None:
        """Its whole session: its DHT and averager processes, and p2pd, may outlive it."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGKILL)
        await self.process.wait()


async def run_hivemind(python: Path, hosts: list[Host], server: str, workdir: Path, config: str, model: dict,
                       budget: float, extra: list[str]) -> Outcome:
    common = ["--seconds", str(budget), "--params", json.dumps(model), "--target-batch", str(TARGET_BATCH),
              "--lr", str(LR), *extra]
    name = config.replace(" ", "-")
    first = ["--address", hosts[0].address, "--data-seed", "0", "--bandwidth", str(LINKS[0][1]), "--evaluate"]
    peers = [await HivemindPeer.start(python, hosts[0], [*first, *common], workdir / f"{name}-0.log")]
    try:
        await until(lambda: peers[0].said("maddrs") or peers[0].process.returncode is not None, 120,
                    f"{config}: the first peer's DHT")
        if not peers[0].said("maddrs"):
            return Outcome("hivemind", config, error=f"its first peer did not start: {workdir / name}-0.log")
        maddrs = peers[0].said("maddrs")[0][1]["maddrs"]
        for i, host in enumerate(hosts[1:], 1):
            own = ["--address", host.address, "--data-seed", str(i), "--bandwidth", str(LINKS[i][1]),
                   "--initial-peers", *maddrs]
            peers.append(await HivemindPeer.start(python, host, [*own, *common], workdir / f"{name}-{i}.log"))
        await until(lambda: all(p.said("ready") for p in peers) or
                    any(p.process.returncode is not None for p in peers), 300, f"{config}: every peer ready")
        async with CableMeter(hosts, server) as meter:
            for p in peers:  # all at once, as Cotrain's four start together
                p.go()
            # The budget is the measure: a step under way then may block for hivemind's
            # averaging timeout, and its peers say nothing of epochs past their deadline.
            await asyncio.sleep(budget)
            await until(lambda: peers[0].said("final") or peers[0].process.returncode is not None,
                        EVALUATION_SECONDS, f"{config}: the first peer's held-out loss")
        gone = [i for i, p in enumerate(peers) if p.process.returncode is not None]
        if gone:
            return Outcome("hivemind", config, error=f"peers {gone} exited early: {workdir / name}-N.log")
    finally:
        for p in peers:
            await p.kill()
    return hivemind_outcome(config, peers, meter)


def hivemind_outcome(config: str, peers: list[HivemindPeer], meter: CableMeter) -> Outcome:
    """The collaboration's samples in the epochs after the first any peer stepped into."""
    epochs = [(t, line) for p in peers for t, line in p.said("applied")]
    final = peers[0].said("final")
    if not epochs:
        return Outcome("hivemind", config, error="no peer stepped")
    first = min(line["epoch"] for _, line in epochs)
    samples = 0
    for p in peers:
        mine = p.said("applied")
        base = max((line["applied"] for _, line in mine if line["epoch"] <= first), default=0)
        samples += (mine[-1][1]["applied"] - base) if mine else 0
    times = [t for t, _ in epochs]
    last = max(line["epoch"] for _, line in epochs)
    return Outcome("hivemind", config, steps=last - first, samples=samples, seconds=max(times) - min(times),
                   to_peers=meter.between(min(times), max(times)),
                   loss=final[0][1]["loss"] if final else None)


async def measure(net, workdir: Path, model: dict, budget: float, python: Path | None,
                  print_line, only: list[str] | None = None) -> None:
    server = net.public.address
    hosts, lines = [], []
    for down, up, delay in LINKS:
        host = net.topology.public_peer(download_mbit=down)
        line = shape(host, server, up, delay)
        hosts.append(host)
        lines += [line] if line is not None else []
    links = {"links": [f"{down}/{up}" for down, up, _ in LINKS], "delay_ms": [delay for *_, delay in LINKS],
             "delay": "a delay line in user space (no netem here)" if lines else "netem"}
    try:
        await measure_configs(net, hosts, workdir, model, budget, python, print_line, only, links)
    finally:
        for line in lines:
            line.terminate()
            line.wait(10)


async def measure_configs(net, hosts: list[Host], workdir: Path, model: dict, budget: float,
                          python: Path | None, print_line, only: list[str] | None, links: dict) -> None:
    server = net.public.address
    configs = [("sync fp32", cotrain_project(model)), ("sync fp16", cotrain_project(model, "fp16")),
               ("sync fp16 overlap", cotrain_project(model, "fp16", overlap=True)),
               ("powersgd r=4 overlap", cotrain_project(model, "powersgd", overlap=True)),
               ("local H=8", cotrain_project(model, local=True))]
    for i, (config, spec) in enumerate(configs):
        if not chosen(f"cotrain {config}", only):
            continue
        outcome = await failed_as_line("cotrain", config, run_cotrain(net, hosts, workdir, config, spec,
                                                                      8600 + i, budget))
        print_line(replace(outcome, extra=outcome.extra | links))
    for config, extra in (("defaults", []), ("delayed fp16", ["--delayed", "--fp16"])):
        if not chosen(f"hivemind {config}", only):
            continue
        if python is None:
            outcome = Outcome("hivemind", config, error="no venv: see tests/bench/hivemind_training.py")
        else:
            outcome = await failed_as_line("hivemind", config, run_hivemind(python, hosts, server, workdir,
                                                                            config, model, budget, extra))
        print_line(replace(outcome, extra=outcome.extra | links))


def chosen(name: str, only: list[str] | None) -> bool:
    return only is None or any(text in name for text in only)


async def failed_as_line(system: str, config: str, run: Coroutine[Any, Any, Outcome]) -> Outcome:
    """A configuration that failed is a line that says so; the others still run."""
    try:
        return await run
    except (AssertionError, asyncio.TimeoutError, RuntimeError, OSError) as exc:
        return Outcome(system, config, error=f"{type(exc).__name__}: {exc}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", action="store_true", help="JSON lines only")
    parser.add_argument("--quick", action="store_true", help="a 3.3M-parameter model, 150 s each")
    parser.add_argument("--seconds", type=float, help="wall time per configuration")
    parser.add_argument("--only", nargs="+", metavar="TEXT",
                        help="the configurations whose 'system config' holds one of these texts")
    parser.add_argument("--hivemind", type=Path, default=Path(os.environ.get("COTRAIN_HIVEMIND_PYTHON",
                                                                             HIVEMIND_PYTHON)))
    args = parser.parse_args()
    model = QUICK if args.quick else FULL
    budget = args.seconds or (150.0 if args.quick else 600.0)
    python = args.hivemind if args.hivemind.exists() else None

    def print_line(outcome: Outcome) -> None:
        line = outcome.line()
        if args.json:
            print(json.dumps(line), flush=True)
            return
        rate, per = line["samples_per_s"], line["bytes_per_sample"]
        loss = line["heldout_loss"] or 0
        error = f"  {outcome.error}" if outcome.error else ""
        print(f"{outcome.system:<9}{outcome.config:<22}{rate:>10.2f}{line['steps_per_min']:>10.2f}"
              f"{per or 0:>16,}{loss:>10.4f}{outcome.steps:>7}{error}", flush=True)

    if not args.json:
        print(f"\n== Cotrain vs hivemind.Optimizer: {len(LINKS)} peers on home links, {budget:.0f} s each, "
              f"demo-lm {model['d_model']}x{model['layers']}, target batch {TARGET_BATCH}")
        print(f"{'system':<9}{'config':<22}{'samples/s':>10}{'steps/min':>10}{'B/sample':>16}{'held-out':>10}"
              f"{'steps':>7}")
    missing = missing_requirements()
    if missing:
        print(json.dumps({"skipped": missing}) if args.json else f"skipped: {missing}")
        return
    with tempfile.TemporaryDirectory(prefix="cotrain-bench-collab-") as tmp, nat_network(Path(tmp)) as net:
        asyncio.run(measure(net, Path(tmp), model, budget, python, print_line, args.only))


if __name__ == "__main__":
    main()
