"""Bytes and messages moved over links: counted per link, summed per peer, shown to people."""

from __future__ import annotations

from msgspec import Struct


class LinkCounters(Struct):
    bytes_sent: int = 0
    bytes_received: int = 0
    messages_sent: int = 0
    messages_received: int = 0

    def __add__(self, other: LinkCounters) -> LinkCounters:
        return LinkCounters(self.bytes_sent + other.bytes_sent, self.bytes_received + other.bytes_received,
                            self.messages_sent + other.messages_sent,
                            self.messages_received + other.messages_received)
