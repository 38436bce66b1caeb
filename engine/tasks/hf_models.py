"""Models that transformers builds from a configuration alone, from the installed library.

A project names a ``model_type`` and its configuration; the allow-list is what the installed
transformers registers for the task's head. Nothing is downloaded and no project code runs:
``trust_remote_code`` and ``auto_map`` are refused, as is anything that would name a file.
The model's size is known on the meta device before a byte of it is allocated.
"""

from __future__ import annotations

import contextlib
import difflib
import functools
import importlib.util
import logging
import threading
from collections.abc import Iterator
from typing import Literal

import torch
from torch import nn

log = logging.getLogger(__name__)
Head = Literal["masked-lm", "causal-lm", "pretraining", "image-classification"]
# Keys of a configuration that would load code or files, or that are transformers' own.
REFUSED_KEYS = {"trust_remote_code", "auto_map", "name_or_path", "_name_or_path", "transformers_version",
                "quantization_config", "pretrained_model_name_or_path", "custom_pipelines"}
MAX_PARAMETERS = 20 * 10**9
# transformers' own attention code. Any other name (a "kernels-community/..." repository) is
# code that transformers would fetch from a model hub.
ATTENTION = ("eager", "sdpa")
# The largest models have a few thousand modules; a configuration that asks for far more
# (ALBERT's num_hidden_groups: 100000) would take minutes to build even on the meta device.
MAX_MODULES = 5_000
# A model's declared depth: weight-shared models (ALBERT) run any depth with few parameters.
MAX_LAYERS = 1_000


class ModelError(ValueError):
    pass


@functools.cache
def _classes(head: Head) -> dict[str, str]:
    """Model type -> the transformers class with this head, as the installed library lists them."""
    from transformers.models.auto import modeling_auto as auto

    heads: dict[str, dict[str, str]] = {
        "masked-lm": dict(auto.MODEL_FOR_MASKED_LM_MAPPING_NAMES),
        "causal-lm": dict(auto.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES),
        "pretraining": {"albert": "AlbertForPreTraining"},  # ALBERT's masked LM with sentence order
        # Some image models list several classes (with and without a teacher): the first is the plain one.
        "image-classification": {t: c if isinstance(c, str) else c[0]
                                 for t, c in auto.MODEL_FOR_IMAGE_CLASSIFICATION_MAPPING_NAMES.items()},
    }
    classes = heads[head]
    # timm_wrapper fetches its model from the Hub; a packaged app carries some families only.
    return {t: c for t, c in classes.items() if t != "timm_wrapper" and _installed(t)}


def _installed(model_type: str) -> bool:
    from transformers.models.auto.configuration_auto import model_type_to_module_name

    try:
        module = f"transformers.models.{model_type_to_module_name(model_type)}"
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def allowed_model_types(head: Head) -> set[str]:
    return set(_classes(head))


def model_config(head: Head, model_type: str, config: dict):
    """transformers' configuration object for the project's model; ModelError says what is wrong."""
    allowed = allowed_model_types(head)
    if model_type not in allowed:
        raise ModelError(f"model type {model_type!r} is not one this Cotrain builds for a {head} "
                         f"task (it builds {len(allowed)}: {', '.join(sorted(allowed)[:12])}, ...)")
    refused = sorted(k for k in config if k in REFUSED_KEYS or k.startswith("_"))
    if refused:
        raise ModelError(f"the model's configuration asks for {', '.join(refused)}: a project sends data, "
                         "never code, and Cotrain runs only the model code it ships")
    unknown = sorted(k for k in config if k not in _settings(model_type))
    if unknown:
        raise ModelError(f"a {model_type!r} model has no setting {_named(unknown, _settings(model_type))}: "
                         "transformers would ignore it and train another model than meant")
    attention = config.get("attn_implementation", ATTENTION[0])
    if attention not in ATTENTION:
        raise ModelError(f"the model's configuration asks for attn_implementation {attention!r}: Cotrain "
                         f"runs transformers' own ({' or '.join(ATTENTION)}), never code from a model hub")
    from transformers import AutoConfig

    try:
        return AutoConfig.for_model(model_type, **config)
    except Exception as exc:  # (configurations validate with exceptions of their own: huggingface_hub's
        # StrictDataclassFieldValidationError for a value of the wrong type, say)
        raise ModelError(f"transformers cannot configure a {model_type!r} model from the project: "
                         f"{exc}") from None


@functools.cache
def _settings(model_type: str) -> frozenset[str]:
    """The keys a configuration of this model type takes: its fields and their aliases, and
    what every configuration takes besides (the attention code, the number of labels)."""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    kind = CONFIG_MAPPING[model_type]
    return frozenset(kind().to_dict()) | frozenset(kind.attribute_map) | {"attn_implementation", "num_labels"}


def _named(keys: list[str], known: frozenset[str]) -> str:
    """The keys, each with the setting it most likely misspells."""
    def one(key: str) -> str:
        close = difflib.get_close_matches(key, sorted(known), n=1)
        return f"{key!r} (did you mean {close[0]!r}?)" if close else repr(key)
    return ", ".join(one(key) for key in keys)


def failed_on_a_batch(exc: Exception) -> str:
    """What to tell the volunteer (or the project's author) when a model that was built fails
    on a batch: out of memory is this computer's limit, anything else the project's."""
    what = f"{type(exc).__name__}: {exc}"
    if isinstance(exc, (MemoryError, torch.OutOfMemoryError)) or "can't allocate memory" in str(exc):
        return f"the project's model ran out of this computer's memory on one batch: {what}"
    return f"the project's model fails on a batch of its own data: {what}"


def model_class(head: Head, cfg) -> type[nn.Module]:
    import transformers

    return getattr(transformers, _classes(head)[cfg.model_type])


class _ModuleCount(threading.local):
    built: int | None = None


_counting = _ModuleCount()


def _count_module(parent: nn.Module, name: str, module: nn.Module | None) -> None:
    if _counting.built is None:
        return
    _counting.built += 1
    if _counting.built > MAX_MODULES:
        raise ModelError(f"configuration builds more than {MAX_MODULES:,} modules (the largest "
                         "models have a few thousand)")


torch.nn.modules.module.register_module_module_registration_hook(_count_module)


@contextlib.contextmanager
def bounded_modules() -> Iterator[None]:
    """Stop a build in this thread past MAX_MODULES (other threads' builds are not counted)."""
    outer, _counting.built = _counting.built, 0
    try:
        yield
    finally:
        _counting.built = outer


def count_parameters(head: Head, cfg) -> int:
    """The model's parameters, counted on the meta device (nothing allocated)."""
    try:
        with torch.device("meta"), bounded_modules():
            model = model_class(head, cfg)(cfg)
    except ModelError as exc:
        raise ModelError(f"this {cfg.model_type!r} model's {exc}") from None
    except Exception as exc:  # (a model's code checks a configuration as it goes: a head count of
        # 0 is a ZeroDivisionError, a size of -3 a RuntimeError)
        raise ModelError(f"transformers cannot build this {cfg.model_type!r} model: "
                         f"{type(exc).__name__}: {exc}") from None
    return sum(p.numel() for p in model.parameters())


def build_model(head: Head, cfg) -> nn.Module:
    count = count_parameters(head, cfg)
    if count > MAX_PARAMETERS:
        raise ModelError(f"the model has {count:,} parameters; Cotrain trains at most {MAX_PARAMETERS:,}")
    return model_class(head, cfg)(cfg)


def structure(cfg) -> tuple[int, int]:
    """The model's width and depth as its configuration declares them (a default where it names
    neither), refused where no model could have them."""
    sizes = []
    for names, bound, default in ((("hidden_size", "n_embd", "d_model"), None, 768),
                                  (("num_hidden_layers", "n_layer", "num_layers"), MAX_LAYERS, 12),
                                  (("vocab_size",), None, 1)):
        key = next((k for k in names if isinstance(getattr(cfg, k, None), int)), None)
        size = default if key is None else getattr(cfg, key)
        if size < 1 or (bound is not None and size > bound):
            limit = "at least 1" if bound is None else f"from 1 to {bound:,}"
            raise ModelError(f"the model's {key} is {size}: it must be {limit}")
        sizes.append(size)
    return sizes[0], sizes[1]


def training_memory(parameters: int, optimizer_states: int = 2) -> int:
    """Bytes a peer holds for the model besides activations: fp32 parameters, gradients, the
    accumulated gradient and the optimizer's states."""
    return 4 * parameters * (3 + optimizer_states)
