"""``demo-lm``: a byte-level causal transformer LM with ALBERT-style cross-layer sharing.

sahajBERT in miniature: one transformer layer's weights applied ``layers`` times and a
factorized embedding, so the model is deep for its few parameters — cheap to average,
which is what volunteer bandwidth needs.
"""

from __future__ import annotations

import hashlib
from typing import Annotated

import torch
from msgspec import Meta, Struct
from torch import nn

from engine.tasks.base import Batch, Task, TaskData
from engine.tasks.corpus import corpus_bytes_limit, load_corpus
from engine.wire.codec import convert

VOCAB = 256
Size = Annotated[int, Meta(ge=1, le=4096)]


class DemoLMParams(Struct, forbid_unknown_fields=True):
    d_model: Size = 512
    heads: Size = 8
    ff: Size = 2048
    layers: Size = 4
    embedding: Size = 128
    seq_len: Size = 64
    micro_batch: Size = 8

    def __post_init__(self) -> None:
        if self.d_model % self.heads:
            raise ValueError("d_model must be a multiple of heads")


class SharedLayerLM(nn.Module):
    def __init__(self, p: DemoLMParams) -> None:
        super().__init__()
        self.depth = p.layers
        self.token = nn.Embedding(VOCAB, p.embedding)
        self.position = nn.Embedding(p.seq_len, p.embedding)
        self.project_in = nn.Linear(p.embedding, p.d_model)
        self.layer = nn.TransformerEncoderLayer(
            p.d_model, p.heads, p.ff, dropout=0.0, activation="gelu",
            batch_first=True, norm_first=True,
        )
        self.norm = nn.LayerNorm(p.d_model)
        self.project_out = nn.Linear(p.d_model, p.embedding)
        self.bias = nn.Parameter(torch.zeros(VOCAB))
        self.apply(_init_weights)
        self.mask: torch.Tensor
        self.register_buffer("mask", nn.Transformer.generate_square_subsequent_mask(p.seq_len),
                             persistent=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        length = tokens.shape[1]
        positions = torch.arange(length, device=tokens.device)
        h = self.project_in(self.token(tokens) + self.position(positions))
        mask = self.mask[:length, :length]
        for _ in range(self.depth):
            h = self.layer(h, src_mask=mask, is_causal=True)
        return self.project_out(self.norm(h)) @ self.token.weight.T + self.bias


def _init_weights(module: nn.Module) -> None:
    """BERT's initializer (normal, std 0.02): keeps the tied output logits small at the start."""
    if isinstance(module, (nn.Linear, nn.Embedding)):
        nn.init.normal_(module.weight, std=0.02)
    if isinstance(module, nn.Linear) and module.bias is not None:
        nn.init.zeros_(module.bias)


class DemoLM(Task):
    name = "demo-lm"

    def __init__(self, params: DemoLMParams, corpus: torch.Tensor) -> None:
        self.params = params
        self.corpus = corpus

    @classmethod
    def create(cls, params: dict, data: TaskData) -> DemoLM:
        p = convert(params, DemoLMParams, "demo-lm parameters")
        return cls(p, load_corpus(data.corpus_dir, corpus_bytes_limit()))

    def build_model(self) -> nn.Module:
        return SharedLayerLM(self.params)

    def batch(self, seed: int, index: int) -> Batch:
        key = hashlib.sha256(f"{seed}:{index}".encode()).digest()
        generator = torch.Generator().manual_seed(int.from_bytes(key[:8], "little") >> 1)
        length = self.params.seq_len
        starts = torch.randint(0, self.corpus.numel() - length - 1, (self.params.micro_batch,),
                               generator=generator)
        windows = self.corpus[starts[:, None] + torch.arange(length + 1)].long()
        return Batch(seed, index, {"tokens": windows[:, :-1], "targets": windows[:, 1:]})

    def loss(self, model: nn.Module, batch: Batch) -> torch.Tensor:
        logits = model(batch.tensors["tokens"])
        return nn.functional.cross_entropy(logits.reshape(-1, VOCAB), batch.tensors["targets"].reshape(-1))
