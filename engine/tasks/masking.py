"""BERT's masked-LM corruption, of tokens or of whole words: 15% chosen, of which 80% become
the mask token, 10% a random token and 10% stay; the loss is on the chosen ones only."""

from __future__ import annotations

import torch

IGNORE = -100  # transformers' label for "no loss here"


def mask_tokens(input_ids: torch.Tensor, word_ids: torch.Tensor, probability: float, whole_words: bool,
                mask_id: int, vocab_size: int,
                generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """(corrupted inputs, labels). ``word_ids`` numbers each token's word, -1 for special
    tokens and padding (never chosen)."""
    eligible = word_ids >= 0
    if whole_words:
        # A word is a word of its row: numbers repeat across rows drawn from different documents.
        span = int(word_ids.max()) + 2
        rowwise = word_ids + span * torch.arange(word_ids.shape[0]).unsqueeze(1)
        words, which = torch.unique(rowwise, return_inverse=True)
        picked = torch.rand(words.numel(), generator=generator) < probability
        chosen = eligible & picked[which]
    else:
        chosen = eligible & (torch.rand(input_ids.shape, generator=generator) < probability)
    if not chosen.any() and eligible.any():  # a batch with no label has no loss to learn from
        first = eligible.flatten().nonzero()[0]
        chosen.view(-1)[first] = True
    labels = torch.where(chosen, input_ids, torch.full_like(input_ids, IGNORE))
    roll = torch.rand(input_ids.shape, generator=generator)
    corrupted = input_ids.clone()
    corrupted[chosen & (roll < 0.8)] = mask_id
    randomized = chosen & (roll >= 0.8) & (roll < 0.9)
    corrupted[randomized] = torch.randint(vocab_size, input_ids.shape, generator=generator)[randomized]
    return corrupted, labels
