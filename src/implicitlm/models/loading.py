"""Building models from option dicts and loading them from checkpoint directories."""

from __future__ import annotations

import contextlib
import hashlib
import inspect
from pathlib import Path
from typing import Any

import torch
from transformers.utils import logging as transformers_logging

from ..core.atomic_io import recover_replaced
from ..core.errors import DataError, ImplicitLMError, first_line, quoted
from ..core.json_file import read_json_object
from ..deq.options import FixedPointOptions
from ..core.memory import FLOAT_BYTES, require
from ..core.run_folder import model_folder
from ..core.schema import OptionError, check_known_keys, dataclass_defaults, option_help
from .configuration import ImplicitLMConfig
from .implicit_lm import ImplicitCausalLM
from .llama import ImplicitLlamaConfig, ImplicitLlamaForCausalLM
from .mamba import ImplicitMambaConfig, ImplicitMambaForCausalLM
from .mamba2 import ImplicitMamba2Config, ImplicitMamba2ForCausalLM

WEIGHTS = "model.safetensors"
# Written beside the weights by checkpoints and imports; checked by load_model when present.
WEIGHTS_DIGEST = "model.safetensors.sha256"

# The ``architecture`` model option names the backbone family.
CONFIG_CLASSES: dict[str, type[ImplicitLMConfig]] = {
    "mamba2": ImplicitMamba2Config,
    "llama": ImplicitLlamaConfig,
    "mamba": ImplicitMambaConfig,
}
MODEL_CLASSES: dict[str, type[ImplicitCausalLM]] = {
    ImplicitMamba2Config.model_type: ImplicitMamba2ForCausalLM,
    ImplicitLlamaConfig.model_type: ImplicitLlamaForCausalLM,
    ImplicitMambaConfig.model_type: ImplicitMambaForCausalLM,
}

# transformers initialises missing weights at random and drops unused ones, with a warning only.
WEIGHT_PROBLEMS = {
    "missing_keys": "lacks weights the config needs",
    "unexpected_keys": "holds weights the config has no place for",
}


class ModelLoadError(ImplicitLMError, ValueError):
    """A directory that does not hold a model this package can load."""


def model_options_help() -> str:
    """What --help lists for ``--model KEY=VALUE``: every family's options, their defaults
    and meanings, and the fixed-point options that go in ``fixed_point``."""
    sections = [
        "model options (--model KEY=VALUE; architecture=mamba2 (default), llama or mamba picks the family):",
        option_help("shared:", _own_defaults(ImplicitLMConfig), ImplicitLMConfig.FIELD_HELP),
    ]
    for architecture, cls in CONFIG_CLASSES.items():
        sections.append(option_help(f"architecture={architecture}:", _own_defaults(cls), cls.FIELD_HELP))
    sections.append(option_help(
        "fixed_point (a JSON object: --model 'fixed_point={\"eval_f_max_iter\": 64}'):",
        dataclass_defaults(FixedPointOptions), FixedPointOptions.FIELD_HELP,
    ))
    return "\n".join(sections)


def _own_defaults(cls: type[ImplicitLMConfig]) -> dict[str, Any]:
    """The defaults of the fields ``cls.__init__`` declares itself."""
    parameters = inspect.signature(cls.__init__).parameters.values()
    return {p.name: p.default for p in parameters if p.name not in ("self", "kwargs")}


def model_option_names(architecture: str = "mamba2") -> list[str]:
    """Every option ``config_from_options`` accepts for that architecture, ``architecture`` included."""
    names = ["architecture"]
    # The family's own fields, then those it passes on to the shared base class.
    for cls in _config_class(architecture).__mro__:
        if issubclass(cls, ImplicitLMConfig):
            names += [n for n in inspect.signature(cls.__init__).parameters if n not in ("self", "kwargs")]
    return list(dict.fromkeys(names))


def config_from_options(options: dict[str, Any]) -> ImplicitLMConfig:
    """A config from user options; ``architecture`` ("mamba2", the default, "llama" or
    "mamba", i.e. Mamba1) picks the family. Unknown names are errors (PretrainedConfig
    would keep them silently)."""
    architecture = options.get("architecture", "mamba2")
    check_known_keys(options, model_option_names(architecture), "model option")
    config = _config_class(architecture)(**{k: v for k, v in options.items() if k != "architecture"})
    config.check_consistency()
    return config


def build_model(config: ImplicitLMConfig) -> ImplicitCausalLM:
    """A freshly initialised model of the config's family, once its weights fit in memory."""
    _require_weights(config)
    return MODEL_CLASSES[config.model_type](config)


def parameter_count(config: ImplicitLMConfig) -> int:
    """The parameters of the model ``config`` describes, counted without allocating: on the
    meta device, from models of one and two blocks (building every block of a config that
    asks for millions would itself take the time and memory this is to check)."""
    def count(layers: int) -> int:
        with torch.device("meta"):
            return MODEL_CLASSES[config.model_type](_with_layers(config, layers)).num_parameters()

    one = count(1)
    return one if config.num_hidden_layers == 1 else one + (count(2) - one) * (config.num_hidden_layers - 1)


def _with_layers(config: ImplicitLMConfig, layers: int) -> ImplicitLMConfig:
    return type(config).from_dict({**config.to_dict(), "num_hidden_layers": layers})


def _require_weights(config: ImplicitLMConfig, source: Path | None = None) -> None:
    """``source``: the config file the config came from; building from a file's config
    fails in whatever ways transformers' own fields allow, reported as that file's fault."""
    try:
        parameters = parameter_count(config)
    except Exception as error:
        if source is None:
            raise
        raise ModelLoadError(f"{source}: cannot build the model it describes ({first_line(error)})") from None
    where = f"{source}: " if source else ""
    require(f"{where}a model of {parameters:,} parameters", FLOAT_BYTES * parameters)


def load_model(path: str | Path) -> ImplicitCausalLM:
    """Load a saved model (config.json + model.safetensors), or a training run's latest
    checkpoint; weights come from safetensors only.

    Nothing in the directory is executed or unpickled: the model class is ours, chosen by
    ``model_type`` (an ``auto_map`` naming code in the directory is never followed).
    """
    path = Path(path)
    recover_replaced(path)  # a checkpoint swap cut between its two renames
    path = model_folder(path)
    config_file = path / "config.json"
    if not config_file.is_file():
        raise ModelLoadError(f"{path}: not a model directory (no config.json)")
    config = _read_config(config_file)
    _require_weights(config, config_file)
    if not (path / WEIGHTS).is_file():
        raise ModelLoadError(f"{path}: no {WEIGHTS}")
    _check_weights_digest(path)
    try:
        with _own_load_report():
            model, report = MODEL_CLASSES[config.model_type].from_pretrained(
                path, config=config, use_safetensors=True, output_loading_info=True
            )
    # A file from anywhere fails in many ways: shapes, dtypes, transformers' own config fields.
    except Exception as error:
        raise ModelLoadError(f"{path}: cannot load weights ({first_line(error)})") from None
    for kind, problem in WEIGHT_PROBLEMS.items():
        if report[kind]:
            raise ModelLoadError(f"{path / WEIGHTS}: {problem}: {quoted(sorted(report[kind]))}")
    for name, tensor in model.state_dict().items():
        # NaN weights evaluate to some accuracy without a word: refused at the door.
        if tensor.is_floating_point() and not bool(torch.isfinite(tensor).all()):
            raise ModelLoadError(f"{path / WEIGHTS}: weight {name} holds NaN or Inf")
    return model


@contextlib.contextmanager
def _own_load_report():
    """transformers prints a table of missing and unexpected weights; those are refused
    here in one line instead, so its table would only be noise before that line."""
    level = transformers_logging.get_verbosity()
    transformers_logging.set_verbosity_error()
    try:
        yield
    finally:
        transformers_logging.set_verbosity(level)


def write_weights_digest(folder: str | Path) -> None:
    """Record the SHA-256 of ``folder``'s weights beside them: safetensors has no checksum,
    so a flipped byte in the data would load as a slightly different model."""
    folder = Path(folder)
    (folder / WEIGHTS_DIGEST).write_text(_sha256(folder / WEIGHTS) + "\n")


def _check_weights_digest(path: Path) -> None:
    digest_file = path / WEIGHTS_DIGEST
    if not digest_file.is_file():
        return  # a folder saved elsewhere (transformers' save_pretrained) has none
    recorded = digest_file.read_text(encoding="utf-8", errors="replace").strip()
    if _sha256(path / WEIGHTS) != recorded:
        raise ModelLoadError(f"{path / WEIGHTS}: SHA-256 differs from {WEIGHTS_DIGEST}: the weights are damaged")


def _sha256(file: Path) -> str:
    digest = hashlib.sha256()
    with open(file, "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _read_config(config_file: Path) -> ImplicitLMConfig:
    """The config in ``config_file``, every field checked as the options of a new model are."""
    try:
        values = read_json_object(config_file, "a model config")
    except DataError as error:
        raise ModelLoadError(str(error)) from None
    model_type = values.get("model_type")
    if not isinstance(model_type, str) or model_type not in MODEL_CLASSES:
        raise ModelLoadError(f"{config_file}: model_type {quoted(model_type)} is not one of {sorted(MODEL_CLASSES)}")
    try:
        config = MODEL_CLASSES[model_type].config_class.from_dict(values)
        config.check_consistency()
        return config
    except OptionError as error:
        raise ModelLoadError(f"{config_file}: {error}") from None
    # transformers checks its own fields (dtype, id2label, ...) and fails with various types.
    except Exception as error:
        raise ModelLoadError(f"{config_file}: invalid config ({first_line(error)})") from None


def _config_class(architecture: str) -> type[ImplicitLMConfig]:
    if not isinstance(architecture, str) or architecture not in CONFIG_CLASSES:
        raise OptionError(f"architecture must be one of {', '.join(CONFIG_CLASSES)}; got {architecture!r}")
    return CONFIG_CLASSES[architecture]
