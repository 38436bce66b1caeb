"""The leaderboard of the current project, from its backbone: my row highlighted, paging,
refresh; ranked by samples computed or, for auxiliary peers, by bytes aggregated."""

from __future__ import annotations

from PySide6.QtGui import QBrush, QColor, QFont
from PySide6.QtWidgets import (
    QComboBox,
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QPushButton,
    QTableWidget,
    QTableWidgetItem,
    QVBoxLayout,
    QWidget,
)

from app.controller import AppState, Controller
from app.views.common import count, duration, heading, help_text, message, show_message, size
from engine.wire.rest import Leaderboard, LeaderboardEntry, Ranking

PAGE_SIZE = 25
COLUMNS = ("Rank", "Volunteer", "Samples", "Aggregated", "Share", "Compute time", "Online")
RANKINGS = {Ranking.SAMPLES: "Samples computed", Ranking.AGGREGATED: "Bytes aggregated"}
MINE = QColor("#d3f9d8")


class LeaderboardPage(QWidget):
    def __init__(self, controller: Controller, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.controller = controller
        self.page_size = PAGE_SIZE
        self.offset = 0
        self.total_samples = 0
        self.entries: list[LeaderboardEntry] = []
        self.subtitle = help_text("")
        self.table = QTableWidget(0, len(COLUMNS))
        self.table.setHorizontalHeaderLabels(COLUMNS)
        self.table.verticalHeader().setVisible(False)
        self.table.setEditTriggers(QTableWidget.EditTrigger.NoEditTriggers)
        self.table.setSelectionMode(QTableWidget.SelectionMode.NoSelection)
        self.table.horizontalHeader().setSectionResizeMode(1, QHeaderView.ResizeMode.Stretch)
        self.previous = QPushButton("‹ Previous")
        self.previous.clicked.connect(lambda: self.load(max(self.offset - self.page_size, 0)))
        self.next = QPushButton("Next ›")
        self.next.clicked.connect(lambda: self.load(self.offset + self.page_size))
        self.page = QLabel()
        self.refresh_button = QPushButton("Refresh")
        self.refresh_button.clicked.connect(lambda: self.load(self.offset))
        self.ranking = QComboBox()
        for ranking, label in RANKINGS.items():
            self.ranking.addItem(label, ranking)
        self.ranking.setToolTip("Training peers are ranked by the samples they computed; auxiliary peers "
                                "(no training) by the bytes of gradients they aggregated for the others")
        self.ranking.currentIndexChanged.connect(lambda _: self.load(0))
        self.error = message("error")

        top = QHBoxLayout()
        top.addWidget(heading("Leaderboard"), 1)
        top.addWidget(QLabel("Rank by"))
        top.addWidget(self.ranking)
        top.addWidget(self.refresh_button)
        paging = QHBoxLayout()
        paging.addWidget(self.previous)
        paging.addStretch(1)
        paging.addWidget(self.page)
        paging.addStretch(1)
        paging.addWidget(self.next)
        layout = QVBoxLayout(self)
        layout.addLayout(top)
        layout.addWidget(self.subtitle)
        layout.addWidget(self.error)
        layout.addWidget(self.table, 1)
        layout.addLayout(paging)
        self._shown_for = ""
        self._latest = 0
        controller.state_changed.connect(self._state)
        controller.login_changed.connect(lambda *_: self._draw())
        controller.stats.connect(self._stats)

    def showEvent(self, event) -> None:
        super().showEvent(event)
        self.load(self.offset)

    def _state(self, state: AppState) -> None:
        key = f"{state.backbone} {state.project_id}"
        if key != self._shown_for and self.isVisible():
            self.load(0)

    def load(self, offset: int) -> None:
        state = self.controller.state
        if not state.backbone or not state.project_id:
            self.subtitle.setText("Join a project to see who contributes to it.")
            return
        self._shown_for = f"{state.backbone} {state.project_id}"
        by = self.by
        what = "Credited samples" if by is Ranking.SAMPLES else "Bytes aggregated by auxiliary peers"
        self.subtitle.setText(f"{what} in {state.project or state.project_id} at {state.backbone}")
        self.refresh_button.setEnabled(False)
        # Replies come back from a thread pool in any order; only the latest request may draw,
        # or a slow earlier page would replace the one the user just asked for.
        self._latest += 1
        request = self._latest
        self.controller.client.leaderboard(state.backbone, state.project_id, self.page_size, offset, by,
                                           lambda body: self._loaded(request, offset, body),
                                           lambda why: self._failed(request, why))

    @property
    def by(self) -> Ranking:
        return Ranking(self.ranking.currentData())

    def _failed(self, request: int, why: str) -> None:
        if request != self._latest:
            return
        self.refresh_button.setEnabled(True)
        show_message(self.error, f"Could not load the leaderboard: {why}")

    def _loaded(self, request: int, offset: int, board: Leaderboard) -> None:
        if request != self._latest:
            return
        self.refresh_button.setEnabled(True)
        show_message(self.error, "")
        self.offset = offset
        self.entries = board.entries
        self.total_samples = board.total_samples
        self._draw()

    @property
    def my_username(self) -> str | None:
        login = self.controller.login
        return login.username if login else self.controller.state.username

    def _draw(self) -> None:
        me = self.my_username
        anonymous = self._anonymous_row() if me is None else None
        self.table.setRowCount(len(self.entries) + (anonymous is not None))
        if anonymous is not None:
            # Most first-time users contribute without an account: their own work shows here
            # too, from this computer's count, though the backbone ranks only accounts.
            for column, text in enumerate(anonymous):
                item = QTableWidgetItem(text)
                item.setBackground(QBrush(MINE))
                font = QFont(item.font())
                font.setItalic(True)
                item.setFont(font)
                item.setToolTip("Your contribution from this computer. Log in on the Account page to be "
                                "ranked among the volunteers.")
                self.table.setItem(len(self.entries), column, item)
        for row, entry in enumerate(self.entries):
            samples = count(entry.samples)
            if entry.withdrawn:  # taken back: a peer of the user was caught returning wrong results
                samples += f" ({count(entry.withdrawn)} withdrawn)"
            cells = (str(entry.rank), entry.username, samples,
                     size(entry.aggregated_bytes) if entry.aggregated_bytes else "",
                     f"{100 * entry.share:.1f} %", duration(entry.compute_seconds),
                     "yes" if entry.online else "")
            mine = me is not None and entry.username == me
            for column, text in enumerate(cells):
                item = QTableWidgetItem(text)
                if mine:
                    item.setBackground(QBrush(MINE))
                    font = QFont(item.font())
                    font.setBold(True)
                    item.setFont(font)
                    item.setToolTip("You")
                self.table.setItem(row, column, item)
        first = self.offset + 1 if self.entries else 0
        if self.entries:
            self.page.setText(f"{first}–{self.offset + len(self.entries)}")
        else:
            self.page.setText("No volunteer with an account has been credited yet." if anonymous else
                              "Nobody has been credited yet.")
        self.previous.setEnabled(self.offset > 0)
        self.next.setEnabled(len(self.entries) == self.page_size)

    def _stats(self, _stats: object) -> None:
        if self.isVisible() and self.my_username is None:
            self._draw()  # this computer's own line follows its count

    def _anonymous_row(self) -> tuple[str, ...] | None:
        """This computer's line while the user is not logged in, if it has contributed."""
        stats = self.controller.last_stats
        if stats is None or self.by is not Ranking.SAMPLES:
            return None
        return ("–", "This computer (not logged in)", count(stats.my_samples_total), "", "", "", "yes")

    def my_row(self) -> int | None:
        me = self.my_username
        return next((i for i, e in enumerate(self.entries) if me and e.username == me), None)
