"""The packaged app leaves PyAV out: aiortc must still open data channels, and media must
fail with a clear error. Runs in a fresh interpreter, where ``av`` was never imported."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

WITHOUT_PYAV = """
import asyncio, json, sys
from engine.transport.without_media import MediaUnavailable, install, media_codecs_loaded
install()
from engine.selftest import check_webrtc
result = {"webrtc": check_webrtc(), "pyav": media_codecs_loaded(),
          "ffmpeg_loaded": any("libavcodec" in line for line in open("/proc/self/maps"))}
from aiortc.mediastreams import AudioStreamTrack
try:
    asyncio.run(AudioStreamTrack().recv())
    result["media"] = "worked"
except MediaUnavailable as exc:
    result["media"] = str(exc)
print(json.dumps(result))
"""


def test_aiortc_opens_data_channels_without_pyav_and_refuses_media_plainly():
    done = subprocess.run([sys.executable, "-c", WITHOUT_PYAV], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["webrtc"].startswith("loopback data channel round trip of 300 kB")
    assert result["webrtc"].endswith("(data channels only, no PyAV)")
    assert result["pyav"] is False and result["ffmpeg_loaded"] is False
    assert "carries no audio or video codecs" in result["media"]


def test_the_stand_in_stays_out_of_the_way_where_pyav_is_installed():
    done = subprocess.run(
        [sys.executable, "-c", "from engine.transport.without_media import install_if_missing, "
         "media_codecs_loaded\nprint(install_if_missing())\nimport aiortc\nprint(media_codecs_loaded())"],
        cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split() == ["False", "True"]
