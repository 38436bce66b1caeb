"""``cotrain demo``: an embedded backbone and N local peer processes training demo-lm.

Peers are separate OS processes, as in production; they find each other through the
backbone and average over WebRTC on loopback.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from engine.backbone.server import Backbone, BackboneConfig
from engine.console import StatusLine, bar
from engine.paths import engine_command
from engine.project import load_catalog
from engine.resources import default_catalog

log = logging.getLogger(__name__)
PROJECT = "demo-lm"


@dataclass
class PeerProcess:
    name: str
    process: asyncio.subprocess.Process
    log_path: Path
    epochs: list[dict] = field(default_factory=list)


async def run_demo(peers: int, epochs: int, data: str | None, catalog: Path | None) -> int:
    if peers < 1 or epochs < 1:
        print("cotrain demo: --peers and --epochs must be at least 1", file=sys.stderr)
        return 2
    line = StatusLine()
    with tempfile.TemporaryDirectory(prefix="cotrain-demo-") as tmp:
        config = BackboneConfig(data_dir=Path(tmp) / "backbone")
        projects = load_catalog(catalog or default_catalog())
        backbone = Backbone(config, [p for p in projects if p.id == PROJECT])
        url = await backbone.start()
        line.say(f"backbone listening on {url}; starting {peers} peers")
        threads = max(1, (os.cpu_count() or 1) // peers)
        procs: list[PeerProcess] = []
        try:
            for i in range(peers):
                procs.append(await _start_peer(f"demo-{i + 1}", url, epochs, threads, data, Path(tmp)))
            readers = [asyncio.ensure_future(_read_epochs(p, line)) for p in procs]
            waiting = asyncio.ensure_future(asyncio.gather(*(p.process.wait() for p in procs)))
            while not waiting.done():
                status = backbone.trackers[PROJECT].status()
                eta = f", next step in ~{status.eta_seconds:.0f}s" if status.eta_seconds else ""
                line.update(f"epoch {status.epoch}/{epochs} {bar(status.samples / status.target)} "
                            f"{status.samples}/{status.target} samples, {status.peers} peers{eta}")
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(asyncio.shield(waiting), 1.0)
            await asyncio.gather(*readers)
        finally:
            for p in procs:
                if p.process.returncode is None:
                    p.process.terminate()
                    await p.process.wait()
            await backbone.stop()
        return _summarise(procs, epochs, line)


async def _start_peer(name: str, url: str, epochs: int, threads: int, data: str | None,
                      tmp: Path) -> PeerProcess:
    cmd = [*engine_command(), "peer", "--backbone", url, "--project", PROJECT, "--name", name,
           "--max-epochs", str(epochs), "--threads", str(threads), "--json"]
    if data:
        cmd += ["--data", data]
    log_path = tmp / f"{name}.log"
    with open(log_path, "wb") as log_file:
        process = await asyncio.create_subprocess_exec(
            *cmd, stdout=asyncio.subprocess.PIPE, stderr=log_file, stdin=asyncio.subprocess.DEVNULL)
    return PeerProcess(name, process, log_path)


async def _read_epochs(peer: PeerProcess, line: StatusLine) -> None:
    assert peer.process.stdout is not None
    async for raw in peer.process.stdout:
        try:
            record = json.loads(raw)
        except json.JSONDecodeError:
            continue
        peer.epochs.append(record)
        if peer is not None and len(peer.epochs) and record.get("epoch") is not None:
            loss = record.get("loss")
            line.say(f"{peer.name}: epoch {record['epoch']} loss "
                     f"{loss:.4f} ({record['samples']} samples, {record['peers']} peers, "
                     f"state {record['state_sha256'][:12]})" if loss is not None else
                     f"{peer.name}: epoch {record['epoch']}")


def _summarise(procs: list[PeerProcess], epochs: int, line: StatusLine) -> int:
    failed = [p for p in procs if p.process.returncode != 0]
    for p in failed:
        tail = p.log_path.read_text(errors="replace").splitlines()[-15:] if p.log_path.exists() else []
        line.say(f"{p.name} exited with status {p.process.returncode}:\n  " + "\n  ".join(tail))
    finals = {p.name: p.epochs[-1] for p in procs if p.epochs}
    if failed or len(finals) != len(procs) or any(f["epoch"] != epochs for f in finals.values()):
        line.say("demo failed: not every peer completed the run")
        return 1
    hashes = {f["state_sha256"] for f in finals.values()}
    losses = {r["epoch"]: r["loss"] for p in procs for r in p.epochs if r.get("loss") is not None}
    first, last = losses[min(losses)], losses[max(losses)]
    identical = len(hashes) == 1
    line.say(f"done: {epochs} epochs; loss {first:.4f} -> {last:.4f}; all {len(procs)} peers "
             f"hold identical parameters: {'yes' if identical else 'NO'} ({next(iter(hashes))[:16]})")
    return 0 if identical else 1
