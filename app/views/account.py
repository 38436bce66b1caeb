"""Account: register, log in and log out against the current project's backbone. The token
goes to the OS keyring (engine/credentials.py); without one, to a private file, and this
page says so in plain words every time it is shown."""

from __future__ import annotations

from PySide6.QtWidgets import (
    QFormLayout,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QPushButton,
    QVBoxLayout,
    QWidget,
)

from app.controller import AppState, Controller
from app.views.common import count, duration, heading, help_text, message, show_message, size
from engine.credentials import Login
from engine.wire.rest import Me


class AccountPage(QWidget):
    def __init__(self, controller: Controller, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.controller = controller
        self.backbone = help_text("")
        self.status = QLabel("Not logged in: you contribute anonymously.")
        self.status.setWordWrap(True)
        self.where = message("ok")
        self.no_keyring = message("warning")
        self.totals = QLabel()
        self.totals.setWordWrap(True)
        self.username = QLineEdit()
        self.username.setPlaceholderText("3 to 32 letters, digits, . _ -")
        self.password = QLineEdit()
        self.password.setEchoMode(QLineEdit.EchoMode.Password)
        self.password.setPlaceholderText("at least 8 characters")
        self.log_in_button = QPushButton("Log in")
        self.register_button = QPushButton("Create account")
        self.log_out_button = QPushButton("Log out")
        self.error = message("error")
        self.log_in_button.clicked.connect(lambda: self._account("log_in"))
        self.register_button.clicked.connect(lambda: self._account("register"))
        self.password.returnPressed.connect(lambda: self._account("log_in"))
        self.log_out_button.clicked.connect(self.log_out)

        self.form = QWidget()
        fields = QFormLayout(self.form)
        fields.addRow("Username", self.username)
        fields.addRow("Password", self.password)
        buttons = QHBoxLayout()
        buttons.addWidget(self.log_in_button)
        buttons.addWidget(self.register_button)
        buttons.addStretch(1)
        fields.addRow("", buttons)

        layout = QVBoxLayout(self)
        layout.addWidget(heading("Account"))
        layout.addWidget(self.backbone)
        layout.addWidget(help_text("With an account, what this computer contributes is credited to you "
                                   "on the leaderboard, and you can use several computers under one name."))
        layout.addWidget(self.status)
        layout.addWidget(self.totals)
        layout.addWidget(self.where)
        layout.addWidget(self.no_keyring)
        layout.addWidget(self.form)
        layout.addWidget(self.log_out_button)
        layout.addWidget(self.error)
        layout.addStretch(1)
        self.login: Login | None = None
        self._show_login(None)
        controller.login_changed.connect(self._login_changed)
        controller.state_changed.connect(self._state)

    def showEvent(self, event) -> None:
        super().showEvent(event)
        self.controller.refresh_login()

    def _state(self, state: AppState) -> None:
        self.backbone.setText(f"Backbone: {state.backbone or 'starting…'}")

    def _login_changed(self, login: Login | None, where: str, keyring: bool) -> None:
        self._show_login(login)
        show_message(self.where, f"Your login is kept {where}." if login and keyring else "")
        show_message(self.no_keyring, "" if keyring else f"Logins are kept {where}.")
        if login is not None:
            self.controller.client.me(self.controller.backbone_url, login.token, self._me, lambda why: None)

    def _show_login(self, login: Login | None) -> None:
        self.login = login
        self.form.setVisible(login is None)
        self.log_out_button.setVisible(login is not None)
        if login is None:
            self.status.setText("Not logged in: you contribute anonymously.")
            self.totals.clear()
        else:
            self.status.setText(f"Logged in as <b>{login.username}</b>.")

    def _me(self, me: Me) -> None:
        project = self.controller.state.project_id
        mine = next((p for p in me.projects if p.project == project), None)
        if mine is None:
            self.totals.setText("No credited samples yet: they appear after the next step you take part in.")
            return
        rank = f", rank {mine.rank}" if mine.rank else ""
        aggregated = ""
        if mine.aggregated_bytes:
            place = f", rank {mine.aggregated_rank}" if mine.aggregated_rank else ""
            aggregated = f"{size(mine.aggregated_bytes)} aggregated as an auxiliary peer{place}; "
        self.totals.setText(f"{count(mine.samples)} samples credited{rank}; {aggregated}"
                            f"{duration(mine.compute_seconds)} of compute, "
                            f"{duration(mine.online_seconds)} online.")

    def _account(self, action: str) -> None:
        url = self.controller.backbone_url
        username, password = self.username.text().strip(), self.password.text()
        if not url:
            show_message(self.error, "Join a project first: accounts belong to a backbone.")
            return
        if not username or not password:
            show_message(self.error, "Type a username and a password.")
            return
        show_message(self.error, "")
        self.log_in_button.setEnabled(False)
        self.register_button.setEnabled(False)
        call = self.controller.client.register if action == "register" else self.controller.client.log_in
        call(url, username, password, self._logged_in, self._failed)

    def _logged_in(self, result: tuple[Login, str]) -> None:
        login, _where = result
        self.password.clear()
        self.log_in_button.setEnabled(True)
        self.register_button.setEnabled(True)
        self.controller.logged_in(login)

    def _failed(self, why: str) -> None:
        self.log_in_button.setEnabled(True)
        self.register_button.setEnabled(True)
        show_message(self.error, why)

    def log_out(self) -> None:
        def done(note: str) -> None:
            show_message(self.error, note)
            self.controller.logged_in(None)

        self.controller.client.log_out(self.controller.backbone_url, done, self._failed)
