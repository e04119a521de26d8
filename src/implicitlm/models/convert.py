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
exactly its explicit output. Exactness ends there, for reasons the design fixes: the
residual stream of iteration 1 starts at 0 rather than at e (Llama's first MLP reads
norm(a_1) instead of norm(e + a_1), block 2 reads h_1 - e instead of h_1), and u is added
in every block, not only the first. Measured on the random tiny models of
tests/test_convert.py (hidden 32, 2 layers, vocab 64, 19 tokens, 5 seeds), the relative
error ||logits_1 - logits|| / ||logits|| of iteration 1 was 0.69-0.79 for Mamba2 and
0.70-0.86 for Llama (a zero injection gives 1.0: z_1 = 0). With u added in block 1 only
it would be 0.23-0.25 and 0.44-0.54 (3 seeds): the repeated injection makes most of
Mamba2's error, the missing embedding most of Llama's. Scaling u by 0.25-1.5 helped
neither family consistently, so u keeps the scale that makes block 1 exact. For Mamba1
the error was 1.18-1.27, worse than no injection, and 1.20-1.25 with u in block 1 only:
the missing embedding makes nearly all of it, as these random Mamba1 models' logits come
mostly from the embedding that the residual stream carries to the head (norm_f(e) alone
is within 0.33-0.39 of them; 1.39-1.49 for Mamba2).
"""

from __future__ import annotations

import copy
import math
from pathlib import Path
from typing import Any, Callable

import torch
from torch import nn
from torch.nn.utils import parametrize
from transformers import (
    LlamaConfig,
    LlamaForCausalLM,
    Mamba2Config,
    Mamba2ForCausalLM,
    MambaConfig,
    MambaForCausalLM,
    PreTrainedModel,
)

from ..core.errors import DataError, first_line
from ..core.json_file import read_json_object
from .implicit_lm import ImplicitCausalLM
from .loading import (
    ModelLoadError, build_model, check_finite, check_generation_config, check_load_report, config_from_options,
    silenced_load_report,
)

# transformers' parameter prefixes -> ours; the layers' own names are the same in both.
# Mamba1 and Mamba2 checkpoints share theirs.
MAMBA_PREFIXES = {
    "backbone.embeddings.": "embeddings.",
    "backbone.layers.": "stack.layers.",
    "backbone.norm_f.": "stack.norm_f.",
}
LLAMA_PREFIXES = {
    "model.embed_tokens.": "embeddings.",
    "model.layers.": "stack.layers.",
    "model.norm.": "stack.norm_f.",
}
# A tied head is the embedding matrix itself in our models, an untied one our own lm_head.
HEAD = "lm_head.weight"

HFSource = PreTrainedModel | str | Path


def from_hf(path: str | Path, implicit: bool = False, **option_overrides: Any) -> ImplicitCausalLM:
    """A model from a transformers checkpoint directory of a Mamba2, Llama or Mamba (Mamba1) model."""
    model_type = _model_type(Path(path))
    if model_type not in IMPORTERS:
        raise ModelLoadError(f"{path}: model_type {model_type!r} is not supported; only Mamba2, Llama and Mamba are")
    return IMPORTERS[model_type](path, implicit, **option_overrides)


def from_hf_mamba2(source: HFSource, implicit: bool = False, **option_overrides: Any) -> ImplicitCausalLM:
    """Our Mamba2 model from a ``Mamba2ForCausalLM`` or its checkpoint directory.

    ``option_overrides``: further model options (e.g. ``fixed_point``, ``chunk_size``).
    """
    hf, options = _hf_model(source, Mamba2ForCausalLM, _mamba2_options)
    return _convert(hf, options, MAMBA_PREFIXES, _mamba_first_projection, implicit, option_overrides)


def from_hf_llama(source: HFSource, implicit: bool = False, **option_overrides: Any) -> ImplicitCausalLM:
    """Our Llama model from a ``LlamaForCausalLM`` or its checkpoint directory.

    ``option_overrides``: further model options (e.g. ``fixed_point``).
    """
    hf, options = _hf_model(source, LlamaForCausalLM, _llama_options)
    return _convert(hf, options, LLAMA_PREFIXES, _llama_first_projection, implicit, option_overrides)


def from_hf_mamba(source: HFSource, implicit: bool = False, **option_overrides: Any) -> ImplicitCausalLM:
    """Our Mamba1 model from a ``MambaForCausalLM`` or its checkpoint directory.

    ``option_overrides``: further model options (e.g. ``fixed_point``, ``chunk_size``).
    """
    hf, options = _hf_model(source, MambaForCausalLM, _mamba_options)
    return _convert(hf, options, MAMBA_PREFIXES, _mamba_first_projection, implicit, option_overrides)


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
            _set_injection(model, FIRST_PROJECTIONS[model.config.model_type])
    return model


IMPORTERS: dict[str, Callable[..., ImplicitCausalLM]] = {
    "mamba2": from_hf_mamba2,
    "llama": from_hf_llama,
    "mamba": from_hf_mamba,
}


def _mamba2_options(config: Mamba2Config) -> dict[str, Any]:
    options = _shared_mamba_options(config)
    _refuse(tuple(config.time_step_limit) != (0.0, math.inf), f"time_step_limit={config.time_step_limit} (dt clamping)")
    return dict(
        options,
        architecture="mamba2",
        head_dim=config.head_dim,
        n_groups=config.n_groups,
        chunk_size=config.chunk_size,
    )


def _llama_options(config: LlamaConfig) -> dict[str, Any]:
    rope = config.rope_parameters or {}
    _refuse(config.attention_bias or config.mlp_bias, "attention_bias / mlp_bias (biases)")
    _refuse(config.hidden_act != "silu", f"hidden_act={config.hidden_act!r} (only silu)")
    head_dim, rope_type = config.head_dim, rope.get("rope_type", "default")
    _refuse(head_dim * config.num_attention_heads != config.hidden_size, f"head_dim={head_dim} (not hidden / heads)")
    _refuse(rope_type != "default", f"rope_type={rope_type!r} (only the default RoPE)")
    return dict(
        architecture="llama",
        vocab_size=config.vocab_size,
        tie_word_embeddings=config.tie_word_embeddings,
        hidden_size=config.hidden_size,
        num_hidden_layers=config.num_hidden_layers,
        num_attention_heads=config.num_attention_heads,
        num_key_value_heads=config.num_key_value_heads,
        intermediate_size=config.intermediate_size,
        rope_theta=rope["rope_theta"],
        layer_norm_epsilon=config.rms_norm_eps,
        initializer_range=config.initializer_range,
    )


def _mamba_options(config: MambaConfig) -> dict[str, Any]:
    # Only the initialisation reads time_step_scale / _init_scheme / _floor and
    # rescale_prenorm_residual; use_mambapy and use_associative_scan choose how the same
    # scan is computed; residual_in_fp32 matters below float32 only.
    return dict(_shared_mamba_options(config), architecture="mamba", time_step_rank=config.time_step_rank)


def _shared_mamba_options(config: MambaConfig | Mamba2Config) -> dict[str, Any]:
    """The settings Mamba1 and Mamba2 configs name alike, after the refusals they share."""
    _refuse(config.use_bias, "use_bias=True (biases in in_proj / out_proj)")
    _refuse(not config.use_conv_bias, "use_conv_bias=False")
    # hidden_act is the conv's activation; the gate is silu whatever it says.
    _refuse(config.hidden_act != "silu", f"hidden_act={config.hidden_act!r} (only silu)")
    return dict(
        vocab_size=config.vocab_size,
        tie_word_embeddings=config.tie_word_embeddings,
        hidden_size=config.hidden_size,
        num_hidden_layers=config.num_hidden_layers,
        state_size=config.state_size,
        conv_kernel=config.conv_kernel,
        expand=config.expand,
        time_step_min=config.time_step_min,
        time_step_max=config.time_step_max,
        layer_norm_epsilon=config.layer_norm_epsilon,
        initializer_range=config.initializer_range,
    )


def _mamba_first_projection(model: ImplicitCausalLM) -> tuple[torch.Tensor, torch.Tensor]:
    layer = model.stack.layers[0]
    return layer.norm.weight, layer.mixer.in_proj.weight


def _llama_first_projection(model: ImplicitCausalLM) -> tuple[torch.Tensor, torch.Tensor]:
    layer = model.stack.layers[0]
    attention = layer.self_attn
    # [q, k, v]: the order in which the attention splits its injection.
    projection = torch.cat([attention.q_proj.weight, attention.k_proj.weight, attention.v_proj.weight])
    return layer.input_layernorm.weight, projection


FIRST_PROJECTIONS = {
    "implicit_mamba2": _mamba_first_projection,
    "implicit_mamba": _mamba_first_projection,
    "implicit_llama": _llama_first_projection,
}


def _set_injection(model: ImplicitCausalLM, first_projection: Callable) -> None:
    norm_weight, projection_weight = first_projection(model)
    _set_weight(model.injection_norm, "weight", norm_weight)
    _set_weight(model.injection, "weight", projection_weight)


def _convert(
    hf: PreTrainedModel,
    options: dict[str, Any],
    prefixes: dict[str, str],
    first_projection: Callable[[ImplicitCausalLM], tuple[torch.Tensor, torch.Tensor]],
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
            _set_injection(model, first_projection)
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


def _hf_model(
    source: HFSource, cls: type[PreTrainedModel], options_of: Callable[[Any], dict[str, Any]]
) -> tuple[PreTrainedModel, dict[str, Any]]:
    """The source model and our options for it (``options_of`` its config). A directory's
    config is read and checked first: a setting we refuse is refused before its weights load."""
    if isinstance(source, cls):
        return source, options_of(source.config)
    if isinstance(source, PreTrainedModel):
        raise TypeError(f"expected a {cls.__name__} or its checkpoint directory, got a {type(source).__name__}")
    path = Path(source)
    model_type = _model_type(path)
    if model_type != cls.config_class.model_type:
        raise ModelLoadError(f"{path}: model_type {model_type!r}, expected {cls.config_class.model_type!r}")
    config = _loaded(path, lambda: cls.config_class.from_pretrained(path))
    options = options_of(config)
    with silenced_load_report():
        check_generation_config(path)
        hf, report = _loaded(path, lambda: cls.from_pretrained(
            path, config=config, use_safetensors=True, output_loading_info=True))
    # transformers initialises a weight the file lacks at random, and loads NaN as it is.
    check_load_report(path, report)
    check_finite(path, hf)
    return hf, options


def _loaded(path: Path, load: Callable[[], Any]) -> Any:
    """What ``load`` reads from the checkpoint ``path``. A foreign checkpoint fails in many
    ways (missing or damaged weights, config fields of the wrong type checked by
    transformers or huggingface_hub), with types that differ between library versions."""
    try:
        return load()
    except Exception as error:
        raise ModelLoadError(f"{path}: cannot load the checkpoint ({first_line(error)})") from None


def _model_type(path: Path) -> str | None:
    config_file = path / "config.json"
    if not config_file.is_file():
        raise ModelLoadError(f"{path}: not a checkpoint directory (no config.json)")
    try:
        return read_json_object(config_file, "a model config").get("model_type")
    except DataError as error:
        raise ModelLoadError(str(error)) from None


def _refuse(condition: bool, setting: str) -> None:
    if condition:
        raise ModelLoadError(f"unsupported setting of the source model: {setting}")
