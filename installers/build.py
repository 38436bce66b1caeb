"""Build the desktop app with PyInstaller; on Linux also the .deb and a tarball.

    python installers/build.py [--skip-bundle]

Outputs go to ``build/installers/``: the onedir bundle ``cotrain/``, ``cotrain_<v>_<arch>.deb``
and ``cotrain-<v>-linux-<arch>.tar.gz``. Prints the bundle's size on disk and the packages',
and the seconds of the bundle's first ``--self-test``, which must pass before anything is packed.
It bundles only the packages of ``installers/requirements.lock``: install them first with
``pip install -c installers/requirements.lock -e '.[test]'`` (the README's test command does).
"""

from __future__ import annotations

import argparse
import os
import platform
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "build" / "installers"
sys.path.insert(0, str(ROOT))

from engine import __version__  # noqa: E402
from installers.lock import LOCK, drift  # noqa: E402

# Libraries Qt loads at run time (plugins dlopen them), which ldd on the bundle cannot see
# when they are absent from the build machine. Package names are Debian 12 / Ubuntu 22.04+.
RUNTIME_DEPENDS = ["libegl1", "libgl1", "libxcb-cursor0", "libxkbcommon-x11-0", "libxcb-icccm4",
                   "libxcb-keysyms1", "libxcb-shape0", "libxcb-xinerama0", "libfontconfig1",
                   "libdbus-1-3"]


def human(n: float) -> str:
    """Decimal megabytes (what the size targets mean), with MiB beside them."""
    return f"{n / 1e6:.1f} MB = {n / 2**20:.1f} MiB"


def maintainer() -> str:
    """Who answers for this package, as Debian's tools ask (DEBFULLNAME, DEBEMAIL), else the
    builder's git identity: whoever builds a .deb for others is its maintainer."""
    name, email = os.environ.get("DEBFULLNAME"), os.environ.get("DEBEMAIL")
    for key, value in (("user.name", name), ("user.email", email)):
        if not value:
            found = subprocess.run(["git", "config", key], capture_output=True, text=True, cwd=ROOT)
            if key == "user.name":
                name = found.stdout.strip()
            else:
                email = found.stdout.strip()
    if not name or not email:
        raise SystemExit("say who maintains this package: set DEBFULLNAME and DEBEMAIL "
                         "(or git's user.name and user.email)")
    return f"{name} <{email}>"


def tree_size(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file() and not f.is_symlink())


def check_lock() -> None:
    """A bundle ships what the lock says, not whatever this environment happened to get."""
    differs = drift()
    if differs:
        sys.exit(f"this environment is not the one {LOCK.relative_to(ROOT)} locks, so its bundle would "
                 f"not be the release's: {'; '.join(differs)}. Install from the lock: "
                 f"pip install -c {LOCK.relative_to(ROOT)} -e '.[test]'")


def build_bundle() -> Path:
    began = time.monotonic()
    subprocess.run([sys.executable, "-m", "PyInstaller", "--noconfirm", "--clean", "--log-level", "WARN",
                    "--distpath", str(OUT), "--workpath", str(OUT / "work"),
                    str(ROOT / "installers" / "cotrain.spec")], check=True, cwd=ROOT)
    bundle = OUT / "cotrain"
    if sys.platform.startswith("linux") and shutil.which("strip"):
        strip_symbols(bundle)
    print(f"bundle built in {time.monotonic() - began:.0f} s", flush=True)
    return bundle


def self_test(bundle: Path) -> str:
    """The bundle's first start, timed: a bundle that fails its self-test is not packaged.
    Returns what it printed."""
    launcher = bundle / ("cotrain" if sys.platform.startswith("linux") else "cotrain-cli")
    began = time.monotonic()
    done = subprocess.run([str(launcher), "--self-test"], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "QT_QPA_PLATFORM": "offscreen"})
    seconds = time.monotonic() - began
    print(done.stdout, end="", flush=True)
    if done.returncode != 0:
        sys.exit(f"the bundle failed its self-test:\n{done.stderr[-4000:]}")
    started = f"self-test: cold start of the bundle {seconds:.1f} s (target 5 s)"
    print(started, flush=True)
    return f"{done.stdout}{started}\n"


def strip_symbols(bundle: Path) -> None:
    """Drop symbol tables users never need (about 150 MB), except from libraries that
    auditwheel repaired: patchelf moved their headers, and strip breaks them ("ELF load
    command address/offset not page-aligned"). Those sit in ``*.libs`` folders or point
    there through their RUNPATH. The self-test proves the result still loads."""
    internal = bundle / "_internal"
    before = tree_size(internal)
    for path in internal.rglob("*"):
        if path.is_symlink() or not path.is_file() or not (path.suffix == ".so" or ".so." in path.name):
            continue
        if any(part.endswith(".libs") for part in path.relative_to(internal).parts):
            continue
        dynamic = subprocess.run(["readelf", "-d", str(path)], capture_output=True, text=True).stdout
        if ".libs" in dynamic:
            continue
        subprocess.run(["strip", "--strip-unneeded", str(path)], check=True, capture_output=True)
    print(f"stripped symbols: {human(before - tree_size(internal))} saved", flush=True)


def deb_arch() -> str:
    return subprocess.run(["dpkg", "--print-architecture"], capture_output=True, text=True,
                          check=True).stdout.strip()


def system_libraries(bundle: Path) -> set[str]:
    """Shared libraries the bundle's binaries load from the system (not shipped inside)."""
    found: set[str] = set()
    for path in elf_files(bundle):
        ldd = subprocess.run(["ldd", str(path)], capture_output=True, text=True)
        for line in ldd.stdout.splitlines():
            match = re.match(r"\s*\S+ => (/\S+)", line)
            if match and not match.group(1).startswith(str(bundle)):
                found.add(os.path.realpath(match.group(1)))
    return found


def elf_files(bundle: Path) -> list[Path]:
    return [path for path in bundle.rglob("*")
            if path.is_file() and not path.is_symlink()
            and (path.suffix == ".so" or ".so." in path.name or path == bundle / "cotrain")]


def glibc_needed(bundle: Path) -> tuple[int, int]:
    """The newest GLIBC symbol version any binary of the bundle asks for: the oldest C library
    it runs on, so the .deb refuses a system too old instead of failing at start."""
    newest = (2, 17)
    for path in elf_files(bundle):
        dump = subprocess.run(["objdump", "-p", str(path)], capture_output=True, text=True).stdout
        for major, minor in re.findall(r"\bGLIBC_(\d+)\.(\d+)\b", dump):
            newest = max(newest, (int(major), int(minor)))
    return newest


def debian_packages(libraries: set[str]) -> set[str]:
    packages: set[str] = set()
    for lib in sorted(libraries):
        owner = subprocess.run(["dpkg", "-S", lib], capture_output=True, text=True)
        if owner.returncode == 0:
            packages.add(owner.stdout.split(":", 1)[0].strip())
    packages.discard("libc6")  # stated with its version (glibc_needed)
    return packages


def build_deb(bundle: Path) -> Path:
    arch = deb_arch()
    stage = OUT / "deb"
    shutil.rmtree(stage, ignore_errors=True)
    shutil.copytree(bundle, stage / "opt" / "cotrain", symlinks=True)
    launcher = stage / "usr" / "bin" / "cotrain"
    launcher.parent.mkdir(parents=True)
    launcher.write_text('#!/bin/sh\nexec /opt/cotrain/cotrain "$@"\n')
    launcher.chmod(0o755)
    linux = ROOT / "installers" / "linux"
    shutil.copy(linux / "cotrain.desktop", _mkdir(stage / "usr" / "share" / "applications"))
    icons = ROOT / "resources" / "icons"
    for png in sorted((icons / "png").glob("cotrain-*.png")):
        size = png.stem.split("-")[-1]
        apps = _mkdir(stage / "usr/share/icons/hicolor" / f"{size}x{size}" / "apps")
        shutil.copy(png, apps / "cotrain.png")
    shutil.copy(icons / "cotrain.svg", _mkdir(stage / "usr/share/icons/hicolor/scalable/apps"))
    depends = sorted(debian_packages(system_libraries(bundle)) | set(RUNTIME_DEPENDS))
    depends.insert(0, "libc6 (>= {}.{})".format(*glibc_needed(bundle)))
    control = _mkdir(stage / "DEBIAN")
    installed_kb = tree_size(stage) // 1024
    (control / "control").write_text(
        f"Package: cotrain\nVersion: {__version__}\nArchitecture: {arch}\n"
        f"Maintainer: {maintainer()}\n"
        f"Installed-Size: {installed_kb}\nSection: science\nPriority: optional\n"
        f"Depends: {', '.join(depends)}\n"
        "Homepage: https://github.com/cotrain/cotrain\n"
        "Description: pool idle computers to train deep-learning models together\n"
        " Cotrain lets volunteers lend their computers' idle time to train a model together\n"
        " (DeDLOC over WebRTC), with a tray app, resource limits and a leaderboard.\n")
    for script in ("postinst", "postrm"):
        shutil.copy(linux / script, control / script)
        (control / script).chmod(0o755)
    deb = OUT / f"cotrain_{__version__}_{arch}.deb"
    began = time.monotonic()
    subprocess.run(["dpkg-deb", "--root-owner-group", "-Zxz", "-z6", "--build", str(stage), str(deb)],
                   check=True, stdout=subprocess.DEVNULL)
    print(f".deb packed in {time.monotonic() - began:.0f} s; Depends: {', '.join(depends)}", flush=True)
    shutil.rmtree(stage)
    return deb


def build_tarball(bundle: Path) -> Path:
    tarball = OUT / f"cotrain-{__version__}-linux-{platform.machine()}.tar.gz"
    subprocess.run(["tar", "-C", str(bundle.parent), "-czf", str(tarball), bundle.name], check=True)
    return tarball


def _mkdir(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    return path


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--skip-bundle", action="store_true", help="package an existing bundle")
    parser.add_argument("--skip-self-test", action="store_true",
                        help="package without the bundle's first start, for a caller that runs it: CI "
                        "builds at the lowest priority beside its tests, where a timed start would starve")
    args = parser.parse_args()
    check_lock()
    bundle = OUT / "cotrain" if args.skip_bundle else build_bundle()
    print(f"bundle: {bundle} ({human(tree_size(bundle))} on disk)", flush=True)
    if not args.skip_self_test:
        self_test(bundle)
    if sys.platform.startswith("linux"):
        deb = build_deb(bundle)
        tarball = build_tarball(bundle)
        print(f"deb: {deb} ({human(deb.stat().st_size)})")
        print(f"tarball: {tarball} ({human(tarball.stat().st_size)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
