"""The one lock of exact versions that every install of this repository uses.

``installers/requirements.lock`` is made from pyproject.toml's ranges by ``uv pip compile
pyproject.toml`` (its settings are pyproject.toml's ``[tool.uv.pip]``); CI and the README's
commands install with it as pip constraints (``pip install -c installers/requirements.lock``),
and ``installers/build.py`` bundles only an environment that matches it. So the same commit
installs the same packages today and next month, and an upgrade is a commit of its own.
"""

from __future__ import annotations

from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

LOCK = Path(__file__).resolve().parent / "requirements.lock"


def locked(lock: Path = LOCK) -> dict[str, Version]:
    """Package -> the version locked for this interpreter and platform (markers evaluated)."""
    versions = {}
    for line in lock.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        requirement = Requirement(line)
        if requirement.marker is None or requirement.marker.evaluate():
            pins = [s.version for s in requirement.specifier if s.operator == "=="]
            if len(pins) != 1:
                raise ValueError(f"{lock.name}: {line!r} is not one exact version")
            versions[canonicalize_name(requirement.name)] = Version(pins[0])
    return versions


def drift(lock: Path = LOCK) -> list[str]:
    """Installed packages whose version is not the locked one (a local build label such as
    torch's ``+cpu`` is the same release)."""
    found = []
    for name, version in sorted(locked(lock).items()):
        try:
            installed = Version(metadata.version(name))
        except metadata.PackageNotFoundError:
            continue
        if Version(installed.public) != version:
            found.append(f"{name} {installed} (locked: {version})")
    return found
