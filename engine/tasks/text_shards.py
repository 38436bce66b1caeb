"""Text shards as training examples: JSONL documents, tokenized with the project's
tokenizer and cut into blocks of ``seq_len`` tokens -- packed for masked or causal language
modelling, or as ALBERT's sentence pairs for sentence-order prediction. A shard's examples
depend on the shard alone, so every peer that reads it gets the same ones."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from engine.shards.jsonl import ShardError
from engine.tasks.shard_order import generator


@dataclass(frozen=True)
class Specials:
    cls: int | None
    sep: int
    pad: int
    mask: int | None


@dataclass
class TextExamples:
    """``input_ids``, ``token_type_ids``, ``attention_mask`` and ``word_ids`` (-1 on special
    tokens and padding) of shape [examples, seq_len]; ``sentence_order`` [examples] (1:
    swapped) when the examples are sentence pairs."""

    tensors: dict[str, torch.Tensor]

    def __len__(self) -> int:
        return int(self.tensors["input_ids"].shape[0])

    def take(self, rows: torch.Tensor) -> dict[str, torch.Tensor]:
        return {k: t[rows] for k, t in self.tensors.items()}


def _tokens(tokenizer, documents: list[str]) -> list[tuple[list[int], list[int]]]:
    """Per document: token ids and word numbers (each word its own number within the document)."""
    out = []
    for encoding in tokenizer.encode_batch(documents, add_special_tokens=False):
        words = [w if w is not None else -1 for w in encoding.word_ids]
        out.append((encoding.ids, words))
    return out


def packed_examples(tokenizer, documents: list[str], seq_len: int, specials: Specials) -> TextExamples:
    """Documents end to end, separated by ``sep``, in blocks of ``seq_len`` (with ``cls`` first
    and ``sep`` last when the model has them)."""
    ids: list[int] = []
    words: list[int] = []
    offset = 0
    for doc_ids, doc_words in _tokens(tokenizer, documents):
        ids += [*doc_ids, specials.sep]
        words += [*(w + offset if w >= 0 else -1 for w in doc_words), -1]
        offset += max(doc_words, default=-1) + 1
    framed = specials.cls is not None
    body = seq_len - 2 if framed else seq_len
    rows = max(1, -(-len(ids) // body))
    input_ids = torch.full((rows, seq_len), specials.pad, dtype=torch.long)
    word_ids = torch.full((rows, seq_len), -1, dtype=torch.long)
    attention = torch.zeros((rows, seq_len), dtype=torch.long)
    for row in range(rows):
        chunk, chunk_words = ids[row * body:(row + 1) * body], words[row * body:(row + 1) * body]
        if framed:
            assert specials.cls is not None
            chunk, chunk_words = [specials.cls, *chunk, specials.sep], [-1, *chunk_words, -1]
        input_ids[row, :len(chunk)] = torch.tensor(chunk)
        word_ids[row, :len(chunk)] = torch.tensor(chunk_words)
        attention[row, :len(chunk)] = 1
    return TextExamples({"input_ids": input_ids, "token_type_ids": torch.zeros_like(input_ids),
                         "attention_mask": attention, "word_ids": word_ids})


def sentence_pairs(tokenizer, documents: list[str], seq_len: int, specials: Specials,
                   key: str) -> TextExamples:
    """ALBERT's sentence-order examples: a window of a document cut in two (A, B) at a
    seeded point, kept in order or swapped (label 1), as [CLS] A [SEP] B [SEP]."""
    if specials.cls is None:
        raise ShardError("sentence-order prediction needs a tokenizer with a [CLS] token")
    window = seq_len - 3
    rows: list[tuple[list[int], list[int], list[int], list[int], int]] = []
    for number, (ids, words) in enumerate(_tokens(tokenizer, documents)):
        for start in range(0, len(ids), window):
            piece, piece_words = ids[start:start + window], words[start:start + window]
            if len(piece) < 2:
                continue
            rng = generator(key, number, start)
            cut = int(torch.randint(1, len(piece), (1,), generator=rng))
            a, b, wa, wb = piece[:cut], piece[cut:], piece_words[:cut], piece_words[cut:]
            swapped = int(torch.rand(1, generator=rng) < 0.5)
            rows.append((b, a, wb, wa, 1) if swapped else (a, b, wa, wb, 0))
    if not rows:
        raise ShardError("no document is long enough for a sentence pair")
    count = len(rows)
    input_ids = torch.full((count, seq_len), specials.pad, dtype=torch.long)
    types = torch.zeros((count, seq_len), dtype=torch.long)
    word_ids = torch.full((count, seq_len), -1, dtype=torch.long)
    attention = torch.zeros((count, seq_len), dtype=torch.long)
    order = torch.zeros(count, dtype=torch.long)
    for row, (a, b, wa, wb, label) in enumerate(rows):
        tokens = [specials.cls, *a, specials.sep, *b, specials.sep]
        input_ids[row, :len(tokens)] = torch.tensor(tokens)
        types[row, len(a) + 2:len(tokens)] = 1
        # Words of B are numbered apart from A's, so that a word cut in two is two words.
        shifted = [w + 1 + max(wa, default=0) if w >= 0 else -1 for w in wb]
        word_ids[row, :len(tokens)] = torch.tensor([-1, *wa, -1, *shifted, -1])
        attention[row, :len(tokens)] = 1
        order[row] = label
    return TextExamples({"input_ids": input_ids, "token_type_ids": types, "attention_mask": attention,
                         "word_ids": word_ids, "sentence_order_label": order})
