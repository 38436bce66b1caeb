"""Let aiortc import without PyAV, for an app that only opens data channels.

aiortc imports PyAV (FFmpeg and a dozen codec libraries, about 100 MB) when it is imported,
for the audio and video tracks Cotrain never creates; upstream keeps it a hard dependency
(aiortc issue #1371). The packaged app leaves PyAV out and installs this finder first, so
``import aiortc`` gets an ``av`` whose every name is a class that refuses to be built:
data channels work, and any media code path fails at once with :class:`MediaUnavailable`
instead of misbehaving.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import logging
import sys
import types

log = logging.getLogger(__name__)


class MediaUnavailable(RuntimeError):
    """Raised by anything that would need PyAV's audio or video codecs."""


class _Absent:
    def __init__(self, *args: object, **kwargs: object) -> None:
        raise MediaUnavailable(f"{type(self).__module__}.{type(self).__name__}: this Cotrain build "
                               "carries no audio or video codecs (PyAV); only data channels work")


class _AbsentModule(types.ModuleType):
    def __getattr__(self, name: str) -> type:
        if name.startswith("__"):
            raise AttributeError(name)
        placeholder = type(name, (_Absent,), {"__module__": self.__name__})
        setattr(self, name, placeholder)
        return placeholder


class _AbsentFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, fullname: str, path: object = None, target: object = None):
        if fullname != "av" and not fullname.startswith("av."):
            return None
        return importlib.machinery.ModuleSpec(fullname, self, is_package=True)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        module = _AbsentModule(spec.name)
        module.__path__ = []
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        """Nothing to run: names appear on first use."""


def media_codecs_loaded() -> bool:
    """Whether the ``av`` that aiortc imported is PyAV itself."""
    return "av" in sys.modules and not isinstance(sys.modules["av"], _AbsentModule)


def install() -> None:
    """Make ``av`` resolve to the placeholder, even where PyAV is installed."""
    if not any(isinstance(finder, _AbsentFinder) for finder in sys.meta_path):
        sys.meta_path.insert(0, _AbsentFinder())


def install_if_missing() -> bool:
    """Install the placeholder when PyAV is not there (the packaged app); True if it did."""
    if "av" in sys.modules or importlib.util.find_spec("av") is not None:
        return False
    install()
    log.debug("PyAV is not bundled: aiortc runs with data channels only")
    return True
