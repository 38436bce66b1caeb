"""Cutting text into shards: .txt/.md files (long ones at paragraph breaks), JSONL with a
"text" field, or Parquet with a "text" column (or another field the author names), into
JSONL shards of about ``shard_bytes`` and a held-out set (engine/authoring/heldout.py)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import BinaryIO

from engine.authoring.heldout import every, spread
from engine.authoring.manifest import HELDOUT, SHARDS
from engine.shards.jsonl import TEXT_FIELD, ShardError, document_line, iter_documents

TEXT_SUFFIXES = {".txt", ".md", ".rst", ".text"}
DOCUMENT_CHARS = 100_000  # a longer text file becomes several documents, cut between paragraphs


def input_files(inputs: list[Path]) -> list[Path]:
    found: list[Path] = []
    for path in inputs:
        if path.is_dir():
            found += sorted(p for p in path.rglob("*") if p.is_file())
        elif path.is_file():
            found.append(path)
        else:
            raise ValueError(f"{path} does not exist")
    return found


def documents(path: Path, field: str = TEXT_FIELD) -> Iterator[str]:
    suffix = path.suffix.lower()
    if suffix in TEXT_SUFFIXES:
        yield from _paragraph_groups(path.read_text(errors="replace"))
    elif suffix == ".jsonl":
        try:
            yield from iter_documents(path, field)
        except ShardError as exc:
            raise ValueError(f"{path.parent}/{exc} (--text-field names another field)") from None
    elif suffix == ".parquet":
        yield from _parquet_documents(path, field)


def _parquet_documents(path: Path, field: str) -> Iterator[str]:
    """The text column, a row group at a time: a dataset's Parquet files run to gigabytes."""
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise ValueError(f"{path}: reading Parquet needs pyarrow (pip install pyarrow)") from None
    try:
        parquet = pq.ParquetFile(path)
    except (OSError, ValueError) as exc:  # pyarrow's errors are among these
        raise ValueError(f"{path}: not a Parquet file pyarrow can read ({exc})") from None
    columns = parquet.schema_arrow.names
    if field not in columns:
        raise ValueError(f"{path}: no {field!r} column (it has {', '.join(columns[:10]) or 'none'}; "
                         "--text-field names another)")
    try:
        for batch in parquet.iter_batches(columns=[field], batch_size=1024):
            yield from (t for t in batch.column(0).to_pylist() if isinstance(t, str))
    except (OSError, ValueError) as exc:
        raise ValueError(f"{path}: damaged ({exc})") from None


def _paragraph_groups(text: str) -> Iterator[str]:
    group: list[str] = []
    size = 0
    for paragraph in text.split("\n\n"):
        if size + len(paragraph) > DOCUMENT_CHARS and group:
            yield "\n\n".join(group)
            group, size = [], 0
        group.append(paragraph)
        size += len(paragraph) + 2
    if "".join(group).strip():
        yield "\n\n".join(group)


def cut_text(inputs: list[Path], root: Path, shard_bytes: int, heldout_every: int,
             field: str = TEXT_FIELD, heldout_size: int | None = None) -> tuple[int, int]:
    """Write ``root/shards`` and ``root/heldout``; returns (documents, held out). With
    ``heldout_size``, that many documents are held out (the inputs are read twice)."""
    files = input_files(inputs)
    if not files:
        raise ValueError("no input files")
    held = every(heldout_every)
    if heldout_size is not None:
        total = sum(1 for path in files for text in documents(path, field) if text.strip())
        held = spread(total, heldout_size, "documents")
    return write_shards((text for path in files for text in documents(path, field)), root, shard_bytes,
                        held)


def write_shards(texts: Iterable[str], root: Path, shard_bytes: int,
                 held_out: Callable[[int], bool]) -> tuple[int, int]:
    writers = {SHARDS: _ShardWriter(root / SHARDS, "shard", shard_bytes),
               HELDOUT: _ShardWriter(root / HELDOUT, "heldout", shard_bytes)}
    count = held = 0
    for text in texts:
        if not text.strip():
            continue
        count += 1
        kept = held_out(count)
        held += kept
        writers[HELDOUT if kept else SHARDS].write(document_line(text))
    for writer in writers.values():
        writer.close()
    if count - held < 1:
        raise ValueError("the inputs hold no text")
    return count, held


class _ShardWriter:
    def __init__(self, folder: Path, stem: str, shard_bytes: int) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        for old in folder.iterdir():
            old.unlink()
        self.folder, self.stem, self.shard_bytes = folder, stem, shard_bytes
        self.number, self.size = 0, 0
        self.file: BinaryIO | None = None

    def write(self, data: bytes) -> None:
        if self.file is None or (self.size + len(data) > self.shard_bytes and self.size):
            self.close()
            self.file = (self.folder / f"{self.stem}-{self.number:05d}.jsonl").open("wb")
            self.number, self.size = self.number + 1, 0
        assert self.file is not None
        self.file.write(data)
        self.size += len(data)

    def close(self) -> None:
        if self.file is not None:
            self.file.close()
            self.file = None
