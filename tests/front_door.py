"""nginx in front of several backbone processes, configured by the deployment example
(resources/deploy/nginx-cotrain.conf) as written, its addresses swapped for free ports."""

from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path

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
    nginx = nginx_binary()
    site = (resources_dir() / "deploy" / "nginx-cotrain.conf").read_text()
    site = site.replace("127.0.0.1:8470", f"127.0.0.1:{front}")
    for example, port in zip(("127.0.0.1:8471", "127.0.0.1:8472"), backbones, strict=True):
        site = site.replace(example, f"127.0.0.1:{port}")
    (root / "site.conf").write_text(site)
    kinds = ("client_body", "proxy", "fastcgi", "uwsgi", "scgi")
    temp = " ".join(f"{kind}_temp_path {root / kind};" for kind in kinds)
    (root / "nginx.conf").write_text(
        f"daemon off; user root; worker_processes 1; pid {root / 'nginx.pid'};\n"
        f"error_log {root / 'nginx-error.log'} info; worker_rlimit_nofile 16384;\n"
        "events { worker_connections 8192; }\n"
        f"http {{ access_log off; {temp} include {root / 'site.conf'}; }}\n")
    process = subprocess.Popen([nginx, "-c", str(root / "nginx.conf"), "-p", str(root)],
                               stdout=subprocess.DEVNULL, stderr=(root / "nginx.out").open("wb"))
    deadline = time.monotonic() + 20
    while not (root / "nginx.pid").exists():  # written once it listens
        assert process.poll() is None and time.monotonic() < deadline, (root / "nginx.out").read_text()
        time.sleep(0.05)
    return process
