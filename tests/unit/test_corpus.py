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


def test_files_are_read_in_the_sorted_order_every_peer_agrees_on(tmp_path):
    """Peers of one collaboration read the same corpus: the lazy walk must keep the order of
    sorting every path, through names that sort around their folders."""
    for name in ("a/z.py", "a.py", "a-b.py", "A.py", "a/b/c.py", "ab/x.py", "b.txt", "_/k.py", "a/b.py"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(name)
    (tmp_path / "link").symlink_to(tmp_path / "a")  # rglob does not follow it either
    expected = [p for p in sorted(tmp_path.rglob("*.py")) if p.is_file()]
    assert list(corpus.sorted_py_files(tmp_path)) == expected
    stdlib = corpus.stdlib_dir()
    assert [p for p in corpus.sorted_py_files(stdlib) if p.is_file()] == [
        p for p in sorted(stdlib.rglob("*.py")) if p.is_file()]
