"""A project that asks a volunteer's computer to fetch code from a model hub. transformers
(>= 5.25, through `kernels`) loads compiled kernels from a hub when a model's configuration
names one (``attn_implementation: "kernels-community/..."``): before, `cotrain project check`
of such a project sent requests to the hub (seen at a loopback stand-in). Now the project is
refused with its reason; and under that, every Cotrain process turns hub kernels and hub
access off, whatever its environment says."""

import os
import subprocess
import sys

import pytest

from engine.authoring.manifest import read_project
from engine.paths import engine_command
from tests.hub_standin import hub_standin
from tests.projects import albert_folder

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]
KERNEL = "kernels-community/flash-attn"


def reaches(hub, env: dict) -> None:
    """The stand-in is where an unguarded process goes: huggingface_hub asks it at once."""
    probe = "import huggingface_hub as h\ntry: h.model_info('albert-base-v2')\nexcept Exception: pass"
    subprocess.run([sys.executable, "-c", probe], env=env, timeout=60, check=True)
    assert hub.requests, "the stand-in saw nothing of a process that asked it"
    hub.requests.clear()


def test_a_project_naming_a_hub_kernel_is_refused_without_a_request(tmp_path):
    folder = albert_folder(tmp_path / "projects")
    config = read_project(folder.root)["task_params"]["config"]
    config["attn_implementation"] = KERNEL
    folder = albert_folder(tmp_path / "projects", task_params={"config": config})
    with hub_standin() as hub:
        env = {**os.environ, **hub.env(), "COTRAIN_HOME": str(tmp_path / "home")}
        reaches(hub, env)
        check = subprocess.run([*engine_command(), "project", "check", str(folder.root)], env=env,
                               capture_output=True, text=True, timeout=90)
        assert hub.requests == []
    out = check.stdout + check.stderr
    assert check.returncode != 0 and f"attn_implementation '{KERNEL}'" in out, out
    assert "never code from a model hub" in out and "Traceback" not in out, out


BUILD_DIRECTLY = f"""
import engine  # what every Cotrain process imports first
from transformers import AlbertConfig, AlbertForMaskedLM
config = AlbertConfig(vocab_size=32, embedding_size=8, hidden_size=16, num_hidden_layers=1,
                      num_attention_heads=2, intermediate_size=16, attn_implementation={KERNEL!r})
try:
    AlbertForMaskedLM(config)
except Exception as exc:
    print("refused:", type(exc).__name__)
"""


def test_under_the_check_a_cotrain_process_asks_no_hub_for_a_kernel(tmp_path):
    """The floor under that refusal: a model built past Cotrain's checks, in a process that
    imported Cotrain, still fetches nothing."""
    with hub_standin() as hub:
        env = {**os.environ, **hub.env(), "HOME": str(tmp_path)}
        reaches(hub, env)
        built = subprocess.run([sys.executable, "-c", BUILD_DIRECTLY], env=env, capture_output=True,
                               text=True, timeout=90)
        assert hub.requests == [], built.stdout + built.stderr
    assert built.returncode == 0 and "refused:" in built.stdout, built.stdout + built.stderr
