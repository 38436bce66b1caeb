"""Text shards' format: one document per line, a JSON object with a "text" string (or a JSON
string). Torch-free: the authoring tools and a backbone building its catalog read it too."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

TEXT_FIELD = "text"  # what the shards Cotrain writes name a document's text
MAX_DOCUMENT = 1 << 22  # characters; longer documents are cut (a shard is data, never trusted)


class ShardError(ValueError):
    pass


def iter_documents(path: Path, field: str = TEXT_FIELD) -> Iterator[str]:
    with path.open("rb") as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                value = json.loads(line)
            except ValueError:
                raise ShardError(f"{path.name} line {number} is not JSON") from None
            text = value.get(field) if isinstance(value, dict) else value
            if not isinstance(text, str):
                raise ShardError(f"{path.name} line {number} has no {field!r} string")
            yield text[:MAX_DOCUMENT]


def read_documents(path: Path) -> list[str]:
    return list(iter_documents(path))


def document_line(text: str) -> bytes:
    return (json.dumps({TEXT_FIELD: text}, ensure_ascii=False) + "\n").encode()
