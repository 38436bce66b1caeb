"""The launcher that forks test peers from a pre-imported process gives them what a fresh
``python -m`` started by subprocess would have, and gives back what subprocess would."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys

import pytest

from engine.paths import engine_command
from tests import launcher

PROBE = [sys.executable, "-m", "tests.unit.launcher_probe"]


@pytest.fixture(params=["launcher", "exec"])
def mode(request, monkeypatch):
    if request.param == "exec":
        monkeypatch.setenv("COTRAIN_TEST_LAUNCHER", "exec")
    return request.param


def test_a_child_gets_its_arguments_environment_folder_and_streams(tmp_path, mode):
    log = (tmp_path / "err.log").open("wb")
    # (a new interpreter in another folder finds the tests' modules through PYTHONPATH)
    env = {**os.environ, "PROBE": "here", **({"PYTHONPATH": str(launcher.ROOT)} if mode == "exec" else {})}
    child = launcher.popen([*PROBE, "3", "x y"], stdout=subprocess.PIPE, stderr=log, stdin=subprocess.DEVNULL,
                           env=env, cwd=tmp_path, text=True)
    said = json.loads(child.stdout.readline())
    assert child.wait(60) == 3
    assert said["argv"] == ["3", "x y"] and said["cwd"] == str(tmp_path) and said["probe"] == "here"
    assert said["stdin"] == "" and said["threads"] == 1 and said["hub_offline"] == "1"
    assert isinstance(child, launcher.LaunchedProcess) == (mode == "launcher")
    log.close()
    assert (tmp_path / "err.log").read_text() == "to stderr\n"


def test_a_killed_child_reports_the_signal_and_poll_and_wait_time_out_as_subprocess(tmp_path, mode):
    child = launcher.popen([*PROBE, "wait"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    json.loads(child.stdout.readline())
    assert child.poll() is None
    with pytest.raises(subprocess.TimeoutExpired):
        child.wait(0.2)
    child.terminate()
    assert child.wait(60) == -signal.SIGTERM
    child.kill()  # after its exit: nothing, as subprocess


def test_the_real_command_line_runs_and_exits_as_cotrain(tmp_path, mode):
    child = launcher.popen([*engine_command(), "peer"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           text=True)
    assert child.wait(60) == 2
    assert "give --backbone URL and --project ID" in child.stderr.read()


def test_the_asyncio_form_reads_lines_and_waits(mode):
    async def run():
        child = await launcher.create_subprocess_exec(*PROBE, "wait", stdout=asyncio.subprocess.PIPE,
                                                      stderr=asyncio.subprocess.DEVNULL,
                                                      stdin=asyncio.subprocess.DEVNULL)
        said = json.loads(await asyncio.wait_for(child.stdout.readline(), 60))
        assert child.returncode is None
        child.send_signal(signal.SIGKILL)
        assert await asyncio.wait_for(child.wait(), 60) == -signal.SIGKILL
        assert child.returncode == -signal.SIGKILL
        return said

    assert asyncio.run(run())["argv"] == ["wait"]


def test_other_programs_start_as_usual():
    child = launcher.popen(["true"])
    assert isinstance(child, subprocess.Popen) and child.wait(10) == 0


def test_a_child_told_of_another_model_hub_starts_anew_and_keeps_off_it():
    """huggingface_hub reads its address and offline mode once, at import: a fork of the
    launcher would keep the launcher's, and a hub stand-in would see nothing of it."""
    hub = {"HF_ENDPOINT": "http://127.0.0.1:9", "HF_HUB_OFFLINE": "0"}
    child = launcher.popen([*PROBE, "0"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                           env={**os.environ, **hub}, text=True)
    said = json.loads(child.stdout.readline())
    assert child.wait(60) == 0
    assert isinstance(child, subprocess.Popen)
    assert said["hub_offline"] == "1", "the engine's floor holds in a new process"
