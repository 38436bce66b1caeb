"""Fetching one file a project's manifest names: resumed with Range where an earlier attempt
stopped, paced by the volunteer's download limit, and checked against its sha256 before
anything reads it. A server that sends more than the manifest says is cut off at once."""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Callable
from pathlib import Path

import aiohttp

from engine.project import FileRef
from engine.transport.shaping import RateLimiter

log = logging.getLogger(__name__)
CHUNK = 1 << 16
Progress = Callable[[int, int], None]


class FileError(OSError):
    """A file could not be had; ``bad`` when what arrived was not the file the manifest names."""

    def __init__(self, message: str, bad: bool = False) -> None:
        super().__init__(message)
        self.bad = bad

    def __str__(self) -> str:
        return str(self.args[0])


def hash_file(path: Path, digest=None):
    digest = digest or hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return digest


async def fetch_file(http: aiohttp.ClientSession, url: str, headers: dict[str, str], ref: FileRef,
                     part: Path, limiter: RateLimiter | None = None, progress: Progress | None = None,
                     timeout: aiohttp.ClientTimeout | None = None) -> None:
    """Complete ``part`` to the file ``ref`` names and check it; raises FileError."""
    have = part.stat().st_size if part.exists() else 0
    if have > ref.bytes:
        part.unlink()
        have = 0
    if have < ref.bytes:
        have = await _receive(http, url, headers, ref, part, have, limiter, progress, timeout)
    if have != ref.bytes:
        raise FileError(f"{ref.path}: {have} bytes arrived of {ref.bytes}")
    if hash_file(part).hexdigest() != ref.sha256:
        part.unlink()
        raise FileError(f"{ref.path} is not the file the project lists (its sha256 differs)", bad=True)


async def _receive(http: aiohttp.ClientSession, url: str, headers: dict[str, str], ref: FileRef,
                   part: Path, have: int, limiter: RateLimiter | None, progress: Progress | None,
                   timeout: aiohttp.ClientTimeout | None) -> int:
    asked = {**headers, "Range": f"bytes={have}-"} if have else headers
    try:
        async with http.get(url, headers=asked, timeout=timeout) as resp:
            if resp.status == 200:
                have = 0  # the server ignored the range: start again
            elif resp.status != 206:
                text = (await resp.content.read(500)).decode(errors="replace").strip()
                raise FileError(f"{ref.path}: the server answered {resp.status} {resp.reason}"
                                + (f" ({text})" if text else ""))
            with part.open("r+b" if have else "wb") as out:
                out.seek(have)
                out.truncate()
                async for chunk in resp.content.iter_chunked(CHUNK):
                    if have + len(chunk) > ref.bytes:
                        raise FileError(f"{ref.path} is larger than the project says ({ref.bytes} bytes)",
                                        bad=True)
                    if limiter is not None:
                        await limiter.acquire(len(chunk))
                    out.write(chunk)
                    have += len(chunk)
                    if progress:
                        progress(have, ref.bytes)
    except FileError:
        raise
    except (aiohttp.ClientError, TimeoutError, OSError) as exc:
        log.info("fetching %s stopped at %d bytes: %r", url, have, exc)
        raise FileError(f"{ref.path}: the download stopped at {have} of {ref.bytes} bytes "
                        f"({type(exc).__name__})") from None
    return have
