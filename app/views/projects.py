"""Projects: the catalog of every known backbone (this computer's and those added by URL),
with live peers, progress and my contribution; join or leave; add a backbone by URL."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from PySide6.QtCore import Qt, QTimer
from PySide6.QtWidgets import (
    QHBoxLayout,
    QHeaderView,
    QLineEdit,
    QPushButton,
    QTreeWidget,
    QTreeWidgetItem,
    QVBoxLayout,
    QWidget,
)

from app.controller import Controller
from app.settings_store import Current
from app.views.common import count, duration, heading, help_text, message, show_message
from engine.backoff import Backoff
from engine.console import megabytes
from engine.credentials import Login
from engine.lan.records import LanBackbone
from engine.wire.rest import Me, ProjectSummary, ProjectTotals
from engine.worker.protocol import LOCAL_BACKBONE

REFRESH_MS = 10_000
# A backbone that did not answer is asked again after a growing, jittered pause (up to
# five minutes), not every ten seconds: many apps must not hammer one that restarts.
RETRY_FIRST, RETRY_CAP = REFRESH_MS / 1000, 300.0
COLUMNS = ("Project", "Peers online", "Progress", "My contribution", "")


@dataclass
class BackboneRow:
    """What one backbone answered: its projects and my totals there, or why it did not."""

    projects: list[ProjectSummary] = field(default_factory=list)
    me: Me | None = None
    error: str = ""


class ProjectsPage(QWidget):
    def __init__(self, controller: Controller, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.controller = controller
        self.url = QLineEdit()
        self.url.setPlaceholderText("http://backbone.example.org:8470")
        self.add = QPushButton("Add backbone")
        self.add.clicked.connect(self.add_backbone)
        self.url.returnPressed.connect(self.add_backbone)
        self.error = message("error")
        self.tree = QTreeWidget()
        self.tree.setColumnCount(len(COLUMNS))
        self.tree.setHeaderLabels(COLUMNS)
        self.tree.setRootIsDecorated(False)
        header = self.tree.header()
        header.setStretchLastSection(False)
        header.setSectionResizeMode(0, QHeaderView.ResizeMode.Stretch)
        for column in (1, 2, 3):
            header.setSectionResizeMode(column, QHeaderView.ResizeMode.ResizeToContents)
        header.setSectionResizeMode(4, QHeaderView.ResizeMode.Fixed)
        header.resizeSection(4, 96)
        self.tree.setWordWrap(True)
        self.refresh_button = QPushButton("Refresh")
        self.refresh_button.clicked.connect(lambda: self.refresh(force=True))

        adding = QHBoxLayout()
        adding.addWidget(self.url, 1)
        adding.addWidget(self.add)
        top = QHBoxLayout()
        top.addWidget(heading("Projects"), 1)
        top.addWidget(self.refresh_button)
        layout = QVBoxLayout(self)
        layout.addLayout(top)
        layout.addWidget(help_text("Cotrain contributes to one project at a time. Projects come from "
                                   "backbones: the one on this computer, and any you add by address."))
        layout.addWidget(self.tree, 1)
        self.lan_status = help_text("Looking for backbones on your network…")
        self.lan_buttons = QHBoxLayout()
        self.lan_buttons.addStretch(1)
        layout.addWidget(self.lan_status)
        layout.addLayout(self.lan_buttons)
        layout.addWidget(help_text("Add a backbone someone shared with you:"))
        layout.addLayout(adding)
        layout.addWidget(self.error)

        self.rows: dict[str, BackboneRow] = {}
        self.on_lan: list[LanBackbone] = []  # announced on the LAN, as last browsed
        self._backoffs: dict[str, Backoff] = {}
        self._retry_at: dict[str, float] = {}  # backbones that failed: not asked before then
        self._timer = QTimer(self, interval=REFRESH_MS)
        self._timer.timeout.connect(self.refresh)
        controller.backbones_changed.connect(self.refresh)
        controller.state_changed.connect(lambda state: self._draw())

    def showEvent(self, event) -> None:
        super().showEvent(event)
        self.refresh()
        self._timer.start()

    def hideEvent(self, event) -> None:
        super().hideEvent(event)
        self._timer.stop()

    def backbones(self) -> list[str]:
        return [LOCAL_BACKBONE, *self.controller.store.backbones()]

    def refresh(self, force: bool = False) -> None:
        self.controller.client.discover(self._discovered, lambda why: self._discovered([], why))
        now = time.monotonic()
        for backbone in self.backbones():
            url = self.controller.url_of(backbone)
            if not url:
                problem = self.controller.hosting_problem if backbone == LOCAL_BACKBONE else ""
                self.rows[backbone] = BackboneRow(error=problem or "starting…")
                continue
            if not force and now < self._retry_at.get(backbone, 0.0):
                continue
            self.controller.client.load_login(
                url, lambda found, b=backbone, u=url: self._fetch(b, u, found[0]),
                lambda m, b=backbone, u=url: self._fetch(b, u, None))
        self._draw()

    def _discovered(self, found: list[LanBackbone], error: str = "") -> None:
        known = {self.controller.url_of(b).rstrip("/") for b in self.backbones()}
        self.on_lan = [b for b in found if b.url not in known]
        while self.lan_buttons.count() > 1:
            item = self.lan_buttons.takeAt(0)
            widget = item.widget() if item is not None else None
            if widget is not None:
                widget.deleteLater()
        for backbone in self.on_lan:
            titles = ", ".join(sorted(backbone.projects.values())) or "no projects yet"
            button = QPushButton(f"Add {backbone.name} ({titles})")
            button.setToolTip(backbone.url)
            button.clicked.connect(lambda _=False, url=backbone.url: self.controller.add_backbone(url))
            self.lan_buttons.insertWidget(self.lan_buttons.count() - 1, button)
        if error:
            text = f"Could not look for backbones on your network: {error}"
        elif self.on_lan:
            text = "Announced on your network:"
        else:
            text = "No other backbone announces itself on your network."
        self.lan_status.setText(text)

    def _fetch(self, backbone: str, url: str, login: Login | None) -> None:
        self.controller.client.projects(
            url, login.token if login else None,
            lambda found: self._loaded(backbone, BackboneRow(found[0].projects, found[1])),
            lambda error: self._loaded(backbone, BackboneRow(error=error)))

    def _loaded(self, backbone: str, row: BackboneRow) -> None:
        backoff = self._backoffs.setdefault(backbone, Backoff(RETRY_FIRST, RETRY_CAP))
        if row.error:
            wait = backoff.next()
            self._retry_at[backbone] = time.monotonic() + wait
            row.error = f"{row.error} (trying again in {duration(wait)})"
        else:
            backoff.reset()
            self._retry_at.pop(backbone, None)
        self.rows[backbone] = row
        self._draw()

    def _draw(self) -> None:
        self.tree.clear()
        current = self.controller.store.current()
        for backbone in self.backbones():
            row = self.rows.get(backbone)
            name = "This computer" if backbone == LOCAL_BACKBONE else backbone
            group = QTreeWidgetItem([name])
            font = group.font(0)
            font.setBold(True)
            group.setFont(0, font)
            self.tree.addTopLevelItem(group)
            if backbone != LOCAL_BACKBONE:
                remove = QPushButton("Remove")
                remove.clicked.connect(lambda _=False, b=backbone: self.controller.remove_backbone(b))
                self.tree.setItemWidget(group, 4, remove)
            if row is None:
                group.setText(1, "loading…")
                continue
            if row.error:
                group.setText(1, row.error)
                group.setToolTip(1, row.error)
                continue
            mine = {p.project: p for p in row.me.projects} if row.me else {}
            for spec in row.projects:
                self._project_row(backbone, spec, mine.get(spec.id), current)

    def _project_row(self, backbone: str, spec: ProjectSummary, mine: ProjectTotals | None,
                     current: Current | None) -> None:
        joined = current is not None and current == Current(backbone, spec.id)
        eta = spec.eta_seconds
        step = "outer step" if spec.mode == "local" else "step"
        progress = (f"epoch {spec.epoch} · {count(spec.samples)}/{count(spec.target_batch_size)}"
                    + (f" · next {step} in {duration(eta)}" if eta is not None else "")
                    + ("\nlocal updates (DiLoCo), for home links" if spec.mode == "local" else ""))
        if mine is not None:
            rank = f", rank {mine.rank}" if mine.rank else ""
            contribution = f"{count(mine.samples)} samples{rank}"
        elif joined and self.controller.last_stats is not None:
            contribution = f"{count(self.controller.last_stats.my_samples_total)} samples (this computer)"
        else:
            contribution = "log in to see" if backbone != LOCAL_BACKBONE or not joined else "–"
        takes = self._takes(backbone, spec)
        item = QTreeWidgetItem([f"{spec.title}\n{spec.description}" + (f"\nTakes {takes}" if takes else ""),
                                str(spec.peers), progress, contribution])
        item.setToolTip(0, spec.description)
        item.setData(0, Qt.ItemDataRole.UserRole, (backbone, spec.id))
        self.tree.addTopLevelItem(item)
        button = QPushButton("Leave" if joined else "Join")
        if joined:
            button.clicked.connect(self.controller.leave)
        else:
            choice = Current(backbone, spec.id)
            button.clicked.connect(lambda _=False: self.join(choice))
        self.tree.setItemWidget(item, 4, button)

    def _takes(self, backbone: str, spec: ProjectSummary) -> str:
        """What the project will take on this computer, as far as is known before joining."""
        parts = []
        if spec.data is not None:
            parts.append(f"{megabytes(spec.data.total_bytes())} to download and keep")
        if spec.needs is not None:
            parts.append(f"about {spec.needs.memory_mb:,} MB of memory")
        rate = self.controller.measured_rates.get((self.controller.url_of(backbone), spec.id))
        if rate:
            parts.append(f"{rate:.1f} samples/s here")
        return ", ".join(parts)

    def join(self, current: Current) -> None:
        self.controller.join(current)
        self._draw()

    def add_backbone(self) -> None:
        url = self.url.text().strip()
        if not url:
            show_message(self.error, "Type the backbone's address, e.g. http://backbone.example.org:8470")
            return
        if "://" not in url:
            url = f"http://{url}"
        self.add.setEnabled(False)
        show_message(self.error, "")

        def added(base: str) -> None:
            self.add.setEnabled(True)
            self.url.clear()
            self.controller.add_backbone(base)

        def failed(why: str) -> None:
            self.add.setEnabled(True)
            show_message(self.error, f"Could not add {url}: {why}")

        self.controller.client.health(url, added, failed)
