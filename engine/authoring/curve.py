"""``cotrain project curve URL ID``: a project's learning curve in the terminal, where a
researcher watching a run over SSH looks: its training loss drawn in text, and a table of
steps with their held-out scores; and where a person at a display runs it, in a window too
(the app's plot: app/curve_window.py)."""

from __future__ import annotations

import os
import statistics
import sys
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable

from engine.wire import ProtocolError
from engine.wire.rest import Curve, CurvePoint, reply_codec

BLOCKS = " ▁▂▃▄▅▆▇█"
MAX_REPLY = 64 * 1024 * 1024


def fetch_curve(url: str, project: str) -> Curve:
    address = f"{url.rstrip('/')}/api/projects/{urllib.parse.quote(project, safe='')}/curve"
    try:
        with urllib.request.urlopen(address, timeout=30) as reply:
            body = reply.read(MAX_REPLY + 1)
    except urllib.error.HTTPError as exc:
        raise ValueError(f"{address}: {exc.code} {exc.reason}") from None
    except (urllib.error.URLError, OSError) as exc:
        raise ValueError(f"cannot reach {url}: {getattr(exc, 'reason', exc)}") from None
    if len(body) > MAX_REPLY:
        raise ValueError(f"{address} answered more than {MAX_REPLY} bytes")
    try:
        return reply_codec(Curve).decode(body)
    except ProtocolError as exc:
        raise ValueError(f"{address} did not answer a curve: {exc}") from None


def plot(points: list[CurvePoint], width: int = 64, height: int = 10) -> list[str]:
    """The training loss, one column per run of steps (their mean), eight levels a row."""
    losses = [(p.epoch, p.loss) for p in points if p.loss is not None]
    if len(losses) < 2:
        return []
    columns = min(width, len(losses))
    means = [statistics.fmean(loss for _, loss in losses[c * len(losses) // columns:
                                                          (c + 1) * len(losses) // columns])
             for c in range(columns)]
    low, high = min(means), max(means)
    span = (high - low) or 1.0
    eighths = [round((m - low) / span * (height * 8 - 1)) + 1 for m in means]
    rows = []
    for row in range(height - 1, -1, -1):
        cells = "".join(BLOCKS[min(max(e - row * 8, 0), 8)] for e in eighths)
        label = f"{high:8.3f} ┤" if row == height - 1 else f"{low:8.3f} ┤" if row == 0 else " " * 8 + " │"
        rows.append(label + cells)
    first, last = losses[0][0], losses[-1][0]
    rows.append(" " * 9 + "└" + "─" * columns)
    rows.append(" " * 10 + f"step {first}".ljust(max(columns - len(f"step {last}"), 0)) + f"step {last}")
    return rows


def table(points: list[CurvePoint], rows: int = 12) -> list[str]:
    """Steps spread over the run (every one scored on the held-out set among them)."""
    if not points:
        return []
    chosen = {round(i * (len(points) - 1) / max(rows - 1, 1)) for i in range(min(rows, len(points)))}
    chosen |= {i for i, p in enumerate(points) if p.heldout_loss is not None}
    lines = [f"{'step':>7} {'loss':>9} {'held-out':>9} {'accuracy':>9} {'samples':>9} {'peers':>6}"]
    for i in sorted(chosen):
        p = points[i]
        loss = "-" if p.loss is None else f"{p.loss:.4f}"
        heldout = "-" if p.heldout_loss is None else f"{p.heldout_loss:.4f}"
        accuracy = "-" if p.heldout_accuracy is None else f"{100 * p.heldout_accuracy:.1f}%"
        lines.append(f"{p.epoch:>7} {loss:>9} {heldout:>9} {accuracy:>9} {p.samples:>9} {p.peers:>6}")
    return lines


def show_curve(url: str, project: str, say, window: Callable[[Curve, str], None] | None = None) -> int:
    curve = fetch_curve(url, project)
    if not curve.epochs:
        say(f"{project} has taken no step yet")
        return 0
    say(f"{project}: {len(curve.epochs)} steps, training loss")
    for line in [*plot(curve.epochs), "", *table(curve.epochs)]:
        say(line)
    if window is not None:
        window(curve, f"{project}: learning curve ({url})")
    return 0


def curve_window() -> Callable[[Curve, str], None] | None:
    """The app's curve window where a person at a display runs the command (a terminal,
    not a script reading its output); None elsewhere, or where the app is not installed."""
    if not sys.stdout.isatty():
        return None
    display = os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY")
    if sys.platform.startswith("linux") and not display:
        return None
    try:
        from app.curve_window import show
    except ImportError:
        return None
    return show
