"""The D-Bus idle sources, against a real dbus-daemon: GNOME's IdleMonitor, the freedesktop
ScreenSaver, and logind's IdleHint, tried in that order, each saying why it did not work."""

import time

import pytest

from engine.governor.idle import IdleDetector, LogindIdle, MutterIdle, ScreenSaverIdle
from tests.governor.dbus import private_bus, service

MUTTER = ("org.gnome.Mutter.IdleMonitor", "/org/gnome/Mutter/IdleMonitor/Core")
SCREENSAVER = ("org.freedesktop.ScreenSaver", "/org/freedesktop/ScreenSaver")
LOGIND = ("org.freedesktop.login1", "/org/freedesktop/login1/session/auto")


@pytest.fixture
def bus(monkeypatch):
    with private_bus() as address:
        # The session and the system bus are both this one: logind lives on the system bus.
        monkeypatch.setenv("DBUS_SESSION_BUS_ADDRESS", address)
        monkeypatch.setenv("DBUS_SYSTEM_BUS_ADDRESS", address)
        yield address


def mutter(milliseconds):
    return {("org.gnome.Mutter.IdleMonitor", "GetIdletime"): lambda body: ("t", (milliseconds,))}


def screensaver(milliseconds):
    return {("org.freedesktop.ScreenSaver", "GetSessionIdleTime"): lambda body: ("u", (milliseconds,))}


def logind(idle: bool, since_monotonic_us: int):
    def get_all(body):
        assert body == ("org.freedesktop.login1.Session",)
        return "a{sv}", ({"IdleHint": ("b", idle), "IdleSinceHintMonotonic": ("t", since_monotonic_us)},)

    return {("org.freedesktop.DBus.Properties", "GetAll"): get_all}


def test_gnome_idle_monitor_answers_in_milliseconds(bus):
    with service(bus, *MUTTER, mutter(4200)):
        assert MutterIdle().idle_seconds() == pytest.approx(4.2)


def test_the_chain_falls_back_to_the_freedesktop_screensaver_and_says_why(bus):
    detector = IdleDetector([MutterIdle(), ScreenSaverIdle()])
    with service(bus, *SCREENSAVER, screensaver(90_000)):
        reading = detector.read()
    assert (reading.source, reading.seconds) == ("org.freedesktop.ScreenSaver", pytest.approx(90.0))
    assert "ServiceUnknown" in reading.problems["GNOME Mutter IdleMonitor"]


def test_logind_idle_hint_gives_time_since_the_session_went_idle(bus):
    since = int((time.clock_gettime(time.CLOCK_MONOTONIC) - 120) * 1e6)
    with service(bus, *LOGIND, logind(True, since)):
        assert LogindIdle().idle_seconds() == pytest.approx(120, abs=2)
    with service(bus, *LOGIND, logind(False, since)):
        assert LogindIdle().idle_seconds() == 0.0


def test_a_source_that_goes_away_hands_over_to_the_next(bus):
    detector = IdleDetector([MutterIdle(), ScreenSaverIdle()])
    with service(bus, *SCREENSAVER, screensaver(1000)):
        with service(bus, *MUTTER, mutter(5000)):
            assert detector.read().source == "GNOME Mutter IdleMonitor"
        reading = detector.read()  # GNOME Shell restarted, say
        assert (reading.source, reading.seconds) == ("org.freedesktop.ScreenSaver", pytest.approx(1.0))


def test_with_nothing_on_the_bus_detection_is_unavailable_not_guessed(bus):
    reading = IdleDetector([MutterIdle(), ScreenSaverIdle(), LogindIdle()]).read()
    assert reading.seconds is None and reading.source is None
    assert reading.describe.startswith("idle detection unavailable (GNOME Mutter IdleMonitor: ")
    assert set(reading.problems) == {"GNOME Mutter IdleMonitor", "org.freedesktop.ScreenSaver",
                                     "logind IdleHint"}
    assert all("ServiceUnknown" in why for why in reading.problems.values())
