"""What a volunteer allows: one validated Struct, changeable while running, sent from the app
to its worker and kept in the app's settings."""

from __future__ import annotations

import os
from typing import Annotated, Any

from msgspec import Meta, Struct

from engine.governor.weekly_hours import WeeklySchedule
from engine.wire.codec import Codec, convert, encode_text

KilobytesPerSecond = Annotated[int, Meta(ge=1, le=10**9)]
DEFAULT_DISK_GB = 10.0


class Limits(Struct, kw_only=True):
    threads: Annotated[int, Meta(ge=1, le=1024)] | None = None  # compute threads; None: all cores
    cpu_percent: Annotated[int, Meta(ge=1, le=100)] = 100  # duty cycle: compute this share of the time
    max_memory_mb: Annotated[int, Meta(ge=64, le=10**8)] | None = None  # pause when the worker uses more
    max_upload_kbps: KilobytesPerSecond | None = None  # None: unlimited
    max_download_kbps: KilobytesPerSecond | None = None
    max_disk_gb: Annotated[float, Meta(ge=0.1, le=10**6)] = DEFAULT_DISK_GB  # projects' data kept here
    use_gpu: bool = True  # when CUDA is present
    run_on_battery: bool = True
    only_when_idle: bool = False
    idle_minutes: Annotated[float, Meta(ge=0, le=24 * 60)] = 5.0  # without input, when only_when_idle
    schedule: Annotated[str, Meta(max_length=1000)] = "always"  # see WeeklySchedule
    low_priority: bool = True  # nice 19 / the idle priority class

    def __post_init__(self) -> None:
        WeeklySchedule.parse(self.schedule)  # raises ValueError naming the problem

    @classmethod
    def checked(cls, **fields: Any) -> Limits:
        """Limits from a person's input (command-line options, a form), every bound checked:
        building a Struct directly checks none of them."""
        return convert(fields, cls, "limits")

    @property
    def weekly(self) -> WeeklySchedule:
        return WeeklySchedule.parse(self.schedule)

    def to_json(self) -> str:
        return encode_text(self)

    @classmethod
    def from_json(cls, text: str | bytes) -> Limits:
        return _codec.decode(text)

    def describe(self) -> str:
        """One line for people, naming only what differs from contributing without limits."""
        parts = [f"{self.threads} threads" if self.threads else "all cores"]
        if self.cpu_percent < 100:
            parts.append(f"{self.cpu_percent}% of the time")
        if self.max_memory_mb:
            parts.append(f"at most {self.max_memory_mb} MB of memory")
        if self.max_upload_kbps:
            parts.append(f"upload at most {self.max_upload_kbps} KB/s")
        if self.max_download_kbps:
            parts.append(f"download at most {self.max_download_kbps} KB/s")
        if self.max_disk_gb != DEFAULT_DISK_GB:
            parts.append(f"at most {self.max_disk_gb:g} GB of data")
        if not self.use_gpu:
            parts.append("no graphics card")
        if not self.run_on_battery:
            parts.append("not on battery")
        if self.only_when_idle:
            parts.append(f"only after {self.idle_minutes:g} idle minutes")
        if self.schedule != "always":
            parts.append(f"only {self.schedule}")
        if not self.low_priority:
            parts.append("at normal priority")
        return ", ".join(parts)


_codec: Codec[Limits] = Codec(Limits, "limits", 64 * 1024)


def default_limits() -> Limits:
    """What a new volunteer starts with: half the processor cores (the other half stays the
    owner's), at the lowest priority, at any time."""
    return Limits(threads=max(1, (os.cpu_count() or 2) // 2))
