"""Training a project's tokenizer on its own shards, as sahajBERT trained one for Bengali: a
Unigram model (SentencePiece's) with NFKC normalization, written as tokenizer.json."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

from engine.shards.jsonl import iter_documents

SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]


def train_tokenizer(shards: list[Path], vocab_size: int, out: Path,
                    progress: Callable[[int, int], None] | None = None) -> int:
    """Write ``out``; returns the vocabulary's size (which the model's vocab_size must equal)."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.Unigram())
    tokenizer.normalizer = normalizers.NFKC()
    tokenizer.pre_tokenizer = pre_tokenizers.Metaspace()
    tokenizer.decoder = decoders.Metaspace()
    trainer = trainers.UnigramTrainer(vocab_size=vocab_size, special_tokens=SPECIALS, unk_token="[UNK]",
                                      show_progress=False)

    def texts() -> Iterator[str]:
        for number, shard in enumerate(shards, 1):
            yield from iter_documents(shard)
            if progress:
                progress(number, len(shards))

    tokenizer.train_from_iterator(texts(), trainer=trainer)
    out.parent.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(out))
    return tokenizer.get_vocab_size()


def tokenize_project(folder: Path, vocab: int | None = None) -> int:
    """Train the project's tokenizer on its shards and make the model's vocabulary match it."""
    from engine.authoring.manifest import SHARDS, TOKENIZER, read_project, update_manifest, write_project

    project = read_project(folder)
    config = project.setdefault("task_params", {}).setdefault("config", {})
    shards = sorted((folder / SHARDS).glob("*.jsonl"))
    if not shards:
        raise ValueError(f"{folder / SHARDS} has no shards: run cotrain project shard first")
    size = train_tokenizer(shards, vocab or int(config.get("vocab_size", 8000)), folder / TOKENIZER)
    config["vocab_size"] = size
    config["pad_token_id"] = SPECIALS.index("[PAD]")
    if project.get("task") == "hf-causal-lm":
        config["bos_token_id"] = config["eos_token_id"] = SPECIALS.index("[SEP]")
    write_project(folder, project)
    update_manifest(folder)
    return size
