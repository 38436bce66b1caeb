"""`cotrain project shard` on text: plain files, JSONL and Parquet become the same JSONL
shards, every n-th document held out or as many as the author asks; an unreadable input is
a clear error."""

import itertools
import json

import pytest

from engine.authoring.text_shards import cut_text
from engine.cli import main


def shard_texts(root, folder):
    return [json.loads(line)["text"] for path in sorted((root / folder).glob("*.jsonl"))
            for line in path.read_text().splitlines()]


TEXTS = [f"document {i}: " + "words " * (i % 7 + 1) for i in range(40)]


def test_text_jsonl_and_parquet_inputs_give_the_same_shards(tmp_path):
    pq = pytest.importorskip("pyarrow.parquet", reason="Parquet input needs pyarrow")
    import pyarrow as pa

    inputs = tmp_path / "in"
    inputs.mkdir()
    (inputs / "a.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in TEXTS[:20]))
    pq.write_table(pa.table({"text": TEXTS[20:], "id": list(range(20))}), inputs / "b.parquet",
                   row_group_size=7)
    count, held = cut_text([inputs], tmp_path / "out", shard_bytes=300, heldout_every=5)
    assert (count, held) == (40, 8)
    shards, heldout = shard_texts(tmp_path / "out", "shards"), shard_texts(tmp_path / "out", "heldout")
    assert heldout == TEXTS[4::5] and shards == [t for i, t in enumerate(TEXTS) if i % 5 != 4]
    assert len(list((tmp_path / "out" / "shards").glob("*.jsonl"))) > 1  # cut at about 300 bytes


def test_a_parquet_file_without_a_text_column_is_refused_naming_its_columns(tmp_path):
    pq = pytest.importorskip("pyarrow.parquet", reason="Parquet input needs pyarrow")
    import pyarrow as pa

    pq.write_table(pa.table({"body": ["x"], "id": [1]}), tmp_path / "bad.parquet")
    says = r"bad\.parquet: no 'text' column \(it has body, id; --text-field names another\)"
    with pytest.raises(ValueError, match=says):
        cut_text([tmp_path / "bad.parquet"], tmp_path / "out", 300, 5)


def test_a_file_named_parquet_that_is_not_one_is_refused(tmp_path):
    pytest.importorskip("pyarrow.parquet", reason="Parquet input needs pyarrow")
    (tmp_path / "fake.parquet").write_text("not parquet at all")
    with pytest.raises(ValueError, match=r"fake\.parquet: not a Parquet file"):
        cut_text([tmp_path / "fake.parquet"], tmp_path / "out", 300, 5)


def test_long_text_files_are_cut_between_paragraphs(tmp_path):
    paragraphs = [f"paragraph {i} " + "x" * 30_000 for i in range(7)]
    (tmp_path / "book.txt").write_text("\n\n".join(paragraphs))
    count, held = cut_text([tmp_path / "book.txt"], tmp_path / "out", 1 << 20, 100)
    texts = shard_texts(tmp_path / "out", "shards")
    assert count == len(texts) > 1 and held == 0
    assert "\n\n".join(texts) == "\n\n".join(paragraphs)
    assert all(len(t) <= 100_000 for t in texts)


def test_the_author_chooses_how_many_documents_are_held_out(tmp_path, capsys):
    inputs = tmp_path / "in"
    inputs.mkdir()
    (inputs / "a.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in TEXTS))
    folder = tmp_path / "project"
    assert main(["project", "new", "--preset", "gpt2-mini", str(folder)]) == 0
    count, held = cut_text([inputs], folder, 300, 50, heldout_size=6)
    assert (count, held) == (40, 6)
    heldout = shard_texts(folder, "heldout")
    numbers = [TEXTS.index(t) for t in heldout]
    assert numbers[0] >= 5 and numbers[-1] == 39 and min(b - a for a, b in itertools.pairwise(numbers)) >= 6
    assert sorted(heldout + shard_texts(folder, "shards")) == sorted(TEXTS)
    # Asking for all of them is refused, and what was cut before stays.
    before = sorted(p.read_bytes() for p in folder.rglob("*.jsonl"))
    assert main(["project", "shard", str(inputs), "--out", str(folder), "--heldout", "40"]) == 1
    said = capsys.readouterr().err
    assert "would leave none of the 40 documents to train on (--heldout at most 39)" in said
    assert sorted(p.read_bytes() for p in folder.rglob("*.jsonl")) == before
