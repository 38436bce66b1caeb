"""``hf-masked-lm`` and ``hf-causal-lm``: a transformers architecture from the project's
configuration, the project's tokenizer (tokenizer.json, read by the tokenizers library) and
its JSONL shards. Masked LM masks tokens or whole words; with ``sentence_order`` an ALBERT
learns sentence order too (AlbertForPreTraining), sahajBERT's recipe."""

from __future__ import annotations

import inspect
import logging
from abc import abstractmethod
from collections import OrderedDict
from collections.abc import Iterator
from typing import Annotated, Any, ClassVar

import torch
from msgspec import Meta, Struct, field
from torch import nn

from engine.project import ParamTable
from engine.shards.download import FileError
from engine.shards.jsonl import ShardError, read_documents
from engine.tasks.activations import BACKWARD_PEAK, saved_bytes
from engine.tasks.base import Batch, Task, TaskData
from engine.tasks.hf_models import (
    Head,
    ModelError,
    bounded_modules,
    build_model,
    count_parameters,
    model_class,
    model_config,
    structure,
    training_memory,
)
from engine.tasks.masking import IGNORE, mask_tokens
from engine.tasks.shard_order import draw_shard, examples, generator
from engine.tasks.text_shards import Specials, TextExamples, packed_examples, sentence_pairs
from engine.wire.codec import convert
from engine.wire.types import Name

log = logging.getLogger(__name__)
SeqLen = Annotated[int, Meta(ge=8, le=8192)]
Size = Annotated[int, Meta(ge=1, le=4096)]
MAX_TOKENIZER_BYTES = 64 * 1024 * 1024
SHARDS_IN_MEMORY = 2
# Vocabularies are often padded to a multiple of 64 or 128 for speed; more than this unused is a mistake.
VOCAB_PADDING = 128


class LanguageModelParams(Struct, kw_only=True, forbid_unknown_fields=True):
    model_type: Name
    config: ParamTable = field(default_factory=dict)
    seq_len: SeqLen = 128
    micro_batch: Size = 8
    per_visit: Annotated[int, Meta(ge=1, le=10**6)] = 32  # micro-batches from a shard before the next
    pad_token: Name = "[PAD]"


class MaskedLMParams(LanguageModelParams, kw_only=True, forbid_unknown_fields=True):
    mask_probability: Annotated[float, Meta(gt=0, lt=1)] = 0.15
    whole_word_masking: bool = False
    sentence_order: bool = False
    cls_token: Name = "[CLS]"
    sep_token: Name = "[SEP]"
    mask_token: Name = "[MASK]"


class CausalLMParams(LanguageModelParams, kw_only=True, forbid_unknown_fields=True):
    end_token: Name = "[SEP]"  # between documents


class LanguageModel(Task):
    head: ClassVar[Head]
    schema: ClassVar[type[LanguageModelParams]]

    def __init__(self, params: Any, cfg: Any, data: TaskData) -> None:
        self.params = params
        self.cfg = cfg
        self.data = data
        self._tokenizer: Any = None
        self._specials: Specials | None = None
        self._shards: OrderedDict[str, TextExamples] = OrderedDict()
        self._accepts: set[str] | None = None
        self._saved: int | None = None  # bytes autograd keeps per sequence

    @classmethod
    def create(cls, params: dict, data: TaskData) -> LanguageModel:
        p = convert(params, cls.schema, f"{cls.name} parameters")
        head = cls.head_for(p)
        cfg = model_config(head, p.model_type, dict(p.config))
        positions = getattr(cfg, "max_position_embeddings", None)
        if isinstance(positions, int) and positions < p.seq_len:
            raise ModelError(f"seq_len is {p.seq_len} but the model has {positions} positions "
                             "(max_position_embeddings)")
        if data.spec is not None and data.spec.tokenizer is None:
            raise ModelError(f"a {cls.name} project lists its tokenizer (data.tokenizer)")
        return cls(p, cfg, data)

    @classmethod
    def head_for(cls, params: Any) -> Head:
        return cls.head

    def build_model(self) -> nn.Module:
        return build_model(self.head_for(self.params), self.cfg)

    def parameters(self) -> int:
        return count_parameters(self.head_for(self.params), self.cfg)

    def memory_needed(self) -> int:
        """Bytes a peer needs for this model: its training state and a micro-batch's
        activations at backward's peak (engine/tasks/activations.py)."""
        structure(self.cfg)  # (a depth past MAX_LAYERS: ALBERT shares its layers, and runs them all)
        if self._saved is None:
            self._saved = self._saved_per_sequence()
        return training_memory(self.parameters()) + int(BACKWARD_PEAK * self.params.micro_batch * self._saved)

    def _saved_per_sequence(self) -> int:
        """What autograd keeps for backward per sequence, counted in a forward pass on the
        meta device (engine/tasks/activations.py); a bound by width and depth where that
        does not run (16 fp32 values per token, layer and hidden unit)."""
        p, head = self.params, self.head_for(self.params)
        try:
            with torch.device("meta"), bounded_modules():
                model = model_class(head, self.cfg)(self.cfg)
                ids = torch.zeros(2, p.seq_len, dtype=torch.long)
                # (no attention mask: transformers asks a mask whether it masks anything,
                # which a meta tensor cannot answer; a full one keeps the same activations)
                inputs = {"input_ids": ids, "token_type_ids": torch.zeros_like(ids), "labels": ids,
                          "sentence_order_label": torch.zeros(2, dtype=torch.long)}
            accepts = set(inspect.signature(model.forward).parameters)
            taken = {k: t for k, t in inputs.items() if k in accepts}
            return saved_bytes(model, lambda m: m(**taken).loss) // 2
        except Exception as exc:  # (a model's code may object in its own way: the bound below stands)
            log.debug("counting %s's activations on the meta device failed (%s)", self.cfg.model_type, exc)
            hidden, layers = structure(self.cfg)
            return 64 * p.seq_len * hidden * layers

    # -- data ------------------------------------------------------------------------------

    def tokenizer(self):
        if self._tokenizer is None:
            self._tokenizer, self._specials = self._load_tokenizer()
        return self._tokenizer

    def _load_tokenizer(self):
        from tokenizers import Tokenizer

        spec, files = self._data()
        assert spec.tokenizer is not None
        if spec.tokenizer.bytes > MAX_TOKENIZER_BYTES:
            raise ModelError(f"the tokenizer is {spec.tokenizer.bytes} bytes; at most {MAX_TOKENIZER_BYTES}")
        path = files.local(spec.tokenizer)
        try:
            tokenizer = Tokenizer.from_file(str(path))
        except Exception as exc:  # the tokenizers library raises its own Exception subclass
            raise ModelError(f"the project's tokenizer does not load: {exc}") from None
        size, vocab = tokenizer.get_vocab_size(), int(self.cfg.vocab_size)
        if size > vocab:
            raise ModelError(f"the tokenizer has {size} tokens but the model's vocabulary only {vocab}: "
                             "the model's vocab_size must be at least the tokenizer's")
        if vocab - size >= VOCAB_PADDING:
            raise ModelError(f"the tokenizer has {size} tokens, the model's vocabulary {vocab}: "
                             f"{vocab - size} embeddings would never be trained (set vocab_size to {size})")
        return tokenizer, self._special_ids(tokenizer)

    def _special_ids(self, tokenizer) -> Specials:
        def token(name: str) -> int:
            found = tokenizer.token_to_id(name)
            if found is None:
                raise ModelError(f"the tokenizer has no {name!r} token, which this project names")
            return int(found)

        p = self.params
        if isinstance(p, MaskedLMParams):
            return Specials(cls=token(p.cls_token), sep=token(p.sep_token), pad=token(p.pad_token),
                            mask=token(p.mask_token))
        return Specials(cls=None, sep=token(p.end_token), pad=token(p.pad_token), mask=None)

    def _data(self):
        spec, files = self.data.spec, self.data.files
        if spec is None or files is None:
            raise ModelError(f"{self.name} trains on a project's data: this project has none")
        return spec, files

    def _examples(self, shard, key: str) -> TextExamples:
        """A shard's examples, tokenized once and kept for the next visits."""
        cached = self._shards.get(key)
        if cached is not None:
            self._shards.move_to_end(key)
            return cached
        tokenizer = self.tokenizer()
        _, files = self._data()
        try:
            documents = read_documents(files.local(shard))
        except OSError as exc:
            raise FileError(f"cannot read {shard.path}: {exc}") from None
        assert self._specials is not None
        if isinstance(self.params, MaskedLMParams) and self.params.sentence_order:
            made = sentence_pairs(tokenizer, documents, self.params.seq_len, self._specials, shard.sha256)
        else:
            made = packed_examples(tokenizer, documents, self.params.seq_len, self._specials)
        self._shards[key] = made
        while len(self._shards) > SHARDS_IN_MEMORY:
            self._shards.popitem(last=False)
        return made

    def batch(self, seed: int, index: int) -> Batch:
        spec, files = self._data()
        p = self.params
        shard, draw = draw_shard(seed, index, spec.shards, p.per_visit, files)
        made = self._examples(shard, shard.sha256)
        tensors = made.take(examples(seed, draw, len(made), p.micro_batch))
        return Batch(seed, index, self.finish(tensors, generator("mask", seed, index)))

    def heldout(self) -> Iterator[Batch]:
        spec, _ = self._data()
        size = self.params.micro_batch
        for number, ref in enumerate(spec.heldout):
            made = self._examples(ref, ref.sha256)
            for start in range(0, len(made), size):
                rows = torch.arange(start, min(start + size, len(made)))
                yield Batch(-1 - number, start // size,
                            self.finish(made.take(rows), generator("heldout", ref.sha256, start)))

    @abstractmethod
    def finish(self, tensors: dict[str, torch.Tensor], rng: torch.Generator) -> dict[str, torch.Tensor]:
        """The model's inputs and labels from a block of examples."""

    def loss(self, model: nn.Module, batch: Batch) -> torch.Tensor:
        if self._accepts is None:
            self._accepts = set(inspect.signature(model.forward).parameters)
        inputs = {k: t for k, t in batch.tensors.items() if k in self._accepts}
        return model(**inputs).loss


class MaskedLM(LanguageModel):
    name = "hf-masked-lm"
    head = "masked-lm"
    schema = MaskedLMParams

    @classmethod
    def head_for(cls, params: Any) -> Head:
        return "pretraining" if params.sentence_order else "masked-lm"

    def finish(self, tensors: dict[str, torch.Tensor], rng: torch.Generator) -> dict[str, torch.Tensor]:
        p, specials = self.params, self._specials
        assert specials is not None and specials.mask is not None
        words = tensors.pop("word_ids")
        tensors["input_ids"], tensors["labels"] = mask_tokens(
            tensors["input_ids"], words, p.mask_probability, p.whole_word_masking, specials.mask,
            self.tokenizer().get_vocab_size(), rng)
        return tensors


class CausalLM(LanguageModel):
    name = "hf-causal-lm"
    head = "causal-lm"
    schema = CausalLMParams

    def finish(self, tensors: dict[str, torch.Tensor], rng: torch.Generator) -> dict[str, torch.Tensor]:
        tensors.pop("word_ids")
        tensors.pop("token_type_ids")
        tensors["labels"] = tensors["input_ids"].masked_fill(tensors["attention_mask"] == 0, IGNORE)
        return tensors


__all__ = ["CausalLM", "MaskedLM", "ShardError"]
