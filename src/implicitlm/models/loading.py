"""Building models from option dicts and loading them from checkpoint directories: the one
loader, behind ``ImplicitCausalLM.from_pretrained`` (and so transformers' Auto classes) and
``load_model``, and the one reader of a saved config.json."""

from __future__ import annotations

import contextlib
import inspect
import logging
from pathlib import Path
from typing import Any

import torch
from transformers import GenerationConfig, PretrainedConfig
from transformers.utils import logging as transformers_logging

from ..core.devices import DTYPES
from ..core.errors import DataError, first_line, quoted
from ..core.file_digests import FILES_DIGEST, check_files_digest
from ..core.json_file import read_json_object
from ..core.log_lines import without_progress_bar
from ..deq.options import FixedPointOptions
from ..core.memory import FLOAT_BYTES, require
from ..core.run_folder import TRAINER_META, model_folder, read_trainer_meta
from ..core.schema import OptionError, check_known_keys, dataclass_defaults, option_help
from ..core.weights_digest import WEIGHTS, WEIGHTS_DIGEST, recorded_weights_digest, weights_sha256
from .configuration import ImplicitLMConfig
from .errors import ModelLoadError
from .families import BY_ARCHITECTURE, BY_MODEL_TYPE, DEFAULT_ARCHITECTURE, FAMILIES, architecture_choices
from .implicit_lm import ImplicitCausalLM
from .locations import hub_model_folder, local_model_path
from .weight_header import check_floating_weights, shape_mismatch

LOGGER = logging.getLogger("implicitlm")
CONFIG = "config.json"

# transformers initialises missing weights at random and drops unused ones, with a warning only.
WEIGHT_PROBLEMS = {
    "missing_keys": "lacks weights the config needs",
    "unexpected_keys": "holds weights the config has no place for",
}


# Keys of a config.json that transformers writes or reads beside a family's own fields: those
# of a default config (model_type, transformers_version, architectures, dtype, ...), the
# generation settings it still takes from a config (token ids, use_cache, ...), and those it
# reads under names a default config does not hold (an older transformers wrote some of them).
TRANSFORMERS_KEYS = frozenset(PretrainedConfig().to_dict()) | frozenset(GenerationConfig().to_dict()) | {
    "torch_dtype", "auto_map", "num_labels", "name_or_path", "_commit_hash", "attn_implementation",
    "experts_implementation",
}
GENERATION_CONFIG = "generation_config.json"
# What transformers writes into a generation_config.json (_from_model_config, transformers_version included).
GENERATION_KEYS = tuple(sorted(GenerationConfig().to_dict()))
# Reads of a run's latest checkpoint, each begun again when the run removed it meanwhile.
READ_ATTEMPTS = 10


def model_options_help() -> str:
    """What --help lists for ``--model KEY=VALUE``: every family's options, their defaults
    and meanings, and the fixed-point options that go in ``fixed_point``."""
    return "\n".join([
        f"model options (--model KEY=VALUE; architecture={architecture_choices()} picks the family):",
        *(option_help(*table) for table in model_option_tables()),
    ])


def model_option_tables() -> list[tuple[str, dict[str, Any], dict[str, str]]]:
    """The model options as (title, defaults, meanings) per table: those every family shares,
    each family's own, and the fixed-point options; what ``implicitlm options`` prints and the
    handbook's option tables show."""
    tables = [("shared:", _own_defaults(ImplicitLMConfig), ImplicitLMConfig.FIELD_HELP)]
    for family in FAMILIES:
        cls = family.config_class
        tables.append((f"architecture={family.architecture}:", _own_defaults(cls), cls.FIELD_HELP))
    tables.append((
        "fixed_point (a JSON object: --model 'fixed_point={\"max_iter\": 64}'):",
        dataclass_defaults(FixedPointOptions), FixedPointOptions.FIELD_HELP,
    ))
    return tables


def _own_defaults(cls: type[ImplicitLMConfig]) -> dict[str, Any]:
    """The defaults of the fields ``cls.__init__`` declares itself."""
    parameters = inspect.signature(cls.__init__).parameters.values()
    return {p.name: p.default for p in parameters if p.name not in ("self", "kwargs")}


def model_option_names(architecture: str = DEFAULT_ARCHITECTURE) -> list[str]:
    """Every option ``config_from_options`` accepts for that architecture, ``architecture`` included."""
    return ["architecture", *_field_names(_config_class(architecture))]


def _field_names(config_class: type[ImplicitLMConfig]) -> list[str]:
    """The fields of a family's config: its own, then those it passes on to the shared base class."""
    names = []
    for cls in config_class.__mro__:
        if issubclass(cls, ImplicitLMConfig):
            names += [n for n in inspect.signature(cls.__init__).parameters if n not in ("self", "kwargs")]
    return list(dict.fromkeys(names))


def config_from_options(options: dict[str, Any]) -> ImplicitLMConfig:
    """A config from user options; ``architecture`` (one of ``families.FAMILIES``, the first by
    default) picks the family. Unknown names are errors (PretrainedConfig would keep them
    silently)."""
    architecture = options.get("architecture", DEFAULT_ARCHITECTURE)
    check_known_keys(options, model_option_names(architecture), "model option")
    config = _config_class(architecture)(**{k: v for k, v in options.items() if k != "architecture"})
    config.check_consistency()
    return config


def build_model(config: ImplicitLMConfig) -> ImplicitCausalLM:
    """A freshly initialised model of the config's family, once its weights fit in memory."""
    _require_weights(config)
    return BY_MODEL_TYPE[config.model_type].model_class(config)


def parameter_count(config: PretrainedConfig, model_class: type | None = None) -> int:
    """The parameters of the model ``config`` describes (of ``model_class``; default: the
    family the config names), counted without allocating: on the meta device, from models of
    one and two blocks (building every block of a config that asks for millions would itself
    take the time and memory this is to check)."""
    def count(layers: int) -> int:
        return _meta_model(_with_layers(config, layers), model_class).num_parameters()

    one = count(1)
    return one if config.num_hidden_layers == 1 else one + (count(2) - one) * (config.num_hidden_layers - 1)


def _meta_model(config: PretrainedConfig, model_class: type | None = None) -> torch.nn.Module:
    """The model ``config`` describes: its tensors' shapes, without their data."""
    with torch.device("meta"):
        return (model_class or BY_MODEL_TYPE[config.model_type].model_class)(config)


def _with_layers(config: PretrainedConfig, layers: int) -> PretrainedConfig:
    return type(config).from_dict({**config.to_dict(), "num_hidden_layers": layers})


def _require_weights(config: PretrainedConfig, source: Path | None = None, model_class: type | None = None) -> None:
    """``source``: the config file the config came from; building from a file's config
    fails in whatever ways transformers' own fields allow, reported as that file's fault."""
    try:
        parameters = parameter_count(config, model_class)
    except Exception as error:
        if source is None:
            raise
        raise ModelLoadError(f"{source}: cannot build the model it describes ({first_line(error)})") from None
    where = f"{source}: " if source else ""
    require(f"{where}a model of {parameters:,} parameters", FLOAT_BYTES * parameters)


def torch_dtype(name: str | torch.dtype | None) -> torch.dtype | None:
    """The torch dtype named ``name`` (one of ``DTYPES``, or a dtype itself); None stays None."""
    if name is None or isinstance(name, torch.dtype):
        return name
    if name not in DTYPES:
        raise OptionError(f"dtype must be one of {', '.join(DTYPES)}; got {name!r}")
    return getattr(torch, name)


def load_model(path: str | Path, dtype: str | torch.dtype | None = None) -> ImplicitCausalLM:
    """``ImplicitCausalLM.from_pretrained(path)`` (see ``load_pretrained``), its parameters in
    ``dtype`` (a name of ``DTYPES`` or a torch dtype; default: as saved)."""
    dtype = torch_dtype(dtype)
    return ImplicitCausalLM.from_pretrained(path, **({} if dtype is None else {"dtype": dtype}))


def load_pretrained(cls: type[ImplicitCausalLM], path: str | Path, model_args: tuple, options: dict[str, Any]):
    """``cls.from_pretrained(path, *model_args, **options)``: a saved model (config.json +
    model.safetensors), or a training run's latest checkpoint, its config, weights' digest,
    weight names, shapes and values and its generation_config.json checked; weights come
    from safetensors only (``locations``: a name that is neither a folder here nor a Hub
    id is refused). ``cls``: ImplicitCausalLM (the family the config names) or a
    family's class (a model of another family is refused). ``options``: transformers'
    (``dtype``, ``device_map``, ``config``, ``revision``, ...), and fields of the config to
    change. A Hub id (``owner/name``) that names nothing here is fetched into the hub's cache
    and loaded from there as a folder here is, with every check.

    Nothing in the directory is executed or unpickled: the model class is ours, chosen by
    ``model_type`` (an ``auto_map`` naming code in the directory is never followed).

    A run that keeps only its latest checkpoints removes the one read here once it has
    written the next: a read that fails as the run moves on is made again from the newest.
    """
    wants_report = options.pop("output_loading_info", False)
    subfolder = options.pop("subfolder", None)
    local = local_model_path(path, subfolder)
    if local is None:
        local = hub_model_folder(path, subfolder, options)
    model, report = _load_local(cls, local, model_args, options)
    return (model, report) if wants_report else model


def _load_local(cls, path: Path, model_args: tuple, options: dict[str, Any]):
    folder = model_folder(path)
    for _ in range(READ_ATTEMPTS):
        try:
            return _load_folder(cls, folder, model_args, dict(options))
        except (ModelLoadError, OSError):
            newest = model_folder(path)
            if newest == folder:
                raise
            folder = newest
    raise ModelLoadError(f"{path}: its latest checkpoint was replaced while being read, {READ_ATTEMPTS} times in a row")


def _load_folder(cls, path: Path, model_args: tuple, options: dict[str, Any]):
    config = _config_to_load(cls, path, options)
    model, report, unchecked = load_checked_folder(BY_MODEL_TYPE[config.model_type].model_class, path, config,
                                                   model_args, options)
    model.learned_solver.load(model, path)
    if unchecked:
        LOGGER.warning(unchecked)
    return model, report


def load_checked_folder(model_class: type, path: Path, config: PretrainedConfig, model_args: tuple = (),
                        options: dict[str, Any] | None = None):
    """(model, transformers' report, what went unchecked to say or None): ``model_class``'s model
    of ``config`` from the safetensors in folder ``path`` (ours, or a transformers checkpoint
    ``convert`` reads), the memory it needs, its generation_config.json, trainer.json, digests
    and weights' dtypes checked before the weights load, the weights' names and values after."""
    ours = issubclass(model_class, ImplicitCausalLM)
    _require_weights(config, path / CONFIG, model_class)
    # A transformers checkpoint may be sharded: its weights are named by their folder.
    weights = path / WEIGHTS if ours else path
    if ours and not weights.is_file():
        raise ModelLoadError(f"{path}: no {WEIGHTS}")
    with silenced_load_report():
        check_generation_config(path)
        if (path / TRAINER_META).is_file():  # a checkpoint's: an edited one is refused, as its other files are
            read_trainer_meta(path)
        # After the files' own checks, which say more of a file changed by hand.
        unchecked = _check_digests(path)
        check_floating_weights(path / WEIGHTS)
        try:
            model, report = _load_weights(model_class, path, model_args, {**(options or {}), "config": config})
        # A file from anywhere fails in many ways: shapes, dtypes, transformers' own config fields.
        except Exception as error:
            # transformers' message about shapes points at a report it printed (or, quietened, did not).
            message = ((ours and shape_mismatch(path / WEIGHTS, _meta_model(config)))
                       or f"{path}: cannot load weights ({first_line(error)})")
            raise ModelLoadError(message) from None
    check_load_report(weights, report)
    check_finite(weights, model)
    return model, report, unchecked


def _load_weights(cls, path, model_args: tuple, options: dict[str, Any]):
    """transformers' own ``from_pretrained`` of ``cls``, from safetensors only, with its report."""
    # Ours overrides from_pretrained with the checks that lead here.
    own = super(ImplicitCausalLM, cls) if issubclass(cls, ImplicitCausalLM) else cls
    return own.from_pretrained(path, *model_args, **options, use_safetensors=True, output_loading_info=True)


def _config_to_load(cls, path: Path, options: dict[str, Any]) -> ImplicitLMConfig:
    """``path``'s config.json, checked, of ``cls``'s family; with the options that name its
    fields (taken out of ``options``) changed, as transformers changes them, but checked. A
    ``config`` in ``options`` (the Auto classes pass the one they read) stands for it."""
    config = read_config(path)
    if cls is not ImplicitCausalLM and cls.config_class is not type(config):
        raise ModelLoadError(f"{path / CONFIG}: a model of type {config.model_type}, not {cls.config_class.model_type}")
    given = options.pop("config", None)
    if given is not None and type(given) is not type(config):
        raise OptionError(f"config must be an {type(config).__name__}, the config of {path}; got {type(given).__name__}")
    changes = {name: options.pop(name) for name in _field_names(type(config)) if name in options}
    config = config if given is None else given
    if changes:
        config = type(config).from_dict({**config.to_dict(), **changes})
    config.check_consistency()
    return config


def check_load_report(source: Path, report: dict[str, Any]) -> None:
    """transformers' ``output_loading_info`` report of loading the weights ``source`` holds: a
    weight the model needs and they lack, or one they hold and the model has no place for,
    is refused in one line naming them."""
    for kind, problem in WEIGHT_PROBLEMS.items():
        if report[kind]:
            raise ModelLoadError(f"{source}: {problem}: {quoted(sorted(report[kind]))}")


def check_finite(source: Path, model: torch.nn.Module) -> None:
    """NaN weights evaluate to some accuracy without a word: refused at the door, naming
    the first such weight of ``model``, loaded from ``source``."""
    for name, tensor in model.state_dict().items():
        if tensor.is_floating_point() and not bool(torch.isfinite(tensor).all()):
            raise ModelLoadError(f"{source}: weight {name} holds NaN or Inf")


def check_generation_config(folder: Path) -> None:
    """``folder``'s generation_config.json, if it has one, is a JSON object of the settings
    transformers knows, with values it accepts. transformers itself loads an unreadable one
    as defaults, and keeps an unknown (misspelt) key as an attribute no one reads, without
    a word. Its warnings about settings that matter only in some decoding modes stay
    unsaid, as when it loads the file itself (call under ``silenced_load_report``)."""
    file = folder / GENERATION_CONFIG
    if not file.exists():
        return
    try:
        values = read_json_object(file, "a generation config")
        check_known_keys(values, GENERATION_KEYS, "generation setting")
        GenerationConfig.from_dict(values)  # transformers' own checks of the values
    except DataError as error:
        raise ModelLoadError(str(error)) from None
    except OptionError as error:
        raise ModelLoadError(f"{file}: {error}") from None
    except Exception as error:  # transformers' checks fail with several types
        raise ModelLoadError(f"{file}: invalid generation config ({first_line(error)})") from None


@contextlib.contextmanager
def silenced_load_report():
    """transformers prints a table of missing and unexpected weights; those are refused
    in one line instead (``check_load_report``), so its table would only be noise before that
    line. Its "Loading weights" bar too, as the command line has it: a checkpoint loads at once,
    and a caller that turned progress off (``progress=False``) gets no bar from a load."""
    level = transformers_logging.get_verbosity()
    transformers_logging.set_verbosity_error()
    try:
        with without_progress_bar():
            yield
    finally:
        transformers_logging.set_verbosity(level)


def _check_digests(path: Path) -> str | None:
    """Check ``path``'s weights, config and tokenizer against their recorded digests; what
    went unchecked, to say. Not an error: folders saved by transformers itself, or by an
    earlier implicitlm, have no digests (or no ``files.sha256``)."""
    try:
        recorded = recorded_weights_digest(path)
        if recorded is not None and weights_sha256(path) != recorded:
            raise ModelLoadError(f"{path / WEIGHTS}: SHA-256 differs from {WEIGHTS_DIGEST}: the weights are damaged")
        files_checked = check_files_digest(path)
    except DataError as error:
        raise ModelLoadError(str(error)) from None
    if recorded is None:
        return f"{path}: no {WEIGHTS_DIGEST} beside the weights: loaded without checking them for damage"
    if not files_checked:
        return f"{path}: no {FILES_DIGEST}: its config and tokenizer loaded without checking them for changes"
    return None


def config_values(folder: Path) -> dict[str, Any]:
    """``folder``'s config.json as read, a JSON object (of any model_type: transformers' too)."""
    config_file = folder / CONFIG
    if not config_file.is_file():
        raise ModelLoadError(f"{folder}: not a model directory (no {CONFIG})")
    try:
        return read_json_object(config_file, "a model config")
    except DataError as error:
        raise ModelLoadError(str(error)) from None


def read_config(folder: Path) -> ImplicitLMConfig:
    """The config in ``folder``'s config.json, every field checked as the options of a new model are."""
    return _checked_config(config_values(folder), folder / CONFIG)


def saved_model_options(folder: Path) -> dict[str, Any]:
    """The model options ``folder``'s config.json holds, as written, ``architecture`` first;
    checked as ``read_config`` checks them."""
    values = config_values(folder)
    family = BY_MODEL_TYPE[_checked_config(values, folder / CONFIG).model_type]
    names = set(_field_names(family.config_class))
    return {"architecture": family.architecture, **{k: v for k, v in values.items() if k in names}}


def _checked_config(values: dict[str, Any], config_file: Path) -> ImplicitLMConfig:
    model_type = values.get("model_type")
    if not isinstance(model_type, str) or model_type not in BY_MODEL_TYPE:
        raise ModelLoadError(f"{config_file}: model_type {quoted(model_type)} is not one of {sorted(BY_MODEL_TYPE)}")
    config_class = BY_MODEL_TYPE[model_type].config_class
    try:
        # PretrainedConfig keeps an unknown key as an attribute: a misspelt field would leave
        # the field at its default without a word.
        check_known_keys({k: v for k, v in values.items() if k not in TRANSFORMERS_KEYS}, _field_names(config_class),
                         "model option")
        config = config_class.from_dict(values)
        config.check_consistency()
        return config
    except OptionError as error:
        raise ModelLoadError(f"{config_file}: {error}") from None
    # transformers checks its own fields (dtype, id2label, ...) and fails with various types.
    except Exception as error:
        raise ModelLoadError(f"{config_file}: invalid config ({first_line(error)})") from None


def _config_class(architecture: str) -> type[ImplicitLMConfig]:
    if not isinstance(architecture, str) or architecture not in BY_ARCHITECTURE:
        raise OptionError(f"architecture must be one of {', '.join(BY_ARCHITECTURE)}; got {architecture!r}")
    return BY_ARCHITECTURE[architecture].config_class
