"""What a volunteer allows: one validated, serialisable dataclass, changeable while running."""

from __future__ import annotations

from dataclasses import asdict, dataclass

from engine.governor.schedule import WeeklySchedule
from engine.wire.schema import from_dict


@dataclass
class Limits:
    threads: int | None = None  # compute threads; None: all cores
    cpu_percent: int = 100  # duty cycle: compute this share of the time, rest the remainder
    max_memory_mb: int | None = None  # pause when the worker uses more
    max_upload_kbps: int | None = None  # kilobytes per second, None: unlimited
    max_download_kbps: int | None = None
    use_gpu: bool = True  # when CUDA is present
    run_on_battery: bool = True
    only_when_idle: bool = False
    idle_minutes: float = 5.0  # after this long without input, when only_when_idle
    schedule: str = "always"  # see WeeklySchedule
    low_priority: bool = True  # nice 19 / the idle priority class

    def __post_init__(self) -> None:
        if self.threads is not None and not 1 <= self.threads <= 1024:
            raise ValueError("threads must be between 1 and 1024")
        if not 1 <= self.cpu_percent <= 100:
            raise ValueError("cpu_percent must be between 1 and 100")
        if self.max_memory_mb is not None and self.max_memory_mb < 64:
            raise ValueError("max_memory_mb must be at least 64")
        for name in ("max_upload_kbps", "max_download_kbps"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(f"{name} must be at least 1")
        if not 0 <= self.idle_minutes <= 24 * 60:
            raise ValueError("idle_minutes must be between 0 and 1440")
        WeeklySchedule.parse(self.schedule)  # raises ValueError naming the problem

    @property
    def weekly(self) -> WeeklySchedule:
        return WeeklySchedule.parse(self.schedule)

    def to_dict(self) -> dict:
        return asdict(self)

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

    @classmethod
    def from_dict(cls, data: dict) -> Limits:
        return from_dict(cls, data, "limits")
