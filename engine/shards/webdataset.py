"""Image shards' layout (WebDataset's): a plain tar of ``KEY.png`` or ``KEY.jpg`` with
``KEY.cls`` (the class index as text), and the bounds a peer reads them within. Torch-free:
the authoring tools and a backbone writing its catalog's folders write them."""

from __future__ import annotations

MAX_MEMBER_BYTES = 32 * 2**20
MAX_MEMBERS = 200_000  # tarfile keeps every header it reads
MAX_SIDE = 4096
MAX_LABEL_BYTES = 32
IMAGE_SUFFIXES = {"png": "PNG", "jpg": "JPEG", "jpeg": "JPEG"}
LABEL_SUFFIX = "cls"


def split_name(name: str) -> tuple[str, str]:
    """WebDataset's rule: the key is the name up to the first dot of its last part."""
    folder, _, base = name.rpartition("/")
    stem, dot, suffix = base.partition(".")
    return (f"{folder}/{stem}" if folder else stem), suffix.lower() if dot else ""
