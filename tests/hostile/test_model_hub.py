"""A project that asks a volunteer's computer to fetch code from a model hub. transformers
(>= 5.25, through `kernels`) loads compiled kernels from a hub when a model's configuration
names one (``attn_implementation: "kernels-community/..."``): before, `cotrain project check`
of such a project sent requests to the hub (seen at a loopback stand-in). Cotrain turns hub
kernels and hub access off in every process it starts, whatever the environment says."""

import os
import subprocess
import sys

import pytest

from engine.authoring.manifest import read_project
from engine.paths import engine_command
from tests.hub_standin import hub_standin
from tests.projects import albert_folder

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]


def test_a_project_naming_a_hub_kernel_is_refused_without_a_request(tmp_path):
    folder = albert_folder(tmp_path / "projects")
    config = read_project(folder.root)["task_params"]["config"]
    folder = albert_folder(tmp_path / "projects", task_params={
        "config": {**config, "attn_implementation": "kernels-community/flash-attn"}})
    with hub_standin() as hub:
        env = {**os.environ, **hub.env(), "COTRAIN_HOME": str(tmp_path / "home")}
        # The stand-in is where an unguarded process goes: huggingface_hub asks it at once.
        probe = "import huggingface_hub as h\ntry: h.model_info('albert-base-v2')\nexcept Exception: pass"
        subprocess.run([sys.executable, "-c", probe], env=env, timeout=60, check=True)
        assert hub.requests, "the stand-in saw nothing of a process that asked it"
        asked = len(hub.requests)
        check = subprocess.run([*engine_command(), "project", "check", str(folder.root)], env=env,
                               capture_output=True, text=True, timeout=90)
        assert hub.requests[asked:] == []
    out = check.stdout + check.stderr
    assert check.returncode != 0 and "kernels-community/flash-attn" in out, out
    assert "Traceback" not in out, out
