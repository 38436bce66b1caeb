"""The cotrain command line: the desktop app (no arguments), backbone, peer, demo, accounts,
and the app's worker process. Arguments are checked before anything heavy is imported: a
mistake is named with its flag in a fraction of a second (exit 2), not after torch loads."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import importlib.util
import logging
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn

from engine import __version__, aio
from engine.authoring.commands import add_project_parser, run_project_command
from engine.backbone.command import add_backbone_parser, run_backbone
from engine.governor.limits import DEFAULT_DISK_GB

if TYPE_CHECKING:
    from engine.governor.limits import Limits


DESCRIPTION = ("Pool idle computers to train deep-learning models together. With no command, "
               "Cotrain opens the desktop app; without a display, it runs the same collaboration "
               "in the terminal.")


def _add_logging(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("-v", "--verbose", action="count", default=0,
                        help="more log output (-vv for debugging)")


def _setup_logging(verbose: int) -> None:
    level = logging.WARNING - 10 * verbose
    logging.basicConfig(level=max(level, logging.DEBUG), stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if verbose < 2:
        for noisy in ("aioice", "aiortc", "aiohttp.access"):
            logging.getLogger(noisy).setLevel(logging.WARNING)


def whole(low: int, high: int | None = None) -> Callable[[str], int]:
    """An argparse type: a whole number from ``low`` to ``high`` (no upper bound if None)."""
    def convert(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
        if value < low or (high is not None and value > high):
            within = f"from {low} to {high}" if high is not None else f"at least {low}"
            raise argparse.ArgumentTypeError(f"must be {within}, not {value}")
        return value
    return convert


def amount(low: float, high: float, unit: str, short: str) -> Callable[[str], float]:
    """An argparse type: a number of ``unit`` from ``low`` to ``high``."""
    def convert(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number of {unit}") from None
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"must be from {low:g} to {high:g} {short}, not {text}")
        return value
    return convert


minutes = amount(0, 24 * 60, "minutes", "minutes")
gigabytes = amount(0.1, 10**6, "gigabytes", "GB")


def schedule(text: str) -> str:
    from engine.governor.weekly_hours import WeeklySchedule

    try:
        WeeklySchedule.parse(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


PORT = whole(0, 65535)


def _add_limit_options(parser: argparse.ArgumentParser) -> None:
    limits = parser.add_argument_group("resource limits")
    limits.add_argument("--cpu-percent", type=whole(1, 100), default=100, metavar="P",
                        help="compute P%% of the time and rest the remainder (default 100)")
    limits.add_argument("--max-memory", type=whole(64), default=None, metavar="MB",
                        help="pause while the worker uses more memory than this")
    limits.add_argument("--max-disk", type=gigabytes, default=DEFAULT_DISK_GB, metavar="GB",
                        help="disk space for projects' data; the least recently used shards go first "
                             f"(default: {DEFAULT_DISK_GB:g})")
    limits.add_argument("--max-upload", type=whole(1), default=None, metavar="KBPS",
                        help="upload at most this many kilobytes per second")
    limits.add_argument("--max-download", type=whole(1), default=None, metavar="KBPS",
                        help="download at most this many kilobytes per second")
    limits.add_argument("--only-when-idle", type=minutes, nargs="?", const=5.0, default=None,
                        metavar="MINUTES", help="compute only after this many idle minutes (default 5)")
    limits.add_argument("--no-battery", action="store_true", help="pause while on battery")
    limits.add_argument("--schedule", type=schedule, default="always",
                        help="allowed hours, e.g. 'mon-fri 18:00-08:00, weekends'")
    limits.add_argument("--normal-priority", action="store_true",
                        help="do not lower the worker's OS priority")
    limits.add_argument("--no-gpu", action="store_true",
                        help="compute on the CPU even when a CUDA graphics card is present")


def limits_from_args(args: argparse.Namespace) -> Limits:
    from engine.governor.limits import Limits

    return Limits.checked(
        threads=args.threads, cpu_percent=args.cpu_percent, max_memory_mb=args.max_memory,
        max_disk_gb=args.max_disk,
        max_upload_kbps=args.max_upload, max_download_kbps=args.max_download,
        run_on_battery=not args.no_battery, only_when_idle=args.only_when_idle is not None,
        idle_minutes=args.only_when_idle if args.only_when_idle is not None else 5.0,
        schedule=args.schedule, low_priority=not args.normal_priority, use_gpu=not args.no_gpu,
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="cotrain", description=DESCRIPTION)
    parser.add_argument("--self-test", action="store_true",
                        help="check that this installation has everything it needs, then exit")
    parser.add_argument("--background", action="store_true",
                        help="start the desktop app in the tray, waiting for the desktop's tray to "
                             "come up (what start at login runs)")
    parser.add_argument("--version", action="version", version=f"cotrain {__version__}")
    sub = parser.add_subparsers(dest="command")

    add_backbone_parser(sub, _add_logging, PORT)

    peer = sub.add_parser("peer", help="join a collaboration and train")
    peer.add_argument("--backbone", default=None, help="backbone URL, e.g. http://host:8470")
    peer.add_argument("--project", default=None, help="project id, e.g. demo-lm")
    peer.add_argument("--discover", action="store_true",
                      help="list the backbones on the LAN; with --project, join the first that hosts it")
    peer.add_argument("--relay-only", action="store_true",
                      help="connect to other peers through the backbone's TURN relay only")
    peer.add_argument("--aux", action="store_true",
                      help="an auxiliary peer: no training, only aggregate the others' gradients (for a "
                           "machine with a good connection but no useful compute)")
    peer.add_argument("--name", default="", help="name shown to others")
    peer.add_argument("--max-epochs", type=whole(1), default=None, help="leave after this epoch")
    peer.add_argument("--save-state", metavar="FILE", default=None,
                      help="as the peer leaves, write the model and optimizer state it holds to FILE")
    peer.add_argument("--threads", type=whole(1, 1024), default=None, help="compute threads")
    peer.add_argument("--data", default=None, help="folder of text files to train on")
    peer.add_argument("--data-seed", type=int, default=None, help=argparse.SUPPRESS)
    peer.add_argument("--slowdown", type=float, default=1.0, help=argparse.SUPPRESS)
    peer.add_argument("--ice-address", action="append", default=None,
                      help="only offer this local address for connections (repeatable)")
    peer.add_argument("--json", action="store_true", help="one JSON line per completed epoch")
    peer.add_argument("--anonymous", action="store_true",
                      help="do not use the login stored for this backbone")
    _add_limit_options(peer)
    _add_logging(peer)

    for name, text in (("login", "log in to a backbone and keep the token"),
                       ("register", "create an account on a backbone and log in")):
        account = sub.add_parser(name, help=text)
        account.add_argument("--backbone", required=True, help="backbone URL")
        account.add_argument("--username", default=None)
        _add_logging(account)
    logout = sub.add_parser("logout", help="revoke and forget the login for a backbone")
    logout.add_argument("--backbone", required=True, help="backbone URL")
    _add_logging(logout)

    demo = sub.add_parser("demo", help="a backbone and local peers training demo-lm together")
    demo.add_argument("--peers", type=whole(1, 64), default=3, help="peers to start (default 3)")
    demo.add_argument("--epochs", type=whole(1), default=5, help="epochs to train (default 5)")
    demo.add_argument("--data", default=None, help="folder of text files to train on")
    demo.add_argument("--catalog", type=Path, default=None, help=argparse.SUPPRESS)
    _add_logging(demo)

    add_project_parser(sub, _add_logging)

    worker = sub.add_parser("worker", help="the desktop app's engine process (JSON lines on stdin/stdout)")
    worker.add_argument("--catalog", type=Path, default=None, help="projects of the local backbone")
    _add_logging(worker)
    return parser


def run(argv: list[str] | None = None) -> NoReturn:
    """The ``cotrain`` program: ``main``, then out without the interpreter's teardown."""
    code = main(argv)
    from engine.program_exit import leave

    leave(code)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    _check(parser, args)
    if args.self_test:
        from engine.selftest import main as self_test

        return self_test(_app_checks())
    if args.command is None:
        from app.main import main as app_main

        return app_main(background=args.background)
    _setup_logging(args.verbose)
    try:
        if args.command == "backbone":
            return _run(run_backbone(args))
        if args.command == "peer":
            return _run(_peer(args))
        if args.command in ("login", "register", "logout"):
            from engine.account_cli import run_account_command

            return _run(run_account_command(args))
        if args.command == "demo":
            from engine.demo import run_demo

            return _run(run_demo(args.peers, args.epochs, args.data, args.catalog))
        if args.command == "project":
            return run_project_command(args)
        if args.command == "worker":
            from engine.worker.main import run as run_worker

            return run_worker(args.catalog)
    except KeyboardInterrupt:
        return 130
    return 2


def _check(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """What argparse cannot check alone; a usage error exits 2 naming what is wrong."""
    if args.command == "peer" and not args.discover and not (args.backbone and args.project):
        parser.exit(2, "cotrain peer: give --backbone URL and --project ID (or --discover)\n")
    if args.command in ("peer", "login", "register", "logout") and args.backbone:
        from engine.urls import backbone_key

        try:
            backbone_key(args.backbone)
        except ValueError as exc:
            parser.exit(2, f"cotrain {args.command}: --backbone: {exc}\n")
    if args.command == "register" and args.username is not None:
        from engine.wire.rest import check_username

        try:
            check_username(args.username)
        except ValueError as exc:
            parser.exit(2, f"cotrain {args.command}: --username: {exc}\n")


def _app_checks() -> list:
    """The desktop app's self-test checks, where the app's libraries are installed."""
    if importlib.util.find_spec("PySide6") is None:
        print("skip  qt         the desktop app is not installed here (cotrain[app])", flush=True)
        return []
    from app.selftest import CHECKS

    return CHECKS


def _run(coro) -> int:
    """Run ``coro`` with SIGTERM and SIGINT stopping it cleanly."""
    async def wrapper() -> int:
        task = asyncio.ensure_future(coro)
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            with contextlib.suppress(NotImplementedError):
                loop.add_signal_handler(sig, task.cancel)
        try:
            return await task
        except asyncio.CancelledError:
            return 130

    return aio.run(wrapper())


async def _peer(args: argparse.Namespace) -> int:
    from engine.account_cli import stored_token
    from engine.governor.governor import Governor
    from engine.governor.throttle import lower_priority
    from engine.peer.auxiliary import AuxiliaryPeer
    from engine.peer.client import PROJECT_CHANGED, BackboneError
    from engine.peer.options import PeerOptions
    from engine.peer.report import ConsoleReporter
    from engine.peer.runner import Peer

    if args.discover:
        found = await _discover(args.project)
        if args.project is None or not found:
            return 0 if found or args.project is None else 1
        args.backbone = found[0].url
        print(f"joining {args.project} on {args.backbone}", file=sys.stderr)
    try:
        token = None if args.anonymous else stored_token(args.backbone)
        limits = limits_from_args(args)
    except (ValueError, RuntimeError) as exc:
        print(f"cotrain peer: {exc}", file=sys.stderr)
        return 1
    if limits.low_priority:
        lower_priority()
    options = PeerOptions(
        backbone_url=args.backbone, project_id=args.project, name=args.name,
        max_epochs=args.max_epochs, threads=args.threads, data_dir=args.data,
        data_seed=args.data_seed, slowdown=args.slowdown, ice_addresses=args.ice_address,
        user_token=token, limits=limits, relay_only=args.relay_only, auxiliary=args.aux,
        save_state=args.save_state,
    )
    kind = AuxiliaryPeer if args.aux else Peer
    reason, carried = PROJECT_CHANGED, None
    while reason == PROJECT_CHANGED:  # (its new version: a new peer, as a volunteer's app does)
        reporter = ConsoleReporter(json_lines=args.json)
        peer = kind(dataclasses.replace(options, carried_state=carried), reporter)
        governing = asyncio.ensure_future(Governor(limits).run(peer))
        try:
            reason = await peer.run()
        except (BackboneError, ValueError, OSError) as exc:
            print(f"cotrain peer: {exc}", file=sys.stderr)
            return 1
        except asyncio.CancelledError:
            return 130
        finally:
            governing.cancel()
        carried = peer.carried
    return 0 if reason.startswith("reached epoch") else 1


async def _discover(project: str | None):
    """Print the backbones on the LAN (those hosting ``project``, if given) and return them.

    Listing is the command's output; before joining, it is commentary and goes to stderr.
    """
    from engine.lan.discover import discover

    out = sys.stdout if project is None else sys.stderr
    found = [b for b in await discover() if project is None or project in b.projects]
    if not found:
        print("no Cotrain backbone found on the LAN" + (f" hosting {project}" if project else ""), file=out)
    for backbone in found:
        print(f"{backbone.url}  {backbone.name}", file=out)
        for project_id, title in sorted(backbone.projects.items()):
            print(f"    {project_id}: {title}", file=out)
    return found
