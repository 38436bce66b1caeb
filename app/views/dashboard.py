"""The dashboard: the state and its reason, the figures of a worker's stats events, progress
toward the collaboration's next step, and two live plots (loss per step, my contribution)."""

from __future__ import annotations

import time

import pyqtgraph as pg
from PySide6.QtWidgets import (
    QGridLayout,
    QHBoxLayout,
    QLabel,
    QProgressBar,
    QPushButton,
    QVBoxLayout,
    QWidget,
)

from app.controller import AppPhase, AppState, Controller, TrayKind
from app.icons import icon
from app.trayicon import SNOOZE_SECONDS
from app.views.common import HELD_OUT_LOSS, TRAINING_LOSS, Tile, count, duration, heading, help_text, rate
from engine.console import megabytes
from engine.peer.events import EpochCompleted
from engine.wire.rest import Curve
from engine.worker import protocol as p

TITLES = {TrayKind.CONTRIBUTING: "Contributing", TrayKind.PAUSED: "Paused",
          TrayKind.WAITING: "Waiting for idle time", TrayKind.ERROR: "Something went wrong"}
MAX_POINTS = 3600
HELDOUT_RELOAD = 5  # steps between fetches of the curve's held-out points


class DashboardPage(QWidget):
    def __init__(self, controller: Controller, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.controller = controller
        self._loss: dict[int, float] = {}
        self._mine_t: list[float] = []
        self._mine_n: list[int] = []
        self._curve_for = ""
        self._heldout: dict[int, tuple[float, float | None]] = {}  # epoch -> held-out loss, accuracy

        self.state_icon = QLabel()
        self.title = heading("Starting…")
        self.reason = QLabel()
        self.reason.setWordWrap(True)
        self.project = help_text("")
        self.device = help_text("")
        self.download = help_text("")  # a download the peer waits for or runs ahead
        self.contribute = QPushButton("Contribute now")
        self.contribute.clicked.connect(controller.contribute_now)
        self.pause = QPushButton("Pause")
        self.pause.clicked.connect(self._pause_or_resume)
        self.snooze = QPushButton("Snooze 1 hour")
        self.snooze.clicked.connect(lambda: controller.snooze(SNOOZE_SECONDS))

        head = QHBoxLayout()
        head.addWidget(self.state_icon)
        words = QVBoxLayout()
        for widget in (self.title, self.reason, self.project, self.device, self.download):
            words.addWidget(widget)
        head.addLayout(words, 1)
        for button in (self.contribute, self.pause, self.snooze):
            head.addWidget(button)

        self.progress = QProgressBar()
        self.progress.setTextVisible(False)
        self.progress_title = QLabel("<b>Progress toward the next step</b>")
        self.progress_text = QLabel("Waiting for the collaboration's progress…")
        self.mode = QLabel("")
        self.mode.setWordWrap(True)

        self.tiles = {
            "speed": Tile("samples per second (mine)"),
            "session": Tile("my samples this session"),
            "total": Tile("my samples in total"),
            "epoch": Tile("epoch (steps taken together)"),
            "peers": Tile("peers online"),
            "upload": Tile("upload"),
            "download": Tile("download"),
            "loss": Tile("loss (lower is better)"),
        }
        grid = QGridLayout()
        for i, tile in enumerate(self.tiles.values()):
            grid.addWidget(tile, i // 4, i % 4)

        plots = self._plots()

        layout = QVBoxLayout(self)
        layout.addLayout(head)
        layout.addSpacing(8)
        layout.addWidget(self.progress_title)
        layout.addWidget(self.progress)
        layout.addWidget(self.progress_text)
        layout.addWidget(self.mode)
        layout.addSpacing(8)
        layout.addLayout(grid)
        layout.addLayout(plots, 1)

        controller.state_changed.connect(self.show_state)
        controller.stats.connect(self.show_stats)
        controller.epoch.connect(self.add_epoch)
        controller.downloading.connect(self.show_download)
        self.show_state(controller.state)

    def _plots(self) -> QHBoxLayout:
        """The loss per step beside this computer's own samples over time."""
        pg.setConfigOptions(antialias=True, background=None, foreground=self.palette().text().color())
        self.loss_plot = pg.PlotWidget(title="Loss per step")
        self.loss_plot.setLabel("bottom", "epoch")
        self.loss_plot.addLegend(offset=(-10, 10))
        self.loss_line = self.loss_plot.plot([], [], pen=pg.mkPen(TRAINING_LOSS, width=2), symbol="o",
                                             symbolSize=4, name="training")
        # The project's held-out set, scored by a few peers every few steps (where it has one).
        self.heldout_line = self.loss_plot.plot([], [], pen=pg.mkPen(HELD_OUT_LOSS, width=2), symbol="s",
                                                symbolSize=6, name="held out")
        self.mine_plot = pg.PlotWidget(title="My contribution (samples)",
                                       axisItems={"bottom": pg.DateAxisItem()})
        self.mine_line = self.mine_plot.plot([], [], pen=pg.mkPen("#0ca678", width=2), fillLevel=0,
                                             brush=pg.mkBrush(12, 166, 120, 50))
        for plot in (self.loss_plot, self.mine_plot):
            plot.setMinimumHeight(180)
            plot.showGrid(x=True, y=True, alpha=0.2)
            plot.setMouseEnabled(x=False, y=False)
            plot.hideButtons()
        # Until there is something to draw, say what will be drawn rather than show empty axes.
        self.hints = {self.loss_plot: _hint(self.loss_plot, "The loss appears after the first step"),
                      self.mine_plot: _hint(self.mine_plot, "Your samples appear as you compute")}
        plots = QHBoxLayout()
        plots.addWidget(self.loss_plot)
        plots.addWidget(self.mine_plot)
        return plots

    def show_state(self, state: AppState) -> None:
        self.state_icon.setPixmap(icon(f"tray-{state.kind}").pixmap(48, 48))
        self.title.setText(TITLES[state.kind] if state.phase not in (AppPhase.STARTING, AppPhase.JOINING)
                           else state.reason)
        self.reason.setText(state.reason if state.reason != self.title.text() else "")
        if state.project:
            who = f"as {state.username}" if state.username else "anonymously"
            self.project.setText(f"{state.project} at {state.backbone}, {who}")
        else:
            self.project.setText(state.backbone)
        self.pause.setText("Resume" if state.user_paused else "Pause")
        if state.project_id and state.backbone and self._curve_for != f"{state.backbone} {state.project_id}" \
                and state.project:
            self._curve_for = f"{state.backbone} {state.project_id}"
            self._loss.clear()
            self._heldout.clear()
            self.controller.client.curve(state.backbone, state.project_id, self._curve_loaded, lambda m: None)

    def show_download(self, d: p.Downloading) -> None:
        done = d.total and d.received >= d.total
        share = f"{100 * d.received // d.total}% of {megabytes(d.total)}" if d.total \
            else megabytes(d.received)
        self.download.setText("" if done else f"Downloading {d.what}: {share}")

    def _pause_or_resume(self) -> None:
        if self.controller.state.user_paused:
            self.controller.resume()
        else:
            self.controller.pause()

    def _curve_loaded(self, curve: Curve) -> None:
        for point in curve.epochs:
            if point.loss is not None:
                self._loss.setdefault(point.epoch, point.loss)
            if point.heldout_loss is not None:
                self._heldout[point.epoch] = (point.heldout_loss, point.heldout_accuracy)
        self._draw_loss()

    def show_stats(self, s: p.Stats) -> None:
        t = self.tiles
        t["speed"].set(f"{s.samples_per_second:.1f}")
        t["session"].set(count(s.my_samples_session))
        t["total"].set(count(s.my_samples_total))
        t["epoch"].set(count(s.epoch))
        t["peers"].set(count(s.peers))
        t["upload"].set(rate(s.upload_bps))
        t["download"].set(rate(s.download_bps))
        for tile, link, word in ((t["upload"], s.link_upload_bps, "upload"),
                                 (t["download"], s.link_download_bps, "download")):
            tile.caption.setText(f"{word} (my link: {rate(link)})" if link else f"{word} (link not measured)")
        t["loss"].set("–" if s.loss is None else f"{s.loss:.3f}")
        self.device.setText(f"Computing on {s.device}" if s.device else "")
        target = max(s.collab_target, 1)
        self.progress.setRange(0, target)
        self.progress.setValue(min(s.collab_samples, target))
        step = "outer step" if s.mode == "local" else "step"
        eta = f" · next {step} in about {duration(s.eta_seconds)}" if s.eta_seconds is not None else ""
        self.progress_text.setText(f"{count(s.collab_samples)} of {count(s.collab_target)} samples "
                                   f"gathered by {s.peers} peer{'s' if s.peers != 1 else ''}{eta}")
        self._show_mode(s)
        self._mine_t.append(time.time())
        self._mine_n.append(s.my_samples_total)
        del self._mine_t[:-MAX_POINTS], self._mine_n[:-MAX_POINTS]
        self.mine_line.setData(self._mine_t, self._mine_n)
        _show_data(self.mine_plot, self.hints[self.mine_plot], True)

    def _show_mode(self, s: p.Stats) -> None:
        local = s.mode == "local"
        self.progress_title.setText(f"<b>Progress toward the next {'outer ' if local else ''}step</b>")
        if not local:
            self.mode.setText("Synchronous training: every step averages the whole batch's gradient.")
            return
        steps = s.inner_steps or 0
        self.mode.setText(f"Local updates (DiLoCo): {count(steps)} step{'' if steps == 1 else 's'} on this "
                          "computer since the last outer step; peers average their progress at the next one.")

    def add_epoch(self, completed: EpochCompleted) -> None:
        step = completed.step
        self.tiles["epoch"].set(count(step.epoch))
        if step.loss is not None:
            self._loss[step.epoch] = step.loss
            self._draw_loss()
        if step.epoch % HELDOUT_RELOAD == 0:  # peers may have scored the held-out set since
            state = self.controller.state
            self.controller.client.curve(state.backbone, state.project_id, self._curve_loaded, lambda m: None)

    def _draw_loss(self) -> None:
        epochs = sorted(self._loss)[-MAX_POINTS:]
        self.loss_line.setData(epochs, [self._loss[k] for k in epochs])
        scored = [k for k in sorted(self._heldout) if not epochs or k >= epochs[0]]
        self.heldout_line.setData(scored, [self._heldout[k][0] for k in scored])
        accuracy = self._heldout[scored[-1]][1] if scored else None
        title = "Loss per step"
        if accuracy is not None:
            title += f" · held-out accuracy {accuracy:.1%} at epoch {scored[-1]}"
        self.loss_plot.setTitle(title)
        _show_data(self.loss_plot, self.hints[self.loss_plot], bool(epochs))


def _hint(plot: pg.PlotWidget, text: str) -> pg.TextItem:
    hint = pg.TextItem(text, anchor=(0.5, 0.5), color=plot.palette().placeholderText().color())
    hint.setPos(0.5, 0.5)
    plot.addItem(hint, ignoreBounds=True)
    plot.setRange(xRange=(0, 1), yRange=(0, 1), padding=0)
    _show_data(plot, hint, False)
    return hint


def _show_data(plot: pg.PlotWidget, hint: pg.TextItem, shown: bool) -> None:
    hint.setVisible(not shown)
    for side in ("left", "bottom"):
        plot.getAxis(side).setStyle(showValues=shown)
    plot.enableAutoRange(enable=shown)
