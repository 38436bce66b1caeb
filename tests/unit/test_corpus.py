"""The frozen app's zipped stdlib corpus gives exactly the bytes a source install reads."""

import sys

import pytest
import torch

from engine.tasks import corpus


def test_the_bundled_corpus_matches_the_stdlib_sources(tmp_path, monkeypatch):
    limit = 3 * 1024 * 1024
    expected = corpus.load_corpus(None, limit)
    archive = corpus.write_stdlib_zip(tmp_path / "stdlib-py.zip", limit)
    monkeypatch.setattr(sys, "frozen", True, raising=False)
    monkeypatch.setattr(corpus, "bundled_stdlib_zip", lambda: archive)
    monkeypatch.setattr(corpus, "stdlib_dir", lambda: tmp_path / "no-stdlib-here")
    assert torch.equal(corpus.load_corpus(None, limit), expected)
    assert archive.stat().st_size < limit / 2  # compressed: a few MB in the installer


def test_a_missing_data_folder_is_a_clear_error(tmp_path):
    with pytest.raises(ValueError, match="does not exist"):
        corpus.load_corpus(str(tmp_path / "nope"), 1 << 20)
