"""nginx in front of several backbone processes, configured by the deployment example
(resources/deploy/nginx-cotrain.conf) as written, its addresses swapped for free ports."""

from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path

from engine.paths import engine_command
from engine.resources import resources_dir


class FrontDoorMissing(RuntimeError):
    pass


def nginx_binary() -> str:
    nginx = shutil.which("nginx") or "/usr/sbin/nginx"
    if not Path(nginx).exists():
        raise FrontDoorMissing("nginx is not installed (apt-get install nginx-light); .ci/run installs it")
    return nginx


def start_front_door(root: Path, front: int, backbones: list[int]) -> subprocess.Popen:
    """nginx listening on ``front`` and passing requests to the ``backbones`` (ports)."""
    site = (resources_dir() / "deploy" / "nginx-cotrain.conf").read_text()
    site = site.replace("127.0.0.1:8470", f"127.0.0.1:{front}")
    for example, port in zip(("127.0.0.1:8471", "127.0.0.1:8472"), backbones, strict=True):
        site = site.replace(example, f"127.0.0.1:{port}")
    (root / "site.conf").write_text(site)
    return run_nginx(root)


def run_nginx(root: Path) -> subprocess.Popen:
    """nginx serving ``root``/site.conf, its files in ``root``; once it listens."""
    nginx = nginx_binary()
    kinds = ("client_body", "proxy", "fastcgi", "uwsgi", "scgi")
    temp = " ".join(f"{kind}_temp_path {root / kind};" for kind in kinds)
    (root / "nginx.conf").write_text(
        f"daemon off; user root; worker_processes 1; pid {root / 'nginx.pid'};\n"
        f"error_log {root / 'nginx-error.log'} info; worker_rlimit_nofile 65536;\n"
        "events { worker_connections 32768; }\n"
        f"http {{ access_log off; {temp} include {root / 'site.conf'}; }}\n")
    process = subprocess.Popen([nginx, "-c", str(root / "nginx.conf"), "-p", str(root)],
                               stdout=subprocess.DEVNULL, stderr=(root / "nginx.out").open("wb"))
    deadline = time.monotonic() + 20
    while not (root / "nginx.pid").exists():  # written once it listens
        assert process.poll() is None and time.monotonic() < deadline, (root / "nginx.out").read_text()
        time.sleep(0.05)
    return process


def start_backbone_process(port: int, data: Path, catalog: Path, database: str,
                           log: Path) -> subprocess.Popen:
    """A `cotrain backbone` behind the front door, as the deployment example says: its own
    data folder under ``data``, the checkpoints' one shared."""
    process = subprocess.Popen(
        [*engine_command(), "backbone", "-v", "--port", str(port), "--data-dir", str(data / str(port)),
         "--checkpoints", str(data / "checkpoints"), "--catalog", str(catalog), "--database", database,
         "--trusted-proxy", "127.0.0.1"],
        stdout=subprocess.PIPE, stderr=log.open("ab"), stdin=subprocess.DEVNULL, text=True)
    assert process.stdout is not None
    line = process.stdout.readline()
    assert line.startswith("backbone listening on "), log.read_text()[-3000:]
    return process
