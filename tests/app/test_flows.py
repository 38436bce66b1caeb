"""The app with its real worker process, joined to a real backbone: the flows a volunteer
goes through, asserted on what they would see. One app serves the module (a worker takes
seconds to start); each test leaves it contributing, as it found it."""

from __future__ import annotations

import os
import signal
from dataclasses import dataclass

import keyring
import pytest

from app.application import CotrainApp
from app.controller import Controller
from app.settings_store import Current, SettingsStore
from app.views.leaderboard import COLUMNS
from engine.credentials import SERVICE
from engine.governor.policy import GovernorState
from engine.urls import backbone_key
from engine.wire.rest import Ranking
from tests.app.conftest import (
    TEST_LIMITS,
    WORKER_START,
    ThreadedBackbone,
    keyring_backend,
    private_home,
    stop_app,
    threaded_backbone,
    tiny,
    wait_until,
)
from tests.collab.accounts import register
from tests.collab.harness import start_peer, stop_all
from tests.unit.test_credentials import memory_keyring

pytestmark = pytest.mark.timeout(120)


@dataclass
class Running:
    app: CotrainApp
    backbone: ThreadedBackbone
    keys: object

    @property
    def dashboard(self):
        return self.app.window.pages["dashboard"]

    def page(self, name: str):
        self.app.window.show_page(name)
        return self.app.window.pages[name]


@pytest.fixture(scope="module")
def running(qapp, tmp_path_factory):
    root = tmp_path_factory.mktemp("flows")
    with pytest.MonkeyPatch.context() as mp, keyring_backend(memory_keyring()) as keys, \
            threaded_backbone(root / "backbone", tiny()) as backbone:
        private_home(mp, root)
        store = SettingsStore()
        store.set_limits(TEST_LIMITS)
        store.set_current(Current(backbone.url, "tiny-lm"))
        app = CotrainApp(Controller(store=store), tray=True)
        app.start()
        try:
            wait_until(lambda: app.controller.state.kind == "contributing", WORKER_START,
                       "the app to contribute")
            yield Running(app, backbone, keys)
        finally:
            stop_app(app)


def contributing(r: Running) -> bool:
    return r.app.controller.state.kind == "contributing" and r.dashboard.title.text() == "Contributing"


def session_samples(r: Running) -> int:
    text = r.dashboard.tiles["session"].text().replace(",", "")
    return int(text) if text.isdigit() else 0


def points(line) -> int:
    x = line.getData()[0]
    return 0 if x is None else len(x)


def test_the_dashboard_numbers_move(qtbot, running):
    d = running.dashboard
    wait_until(lambda: session_samples(running) > 0, 20)
    before = session_samples(running)
    wait_until(lambda: session_samples(running) > before, 20)
    wait_until(lambda: d.tiles["epoch"].text() not in ("–", "0"), 30)
    assert float(d.tiles["speed"].text()) > 0
    assert d.tiles["peers"].text() == "1"
    assert "of 64 samples gathered by 1 peer" in d.progress_text.text()
    assert d.progress.maximum() == 64
    wait_until(lambda: points(d.loss_line) >= 1, 10)
    assert points(d.mine_line) >= 2
    # A running total across rounds: a round in flight holds what it took, and the chart
    # never dips (it did, 380 -> 270, while each round ran).
    first = int(d.tiles["epoch"].text().replace(",", ""))
    wait_until(lambda: int(d.tiles["epoch"].text().replace(",", "")) >= first + 3, 30, "three more steps")
    assert d._mine_n == sorted(d._mine_n), d._mine_n
    assert not any(hint.isVisible() for hint in d.hints.values())  # "appears after the first step"
    assert "Tiny LM" in d.project.text() and "anonymously" in d.project.text()
    # The link was probed against the backbone on joining: the tiles say what it achieves.
    wait_until(lambda: "my link:" in d.tiles["download"].caption.text(), 20)
    assert "my link:" in d.tiles["upload"].caption.text()


def test_the_tray_menu_opens_each_window(qtbot, running):
    window, actions = running.app.window, {a.text(): a for a in running.app.tray.menu.actions()}
    assert {"Contribute now", "Pause", "Snooze 1 hour", "Contribute only while idle", "Open Cotrain",
            "Projects…", "Settings…", "Quit"} <= set(actions)
    window.hide()
    for text, page in (("Projects…", "projects"), ("Settings…", "settings"), ("Open Cotrain", "dashboard")):
        actions[text].trigger()
        wait_until(lambda p=page: window.isVisible() and window.current_page == p, 5, f"{text}: {page}")
        window.hide()  # as the user closes it: back to the tray
    assert running.app.controller.manager.running  # closing the window leaves the worker running


def test_pause_and_resume_from_the_tray(qtbot, running):
    tray = running.app.tray
    tray.pause_action.trigger()
    wait_until(lambda: running.dashboard.title.text() == "Paused", 10)
    assert running.dashboard.reason.text() == "Paused by you"
    assert tray.kind == "paused" and "Paused by you" in tray.toolTip()
    assert tray.pause_action.text() == "Resume" and running.dashboard.pause.text() == "Resume"
    # Compute stops: a paused worker adds no samples over the next stats reports.
    stats = []
    running.app.controller.stats.connect(stats.append)
    wait_until(lambda: len(stats) >= 3, 10)
    assert stats[-1].my_samples_session == stats[-2].my_samples_session
    tray.pause_action.trigger()
    wait_until(lambda: contributing(running), 10)
    assert tray.kind == "contributing" and running.dashboard.reason.text() == ""
    before = session_samples(running)
    wait_until(lambda: session_samples(running) > before, 20)


def test_snooze_for_an_hour(qtbot, running):
    running.app.tray.snooze_action.trigger()
    wait_until(lambda: running.dashboard.reason.text().startswith("Snoozed until"), 10)
    assert running.app.tray.kind == "paused"
    running.dashboard.pause.click()  # now "Resume"
    wait_until(lambda: contributing(running), 10)


def test_only_while_idle_reaches_the_worker(qtbot, running):
    tray, settings = running.app.tray, running.page("settings")
    tray.idle_action.trigger()
    # The worker's governor now waits for idle time (or says it cannot measure it here).
    wait_until(lambda: running.app.controller.state.kind == "waiting", 10)
    assert running.app.controller.state.governor in (GovernorState.WAITING_IDLE, GovernorState.IDLE_UNKNOWN)
    assert running.app.controller.state.limits.only_when_idle
    assert tray.kind == "waiting" and tray.idle_action.isChecked()
    assert running.dashboard.title.text() == "Waiting for idle time"
    assert settings.only_when_idle.isChecked()  # the settings page follows the tray
    assert SettingsStore().limits().only_when_idle  # and it is saved
    # "Contribute now" overrides the wait until the user pauses and resumes.
    tray.contribute_action.trigger()
    wait_until(lambda: running.dashboard.reason.text() == "Contributing (you asked to)", 10)
    tray.idle_action.trigger()
    wait_until(lambda: not running.app.controller.state.limits.only_when_idle, 10)
    assert not settings.only_when_idle.isChecked()
    tray.pause_action.trigger()
    wait_until(lambda: tray.pause_action.text() == "Resume", 10)
    tray.pause_action.trigger()
    wait_until(lambda: contributing(running) and running.dashboard.reason.text() == "", 10)


def test_a_limit_changed_in_settings_is_applied_by_the_running_worker(qtbot, running):
    settings = running.page("settings")
    settings.cpu_percent.setValue(60)
    wait_until(lambda: running.app.controller.state.limits.cpu_percent == 60, 10)
    wait_until(lambda: settings.applied.text() == "Applied to the running worker.", 5)
    # A memory cap below what the worker uses pauses it, with the reason in words.
    settings.max_memory.check.setChecked(True)
    settings.max_memory.spin.setValue(64)
    wait_until(lambda: "more than your limit of 64 MB" in running.dashboard.reason.text(),
                    10)
    assert running.app.controller.state.kind == "paused"
    assert SettingsStore().limits().max_memory_mb == 64
    settings.max_memory.check.setChecked(False)
    settings.cpu_percent.setValue(100)
    wait_until(lambda: contributing(running) and running.app.controller.state.limits.cpu_percent == 100,
                    10)
    # A schedule the governor cannot read is refused in the page, and nothing is sent.
    settings.schedule.setText("someday 25:00")
    wait_until(lambda: settings.error.text().startswith("Not applied"), 5)
    assert running.app.controller.state.limits.schedule == "always"
    settings.schedule.setText("")
    wait_until(lambda: not settings.error.isVisible(), 5)


def _register_alice(running) -> None:
    account = running.page("account")
    account.username.setText("alice")
    account.password.setText("correct horse battery")
    account.register_button.click()
    key = backbone_key(running.backbone.url)
    wait_until(lambda: keyring.get_password(SERVICE, key) is not None, 10)


def test_register_stores_the_token_and_the_worker_uses_it(qtbot, running):
    notices = []
    running.app.controller.notice.connect(lambda title, text, kind: notices.append(text))
    _register_alice(running)
    account = running.page("account")
    key = backbone_key(running.backbone.url)
    assert '"alice"' in keyring.get_password(SERVICE, key)
    # The worker joins again under the account: the dashboard says so.
    wait_until(lambda: "as alice" in running.dashboard.project.text(), 30)
    assert "Joined Tiny LM as alice." in notices  # the tray says so too
    wait_until(lambda: "Logged in as <b>alice</b>" in account.status.text(), 10)
    assert account.where.text().startswith("Your login is kept in your system keyring")
    assert not account.no_keyring.isVisible()
    wait_until(lambda: contributing(running), 30)


def test_the_leaderboard_shows_the_backbone_entries_with_my_row_highlighted(qtbot, running):
    if running.app.controller.login is None:  # run on its own, without the test above
        _register_alice(running)
        wait_until(lambda: "as alice" in running.dashboard.project.text(), 30)
    bb = running.backbone
    bob_token = bb.call(register(bb.url, "bobby"))
    dave_token = bb.call(register(bb.url, "dave"))
    bob = dave = None
    try:
        bob = bb.call(_start_bob(bb.url, bob_token))
        dave = bb.call(_start_auxiliary(bb.url, dave_token))
        # Both earn credit in the steps they take together; dave, an auxiliary peer, for
        # the bytes he aggregates for them.
        wait_until(lambda: _credited(bb) >= {"alice", "bobby"} and _aggregated(bb) > 0, 60,
                   lambda: f"credit for alice and bobby, bytes for dave; credited {_credited(bb)}")
    finally:
        bb.call(stop_all(*(p for p in (bob, dave) if p is not None)))
    board = running.page("leaderboard")
    board.refresh_button.click()
    wait_until(lambda: {e.username for e in board.entries} >= {"alice", "bobby"}, 30)
    row = board.my_row()
    assert row is not None and board.table.item(row, 1).text() == "alice"
    assert board.table.item(row, 1).font().bold()
    other = 1 - row
    assert not board.table.item(other, 1).font().bold()
    # Paging: one per page.
    board.page_size = 1
    board.load(0)
    # A page asked for earlier and answered later must not replace this one.
    wait_until(lambda: len(board.entries) == 1 and board.offset == 0, 30,
               lambda: f"one entry per page; shown {len(board.entries)}, error {board.error.text()!r}")
    first = board.entries[0].username
    assert board.next.isEnabled() and not board.previous.isEnabled()
    board.next.click()
    wait_until(lambda: board.offset == 1 and board.entries and board.entries[0].username != first,
               30, "the second page")
    assert board.previous.isEnabled()
    # Ranked by bytes aggregated: dave alone, with what he aggregated in its column.
    board.page_size = 25
    board.ranking.setCurrentIndex(board.ranking.findData(Ranking.AGGREGATED))
    wait_until(lambda: [e.username for e in board.entries] == ["dave"], 30,
               lambda: f"dave ranked by bytes; shown {[e.username for e in board.entries]}")
    assert board.table.item(0, COLUMNS.index("Aggregated")).text().endswith("B")
    assert board.table.item(0, COLUMNS.index("Share")).text() == "100.0 %"
    assert "aggregated by auxiliary peers" in board.subtitle.text()
    board.ranking.setCurrentIndex(board.ranking.findData(Ranking.SAMPLES))
    # Credit withdrawn (a peer of bobby's caught returning wrong results) says so.
    withdrawn = _withdraw(bb, "bobby")
    assert withdrawn > 0
    wait_until(lambda: board.refresh_button.isEnabled(), 30, "the samples ranking to load")
    board.refresh_button.click()
    wait_until(lambda: any(e.withdrawn for e in board.entries), 30, "bobby's withdrawn credit")
    bobby = next(i for i, e in enumerate(board.entries) if e.username == "bobby")
    assert board.table.item(bobby, COLUMNS.index("Samples")).text().endswith(f"({withdrawn:,} withdrawn)")
    wait_until(lambda: contributing(running), 30)


async def _start_bob(url: str, token: str):
    return start_peer(url, "tiny-lm", "bob", threads=1, user_token=token)


async def _start_auxiliary(url: str, token: str):
    from tests.collab.test_auxiliary import start_auxiliary

    return start_auxiliary(url, "tiny-lm", "dave", user_token=token)


def _aggregated(bb: ThreadedBackbone) -> int:
    async def total() -> int:
        return bb.backbone.store.credit.leaderboard("tiny-lm", 1, 0)[0][1]

    return bb.call(total())


def _withdraw(bb: ThreadedBackbone, username: str) -> int:
    """Take back every credit of ``username``'s peers, as the backbone does for a caught liar."""
    async def withdraw() -> int:
        store = bb.backbone.store
        rows = store.database.execute(
            "SELECT c.peer_id, c.round_id FROM contributions c JOIN users u ON u.id = c.user_id "
            "WHERE u.username=?", (username,)).fetchall()
        return sum(store.credit.withdraw_credits("tiny-lm", peer, [round_id], "a test")
                   for peer, round_id in rows)

    return bb.call(withdraw())


def _credited(bb: ThreadedBackbone) -> set[str]:
    async def names() -> set[str]:
        return set(bb.backbone.store.credit.credited_by_user("tiny-lm"))

    return bb.call(names())


def test_log_out_forgets_the_token(qtbot, running):
    account = running.page("account")
    wait_until(lambda: account.log_out_button.isVisible(), 10)
    account.log_out_button.click()
    key = backbone_key(running.backbone.url)
    wait_until(lambda: keyring.get_password(SERVICE, key) is None, 10)
    wait_until(lambda: "anonymously" in running.dashboard.project.text(), 30)
    wait_until(lambda: account.username.isVisible() and "Not logged in" in account.status.text(),
                    10)
    wait_until(lambda: contributing(running), 30)
    assert keyring.get_password(SERVICE, key) is None  # the token is gone from the keyring
    assert "anonymously" in running.dashboard.project.text()  # and the worker no longer uses it


def test_log_in_with_an_existing_account(qtbot, running):
    bb = running.backbone
    bb.call(register(bb.url, "carol", "carol's long password"))
    account, key = running.page("account"), backbone_key(bb.url)
    if running.app.controller.login is not None:  # run after the register test
        account.log_out_button.click()
        wait_until(lambda: account.log_in_button.isVisible(), 10)
    account.username.setText("carol")
    account.password.setText("not her password")
    account.log_in_button.click()
    wait_until(lambda: account.error.isVisible(), 10)
    assert "password" in account.error.text().lower()
    assert keyring.get_password(SERVICE, key) is None and account.password.text() != ""
    account.password.setText("carol's long password")
    account.log_in_button.click()
    wait_until(lambda: keyring.get_password(SERVICE, key) is not None, 10)
    assert '"carol"' in keyring.get_password(SERVICE, key)
    assert account.password.text() == ""  # not kept in the form
    wait_until(lambda: "as carol" in running.dashboard.project.text(), 30)
    wait_until(lambda: "Logged in as <b>carol</b>" in account.status.text(), 10)
    wait_until(lambda: contributing(running), 30)
    account.log_out_button.click()
    wait_until(lambda: "anonymously" in running.dashboard.project.text(), 30)
    wait_until(lambda: contributing(running), 30)


def test_a_worker_crash_is_shown_and_recovered(qtbot, running):
    manager = running.app.controller.manager
    notices = []
    running.app.controller.notice.connect(lambda title, text, kind: notices.append((title, text, kind)))
    old_pid = manager.pid
    os.kill(old_pid, signal.SIGKILL)
    wait_until(lambda: running.dashboard.title.text() == "Something went wrong", 10)
    assert "stopped unexpectedly" in running.dashboard.reason.text()
    assert "restarting in 1 s" in running.dashboard.reason.text()
    assert running.app.tray.kind == "error"
    assert any(kind == "error" and "stopped unexpectedly" in text for _, text, kind in notices)
    # Restarted, told what it was doing, and contributing again.
    wait_until(lambda: manager.pid not in (0, old_pid), WORKER_START)
    wait_until(lambda: contributing(running), WORKER_START)
    assert any("running again" in text for _, text, _ in notices)
    before = session_samples(running)
    wait_until(lambda: session_samples(running) > before, 30)
