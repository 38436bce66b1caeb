"""``albert-mini``: sahajBERT's recipe in miniature on a text every Python carries, the
documentation topics of ``help()`` (pydoc_data, under the PSF license: about 0.5 MB of
English), with a tokenizer trained on them when the folder is written."""

from __future__ import annotations

from pathlib import Path

from engine.authoring.heldout import every
from engine.authoring.manifest import update_manifest, write_project
from engine.authoring.presets import PRESETS
from engine.authoring.text_shards import write_shards

SHARD_BYTES = 128 * 1024


def build_albert_mini(folder: Path) -> None:
    try:
        import tokenizers  # noqa: F401  (the tokenizer is trained here)
    except ImportError:
        raise ImportError("training its tokenizer needs the tokenizers library (pip install cotrain[peer])") \
            from None
    from pydoc_data.topics import topics

    from engine.authoring.tokenizer import tokenize_project

    project = {
        "id": "albert-mini", **PRESETS["albert-mini"],
        "title": "ALBERT mini on Python's documentation",
        "description": "A small ALBERT (2M parameters) learning masked words and sentence order from the "
                       "documentation topics every Python installs: sahajBERT's recipe in miniature.",
        "seed": 2021,
    }
    write_project(folder, project)
    write_shards((topics[name] for name in sorted(topics)), folder, SHARD_BYTES, every(10))
    update_manifest(folder)
    tokenize_project(folder, vocab=8000)
