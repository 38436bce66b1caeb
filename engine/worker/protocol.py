"""The app <-> worker protocol, version 1: one JSON object per line.

The desktop app starts ``cotrain worker`` as a child process and talks to it over its
stdin (commands) and stdout (events); the worker logs to stderr only. Every line is
``{"v": 1, "type": ..., ...fields}``. A line the worker cannot read is answered with an
``error`` event (``fatal: false``) and otherwise ignored: a bad command never kills it.

Commands (app -> worker):

- ``start {backbone, project, token, name}`` join ``project`` on ``backbone`` (leaving the
  current project first). ``backbone: "local"`` means the worker's own embedded backbone,
  started on demand (it announces its URL with ``hosting``). ``token`` may be null.
- ``leave {}`` leave the current project; the worker keeps running (and hosting).
- ``set_limits {limits}`` the governor's limits (engine.governor.limits.Limits as a dict),
  applied at once; answered by a ``state`` event that carries them.
- ``pause {}``, ``resume {}`` (back to automatic), ``run_now {}`` (contribute regardless of
  idle time and schedule), ``snooze {until}`` (a UNIX time).
- ``stop {}`` leave cleanly and exit with status 0.

Events (worker -> app):

- ``hello {version, pid}`` first line, once the worker reads commands.
- ``hosting {url}`` the embedded backbone is listening.
- ``joined {backbone, project, title, peer_id, username}``.
- ``state {running, code, reason, limits}`` whenever the governor decides differently or the
  limits change; ``code`` is the governor's (running, paused, snoozed, battery, schedule,
  memory, waiting_idle, idle_unknown) or ``idle`` before any project is joined.
- ``stats {...}`` once a second while in a project (see Stats).
- ``epoch {epoch, loss, samples, peers, my_samples}`` a global step this peer took part in.
- ``left {reason}`` the project was left (asked for, or the peer stopped by itself).
- ``error {message, fatal}`` something the user should know; fatal errors end the project.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any, ClassVar

from engine.wire import ProtocolError
from engine.wire.schema import from_dict

VERSION = 1
MAX_LINE = 1 << 20

# --- commands --------------------------------------------------------------------------


@dataclass
class Start:
    TYPE: ClassVar[str] = "start"
    backbone: str
    project: str
    token: str | None = None
    name: str = ""


@dataclass
class Leave:
    TYPE: ClassVar[str] = "leave"


@dataclass
class SetLimits:
    TYPE: ClassVar[str] = "set_limits"
    limits: dict = field(default_factory=dict)


@dataclass
class Pause:
    TYPE: ClassVar[str] = "pause"


@dataclass
class Resume:
    TYPE: ClassVar[str] = "resume"


@dataclass
class RunNow:
    TYPE: ClassVar[str] = "run_now"


@dataclass
class Snooze:
    TYPE: ClassVar[str] = "snooze"
    until: float  # UNIX time


@dataclass
class Stop:
    TYPE: ClassVar[str] = "stop"


# --- events ----------------------------------------------------------------------------


@dataclass
class Hello:
    TYPE: ClassVar[str] = "hello"
    version: int
    pid: int


@dataclass
class Hosting:
    TYPE: ClassVar[str] = "hosting"
    url: str


@dataclass
class Joined:
    TYPE: ClassVar[str] = "joined"
    backbone: str
    project: str
    title: str
    peer_id: str
    username: str | None = None


@dataclass
class State:
    TYPE: ClassVar[str] = "state"
    running: bool
    code: str
    reason: str
    limits: dict = field(default_factory=dict)


@dataclass
class Stats:
    """A snapshot, once a second. Rates are per second; samples count training examples."""

    TYPE: ClassVar[str] = "stats"
    samples_per_second: float  # mine
    my_samples_session: int  # computed since this worker joined
    my_samples_total: int  # credited in earlier sessions on this computer, plus this session
    collab_samples: int  # gathered toward the next step
    collab_target: int
    eta_seconds: float | None
    epoch: int
    peers: int
    upload_bps: float  # bytes per second
    download_bps: float
    loss: float | None  # the mean loss of the last step (or of my current batch before one)
    device: str = ""  # where micro-batches run, in words ("the CPU (no CUDA graphics card found)")


@dataclass
class Epoch:
    TYPE: ClassVar[str] = "epoch"
    epoch: int
    loss: float | None
    samples: int
    peers: int
    my_samples: int


@dataclass
class Left:
    TYPE: ClassVar[str] = "left"
    reason: str


@dataclass
class Error:
    TYPE: ClassVar[str] = "error"
    message: str
    fatal: bool = False


COMMANDS: dict[str, type] = {c.TYPE: c for c in (Start, Leave, SetLimits, Pause, Resume, RunNow, Snooze,
                                                  Stop)}
EVENTS: dict[str, type] = {e.TYPE: e for e in (Hello, Hosting, Joined, State, Stats, Epoch, Left, Error)}
Command = Start | Leave | SetLimits | Pause | Resume | RunNow | Snooze | Stop
Event = Hello | Hosting | Joined | State | Stats | Epoch | Left | Error


def encode(message: Any) -> str:
    """One line, newline included."""
    return json.dumps({"v": VERSION, "type": message.TYPE, **asdict(message)}, separators=(",", ":")) + "\n"


def _decode(line: str | bytes, kinds: dict[str, type]) -> Any:
    if len(line) > MAX_LINE:
        raise ProtocolError(f"line longer than {MAX_LINE} bytes")
    try:
        data = json.loads(line)
    except (ValueError, UnicodeDecodeError) as exc:
        raise ProtocolError(f"not JSON: {exc}") from None
    if not isinstance(data, dict):
        raise ProtocolError("a message must be a JSON object")
    if data.pop("v", None) != VERSION:
        raise ProtocolError(f"unsupported protocol version (this worker speaks {VERSION})")
    kind = data.pop("type", None)
    if kind not in kinds:
        raise ProtocolError(f"unknown message type {kind!r}")
    return from_dict(kinds[kind], data, kind)


def decode_command(line: str | bytes) -> Command:
    return _decode(line, COMMANDS)


def decode_event(line: str | bytes) -> Event:
    return _decode(line, EVENTS)
