"""coturn, backbones, probes and peers as processes inside the topology's namespaces.

coturn and the backbones are long-lived services shared by a module's tests, so they are
plain ``subprocess`` children with a reader thread; probes and peers belong to one test and
run under its event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
import sys
import threading
from pathlib import Path

from engine.paths import engine_command
from tests.collab.processes import PeerProcess, spawn_peer
from tests.nat.topology import Host

TURN_PORT = 3478
REALM = "cotrain.test"
REPO = Path(__file__).resolve().parents[2]


class Service:
    """A child process whose output goes to a log; ready once ``marker`` was printed."""

    def __init__(self, name: str, args: list[str], log: Path, marker: str, timeout: float,
                 env: dict | None = None) -> None:
        self.name, self.log = name, log
        self.ready_line = ""
        self._ready = threading.Event()
        self.process = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                        stdin=subprocess.DEVNULL, env={**os.environ, **(env or {})},
                                        cwd=REPO)
        self._reader = threading.Thread(target=self._read, args=(marker,), daemon=True)
        self._reader.start()
        if not self._ready.wait(timeout) or not self.ready_line:
            self.stop()
            raise RuntimeError(f"{name} did not start; see {log}")

    def _read(self, marker: str) -> None:
        assert self.process.stdout is not None
        with open(self.log, "ab") as sink:
            for line in self.process.stdout:
                sink.write(line)
                sink.flush()
                if not self._ready.is_set() and marker in line.decode(errors="replace"):
                    self.ready_line = line.decode(errors="replace").strip()
                    self._ready.set()
        self._ready.set()

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()

    def kill(self) -> None:
        self.process.kill()
        self.process.wait()


def start_coturn(host: Host, secret: str, workdir: Path, name: str = "coturn") -> Service:
    """coturn with time-limited credentials only (``use-auth-secret``), as in production."""
    return Service(name, [
        *host.prefix(), "turnserver", "-n", f"--listening-ip={host.address}", f"--relay-ip={host.address}",
        f"--listening-port={TURN_PORT}", f"--realm={REALM}", "--use-auth-secret",
        f"--static-auth-secret={secret}", "--no-cli", "--no-tls", "--no-dtls", "--log-file=stdout",
        "--simple-log", "--no-software-attribute", f"--pidfile={workdir / f'{name}.pid'}",
        f"--db={workdir / f'{name}.sqlite'}", "--min-port=49152", "--max-port=49999",
    ], workdir / f"{name}.log", "Total General servers", 20)


def start_backbone(host: Host, workdir: Path, catalog: Path, port: int, *args: str,
                   env: dict | None = None) -> tuple[Service, str]:
    data = workdir / f"backbone-{port}"
    service = Service(f"backbone-{port}", [
        *host.prefix(), *engine_command(), "backbone", "--host", host.address, "--port", str(port),
        "--data-dir", str(data), "--catalog", str(catalog), "-v", *args,
    ], workdir / f"backbone-{port}.log", "backbone listening on", 60, env=env)
    return service, service.ready_line.rsplit(" ", 1)[1]


# Inside a namespace every interface is the test's own: let LAN discovery use them all.
NAMESPACE_ENV = {"COTRAIN_LAN_INTERFACES": ""}


async def spawn_peer_in(host: Host, url: str | None, project: str, name: str, log_dir: Path,
                        *args: str) -> PeerProcess:
    return await spawn_peer(url, project, name, log_dir, *args, prefix=host.prefix(), env=NAMESPACE_ENV)


async def run_probes(a: Host, b: Host, url: str, project: str, workdir: Path, *args: str,
                     timeout: float = 120, a_args: tuple[str, ...] = ()) -> tuple[dict, dict]:
    """Two connectivity probes (tests/nat/probe.py), one per host; their JSON reports.
    ``args`` go to both, ``a_args`` to the first only."""
    rendezvous = workdir / f"rendezvous-{os.urandom(3).hex()}"
    rendezvous.mkdir()
    procs = []
    for host, me, other, own in ((a, "a", "b", a_args), (b, "b", "a", ())):
        log = open(workdir / f"probe-{rendezvous.name}-{me}.log", "wb")  # noqa: SIM115
        procs.append(await asyncio.create_subprocess_exec(
            *host.prefix(), sys.executable, "-m", "tests.nat.probe", "--backbone", url,
            "--project", project, "--name", me, "--other", other, "--rendezvous", str(rendezvous),
            *args, *own,
            stdout=asyncio.subprocess.PIPE, stderr=log, cwd=REPO,
        ))
        log.close()
    try:
        outputs = await asyncio.wait_for(asyncio.gather(*(p.communicate() for p in procs)), timeout)
    finally:
        for p in procs:
            with contextlib.suppress(ProcessLookupError):
                p.kill()
    reports = []
    for out, _ in outputs:
        lines = out.decode().strip().splitlines()
        reports.append(json.loads(lines[-1]) if lines else {"ok": False, "error": "no report"})
    return reports[0], reports[1]
