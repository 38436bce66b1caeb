"""`cotrain backbone`: its options, checked before anything heavy is imported, and its run."""

from __future__ import annotations

import argparse
import asyncio
import ipaddress
import json
import logging
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from engine.paths import user_data_dir

if TYPE_CHECKING:
    from engine.backbone.server import BackboneConfig

log = logging.getLogger(__name__)


def add_backbone_parser(sub, add_logging: Callable[[argparse.ArgumentParser], None],
                        port: Callable[[str], int]) -> None:
    bb = sub.add_parser("backbone", help="run the server that coordinates a collaboration")
    bb.add_argument("--host", default="127.0.0.1", help="address to bind (default: 127.0.0.1)")
    bb.add_argument("--port", type=port, default=8470, help="port, 0 for any free one (default: 8470)")
    bb.add_argument("--data-dir", type=Path, default=None,
                    help="where the database and checkpoints live")
    bb.add_argument("--database", default=None, metavar="URL",
                    help="keep the records on a PostgreSQL server instead of an SQLite file in the "
                         "data directory, e.g. postgresql://cotrain@db.example.org/cotrain (a password "
                         "goes in ~/.pgpass or PGPASSWORD, not on the command line); several backbone "
                         "processes may share one, each project's tracker running in one of them")
    bb.add_argument("--internal-url", default=None, metavar="URL",
                    help="with --database: how the other backbone processes reach this one, e.g. "
                         "http://10.0.0.2:8470 (default: the address it listens on)")
    bb.add_argument("--checkpoints", type=Path, default=None, metavar="DIR",
                    help="where checkpoint files live (default: the data directory's checkpoints); "
                         "processes sharing a --database share this folder too, e.g. on NFS")
    bb.add_argument("--catalog", type=Path, default=None, help="projects JSON file")
    bb.add_argument("--projects", type=Path, default=None, metavar="DIR",
                    help="serve the project folders in DIR too (one folder per project, with its "
                         "project.json, tokenizer and shards; see `cotrain project new`)")
    bb.add_argument("--tensorboard", type=Path, default=None, metavar="DIR",
                    help="write each project's learning curve as TensorBoard event files in DIR/PROJECT")
    bb.add_argument("--peer-timeout", type=float, default=15.0,
                    help="seconds of silence after which a peer is left out of rounds")
    bb.add_argument("--stun", action="append", default=[], metavar="URL",
                    help="STUN server handed to peers, e.g. stun:turn.example.org:3478 (repeatable)")
    bb.add_argument("--turn", action="append", default=[], metavar="URL",
                    help="TURN server handed to peers, e.g. turn:turn.example.org:3478 (repeatable)")
    bb.add_argument("--turn-secret-file", type=Path, default=None, metavar="FILE",
                    help="file holding coturn's static-auth-secret (or set COTRAIN_TURN_SECRET)")
    bb.add_argument("--turn-ttl", type=int, default=6 * 3600, metavar="SECONDS",
                    help="how long a peer's TURN credentials stay valid (default: 6 hours)")
    bb.add_argument("--relay-only", action="store_true",
                    help="tell every peer to connect through TURN only")
    bb.add_argument("--equal-shares", action="store_true",
                    help="give every reducer an equal part of each round instead of sizing parts by "
                         "the links peers measure (to compare)")
    bb.add_argument("--advertise", action="store_true",
                    help="announce the backbone on the LAN (mDNS, _cotrain._tcp)")
    bb.add_argument("--trusted-proxy", action="append", default=[], metavar="ADDR",
                    help="a reverse proxy in front of the backbone: its X-Forwarded-For names the "
                         "client (repeat for several; without it, the header is ignored)")
    bb.add_argument("--ipv6-prefix", type=_ipv6_prefix, default=64, metavar="BITS",
                    help="per-address limits count an IPv6 client by its network of this many bits "
                         "(default: 64, what one host is usually given; IPv4 counts by address)")
    add_logging(bb)


def _ipv6_prefix(text: str) -> int:
    bits = int(text)
    if not 0 <= bits <= 128:
        raise argparse.ArgumentTypeError(f"an IPv6 prefix is 0 to 128 bits, not {bits}")
    return bits


async def run_backbone(args: argparse.Namespace) -> int:
    from engine.backbone.addresses import plain_address
    from engine.backbone.ice import IceConfig, read_turn_secret
    from engine.backbone.server import BackboneConfig
    from engine.backbone.store.opening import is_database_url

    try:
        ice = IceConfig(stun_urls=args.stun, turn_urls=args.turn, turn_ttl=args.turn_ttl,
                        relay_only=args.relay_only, turn_secret=read_turn_secret(args.turn_secret_file))
        ice.validate()
        proxies = frozenset(plain_address(str(ipaddress.ip_address(a))) for a in args.trusted_proxy)
    except (OSError, ValueError) as exc:
        print(f"cotrain backbone: {exc}", file=sys.stderr)
        return 2
    if args.database is not None and not is_database_url(args.database):
        print(f"cotrain backbone: --database takes a postgresql:// URL, not {args.database!r}",
              file=sys.stderr)
        return 2
    if args.verbose == 0:  # (-v shows them with the rest of INFO)
        for shown in ("engine.backbone.steps", "engine.backbone.project_watch"):  # (steps, projects offered)
            logging.getLogger(shown).setLevel(logging.INFO)
    config = BackboneConfig(data_dir=args.data_dir or user_data_dir() / "backbone", database=args.database,
                            tensorboard_dir=args.tensorboard,
                            internal_url=args.internal_url,
                            host=args.host, port=args.port, peer_timeout=args.peer_timeout,
                            ice=ice, advertise=args.advertise, trusted_proxies=proxies,
                            equal_shares=args.equal_shares, ipv6_prefix=args.ipv6_prefix)
    if args.catalog:
        config.catalog = args.catalog
    config.projects_dir = args.projects
    config.checkpoints_dir = args.checkpoints
    try:
        await serve(config)
    except (OSError, ValueError, RuntimeError) as exc:
        print(f"cotrain backbone: {exc}", file=sys.stderr)
        return 1
    return 0


def raise_open_file_limit() -> None:
    """Every peer holds a socket open; the default soft limit (often 1024) caps a backbone at
    about a thousand peers, so take what the hard limit allows."""
    try:
        import resource
    except ImportError:  # Windows has no such limit
        return
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = hard if hard != resource.RLIM_INFINITY else 65536
    if soft < target:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        except (ValueError, OSError) as exc:
            log.warning("could not raise the open-file limit from %d: %s", soft, exc)


async def serve(config: BackboneConfig, ready_message: bool = True) -> None:
    """Run a backbone until cancelled."""
    from engine.backbone.server import Backbone

    raise_open_file_limit()
    backbone = Backbone(config)
    url = await backbone.start()
    advertiser = None
    if config.advertise:
        from engine.lan.advertise import Advertiser

        await backbone.projects_ready()  # announced with the catalog's projects that carry data
        port = int(url.rsplit(":", 1)[1])
        advertiser = Advertiser(config.host, port, {p.id: p.title for p in backbone.projects.values()})
        await advertiser.start()
    if ready_message:
        print(f"backbone listening on {url}", flush=True)
    log.info("projects: %s", json.dumps(sorted(backbone.projects)))
    try:
        await asyncio.Event().wait()
    finally:
        if advertiser is not None:
            await advertiser.stop()
        await backbone.stop()
