"""The app <-> worker protocol, version 3: one JSON object per line.

The desktop app starts ``cotrain worker`` as a child process and talks to it over its
stdin (commands) and stdout (events); the worker logs to stderr only. Every line is
``{"type": ..., ...fields}``; the worker's first line, ``hello``, says which version it
speaks, and the app talks only to a worker of its own version (both come from one
installation, so a mismatch means a broken one). A line the worker cannot read is answered
with a ``problem`` event (``fatal: false``) and otherwise ignored: a bad command never kills it.

Commands (app -> worker):

- ``start {backbone, project, token, name}`` join ``project`` on ``backbone`` (leaving the
  current project first). ``backbone: "local"`` (LOCAL_BACKBONE) means the worker's own
  embedded backbone, started on demand (it announces its URL with ``hosting``).
- ``leave {}`` leave the current project; the worker keeps running (and hosting).
- ``set_limits {limits}`` the governor's limits (engine.governor.limits.Limits), applied at
  once; answered by a ``governor`` event that carries them.
- ``pause {}``, ``resume {}`` (back to automatic), ``run_now {}`` (contribute regardless of
  idle time and schedule), ``snooze {until}`` (a UNIX time).
- ``stop {}`` leave cleanly and exit with status 0.

Events (worker -> app):

- ``hello {version, pid}`` first line, once the worker reads commands.
- ``hosting {url}`` the embedded backbone is listening.
- ``joined {backbone, project, title, peer_id, username}``.
- ``governor {running, state, reason, limits}`` whenever the governor decides differently
  or the limits change (``state`` is a GovernorState).
- ``stats {...}`` once a second while in a project (see Stats).
- ``epoch {step, my_samples, my_batches, paths}`` a global step this peer took part in
  (engine.peer.events.EpochCompleted).
- ``left {reason}`` the project was left (asked for, or the peer stopped by itself).
- ``connection {connected, message}`` the line to the backbone was lost (the worker keeps
  trying, and says how) or is back.
- ``problem {message, fatal, retry_in, hosting}`` something the user should know, in words
  for people (engine/problems.py); fatal ones end the project; ``retry_in``: the worker
  tries again by itself in that many seconds; ``hosting``: it is about this computer's
  own backbone.
"""

from __future__ import annotations

from typing import Annotated, Final

from msgspec import Meta, Struct

from engine.governor.limits import Limits
from engine.governor.policy import GovernorState
from engine.peer.events import EpochCompleted
from engine.project import ProjectMode
from engine.wire.codec import Codec, encode
from engine.wire.types import Count, EpochNumber, Loss, Name, ProjectId, Rate, Seconds, Text, Url

VERSION: Final = 4
MAX_LINE = 1 << 20
LOCAL_BACKBONE: Final = "local"  # ``start``'s backbone: the one the worker hosts on this computer


class Message(Struct, tag_field="type", kw_only=True):
    pass


# --- commands --------------------------------------------------------------------------


class Start(Message, tag="start"):
    backbone: Url  # a URL or LOCAL_BACKBONE
    project: ProjectId
    token: Annotated[str, Meta(max_length=256)] | None = None
    name: Name = ""


class Leave(Message, tag="leave"):
    pass


class SetLimits(Message, tag="set_limits"):
    limits: Limits


class Pause(Message, tag="pause"):
    pass


class Resume(Message, tag="resume"):
    pass


class RunNow(Message, tag="run_now"):
    pass


class Snooze(Message, tag="snooze"):
    until: Annotated[float, Meta(ge=0, le=1e11)]  # UNIX time


class Stop(Message, tag="stop"):
    pass


# --- events ----------------------------------------------------------------------------


class Hello(Message, tag="hello"):
    version: int
    pid: int


class Hosting(Message, tag="hosting"):
    url: Url


class ProjectJoined(Message, tag="joined"):
    backbone: Url
    project: ProjectId
    title: Text
    peer_id: Name
    username: Name | None = None


class GovernorDecided(Message, tag="governor"):
    running: bool
    state: GovernorState
    reason: Text
    limits: Limits


class Stats(Message, tag="stats"):
    """A snapshot, once a second. Rates are per second; samples count training examples."""

    samples_per_second: Rate  # mine
    my_samples_session: Count  # computed since this worker joined
    my_samples_total: Count  # credited in earlier sessions on this computer, plus this session
    collab_samples: Count  # gathered toward the next step
    collab_target: Count
    eta_seconds: Seconds | None
    epoch: EpochNumber
    peers: Count
    upload_bps: Rate  # bytes per second
    download_bps: Rate
    loss: Loss | None  # the mean loss of the last step (or of my current batch before one)
    device: Text = ""  # where micro-batches run, in words ("the CPU (no CUDA graphics card found)")
    # What the link achieves (probed, refined by rounds; engine/peer/bandwidth.py), None until measured:
    # the tracker sizes this peer's share of each round by it.
    link_upload_bps: Rate | None = None
    link_download_bps: Rate | None = None
    # The project's mode; in ``local`` mode, ``epoch`` counts outer steps, ``collab_*`` the
    # samples toward the next one, and ``inner_steps`` this peer's own steps since the last.
    mode: ProjectMode = "sync"
    inner_steps: Count | None = None


class ProjectLeft(Message, tag="left"):
    reason: Text


class Problem(Message, tag="problem"):
    message: Text
    fatal: bool = False
    retry_in: Seconds | None = None  # the worker tries again by itself, so long from now
    hosting: bool = False  # about this computer's backbone (``start`` with LOCAL_BACKBONE)


class ConnectionChanged(Message, tag="connection"):
    """The line to the backbone was lost (``message`` says what the worker does about it) or
    is back."""

    connected: bool
    message: Text


class Downloading(Message, tag="downloading"):
    """A download the peer waits for or runs ahead: the collaboration's state, or one of the
    project's files (``what`` says which, in words). Sent a few times a second at most."""

    what: Text
    received: Count
    total: Count


Command = Start | Leave | SetLimits | Pause | Resume | RunNow | Snooze | Stop
WorkerEvent = (Hello | Hosting | ProjectJoined | GovernorDecided | Stats | EpochCompleted | ProjectLeft
               | Problem | ConnectionChanged | Downloading)

commands: Codec[Command] = Codec(Command, "command", MAX_LINE)
events: Codec[WorkerEvent] = Codec(WorkerEvent, "event", MAX_LINE)


def encode_line(message: Message | EpochCompleted) -> bytes:
    """One line, newline included."""
    return encode(message) + b"\n"
