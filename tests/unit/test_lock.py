"""The one lock every install takes (installers/requirements.lock): it must agree with
pyproject.toml's ranges, be what the README's commands and the installer build use, and this
very environment (made by the README's test command) must be what it locks."""

import re
import sys
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from installers.lock import LOCK, drift, locked

if sys.version_info >= (3, 11):
    import tomllib
else:
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[2]


def project_requirements() -> list[Requirement]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"].values()
    listed = [*project["dependencies"], *(r for extra in extras for r in extra)]
    return [Requirement(r) for r in listed if not r.startswith(f"{project['name']}[")]


def test_every_range_of_pyproject_has_a_locked_version_inside_it():
    versions = locked()
    for requirement in project_requirements():
        if requirement.marker is not None and not requirement.marker.evaluate():
            continue
        name = canonicalize_name(requirement.name)
        assert name in versions, f"{requirement} is not in {LOCK.name}: run the README's lock command"
        assert requirement.specifier.contains(versions[name], prereleases=True), (
            f"{LOCK.name} locks {name} {versions[name]}, outside pyproject.toml's {requirement}")


def test_the_torch_it_locks_is_the_one_on_this_projects_machines():
    assert str(locked()["torch"]) == "2.13.0"


def test_the_readme_commands_install_from_the_lock():
    readme = (ROOT / "README.md").read_text()
    blocks = re.findall(r"```\n(python3 -m venv \.venv[^\n]*)\n```", readme)
    assert len(blocks) == 2, blocks  # the app's and the tests'
    for command in blocks:
        assert "-c installers/requirements.lock -e '.[" in command, command
    assert "torch==" not in " ".join(blocks), "torch comes from the lock, not a second pin"


def test_this_environment_is_the_locked_one():
    assert drift() == []


def test_a_version_other_than_the_locked_one_is_named(tmp_path):
    lock = tmp_path / "requirements.lock"
    lock.write_text("pytest==1.0.0\n    # via cotrain\ntorch==2.13.0\nno-such-package==1.0\n"
                    "packaging==0.1 ; python_version < '3'\n")
    found = drift(lock)
    assert len(found) == 1 and found[0].startswith("pytest ") and "(locked: 1.0.0)" in found[0], found


def test_a_lock_line_without_one_exact_version_is_refused(tmp_path):
    lock = tmp_path / "requirements.lock"
    lock.write_text("pytest>=8\n")
    with pytest.raises(ValueError, match="not one exact version"):
        locked(lock)
