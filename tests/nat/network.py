"""The NAT test network: a public segment with coturn, two public hosts, three home routers."""

from __future__ import annotations

import contextlib
import secrets
from dataclasses import dataclass
from pathlib import Path

from tests.collab.harness import tiny_project
from tests.collab.processes import write_catalog
from tests.nat.services import TURN_PORT, Service, start_backbone, start_coturn
from tests.nat.topology import Host, Topology

ROUND_TIMEOUT = 12


@dataclass
class Network:
    topology: Topology
    workdir: Path
    catalog: Path
    secret: str
    public: Host  # the public segment's server (backbone and coturn live there)
    host: Host  # a peer with a public address
    lan_host: Host  # another public peer on the same segment (the same LAN as ``host``)
    cone: Host  # behind a port-preserving NAT
    cone2: Host  # behind another one
    symmetric: Host  # behind a symmetric NAT
    coturn: Service | None = None

    @property
    def stun(self) -> str:
        return f"stun:{self.public.address}:{TURN_PORT}"

    @property
    def turn(self) -> str:
        return f"turn:{self.public.address}:{TURN_PORT}"

    def start_coturn(self) -> Service:
        self.coturn = start_coturn(self.public, self.secret, self.workdir)
        return self.coturn

    def backbone(self, port: int, *args: str, turn: bool = True,
                 catalog: Path | None = None) -> tuple[Service, str]:
        ice = ["--stun", self.stun]
        env = None
        if turn:
            ice += ["--turn", self.turn]
            env = {"COTRAIN_TURN_SECRET": self.secret}
        return start_backbone(self.public, self.workdir, catalog or self.catalog, port, *ice, *args, env=env)


@contextlib.contextmanager
def nat_network(workdir: Path):
    """Build the network and start coturn; tear everything down on the way out."""
    topology = Topology()
    net = None
    try:
        net = Network(
            topology=topology, workdir=workdir,
            catalog=write_catalog(workdir / "catalog.json",
                                  tiny_project(target_batch_size=256, round_timeout=ROUND_TIMEOUT)),
            secret=secrets.token_hex(16), public=topology.public_host, host=topology.public_peer(),
            lan_host=topology.public_peer(), cone=topology.behind_nat(symmetric=False),
            cone2=topology.behind_nat(symmetric=False), symmetric=topology.behind_nat(symmetric=True),
        )
        net.start_coturn()
        yield net
    finally:
        if net is not None and net.coturn is not None:
            net.coturn.stop()
        topology.close()
