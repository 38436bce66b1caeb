"""What a backbone says about itself on the LAN, as DNS-SD TXT records (versioned)."""

from __future__ import annotations

from dataclasses import dataclass, field

SERVICE_TYPE = "_cotrain._tcp.local."
TXT_VERSION = "1"
_PROJECT_KEY = "p:"  # one record per project: p:<id>=<title>
_MAX_VALUE = 200  # a TXT string holds 255 bytes, key included


@dataclass
class LanBackbone:
    """A backbone found on the LAN; ``url`` is what ``cotrain peer --backbone`` takes."""

    name: str
    url: str
    projects: dict[str, str] = field(default_factory=dict)  # id -> title


def encode_properties(projects: dict[str, str]) -> dict[str, str]:
    properties = {"v": TXT_VERSION}
    for project_id, title in projects.items():
        key = f"{_PROJECT_KEY}{project_id}"
        properties[key] = title.encode()[: _MAX_VALUE - len(key)].decode(errors="ignore")
    return properties


def decode_properties(properties: dict[bytes, bytes | None]) -> dict[str, str] | None:
    """Projects from TXT records, or None when they are not ours (or from a newer format)."""
    try:
        text = {k.decode(): (v or b"").decode() for k, v in properties.items()}
    except UnicodeDecodeError:
        return None
    if text.get("v") != TXT_VERSION:
        return None
    return {k[len(_PROJECT_KEY):]: v for k, v in text.items() if k.startswith(_PROJECT_KEY) and len(k) > 2}
