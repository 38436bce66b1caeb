"""Starting points for ``cotrain project new``: a project.json to edit, for models that
train on a volunteer's CPU in minutes and scale up by editing their configuration."""

from __future__ import annotations

from typing import Any

_COMMON: dict[str, Any] = {
    "optimizer": {"name": "adamw", "lr": 0.001, "weight_decay": 0.01, "clip_grad_norm": 1.0},
    "schedule": {"type": "linear", "warmup_epochs": 10, "total_epochs": 2000, "min_ratio": 0.1},
    "aggregation": {"method": "mean", "verify_probability": 0.1},
    "round_timeout": 120,
    "checkpoint_every": 10,
    "require_account": False,
}

PRESETS: dict[str, dict[str, Any]] = {
    # sahajBERT's recipe in miniature: ALBERT (shared layers, factorized embeddings), masked LM
    # of whole words and sentence-order prediction.
    "albert-mini": {
        "title": "ALBERT mini",
        "description": "A small ALBERT learning masked words and sentence order from this project's texts.",
        "task": "hf-masked-lm",
        "task_params": {
            "model_type": "albert",
            "config": {"vocab_size": 8000, "embedding_size": 128, "hidden_size": 256, "num_hidden_layers": 4,
                       "num_attention_heads": 4, "intermediate_size": 1024, "max_position_embeddings": 128},
            "seq_len": 128, "micro_batch": 8, "whole_word_masking": True, "sentence_order": True,
        },
        "target_batch_size": 256,
        **_COMMON,
        "optimizer": {**_COMMON["optimizer"], "lr": 0.002},
    },
    "gpt2-mini": {
        "title": "GPT-2 mini",
        "description": "A small GPT-2 learning to continue this project's texts.",
        "task": "hf-causal-lm",
        "task_params": {
            "model_type": "gpt2",
            "config": {"vocab_size": 8000, "n_embd": 256, "n_layer": 4, "n_head": 4, "n_positions": 128},
            "seq_len": 128, "micro_batch": 8,
        },
        "target_batch_size": 256,
        **_COMMON,
    },
    # ResNet-18's shape, built by transformers from its configuration; `cotrain project shard`
    # sets num_classes from the class folders.
    "resnet18": {
        "title": "ResNet-18",
        "description": "A ResNet-18 learning to classify this project's images (one folder per class). "
                       "torchvision's own build is the alternative: architecture \"torchvision:resnet18\", "
                       "no config, where torchvision is installed for the peers' torch.",
        "task": "image-classification",
        "task_params": {
            "architecture": "resnet",
            "config": {"embedding_size": 64, "hidden_sizes": [64, 128, 256, 512], "depths": [2, 2, 2, 2],
                       "layer_type": "basic"},
            "num_classes": 10, "image_size": 224, "channels": 3, "micro_batch": 16,
            "mean": [0.485, 0.456, 0.406], "std": [0.229, 0.224, 0.225],
        },
        "target_batch_size": 256,
        **_COMMON,
    },
}
