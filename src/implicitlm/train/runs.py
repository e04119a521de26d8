"""Training runs as the command line starts them: settings and a fresh model from a preset
plus overrides, merged by the presets' one rule (shared section, then the kind's, then the
command line), or a run's own settings and latest weights to resume."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from ..core.errors import OptionError
from ..core.run_folder import model_folder
from ..data.groups import get_group
from ..data.shards import TokenShards
from ..data.word_storage import load_words
from ..data.words import WordData
from ..models import ImplicitCausalLM, ImplicitLMConfig, build_model, config_from_options, load_model
from ..presets import checkpoint_preset, load_preset, merged_options, model_kind, model_options_from
from ..tasks.lm import check_shards_tokenizer
from .checkpoint import run_checkpoint, warm_start
from .config import TrainConfig
from .run_log import settle_before_resuming
from .step_memory import fitting_preset, require_training, training_memory
from .trainer import resume_config, train

# What a refusal for memory suggests instead, the largest model first.
SMALLER_PRESETS = {"words": ("words_s5", "demo"), "lm": ("lm_wikitext2", "lm_demo")}


def word_train_config(preset: dict[str, Any], kind: str, overrides: dict[str, Any] | None = None) -> TrainConfig:
    return TrainConfig.for_task("words", **merged_options(preset, "train", kind, overrides or {}))


def word_model(
    preset: dict[str, Any], kind: str, config: TrainConfig, overrides: dict[str, Any] | None = None
) -> ImplicitCausalLM:
    """A freshly initialised model (seeded by ``config.seed``) whose vocabulary is the group's elements."""
    model_config = word_model_config(preset, kind, config, overrides)
    torch.manual_seed(config.seed)
    return build_model(model_config)


def word_model_config(
    preset: dict[str, Any], kind: str, config: TrainConfig, overrides: dict[str, Any] | None = None
) -> ImplicitLMConfig:
    options = {
        **merged_options(preset, "model", kind, overrides or {}),
        "implicit": kind == "implicit",
        "vocab_size": get_group(config.group).order,
        "label_alignment": "aligned",
    }
    return config_from_options(options)


def _word_preset_memory(name: str, kind: str) -> int:
    preset = load_preset(name)
    config = word_train_config(preset, kind)
    return training_memory(word_model_config(preset, kind, config), config)


# What a run started from another's weights keeps of that run's training settings unless its
# preset or command line says otherwise: the task it learnt (the group, its words and batches).
CONTINUED_TASK = ("group", "sequence_length", "batch_size", "hard_prob")


def train_words_run(
    out_dir: Path, preset: str | None = None, explicit: bool = False, data: Path | None = None,
    model_options: dict[str, Any] | None = None, train_options: dict[str, Any] | None = None,
    init_from: Path | None = None, resume: bool = False, overwrite: bool = False, progress: bool = True,
    device: str | None = None,
) -> dict[str, Any]:
    """``implicitlm words train``: a fresh run from a preset (``explicit``: the explicit
    model), or, with ``resume``, the run in ``out_dir`` continued with its own model and
    settings (``train_options`` on top). ``data``: a word file; None trains on fresh words.
    ``init_from``: a checkpoint (or run) whose model and weights the run starts from, with
    ``model_options`` on top, on the task that run learnt (``CONTINUED_TASK``); the preset
    gives the rest of the training settings (a second stage, as the contraction stage of
    the state-tracking recipe). ``device``: where it trains (``trainer.train``)."""
    presets = load_preset(preset) if preset else {}
    if init_from is not None:
        if resume or explicit:
            flag = "resume=True continues the run from its own weights" if resume else "explicit builds a fresh model"
            raise OptionError(f"{flag}; init_from starts a new run from a checkpoint's model",
                              arguments=("resume" if resume else "explicit", "init_from"))
        return _train_words_from(init_from, out_dir, presets, data, model_options or {}, train_options or {},
                                 overwrite, progress, device)
    if resume:
        settle_before_resuming(out_dir)
        # A preset given again names the length it started from; the word file's is the run's.
        changed = set(train_options or {}) | ({"sequence_length"} if data else set())
        require_the_runs_options(out_dir, "words", model_options, presets, explicit, changed=changed)
    kind = "explicit" if explicit else "implicit"
    config = resume_config(out_dir, train_options or {}) if resume else word_train_config(presets, kind, train_options)
    words, config = words_at_their_length(data, config, train_options or {})
    if not resume:
        require_training(word_model_config(presets, kind, config, model_options), config, lambda available: fitting_preset(
            {name: lambda name=name: _word_preset_memory(name, kind) for name in SMALLER_PRESETS["words"]}, available),
            device)
    model = load_model(out_dir) if resume else word_model(presets, kind, config, model_options)
    return train(model, config, out_dir, data=words, resume=resume, overwrite=overwrite, progress=progress, device=device)


def _train_words_from(
    init_from: Path, out_dir: Path, presets: dict[str, Any], data: Path | None, model_options: dict[str, Any],
    train_options: dict[str, Any], overwrite: bool, progress: bool, device: str | None,
) -> dict[str, Any]:
    source = checkpoint_preset(init_from)
    task = {name: value for name, value in source.get("train", {}).items() if name in CONTINUED_TASK}
    model_config = config_from_options({**source["model"], **model_options})
    kind = "implicit" if model_config.implicit else "explicit"
    config = TrainConfig.for_task("words", **merged_options(presets, "train", kind, train_options, task))
    if get_group(config.group).order != model_config.vocab_size:
        raise OptionError(f"{init_from}: a model of {model_config.vocab_size} tokens, but group {config.group} has "
                          f"{get_group(config.group).order} elements")
    words, config = words_at_their_length(data, config, train_options)
    require_training(model_config, config, device=device)
    torch.manual_seed(config.seed)
    model = build_model(model_config)
    start = warm_start(model, init_from)
    return train(model, config, out_dir, data=words, overwrite=overwrite, progress=progress, warm_start=start,
                 device=device)


def words_at_their_length(
    data: Path | None, config: TrainConfig, train_options: dict[str, Any]
) -> tuple[WordData | None, TrainConfig]:
    """The word file ``data`` (None: fresh words) and the run's settings at its words' length,
    over the preset's or an earlier run's: a run records the length it trained at, which its
    checkpoint, its card and every evaluation by multiples of it read. A length the command
    line asks for that is not the file's is refused."""
    if data is None:
        return None, config
    words = load_words(data, group=config.group)
    if words.group != get_group(config.group).name:
        raise OptionError(f"{data}: words over {words.group}, but the training group is {config.group}")
    length = int(words.inputs.shape[1])
    asked = train_options.get("sequence_length", length)
    if asked != length:
        raise OptionError(f"{data}: words of length {length}, but sequence_length={asked}; a run trains at its "
                          "word file's length (leave sequence_length out)")
    return words, config.replace(sequence_length=length)


# Fixed-point options the curriculum sets phase by phase, and the trainer from the training
# length: a checkpoint holds the last phase's, whatever the preset said.
SET_IN_TRAINING = ("train_max_iter", "phantom_steps", "train_tol", "unroll_steps", "chunk_length")


def require_the_runs_options(
    out_dir: Path, task: str, model_options: dict[str, Any] | None, preset: dict[str, Any], explicit: bool | None,
    changed: set[str], base: dict[str, Any] | None = None,
) -> None:
    """A resume continues the run with its own model and settings: model options are refused;
    a preset (``base``: a model preset's options; ``explicit``: the kind asked for, None for
    the run's own) given again is accepted where it says what the run trains with
    (``changed``: the training options this resume sets anew), and refused in one line
    naming the first option where it does not."""
    if model_options:
        raise OptionError(
            "resume=True continues the run with its own model; only train_options may change",
            arguments=("resume", "train_options"),
        )
    if not (preset or base or explicit):
        return
    run = checkpoint_preset(run_checkpoint(out_dir))
    kind = "implicit" if run["model"].get("implicit", True) else "explicit"
    if explicit is not None and explicit != (kind == "explicit"):
        raise OptionError(f"resume=True continues the run with its own model, an {kind} one", arguments=("resume",))
    given = merged_options(preset, "train", kind, {})
    recorded, wanted = TrainConfig.for_task(task, **run["train"]), TrainConfig.for_task(task, **given)
    differing = [(key, getattr(wanted, key), getattr(recorded, key)) for key in given
                 if key not in changed and getattr(wanted, key) != getattr(recorded, key)]
    for key, value in merged_options(preset, "model", kind, {}, base).items():
        if key == "fixed_point":
            differing += [(f"fixed_point.{name}", option, run["model"][key].get(name)) for name, option in value.items()
                          if name not in SET_IN_TRAINING and run["model"][key].get(name) != option]
        elif run["model"].get(key) != value:
            differing.append((key, value, run["model"].get(key)))
    if differing:
        key, value, own = differing[0]
        raise OptionError(
            f"resume=True continues the run with its own settings; the preset's {key}={value!r} is not the run's "
            f"{own!r} (only train_options may change)", arguments=("resume", "train_options"),
        )


def train_lm_run(
    data: Path, out_dir: Path, preset: str | None = None, model_preset: str | None = None,
    model_options: dict[str, Any] | None = None, train_options: dict[str, Any] | None = None,
    init_from: Path | None = None, resume: bool = False, overwrite: bool = False, progress: bool = True,
    device: str | None = None,
) -> dict[str, Any]:
    """``implicitlm train``: a language model on the token shards in ``data``, from a run
    preset and a model preset (name or JSON), or, with ``resume``, the run in ``out_dir``
    continued with its own settings (``train_options`` on top). ``init_from``: a checkpoint
    (or run) whose model and weights the run starts from, with ``model_options`` on top
    (``implicit=true`` turns an explicit model implicit); the preset gives the training
    settings only, as its model widths are the checkpoint's. ``device``: where it trains
    (``trainer.train``)."""
    if resume:
        if init_from is not None:
            raise OptionError(
                "resume=True continues the run from its own weights; init_from starts a new run",
                arguments=("resume", "init_from"),
            )
        settle_before_resuming(out_dir)
        base = None
        if model_preset is not None:
            # The shards' vocabulary, as a fresh run's model takes it over the model preset's.
            base = {**model_options_from(model_preset), "vocab_size": TokenShards(data, "train").vocab_size}
        presets = load_preset(preset) if preset else {}
        require_the_runs_options(out_dir, "lm", model_options, presets, None, set(train_options or {}), base)
        config = resume_config(out_dir, train_options or {})
        model = load_model(out_dir)
        return train(model, config, out_dir, data=data, resume=True, progress=progress, device=device)
    if init_from is not None and model_preset is not None:
        raise OptionError(
            "init_from builds the checkpoint's model; model_preset cannot choose another",
            arguments=("init_from", "model_preset"),
        )
    presets = load_preset(preset) if preset else {}
    command_line = dict(model_options or {})
    source = init_from if init_from is not None else model_preset
    base = model_options_from(str(source)) if source is not None else {}
    # A preset's "explicit_model" / "implicit_model" section holds the widths that give both
    # kinds the same number of parameters; the command line still has the last word.
    kind = model_kind({} if init_from else presets, command_line, base)
    config = TrainConfig.for_task("lm", **merged_options(presets, "train", kind, train_options or {}))
    shards = TokenShards(data, "train")
    vocab_size = shards.vocab_size
    if init_from is not None:
        model_config = config_from_options({**base, **command_line})
        if model_config.vocab_size != vocab_size:
            raise OptionError(f"{init_from}: a model of {model_config.vocab_size} tokens, but the shards' tokenizer has {vocab_size}")
        check_shards_tokenizer(shards, model_folder(init_from))
    else:
        model_config = lm_model_config(presets, kind, vocab_size, command_line, base)
    require_training(model_config, config, lambda available: fitting_preset(
        {name: lambda name=name: _lm_preset_memory(name, vocab_size) for name in SMALLER_PRESETS["lm"]}, available),
        device)
    torch.manual_seed(config.seed)  # the initial weights are part of the run's seed
    model = build_model(model_config)
    start = warm_start(model, init_from) if init_from is not None else None
    return train(model, config, out_dir, data=data, overwrite=overwrite, progress=progress, warm_start=start,
                 device=device)


def lm_model_config(
    presets: dict[str, Any], kind: str, vocab_size: int, model_options: dict[str, Any], base: dict[str, Any] | None = None,
) -> ImplicitLMConfig:
    """A fresh language model's config: ``base`` (a model preset's options), the run
    preset's sections and the options given; the vocabulary is the shards' tokenizer's,
    unless an option says otherwise."""
    base = {**(base or {}), "vocab_size": vocab_size}
    return config_from_options({"label_alignment": "shifted", **merged_options(presets, "model", kind, model_options, base)})


def _lm_preset_memory(name: str, vocab_size: int) -> int:
    presets = load_preset(name)
    kind = model_kind(presets, {})
    config = TrainConfig.for_task("lm", **merged_options(presets, "train", kind, {}))
    return training_memory(lm_model_config(presets, kind, vocab_size, {}), config)
