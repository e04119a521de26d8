"""Our models initialised from explicit Hugging Face checkpoints (Mamba2, Llama, Mamba1).

``from_hf_mamba2`` / ``from_hf_llama`` / ``from_hf_mamba`` take a ``transformers`` model
or a checkpoint directory (read from safetensors only, never unpickled), map its config
onto ours, refuse the settings we do not implement, and copy every weight. ``from_hf``
picks the family from the directory's config.json.

Explicit (``implicit=False``): the same function as the source model.

Implicit (``implicit=True``): the backbone gets the explicit weights (through the
weight-norm parametrisation, so the effective weights equal them) and the injection is
chosen so that the FIRST iteration from z = 0 reproduces the explicit model as far as
the design allows. Explicit block 1 reads ``proj_1(norm_1(e))``, e = embed(x), where
proj_1 is a Mamba mixer's in_proj or Llama's q/k/v projections. Implicit iteration 1
starts at z = 0, so norm_1(z) = 0 and block 1's mixer reads the injection alone; we set

    injection_norm.weight = norm_1.weight,    injection.weight = proj_1.weight

so that ``u = proj_1(norm_1(e))`` and block 1's mixer (Mamba mixer, attention) computes
exactly its explicit output. Beyond it iteration 1 differs from the explicit model, as the
design has it: the residual stream starts at 0 rather than at e (Llama's first MLP reads
norm(a_1) instead of norm(e + a_1), block 2 reads h_1 - e instead of h_1), and u is added
in every block, not only the first. u keeps the scale that makes block 1 exact.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any, Callable

import torch
from torch import nn
from torch.nn.utils import parametrize
from transformers import PreTrainedModel

from ..core.errors import ArgumentTypeError, first_line
from ..core.file_digests import FILES_DIGEST
from ..core.memory import FLOAT_BYTES, require
from ..core.targets import FolderKind
from .families import BY_ARCHITECTURE, BY_SOURCE_MODEL_TYPE, Family
from .implicit_lm import ImplicitCausalLM
from .loading import ModelLoadError, build_model, config_from_options, config_values, load_checked_folder

# The folder of a saved model (``models import``, ``solver train``): its config and weights with
# their digests, the tokenizer beside them, and what a checkpoint copied from a run keeps
# (training settings, model card, a learned solver's record). A config.json of its own marks
# it; not a run folder's link to its latest checkpoint nor its copy (core.run_folder: a run's
# entries), nor a run's checkpoint itself, whose training state belongs to the run.
MODEL_FOLDER = FolderKind(
    "a saved model", marks=("config.json",), foreign=("checkpoints", "metrics.jsonl", "training_state.pt"), entries=(
        "config.json", "generation_config.json", "*.safetensors", "*.safetensors.sha256", "*.safetensors.index.json",
        "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json",
        "chat_template.jinja", "trainer.json", "README.md", "learned_solver.json", FILES_DIGEST,
    ),
)

# A tied head is the embedding matrix itself in our models, an untied one our own lm_head.
HEAD = "lm_head.weight"

HFSource = PreTrainedModel | str | Path


def from_hf(path: str | Path, implicit: bool = False, **option_overrides: Any) -> ImplicitCausalLM:
    """A model from a transformers checkpoint directory of a family's source model (``families.FAMILIES``)."""
    model_type = config_values(Path(path)).get("model_type")
    if model_type not in BY_SOURCE_MODEL_TYPE:
        names = [family.source_class.__name__.removesuffix("ForCausalLM") for family in BY_SOURCE_MODEL_TYPE.values()]
        supported = f"{', '.join(names[:-1])} and {names[-1]}"
        raise ModelLoadError(f"{path}: model_type {model_type!r} is not supported; only {supported} are")
    return from_source(BY_SOURCE_MODEL_TYPE[model_type], path, implicit, **option_overrides)


def from_source(family: Family, source: HFSource, implicit: bool = False, **option_overrides: Any) -> ImplicitCausalLM:
    """``family``'s model from a model of its ``source_class`` or its checkpoint directory.

    ``option_overrides``: further model options (e.g. ``fixed_point``, ``chunk_size``).
    """
    hf, options = _hf_model(source, family)
    return _convert(hf, {**options, "architecture": family.architecture}, family.source_prefixes, implicit,
                    option_overrides)


def from_hf_mamba2(source: HFSource, implicit: bool = False, **option_overrides: Any) -> ImplicitCausalLM:
    """Our Mamba2 model from a ``Mamba2ForCausalLM`` or its checkpoint directory."""
    return from_source(BY_ARCHITECTURE["mamba2"], source, implicit, **option_overrides)


def from_hf_llama(source: HFSource, implicit: bool = False, **option_overrides: Any) -> ImplicitCausalLM:
    """Our Llama model from a ``LlamaForCausalLM`` or its checkpoint directory."""
    return from_source(BY_ARCHITECTURE["llama"], source, implicit, **option_overrides)


def from_hf_mamba(source: HFSource, implicit: bool = False, **option_overrides: Any) -> ImplicitCausalLM:
    """Our Mamba1 model from a ``MambaForCausalLM`` or its checkpoint directory."""
    return from_source(BY_ARCHITECTURE["mamba"], source, implicit, **option_overrides)


def initialise_from(model: ImplicitCausalLM, source: ImplicitCausalLM) -> ImplicitCausalLM:
    """``model``'s weights set from a trained ``source`` of this package, of the same family
    and widths (solver options may differ). Every weight ``source`` has is copied; an
    implicit ``model`` started from an explicit ``source`` gets its injection from block 1,
    as from a transformers checkpoint, so that its first iteration begins from the explicit
    model's first block. An implicit ``source`` cannot start an explicit model: its blocks
    were trained to read the injection, which an explicit model does not have."""
    if model.config.model_type != source.config.model_type:
        raise ModelLoadError(f"cannot start a model of type {model.config.model_type} from one of type {source.config.model_type}")
    if source.config.implicit and not model.config.implicit:
        raise ModelLoadError("cannot start an explicit model from an implicit one (its blocks read the injection)")
    weights = {}
    for name in sorted(_plain_names(source)):  # sorted: the first misfit named is always the same
        module_name, _, attribute = name.rpartition(".")
        weights[name] = getattr(source.get_submodule(module_name), attribute)
    with torch.no_grad():
        _copy_weights(model, weights)
        if model.config.implicit and not source.config.implicit:
            _set_injection(model)
    return model


def _set_injection(model: ImplicitCausalLM) -> None:
    norm_weight, projection_weight = model.stack.layers[0].first_projection()
    _set_weight(model.injection_norm, "weight", norm_weight)
    _set_weight(model.injection, "weight", projection_weight)


def _convert(
    hf: PreTrainedModel,
    options: dict[str, Any],
    prefixes: dict[str, str],
    implicit: bool,
    overrides: dict[str, Any],
) -> ImplicitCausalLM:
    model = build_model(config_from_options({**options, "implicit": implicit, **overrides}))
    # generate() stops at eos and pads with pad: without the source's ids it would never stop.
    for key in SPECIAL_TOKEN_IDS:
        setattr(model.config, key, getattr(hf.config, key, None))
    if hf.generation_config is not None:
        model.generation_config = copy.deepcopy(hf.generation_config)
    tied = model.config.tie_word_embeddings
    weights = _renamed(hf.state_dict(), prefixes if tied else {**prefixes, HEAD: HEAD})
    for name in ("embeddings.weight",) if tied else ("embeddings.weight", HEAD):
        weights[name] = _pad_rows(weights[name], model.config.padded_vocab_size)
    with torch.no_grad():
        _copy_weights(model, weights)
        if model.config.implicit:
            _set_injection(model)
    return model.eval()


SPECIAL_TOKEN_IDS = ("bos_token_id", "eos_token_id", "pad_token_id")


def _renamed(state: dict[str, torch.Tensor], prefixes: dict[str, str]) -> dict[str, torch.Tensor]:
    renamed = {}
    for name, tensor in state.items():
        if name == HEAD and HEAD not in prefixes:
            continue
        prefix = next((p for p in prefixes if name.startswith(p)), None)
        if prefix is None:
            raise ModelLoadError(f"checkpoint weight {name!r} has no counterpart in this model")
        renamed[prefixes[prefix] + name.removeprefix(prefix)] = tensor
    return renamed


def _pad_rows(embedding: torch.Tensor, rows: int) -> torch.Tensor:
    """An embedding or head matrix padded with zero rows to our padded vocabulary (logits
    of padding rows are cut off, and no token id reaches them)."""
    if embedding.shape[0] > rows:
        raise ModelLoadError(f"embedding has {embedding.shape[0]} rows, more than the padded vocabulary ({rows})")
    return torch.cat([embedding, embedding.new_zeros(rows - embedding.shape[0], embedding.shape[1])])


def _copy_weights(model: nn.Module, weights: dict[str, torch.Tensor]) -> None:
    """Set every weight by its plain name (``...in_proj.weight``), all present; the
    injection only where ``weights`` has one."""
    # An explicit source has no counterpart of the injection; it is set from block 1 afterwards.
    injection = ("injection.", "injection_norm.")
    has_injection = any(name.startswith(injection) for name in weights)
    expected = {name for name in _plain_names(model) if has_injection or not name.startswith(injection)}
    if expected != weights.keys():
        missing, unexpected = sorted(expected - weights.keys()), sorted(weights.keys() - expected)
        raise ModelLoadError(f"checkpoint does not match the model: missing {missing}, unexpected {unexpected}")
    for name, tensor in weights.items():
        module_name, _, attribute = name.rpartition(".")
        module = model.get_submodule(module_name)
        if tensor.shape != getattr(module, attribute).shape:
            shape, ours = tuple(tensor.shape), tuple(getattr(module, attribute).shape)
            raise ModelLoadError(f"{name}: shape {shape} in the checkpoint, {ours} in the model")
        _set_weight(module, attribute, tensor)


def _plain_names(model: nn.Module) -> set[str]:
    """State-dict names with weight norm's (g, v) pairs folded back into the weight they define."""
    names = set()
    for name in model.state_dict():
        head, marker, rest = name.partition("parametrizations.")
        names.add(head + rest.split(".")[0] if marker else name)
    return names


def _set_weight(module: nn.Module, attribute: str, value: torch.Tensor) -> None:
    """Copy ``value`` into a parameter; a parametrised one is set through its right inverse
    (weight norm: g = ||w|| per row, v = w), so that its effective value is ``value``."""
    target = getattr(module, attribute)
    # A copy: assignment stores the given tensor itself, which must not alias the source model.
    value = value.detach().to(dtype=target.dtype, device=target.device, copy=True)
    if parametrize.is_parametrized(module, attribute):
        setattr(module, attribute, value)
    else:
        target.copy_(value)


def _hf_model(source: HFSource, family: Family) -> tuple[PreTrainedModel, dict[str, Any]]:
    """The source model and our options for it. A directory's config is read and checked
    first: a setting we refuse is refused before its weights load."""
    cls = family.source_class
    if isinstance(source, cls):
        return source, family.source_options(source.config)
    if isinstance(source, PreTrainedModel):
        raise ArgumentTypeError(f"expected a {cls.__name__} or its checkpoint directory, got a {type(source).__name__}")
    path = Path(source)
    values = config_values(path)
    if values.get("model_type") != family.source_model_type:
        raise ModelLoadError(f"{path}: model_type {values.get('model_type')!r}, expected {family.source_model_type!r}")
    _require_blocks(values, path / "config.json")
    config = _loaded(path, lambda: cls.config_class.from_pretrained(path))
    options = family.source_options(config)
    hf, _, _ = load_checked_folder(cls, path, config)  # transformers checkpoints carry no digests to miss
    return hf, options


def _require_blocks(values: dict[str, Any], source: Path) -> None:
    """Refuse, from the config file's own numbers, a model whose blocks alone outgrow the memory:
    transformers' config lists a field per block, so a billion blocks took minutes and gigabytes
    before the full count was refused. Each block holds at least a norm of the width."""
    blocks, width = values.get("num_hidden_layers"), values.get("hidden_size")
    if all(isinstance(value, int) and not isinstance(value, bool) and value > 0 for value in (blocks, width)):
        require(f"{source}: a model of at least {blocks * width:,} parameters", FLOAT_BYTES * blocks * width)


def _loaded(path: Path, load: Callable[[], Any]) -> Any:
    """What ``load`` reads from the checkpoint ``path``. A foreign checkpoint fails in many
    ways (config fields of the wrong type checked by transformers or huggingface_hub), with
    types that differ between library versions."""
    try:
        return load()
    except Exception as error:
        raise ModelLoadError(f"{path}: cannot load the checkpoint ({first_line(error)})") from None
