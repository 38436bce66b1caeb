"""torchvision's models, trained for real: in a venv where torchvision loads
(tests/torchvision_venv.py), every allowed architecture builds and trains, three peers
on the catalog's digits with torchvision's ConvNeXt-Tiny end where one machine would, and
a trained ResNet-18 exported loads into torchvision's own and classifies alike."""

import subprocess

import pytest

from engine.tasks.images import TORCHVISION_MODELS
from tests.torchvision_venv import INSTALL_SECONDS, ROOT, env, torchvision_python

pytestmark = pytest.mark.slow

TESTS = ["tests/unit/test_image_task.py::"
         "test_every_allowed_torchvision_network_trains_on_grey_images_and_downloads_nothing",
         "tests/collab/test_equivalence.py::"
         "test_three_peers_match_one_large_batch_process_and_each_other[torchvision-False]",
         "tests/unit/test_export_images.py::"
         "test_an_exported_image_network_classifies_as_the_collaboration_did[torchvision:resnet18]"]
RUN_SECONDS = 900


@pytest.mark.timeout(INSTALL_SECONDS + RUN_SECONDS + 120)
def test_torchvision_models_train_and_match_one_large_batch_process():
    python = torchvision_python()
    command = [str(python), "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rs", *TESTS]
    try:
        done = subprocess.run(command, cwd=ROOT, env=env(), capture_output=True, text=True,
                              timeout=RUN_SECONDS)
    except subprocess.TimeoutExpired as exc:
        raise AssertionError(f"the tests did not end within {RUN_SECONDS} s: {exc.stdout!r}") from None
    report = done.stdout + done.stderr
    assert done.returncode == 0, report[-6000:]
    summary = report.strip().splitlines()[-1]
    expected = len(TORCHVISION_MODELS) + 2  # every architecture, the equivalence and the export
    assert "skipped" not in summary and f"{expected} passed" in summary, report[-3000:]
