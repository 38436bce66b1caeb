"""The per-OS packaging files: the NSIS script compiles, the plists and desktop entry are valid."""

from __future__ import annotations

import plistlib
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from app.autostart import AGENT_LABEL

INSTALLERS = Path(__file__).resolve().parents[2] / "installers"


def test_the_windows_installer_script_compiles_against_the_bundle_layout(tmp_path):
    if shutil.which("makensis") is None:
        pytest.skip("makensis is not installed (apt-get install nsis); .ci/run installs it")
    bundle = tmp_path / "cotrain"  # what PyInstaller's COLLECT writes on Windows
    (bundle / "_internal" / "resources").mkdir(parents=True)
    for exe in ("cotrain-cli.exe", "Cotrain.exe"):
        (bundle / exe).write_bytes(b"MZ" + bytes(100))
    (bundle / "_internal" / "resources" / "catalog.json").write_text("{}")
    setup = tmp_path / "Cotrain-Setup.exe"
    done = subprocess.run(["makensis", "-V2", f"-DBUNDLE={bundle}", "-DVERSION=0.1.0", f"-DOUTFILE={setup}",
                           str(INSTALLERS / "windows" / "cotrain.nsi")], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    assert setup.read_bytes()[:2] == b"MZ"


def test_the_macos_bundle_and_login_agent_describe_cotrain():
    info = plistlib.loads((INSTALLERS / "macos" / "Info.plist").read_bytes())
    assert info["CFBundleIdentifier"] == "org.cotrain.Cotrain"
    assert info["CFBundleExecutable"] == "Cotrain"  # the windowed executable of cotrain.spec
    assert "_cotrain._tcp" in info["NSBonjourServices"]
    assert "info_plist=INFO" in (INSTALLERS / "cotrain.spec").read_text()  # loaded, as BUNDLE wants
    agent = plistlib.loads((INSTALLERS / "macos" / f"{AGENT_LABEL}.plist").read_bytes())
    assert agent["Label"] == AGENT_LABEL  # the app's own start-at-login writes the same agent
    assert agent["ProgramArguments"][0].startswith("/Applications/Cotrain.app/")
    assert agent["ProgramArguments"][1:] == ["--background"]  # in the tray, as start at login does


def test_the_launchers_names_differ_beyond_case():
    """Windows and macOS file systems ignore case: `cotrain` and `Cotrain` would be one file."""
    spec = (INSTALLERS / "cotrain.spec").read_text()
    exes = spec.split("PYZ(")[1].split("COLLECT(")[0]
    assert re.search(r'name="cotrain-cli" if GUI_SEPARATE else "cotrain"', exes)
    assert re.findall(r'name="(\w+)", console=False', exes) == ["Cotrain"]


def test_the_dmg_settings_file_runs_as_dmgbuild_would_run_it():
    settings: dict = {"defines": {"app": "build/installers/Cotrain.app"}}
    exec(compile((INSTALLERS / "macos" / "dmg_settings.py").read_text(), "dmg_settings.py", "exec"), settings)
    assert settings["files"] == ["build/installers/Cotrain.app"]
    assert settings["symlinks"] == {"Applications": "/Applications"}


def test_the_linux_desktop_entry_is_valid():
    entry = INSTALLERS / "linux" / "cotrain.desktop"
    if shutil.which("desktop-file-validate"):
        done = subprocess.run(["desktop-file-validate", str(entry)], capture_output=True, text=True)
        assert done.returncode == 0, done.stdout + done.stderr
    fields = dict(line.split("=", 1) for line in entry.read_text().splitlines() if "=" in line)
    assert fields["Exec"] == "cotrain" and fields["Icon"] == "cotrain" and fields["Type"] == "Application"
