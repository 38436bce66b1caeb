"""A project: what a collaboration trains and how (shared by backbone and peers).

The backbone reads projects from its catalog file and hands them to peers at join; peers
build the task, the optimizer and the schedule from them. Torch-free, like the backbone.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal

from msgspec import Meta, Struct, field

from engine.shards.webdataset import MAX_MEMBERS
from engine.wire import ProtocolError
from engine.wire.codec import convert, decode_json
from engine.wire.types import Name, ProjectId, Sha256, Text

OptimizerName = Literal["sgd", "adam", "adamw", "lamb"]
ScheduleType = Literal["constant", "linear", "cosine"]
AggregationMethod = Literal["mean", "centered_clip"]
# How a round's gradient travels: blockwise codecs of parts and results
# (engine/averaging/compression.py), or PowerSGD (engine/averaging/powersgd.py: two
# all-reduce phases of rank-r factors, which travel as fp32).
CompressionMethod = Literal["none", "fp16", "uint8", "powersgd"]
# What parts and results are encoded with on the wire.
Codec = Literal["none", "fp16", "uint8"]
# sync: one averaged gradient per global batch (DeDLOC). local: local updates with DiLoCo
# outer steps, for links too slow to move a gradient per batch.
ProjectMode = Literal["sync", "local"]
Fraction = Annotated[float, Meta(ge=0, lt=1)]
# A task's parameters: names to numbers, flags, short strings, short lists of them, and
# one level of such tables (a model's configuration). Each task family reads them with its
# own schema (engine/tasks/).
Scalar = int | float | bool | Name | None
Values = Annotated[list[int | float | Name], Meta(max_length=64)]
ParamTable = Annotated[dict[Name, Scalar | Values], Meta(max_length=128)]
TaskParams = Annotated[dict[Name, Scalar | Values | ParamTable], Meta(max_length=64)]
Precision = Literal["fp32", "bf16", "fp16"]
MAX_FILE_BYTES = 2**40
# A project's files are listed, hashed and sized in its manifest; the join reply carries it.
MAX_SHARDS = 4096
# A file's place: a path inside the project's folder on its backbone, or an http(s) URL.
FilePlace = Annotated[str, Meta(min_length=1, max_length=1024, pattern=r"^(https?://\S+|[A-Za-z0-9_.-][A-Za-z0-9_./-]*)$")]


class FileRef(Struct, frozen=True, omit_defaults=True):
    """One file a peer fetches and checks before using it."""

    path: FilePlace
    sha256: Sha256
    bytes: Annotated[int, Meta(ge=1, le=MAX_FILE_BYTES)]
    # An image shard's image count, written by `cotrain project shard`: a peer sizes the
    # memory its decoded shards take from it before downloading, and refuses a shard that
    # holds more.
    examples: Annotated[int, Meta(ge=1, le=MAX_MEMBERS)] | None = None

    def __post_init__(self) -> None:
        if not self.path.startswith(("http://", "https://")) and (
                ".." in self.path.split("/") or self.path.endswith("/")):
            raise ValueError(f"file {self.path!r} leaves the project's folder")


class ProjectNeeds(Struct, kw_only=True):
    """What one peer needs for the model, as `cotrain project check` measured it: shown before
    Join (each peer still checks its own limits itself)."""

    parameters: Annotated[int, Meta(ge=0, le=10**13)]
    memory_mb: Annotated[int, Meta(ge=0, le=10**9)]


class DataSpec(Struct, kw_only=True):
    """What a project trains on: shards each peer draws in its own seeded order, a held-out
    set every peer scores the same way, the tokenizer (for text families), and the weights
    its model starts from, if not its seed's."""

    shards: Annotated[list[FileRef], Meta(min_length=1, max_length=MAX_SHARDS)]
    heldout: Annotated[list[FileRef], Meta(max_length=64)] = field(default_factory=list)
    tokenizer: FileRef | None = None
    # The model's starting weights, a safetensors file (engine/tasks/initial_weights.py).
    initial_weights: FileRef | None = None

    def files(self) -> list[FileRef]:
        return [*self.shards, *self.heldout, *(ref for ref in (self.tokenizer, self.initial_weights) if ref)]

    def total_bytes(self) -> int:
        return sum(f.bytes for f in self.files())


class OptimizerSpec(Struct, kw_only=True):
    name: OptimizerName = "adamw"
    lr: Annotated[float, Meta(gt=0, lt=10)] = 1e-3
    weight_decay: Annotated[float, Meta(ge=0, le=10)] = 0.01
    betas: Annotated[list[Fraction], Meta(min_length=2, max_length=2)] = field(
        default_factory=lambda: [0.9, 0.999])
    eps: Annotated[float, Meta(gt=0, le=1)] = 1e-8
    momentum: Fraction = 0.0
    clip_grad_norm: Annotated[float, Meta(gt=0, le=1e6)] | None = 1.0
    # False: biases and normalization weights (every 1-D parameter) take no weight decay, as
    # in BERT's and sahajBERT's recipes.
    decay_norms_and_biases: bool = True

    @property
    def norms_and_biases_apart(self) -> bool:
        """Whether the 1-D parameters form a group of their own (no weight decay): a state's
        slots follow the groups, so every peer, and the backbone's check of an edit, must agree."""
        return not (self.decay_norms_and_biases or self.weight_decay == 0)


class ScheduleSpec(Struct, kw_only=True):
    """Linear warm-up over ``warmup_epochs``, then constant, linear or cosine decay to
    ``min_ratio`` of the base LR at ``total_epochs``."""

    type: ScheduleType = "linear"
    warmup_epochs: Annotated[int, Meta(ge=0, le=10**9)] = 0
    total_epochs: Annotated[int, Meta(ge=1, le=10**9)] = 1000
    min_ratio: Annotated[float, Meta(ge=0, le=1)] = 0.1


class AggregationSpec(Struct, kw_only=True):
    """How a reducer combines the parts it receives (see engine/averaging/robust.py)."""

    method: AggregationMethod = "mean"
    # A sender's claimed samples weigh at most this share of the target batch (None: as many
    # as it claims). An honest peer that brings more then weighs less than its samples and
    # the step is no longer exactly the large batch's: for projects open to strangers.
    max_sample_share: Annotated[float, Meta(gt=0, le=100)] | None = None
    # A part whose per-sample gradient is longer than this many times the round's median is left out.
    max_norm_ratio: Annotated[float, Meta(gt=1, le=1e6)] = 10.0
    # centered_clip: the radius, in median distances from the estimate, and the iterations.
    clip_radius: Annotated[float, Meta(gt=0, le=100)] = 1.0
    clip_iterations: Annotated[int, Meta(ge=1, le=100)] = 10
    # Each reducer's part of a round is checked by another member with this probability
    # (engine/averaging/recheck.py): that part's inputs travel once more, to the checker.
    verify_probability: Annotated[float, Meta(ge=0, le=1)] = 0.0


class PowerSGDSpec(Struct, kw_only=True):
    """``compression: powersgd``: each parameter of two or more dimensions travels as rank
    ``rank`` factors where that is smaller (Vogels et al. 2019, with error feedback)."""

    rank: Annotated[int, Meta(ge=1, le=64)] = 4


_CODECS: dict[str, Codec] = {"none": "none", "fp16": "fp16", "uint8": "uint8", "powersgd": "none"}


def codec_of(method: CompressionMethod) -> Codec:
    """How parts and results are encoded: PowerSGD's factors travel as fp32 (a lossy codec
    on top would leave its error outside the error feedback)."""
    return _CODECS[method]


class LocalSpec(Struct, kw_only=True):
    """The ``local`` mode (DiLoCo, Douillard et al. 2023): each peer steps its own copy with
    the project's optimizer (the inner one) every ``inner_batch_size`` samples; once the
    collaboration's samples since the last outer step reach ``target_batch_size``, the
    members average their pseudo-gradients (global minus local parameters, weighted by
    samples) and all take the same outer step: SGD with (Nesterov) momentum."""

    inner_batch_size: Annotated[int, Meta(ge=1, le=10**6)] = 32  # samples per inner step, per peer
    outer_lr: Annotated[float, Meta(gt=0, le=10)] = 0.7
    outer_momentum: Fraction = 0.9
    nesterov: bool = True


class ProjectSpec(Struct, kw_only=True):
    id: ProjectId
    title: Annotated[str, Meta(min_length=1, max_length=200)]
    task: Name
    description: Text = ""
    task_params: TaskParams = field(default_factory=dict)
    data: DataSpec | None = None
    # Autocast for the forward and backward passes; gradients, averaging and the step stay fp32.
    precision: Precision = "fp32"
    needs: ProjectNeeds | None = None
    # The collaboration's samples per step: per averaged gradient in ``sync`` mode, per
    # outer step in ``local`` mode.
    target_batch_size: Annotated[int, Meta(ge=1, le=10**9)] = 128
    mode: ProjectMode = "sync"
    # Peers go on computing while a round averages and steps: the next gradient is computed
    # on the state before that step (one step stale, as hivemind's delayed updates), so the
    # round's time hides behind compute. Sync mode only.
    overlap: bool = False
    local: LocalSpec = field(default_factory=LocalSpec)
    optimizer: OptimizerSpec = field(default_factory=OptimizerSpec)
    compression: CompressionMethod = "none"
    powersgd: PowerSGDSpec = field(default_factory=PowerSGDSpec)  # read with compression: powersgd
    schedule: ScheduleSpec = field(default_factory=ScheduleSpec)
    seed: Annotated[int, Meta(ge=0, le=2**63 - 1)] = 0
    round_timeout: Annotated[float, Meta(ge=1, le=3600)] = 60.0
    checkpoint_every: Annotated[int, Meta(ge=1, le=10**6)] = 5
    # The held-out set is scored every this many steps, by about three peers (its data.heldout).
    evaluate_every: Annotated[int, Meta(ge=1, le=10**6)] = 10
    keep_checkpoints: Annotated[int, Meta(ge=1, le=100)] = 3
    aggregation: AggregationSpec = field(default_factory=AggregationSpec)
    # Only peers logged in to an account may join: no free identities (see SECURITY.md).
    require_account: bool = False
    # Rounds of more members run in groups of about this many (engine/averaging/grouped.py):
    # a member links to its group and its slot's reducers, not to every reducer. None: flat.
    group_size: Annotated[int, Meta(ge=2, le=1000)] | None = None

    def __post_init__(self) -> None:
        if self.overlap and self.mode == "local":
            raise ValueError("overlap applies to sync rounds: in local mode peers already train "
                             "between rounds, on their own copy")


class Catalog(Struct):
    projects: Annotated[list[ProjectSpec], Meta(max_length=1000)]

    def __post_init__(self) -> None:
        ids = [p.id for p in self.projects]
        if len(set(ids)) != len(ids):
            raise ValueError("the catalog lists a project id twice")


MAX_CATALOG = 16 * 1024 * 1024


def load_catalog(path: str | Path) -> list[ProjectSpec]:
    """Projects from a JSON file ``{"projects": [...]}``; raises ValueError naming the problem."""
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise ValueError(f"cannot read catalog {path}: {exc}") from None
    try:
        return convert(_renamed(decode_json(data, "catalog", MAX_CATALOG)), Catalog, "catalog").projects
    except ProtocolError as exc:
        raise ValueError(f"catalog {path}: {exc}") from None


def _renamed(catalog: Any) -> Any:
    """Catalogs written for Cotrain 0.1 said ``allow_anonymous``: the opposite of
    ``require_account``."""
    projects = catalog.get("projects") if isinstance(catalog, dict) else None
    for project in projects if isinstance(projects, list) else []:
        if isinstance(project, dict) and isinstance(project.get("allow_anonymous"), bool):
            project.setdefault("require_account", not project.pop("allow_anonymous"))
    return catalog
