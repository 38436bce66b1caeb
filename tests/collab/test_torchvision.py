"""torchvision's models, trained for real: in a venv where torchvision loads
(tests/torchvision_venv.py), every allowed architecture builds and trains, and three peers
on the catalog's digits with torchvision's ResNet-18 end where one machine would."""

import subprocess

import pytest

from tests.torchvision_venv import ROOT, torchvision_python

pytestmark = pytest.mark.slow

TESTS = ["tests/unit/test_image_task.py::"
         "test_every_allowed_torchvision_network_trains_on_grey_images_and_downloads_nothing",
         "tests/collab/test_equivalence.py::"
         "test_three_peers_match_one_large_batch_process_and_each_other[torchvision-False]"]


@pytest.mark.timeout(2400)
def test_torchvision_models_train_and_match_one_large_batch_process():
    python = torchvision_python()
    done = subprocess.run([str(python), "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rs", *TESTS],
                          cwd=ROOT, capture_output=True, text=True, timeout=900)
    report = done.stdout + done.stderr
    assert done.returncode == 0, report[-6000:]
    summary = report.strip().splitlines()[-1]
    assert "skipped" not in summary and "8 passed" in summary, report[-3000:]
