"""The owner's catalog file: read strictly, old spellings understood."""

import gc
import json

import pytest

from engine.project import load_catalog
from engine.resources import default_catalog


def write(tmp_path, projects) -> str:
    path = tmp_path / "catalog.json"
    path.write_text(json.dumps({"projects": projects}))
    return str(path)


def test_the_shipped_catalog_loads_and_welcomes_anonymous_peers():
    projects = load_catalog(default_catalog())
    assert projects and not any(p.require_account for p in projects)


def test_the_shipped_catalog_offers_the_demo_in_both_modes():
    modes = {p.id: (p.mode, p.local.inner_batch_size) for p in load_catalog(default_catalog())}
    assert modes["demo-lm"][0] == "sync"
    mode, inner_batch = modes["demo-lm-home"]
    assert mode == "local" and inner_batch > 0


def test_a_catalog_of_the_first_release_keeps_its_meaning(tmp_path):
    old = [{"id": "closed", "title": "C", "task": "demo-lm", "allow_anonymous": False},
           {"id": "open", "title": "O", "task": "demo-lm", "allow_anonymous": True}]
    assert [p.require_account for p in load_catalog(write(tmp_path, old))] == [True, False]


@pytest.mark.parametrize("projects, problem", [
    ([{"id": "x", "title": "X", "task": "demo-lm", "require_account": "yes"}], "require_account"),
    ([{"id": "x", "title": "X", "task": "demo-lm"}] * 2, "twice"),
    ([{"id": "x", "title": "X"}], "task"),
])
def test_a_bad_catalog_is_refused_naming_the_problem(tmp_path, projects, problem):
    with pytest.raises(ValueError, match=problem):
        load_catalog(write(tmp_path, projects))


def test_a_catalog_nested_beyond_reason_is_refused(tmp_path):
    path = tmp_path / "deep.json"
    path.write_text('{"projects": ' + "[" * 100_000 + "]" * 100_000 + "}")
    # The decoder counts its depth against Python's recursion limit: a finalizer of an earlier
    # test's garbage, run by a collection the decoder's allocations set off, would run there
    # and fail for want of stack (a run saw that), so that garbage goes first.
    gc.collect()
    gc.disable()
    try:
        with pytest.raises(ValueError, match="catalog"):
            load_catalog(str(path))
    finally:
        gc.enable()
