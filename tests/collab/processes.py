"""Peers as separate OS processes, as in production, with their JSON epoch lines collected."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path

from engine.backbone.tracker import RecordCredits, RecordStep, Send
from engine.paths import engine_command
from engine.project import Catalog, ProjectSpec
from engine.wire.codec import encode
from engine.wire.control import RoundStart
from tests import launcher
from tests.conftest import until


def write_catalog(path: Path, *projects: ProjectSpec) -> Path:
    path.write_bytes(encode(Catalog(list(projects))))
    return path


@dataclass
class PeerProcess:
    name: str
    process: asyncio.subprocess.Process | launcher.AsyncLaunchedProcess
    epochs: list[dict] = field(default_factory=list)
    arrivals: list[float] = field(default_factory=list)  # monotonic time each epoch line came
    reader: asyncio.Task | None = None

    @property
    def epoch(self) -> int:
        return self.epochs[-1]["epoch"] if self.epochs else 0

    async def reached(self, epoch: int, timeout: float) -> None:
        await until(lambda: self.epoch >= epoch or self.process.returncode is not None, timeout,
                    f"{self.name} to reach epoch {epoch}")
        assert self.epoch >= epoch, f"{self.name} exited with {self.process.returncode}"

    def kill(self) -> None:
        self.process.send_signal(signal.SIGKILL)


async def spawn_peer(url: str | None, project: str, name: str, log_dir: Path, *args: str,
                     env: dict | None = None, prefix: list[str] = ()) -> PeerProcess:
    env = {**os.environ, **(env or {})}
    log = open(log_dir / f"{name}.log", "wb")  # noqa: SIM115 - owned by the child
    process = await launcher.create_subprocess_exec(
        *prefix, *engine_command(), "peer", *(["--backbone", url] if url else ["--discover"]),
        "--project", project, "--name", name, "--json", "--threads", "1", *args,
        stdout=asyncio.subprocess.PIPE, stderr=log, stdin=asyncio.subprocess.DEVNULL, env=env,
    )
    log.close()
    peer = PeerProcess(name, process)

    async def read() -> None:
        assert process.stdout is not None
        async for line in process.stdout:
            peer.epochs.append(json.loads(line))
            peer.arrivals.append(time.monotonic())

    peer.reader = asyncio.ensure_future(read())
    return peer


async def terminate(*peers: PeerProcess) -> None:
    for p in peers:
        if p.process.returncode is None:
            p.process.terminate()
    for p in peers:
        try:
            await asyncio.wait_for(p.process.wait(), 20)
        except asyncio.TimeoutError:
            p.kill()
            await p.process.wait()


def home_with_login(home: Path, url: str, username: str, token: str) -> dict:
    """Environment for a peer process whose user logged in on a machine without a keyring."""
    import keyring
    from keyring.backends import null

    from engine.credentials import CredentialStore, Login

    previous = keyring.get_keyring()
    keyring.set_keyring(null.Keyring())  # the same backend the peer process will have
    try:
        CredentialStore(home / "credentials.json").save(url, Login(username, token))
    finally:
        keyring.set_keyring(previous)
    return {"COTRAIN_HOME": str(home), "PYTHON_KEYRING_BACKEND": "keyring.backends.null.Keyring"}


def kill_as_a_round_begins(backbone, pick) -> tuple[list[tuple[RoundStart, object]], list]:
    """SIGKILL a peer as the backbone sends the first RoundStart for which ``pick(start)``
    names one; returns that start and peer (once sent) and the steps and credits the
    backbone records."""
    killed: list[tuple[RoundStart, object]] = []
    recorded: list = []
    carry_out = backbone.execute

    def execute(project_id, outs):
        carry_out(project_id, outs)
        recorded.extend(o for o in outs if isinstance(o, (RecordStep, RecordCredits)))
        starts = [o.msg for o in outs if isinstance(o, Send) and isinstance(o.msg, RoundStart)]
        victim = pick(starts[0]) if not killed and starts else None
        if victim is not None:
            victim.kill()
            killed.append((starts[0], victim))

    backbone.execute = execute
    return killed, recorded


async def survivors_step(tracker, peers: list, start: RoundStart, victim, round_timeout: float) -> list:
    """The peers but ``victim``, once the round it died in has settled and each of them
    has taken that step."""
    survivors = [p for p in peers if p is not victim]
    await until(lambda: tracker.epoch > start.epoch, round_timeout, "the round the victim died in to settle")
    for p in survivors:
        await p.reached(start.epoch + 1, timeout=60)
    return survivors


def settled_without_a_redo(recorded: list, start: RoundStart, survivors: list) -> tuple:
    """The step the round ``start`` opened settled (not a redone one), every survivor on its
    state; that step and the round's credits."""
    (step,) = [r.step for r in recorded if isinstance(r, RecordStep) and r.step.epoch == start.epoch + 1]
    assert step.round_id == start.round_id, "the round was redone"
    hashes = {e["state_sha256"] for p in survivors for e in p.epochs if e["epoch"] == start.epoch + 1}
    assert hashes == {step.state_sha256}
    (credited,) = [r.credits for r in recorded
                   if isinstance(r, RecordCredits) and r.round_id == start.round_id]
    return step, credited
