"""``image-classification``: a transformers vision architecture from the project's
configuration (or a torchvision one from a short allow-list), trained with cross entropy on
the project's WebDataset shards (engine/tasks/image_shards.py). Augmentations are drawn from
the micro-batch's (seed, index), so a batch is the same wherever it is drawn again."""

from __future__ import annotations

import importlib
import logging
import math
from collections import OrderedDict
from collections.abc import Iterator
from types import ModuleType
from typing import TYPE_CHECKING, Annotated, Any, Literal

import torch
import torch.nn.functional as F
from msgspec import Meta, Struct, field
from torch import nn

from engine.project import FileRef, ParamTable
from engine.shards.download import FileError
from engine.tasks.activations import saved_bytes
from engine.tasks.base import Batch, Task, TaskData
from engine.tasks.hf_models import (
    Head,
    ModelError,
    build_model,
    count_parameters,
    model_class,
    model_config,
    training_memory,
)
from engine.tasks.shard_order import draw_shard, examples, generator
from engine.wire.codec import convert
from engine.wire.types import Name

if TYPE_CHECKING:
    from engine.tasks.image_shards import ImageExamples

log = logging.getLogger(__name__)
HEAD: Head = "image-classification"
TORCHVISION = "torchvision:"
# torchvision builders that take ``num_classes`` and download nothing with ``weights=None``.
TORCHVISION_MODELS = frozenset({"resnet18", "resnet34", "resnet50", "mobilenet_v3_small",
                                "mobilenet_v3_large", "convnext_tiny", "efficientnet_b0"})
# What a project may set of each one's regularisation (a probability; torchvision's default
# otherwise). Dropped units are drawn from each peer's own random stream: at 0, the
# collaboration's steps are those of one machine on the global batch, to the last bits' noise.
TORCHVISION_OPTIONS = {"convnext_tiny": ("stochastic_depth_prob",),
                       "efficientnet_b0": ("dropout", "stochastic_depth_prob"),
                       "mobilenet_v3_small": ("dropout",), "mobilenet_v3_large": ("dropout",)}
Augmentation = Literal["random_crop", "horizontal_flip", "rotate"]
# Applied in this order whatever order the project lists them in.
AUGMENTATIONS: tuple[Augmentation, ...] = ("random_crop", "horizontal_flip", "rotate")
CROP_PADDING = 8  # random_crop pads by 1/8 of the side and crops back, as in the CIFAR recipe
MAX_DEGREES = 15.0  # rotate turns each image by up to this much either way
# Activations a sample keeps for backward, in fp32 values per input pixel, where they cannot be
# counted: more than ResNet-50 or ConvNeXt keep (430, 1060), less than ViT (2570).
ACTIVATIONS_PER_PIXEL = 2048
SHARDS_IN_MEMORY = 2
# The fewest tar bytes an image takes in a shard: its member and its label's, each a header
# and a block of 512 bytes.
TAR_BYTES_PER_IMAGE = 2048
Size = Annotated[int, Meta(ge=1, le=4096)]
Channels = Annotated[list[float], Meta(min_length=1, max_length=3)]
Scales = Annotated[list[Annotated[float, Meta(gt=0)]], Meta(min_length=1, max_length=3)]


class ImageClassificationParams(Struct, kw_only=True, forbid_unknown_fields=True):
    architecture: Name  # a transformers model type, or torchvision:<name>
    config: ParamTable = field(default_factory=dict)
    num_classes: Annotated[int, Meta(ge=2, le=65536)]
    image_size: Annotated[int, Meta(ge=8, le=1024)] = 224  # square, in pixels
    channels: Literal[1, 3] = 3
    micro_batch: Size = 32
    per_visit: Annotated[int, Meta(ge=1, le=10**6)] = 32  # micro-batches from a shard before the next
    augmentations: Annotated[list[Augmentation], Meta(max_length=3)] = field(default_factory=list)
    # Per channel, of pixels scaled to [0, 1]: inputs are (pixel - mean) / std.
    mean: Channels | None = None
    std: Scales | None = None


def torchvision_models(architecture: str) -> ModuleType:
    """``torchvision.models``; a ModelError that says how to get it when it does not load."""
    try:
        return importlib.import_module("torchvision.models")
    except (ImportError, RuntimeError, OSError, AttributeError) as exc:
        raise ModelError(f"{architecture} needs torchvision, which does not load beside this torch "
                         f"{torch.__version__} ({exc}). {_torchvision_hint()}, or name a transformers "
                         "architecture instead, such as 'resnet'.") from None


def _torchvision_hint() -> str:
    """torchvision is built against one torch release: 0.(N+15) goes with torch 2.N."""
    version, _, local = torch.__version__.partition("+")
    major, minor = (int(part) for part in version.split(".")[:2])
    if major != 2:
        return "Install the torchvision release built for this torch"
    index = f" --index-url https://download.pytorch.org/whl/{local}" if local else ""
    return (f"Install the torchvision release built for this torch, from where torch came "
            f"(pip install 'torchvision==0.{minor + 15}.*'{index})")


def _transformers_config(p: ImageClassificationParams):
    """The model's configuration, its labels, channels and size the project's own."""
    config = dict(p.config)
    given = {"num_labels": ("num_classes", p.num_classes), "num_channels": ("channels", p.channels),
             "image_size": ("image_size", p.image_size)}
    for key, (name, value) in given.items():
        if key in config and config[key] != value:
            raise ModelError(f"config.{key} is {config[key]} but the project's {name} is {value}: "
                             f"set {name} alone")
    cfg = model_config(HEAD, p.architecture, {**config, "num_labels": p.num_classes})
    for key in ("num_channels", "image_size"):
        if isinstance(getattr(cfg, key, None), int):
            setattr(cfg, key, given[key][1])
    return cfg


def augment(pixels: torch.Tensor, names: list[Augmentation], seed: int, index: int) -> torch.Tensor:
    """Each augmentation draws from its own generator, so adding one leaves the others' draws."""
    for name in AUGMENTATIONS:
        if name in names:
            pixels = _AUGMENT[name](pixels, generator("augment", name, seed, index))
    return pixels


def random_crop(pixels: torch.Tensor, rng: torch.Generator) -> torch.Tensor:
    side = pixels.shape[-1]
    pad = max(1, side // CROP_PADDING)
    padded = F.pad(pixels, (pad, pad, pad, pad))
    offsets = torch.randint(0, 2 * pad + 1, (pixels.shape[0], 2), generator=rng).tolist()
    return torch.stack([padded[i, :, y:y + side, x:x + side] for i, (y, x) in enumerate(offsets)])


def horizontal_flip(pixels: torch.Tensor, rng: torch.Generator) -> torch.Tensor:
    flip = torch.rand(pixels.shape[0], generator=rng) < 0.5
    return torch.where(flip[:, None, None, None], pixels.flip(-1), pixels)


def rotate(pixels: torch.Tensor, rng: torch.Generator) -> torch.Tensor:
    angles = (torch.rand(pixels.shape[0], generator=rng) * 2 - 1) * math.radians(MAX_DEGREES)
    cos, sin, zero = angles.cos(), angles.sin(), torch.zeros_like(angles)
    theta = torch.stack([torch.stack([cos, -sin, zero], 1), torch.stack([sin, cos, zero], 1)], 1)
    grid = F.affine_grid(theta, list(pixels.shape), align_corners=False)
    return F.grid_sample(pixels, grid, mode="bilinear", padding_mode="zeros", align_corners=False)


_AUGMENT = {"random_crop": random_crop, "horizontal_flip": horizontal_flip, "rotate": rotate}


class ImageClassification(Task):
    name = "image-classification"

    def __init__(self, params: ImageClassificationParams, cfg: Any, data: TaskData) -> None:
        self.params = params
        self.cfg = cfg  # transformers' configuration; None for a torchvision architecture
        self.data = data
        self._shards: OrderedDict[str, ImageExamples] = OrderedDict()
        self._mean = self._per_channel(params.mean, 0.0)
        self._std = self._per_channel(params.std, 1.0)
        self._saved: int | None = None

    @classmethod
    def create(cls, params: dict, data: TaskData) -> ImageClassification:
        p = convert(params, ImageClassificationParams, f"{cls.name} parameters")
        for name in ("mean", "std"):
            values = getattr(p, name)
            if values is not None and len(values) != p.channels:
                raise ModelError(f"{name} has {len(values)} values; the images have {p.channels} channels")
        if not p.architecture.startswith(TORCHVISION):
            return cls(p, _transformers_config(p), data)
        name = p.architecture.removeprefix(TORCHVISION)
        if name not in TORCHVISION_MODELS:
            raise ModelError(f"{p.architecture} is not a torchvision architecture this Cotrain builds "
                             f"(it builds {', '.join(sorted(TORCHVISION_MODELS))})")
        _check_torchvision_options(name, p.config)
        torchvision_models(p.architecture)
        return cls(p, None, data)

    def channel_values(self, values: list[float] | None, default: float) -> list[float]:
        return list(values or [default] * self.params.channels)

    def _per_channel(self, values: list[float] | None, default: float) -> torch.Tensor:
        return torch.tensor(self.channel_values(values, default)).view(-1, 1, 1)

    def _torchvision_model(self) -> nn.Module:
        p = self.params
        builder = getattr(torchvision_models(p.architecture), p.architecture.removeprefix(TORCHVISION))
        return builder(weights=None, num_classes=p.num_classes, **p.config)

    def plain_model(self) -> nn.Module:
        """The network as its library builds it (batch norm with running statistics): what
        an exported model is."""
        return self._torchvision_model() if self.cfg is None else build_model(HEAD, self.cfg)

    def build_model(self) -> nn.Module:
        return batch_statistics(self.plain_model())

    def parameters(self) -> int:
        if self.cfg is not None:
            return count_parameters(HEAD, self.cfg)
        with torch.device("meta"):
            return sum(t.numel() for t in self._torchvision_model().parameters())

    def memory_needed(self) -> int:
        """Bytes a peer needs: the model's training state, a micro-batch's activations (twice
        what autograd keeps, for what backward holds at its peak) and its decoded shards."""
        p = self.params
        return (training_memory(self.parameters()) + 2 * p.micro_batch * self._saved_per_sample()
                + self._decoded_shards())

    def _decoded_shards(self) -> int:
        """The pixels of the shards a peer keeps decoded, and of the next while it decodes:
        the largest in the manifest, by their image counts (one without a count, as many as
        its tar could hold)."""
        spec, p = self.data.spec, self.params
        if spec is None:
            return 0
        refs = [*spec.shards, *spec.heldout]
        counts = sorted((ref.examples or ref.bytes // TAR_BYTES_PER_IMAGE for ref in refs), reverse=True)
        return sum(counts[:SHARDS_IN_MEMORY + 1]) * p.channels * p.image_size * p.image_size

    def _saved_per_sample(self) -> int:
        """Bytes autograd keeps for backward per sample, counted in a forward pass on the meta
        device (nothing allocated or computed); a bound per pixel where that does not run."""
        if self._saved is not None:
            return self._saved
        p = self.params
        try:
            with torch.device("meta"):
                model = self._torchvision_model() if self.cfg is None else model_class(HEAD, self.cfg)(
                    self.cfg)
                batch = Batch(0, 0, {"pixel_values": torch.empty(2, p.channels, p.image_size, p.image_size)})
            self._saved = saved_bytes(model, lambda m: self.logits(m, batch)) // 2
        except Exception as exc:  # (a model's code may object in its own way: the bound below stands)
            log.debug("counting %s's activations on the meta device failed (%s)", p.architecture, exc)
            self._saved = 4 * ACTIVATIONS_PER_PIXEL * p.image_size * p.image_size
        return self._saved

    # -- data ------------------------------------------------------------------------------

    def _data(self):
        spec, files = self.data.spec, self.data.files
        if spec is None or files is None:
            raise ModelError(f"{self.name} trains on a project's data: this project has none")
        return spec, files

    def _examples(self, ref: FileRef) -> ImageExamples:
        """A shard's images, decoded once and kept for the next visits."""
        from engine.tasks.image_shards import read_image_shard  # Pillow, only when images are read

        cached = self._shards.get(ref.sha256)
        if cached is not None:
            self._shards.move_to_end(ref.sha256)
            return cached
        _, files = self._data()
        p = self.params
        path = files.local(ref)
        try:
            made = read_image_shard(path, p.num_classes, p.image_size, p.channels, ref.examples)
        except OSError as exc:
            raise FileError(f"cannot read {ref.path}: {exc}") from None
        self._shards[ref.sha256] = made
        while len(self._shards) > SHARDS_IN_MEMORY:
            self._shards.popitem(last=False)
        return made

    def _inputs(self, images: torch.Tensor, labels: torch.Tensor, seed: int | None = None,
                index: int = 0) -> dict[str, torch.Tensor]:
        pixels = images.float() / 255
        if seed is not None:
            pixels = augment(pixels, self.params.augmentations, seed, index)
        return {"pixel_values": (pixels - self._mean) / self._std, "labels": labels}

    def batch(self, seed: int, index: int) -> Batch:
        spec, files = self._data()
        p = self.params
        shard, draw = draw_shard(seed, index, spec.shards, p.per_visit, files)
        made = self._examples(shard)
        images, labels = made.take(examples(seed, draw, len(made), p.micro_batch))
        return Batch(seed, index, self._inputs(images, labels, seed, index))

    def heldout(self) -> Iterator[Batch]:
        """The held-out shards in order, unaugmented, in micro-batches."""
        spec, _ = self._data()
        size = self.params.micro_batch
        for number, ref in enumerate(spec.heldout):
            made = self._examples(ref)
            for start in range(0, len(made), size):
                images, labels = made.take(torch.arange(start, min(start + size, len(made))))
                yield Batch(-1 - number, start // size, self._inputs(images, labels))

    # -- model -----------------------------------------------------------------------------

    def logits(self, model: nn.Module, batch: Batch) -> torch.Tensor:
        pixels = batch.tensors["pixel_values"]
        if self.cfg is not None:
            return model(pixel_values=pixels).logits
        # torchvision's networks take RGB: a grey image is the same in all three channels.
        out = model(pixels.expand(-1, 3, -1, -1) if pixels.shape[1] == 1 else pixels)
        return out if isinstance(out, torch.Tensor) else out.logits

    def loss(self, model: nn.Module, batch: Batch) -> torch.Tensor:
        return F.cross_entropy(self.logits(model, batch).float(), batch.tensors["labels"])

    def metrics(self, model: nn.Module, batch: Batch) -> dict[str, float]:
        with torch.no_grad():
            logits = self.logits(model, batch).float()
        labels = batch.tensors["labels"]
        return {"loss": float(F.cross_entropy(logits, labels, reduction="sum")),
                "accuracy": float((logits.argmax(-1) == labels).sum())}


def _check_torchvision_options(name: str, config: dict) -> None:
    """ModelError unless ``config`` sets only the regularisation ``name`` has, to a
    probability: torchvision's builders take any keyword, some of them code (a block class)."""
    allowed = TORCHVISION_OPTIONS.get(name, ())
    for key, value in config.items():
        if key not in allowed:
            takes = f"takes only {', '.join(allowed)}" if allowed else "takes no config"
            raise ModelError(f"torchvision:{name} {takes} (config.{key}): torchvision builds it from "
                             "num_classes")
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < 1:
            raise ModelError(f"config.{key} is a probability in [0, 1), not {value!r}")


# The running statistics batch norm keeps, which a collaboration's networks hold none of.
BATCH_NORM_STATS = ("running_mean", "running_var", "num_batches_tracked")


def batch_statistics(model: nn.Module) -> nn.Module:
    """Batch norm layers normalize by each batch's own statistics, in training and evaluation
    alike. Running statistics would be each peer's own (a peer sees only its micro-batches),
    so peers would hold different states after every step; without them every peer applies
    the same bits, as the collaboration requires."""
    for module in model.modules():
        if isinstance(module, nn.modules.batchnorm._BatchNorm) and module.track_running_stats:
            module.track_running_stats = False
            module.running_mean = module.running_var = module.num_batches_tracked = None
    return model
