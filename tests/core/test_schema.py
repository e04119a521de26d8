"""Validated fields: every option from a preset, the command line or a file is type- and range-checked."""

from __future__ import annotations

import dataclasses
import json
import typing
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from implicitlm.cli import main
from implicitlm.presets import load_preset, preset_names
from implicitlm.recipes.words import DemoEval
from implicitlm.models import ImplicitLlamaConfig, config_from_options
from implicitlm.models.loading import model_option_names
from implicitlm.core.schema import UNIT_INTERVAL, OptionError, at_least, check_field, conforms, expectation, one_of
from implicitlm.tasks import TRAINING
from implicitlm.train.config import TrainConfig
from implicitlm.train.runs import word_train_config

TINY = {"vocab_size": 8, "hidden_size": 16, "num_hidden_layers": 1}
# Valid small options of each family, which the property tests change.
BASES = {
    "mamba2": {"architecture": "mamba2", **TINY, "state_size": 8, "head_dim": 8},
    "llama": {"architecture": "llama", **TINY, "num_attention_heads": 2},
    "mamba": {"architecture": "mamba", **TINY},
}

# ---------------------------------------------------------------- the checks themselves


@pytest.mark.parametrize(
    "annotation, good, bad",
    [
        (int, [0, -3, 2**70], [True, 1.0, "1", None]),
        (float, [0, 1.5, -2, 10**30], [True, "1.5", float("nan"), float("inf"), None, [1.0]]),
        (bool, [True, False], [0, 1, "true", None]),
        (str, ["", "rel"], [1, None, b"rel", ["rel"]]),
        (float | None, [None, 0.5, 3], ["x", float("nan")]),
        (tuple[float, float], [(1, 2.5), [0.9, 0.95]], [[1.0], [1.0, 2.0, 3.0], [1.0, "2"], 1.0, {"a": 1}]),
        (tuple[int, ...], [(), [1, 2, 4]], [[1, 2.0], [True], "124"]),
        (list[int], [[], [1, 2]], [[1, None], 1, {"1": 1}]),
        (dict[str, Any], [{}, {"tau": 0.5, "x": [1, {"y": None}]}], [3, [], None, "{}", {1: "a"}]),
        (int | str, [4, "auto"], [4.0, None, True]),
    ],
)
def test_values_conform_to_their_annotation(annotation, good, bad):
    assert all(conforms(value, annotation) for value in good), good
    assert not any(conforms(value, annotation) for value in bad), [v for v in bad if conforms(v, annotation)]


def test_expectations_read_as_the_json_user_writes_them():
    assert expectation(int, at_least(1)) == "an integer >= 1"
    assert expectation(float | None, UNIT_INTERVAL) == "a number in [0, 1] or null"
    assert expectation(str, one_of("rel", "abs")) == "one of 'rel', 'abs'"
    assert expectation(tuple[float, float]) == "a list of 2 numbers"
    assert expectation(tuple[int, ...]) == "a list of integers"
    assert expectation(dict[str, Any] | None) == "a dict or null"
    assert expectation(bool) == "true or false"


def test_a_failed_check_is_one_line_naming_the_field_and_value():
    with pytest.raises(OptionError) as caught:
        check_field("training option", "lr", "abc", float, at_least(0))
    assert str(caught.value) == "training option 'lr' must be a number >= 0, got 'abc'"
    with pytest.raises(OptionError) as caught:
        check_field("model option", "fixed_point", "a\nb" * 100, dict[str, Any])
    assert "\n" not in str(caught.value) and len(str(caught.value)) < 150
    check_field("training option", "hard_prob", None, float | None, UNIT_INTERVAL)  # None has no range


def test_a_json_list_becomes_the_tuple_a_field_declares():
    assert TrainConfig.for_task("lm", betas=[0.8, 0.9]).betas == (0.8, 0.9)
    assert DemoEval.from_dict({"length_multiples": [1, 3]}).length_multiples == (1, 3)


# ---------------------------------------------------------------- training and model configs


@pytest.mark.parametrize(
    "values, message",
    [
        ({"lr": "abc"}, "training option 'lr' must be a number > 0, got 'abc'"),
        ({"warmup_steps": -3}, "training option 'warmup_steps' must be an integer >= 0, got -3"),
        ({"batch_size": 2.0}, "training option 'batch_size' must be an integer >= 1, got 2.0"),
        ({"seed": True}, "training option 'seed' must be an integer in [0, 9223372036854775807], got True"),
        ({"hard_prob": 1.5}, "training option 'hard_prob' must be a number in [0, 1] or null, got 1.5"),
        ({"compile": "yes"}, "training option 'compile' must be true or false, got 'yes'"),
        ({"log_every": 0}, "training option 'log_every' must be an integer >= 1, got 0"),
        ({"group": 5}, "training option 'group' must be a string, got 5"),
    ],
)
def test_word_training_options_are_checked(values, message):
    with pytest.raises(OptionError) as caught:
        TrainConfig.for_task("words", **values)
    assert str(caught.value) == message


@pytest.mark.parametrize(
    "values, fragment",
    [
        ({"betas": [0.9]}, "'betas' must be a list of 2 numbers in [0, 1), got [0.9]"),
        ({"betas": [0.9, 1.0]}, "'betas' must be a list of 2 numbers in [0, 1), got [0.9, 1.0]"),
        ({"distributed": "zero"}, "'distributed' must be one of 'ddp', 'fsdp', got 'zero'"),
        ({"bounded_fraction": 1.2}, "'bounded_fraction' must be a number in [0, 1], got 1.2"),
        ({"keep_checkpoints": 0}, "'keep_checkpoints' must be an integer >= 1, got 0"),
        ({"min_lr": float("nan")}, "'min_lr' must be a number >= 0, got nan"),
    ],
)
def test_lm_training_options_are_checked(values, fragment):
    with pytest.raises(OptionError) as caught:
        TrainConfig.for_task("lm", **values)
    assert str(caught.value) == f"training option {fragment}"


@pytest.mark.parametrize(
    "task, values, message",
    [
        ("words", {"train_length": 8}, "training option 'train_length' is now sequence_length"),
        ("lm", {"micro_batch_size": 8}, "training option 'micro_batch_size' is now batch_size"),
        ("words", {"bounded_steps": 8}, "training option 'bounded_steps' is now total_steps with bounded_fraction"),
        ("lm", {"group": "S5"}, "training option 'group' is for the words task, not lm"),
        ("words", {"eval_every": 10}, "training option 'eval_every' is for the lm task, not words"),
        ("words", {"total_steps": 3, "unroll_steps": 4}, "unroll_steps=4 is more than total_steps=3"),
        ("words", {"total_steps": 5, "unroll_steps": 2, "contraction_steps": 4},
         "unroll_steps=2 and contraction_steps=4 are more than total_steps=5"),
        ("words", {"contraction_jacobian": 0}, "training option 'contraction_jacobian' must be"),
        ("words", {"task": "lm"}, "training option 'task' is 'lm', but this command trains 'words'"),
        ("catbabi", {}, "training option 'task' must be one of 'words', 'lm', got 'catbabi'"),
    ],
)
def test_one_training_config_refuses_what_its_task_does_not_read(task, values, message):
    with pytest.raises(OptionError) as caught:
        TrainConfig.for_task(task, **values)
    assert str(caught.value).startswith(message), str(caught.value)


def test_the_tasks_defaults_differ_where_the_tasks_do():
    words, lm = TrainConfig.for_task("words"), TrainConfig.for_task("lm")
    assert (words.sequence_length, words.batch_size, words.batch_tokens, words.betas) == (16, 128, 0, (0.9, 0.999))
    assert (lm.sequence_length, lm.batch_size, lm.batch_tokens, lm.betas) == (2048, 8, 2**20, (0.9, 0.95))
    assert words.accumulation_steps(world_size=2) == 1 and lm.accumulation_steps(world_size=2) == 2**20 // (2048 * 8 * 2)


# A value other than its default for each field that only one task reads.
OWN_FIELD_VALUES = {"group": "S5", "hard_prob": 0.5, "eval_every": 3, "eval_batches": 3}


@pytest.mark.parametrize("task", TRAINING)
def test_a_task_that_trains_takes_its_defaults_and_its_own_fields_from_its_entry_in_the_table(task):
    """The table of tasks (``tasks.TASKS``) is the one home of what a task trains with."""
    config = TrainConfig.for_task(task)
    assert {name: getattr(config, name) for name in TRAINING[task].defaults} == dict(TRAINING[task].defaults)
    assert {name for training in TRAINING.values() for name in training.own_fields} == set(OWN_FIELD_VALUES)
    for other, training in TRAINING.items():
        for name in training.own_fields:
            changed = {name: OWN_FIELD_VALUES[name]}
            if other == task:
                assert getattr(TrainConfig.for_task(task, **changed), name) == changed[name]
            else:
                with pytest.raises(OptionError, match=f"^training option '{name}' is for the {other} task, not {task}$"):
                    TrainConfig.for_task(task, **changed)


@pytest.mark.parametrize(
    "options, message",
    [
        ({"hidden_size": "abc"}, "model option 'hidden_size' must be an integer >= 1, got 'abc'"),
        ({"hidden_size": -1}, "model option 'hidden_size' must be an integer >= 1, got -1"),
        ({"num_hidden_layers": 0}, "model option 'num_hidden_layers' must be an integer >= 1, got 0"),
        ({"fixed_point": 3}, "model option 'fixed_point' must be a dict or null, got 3"),
        ({"implicit": "no"}, "model option 'implicit' must be true or false, got 'no'"),
        (
            {"label_alignment": "left"},
            "model option 'label_alignment' must be one of 'shifted', 'aligned', got 'left'",
        ),
        ({"head_dim": 12}, "model option 'head_dim' must be a divisor of expand * hidden_size = 32, got 12"),
        (
            {"head_dim": 8, "n_groups": 3},
            "model option 'n_groups' must be a divisor of the number of heads expand * hidden_size / head_dim = 4, "
            "got 3",
        ),
        (
            {"a_init_range": [4, 2]},
            "model option 'a_init_range' must be a list of 2 numbers with 0 < low <= high, got [4, 2]",
        ),
        ({"time_step_min": 0.5}, "model option 'time_step_min' must be <= time_step_max = 0.1, got 0.5"),
    ],
)
def test_mamba2_options_are_checked(options, message):
    with pytest.raises(OptionError) as caught:
        config_from_options({**BASES["mamba2"], **options})
    assert str(caught.value) == message


EVEN_HEADS = "a divisor of hidden_size = 16 into heads of even size"


@pytest.mark.parametrize(
    "options, message",
    [
        ({"num_attention_heads": 3}, f"'num_attention_heads' must be {EVEN_HEADS}, got 3"),
        ({"num_attention_heads": 16}, f"'num_attention_heads' must be {EVEN_HEADS}, got 16"),
        ({"num_key_value_heads": 3}, "'num_key_value_heads' must be a divisor of num_attention_heads = 4, got 3"),
        ({"intermediate_size": 0}, "'intermediate_size' must be an integer >= 1 or null, got 0"),
    ],
)
def test_llama_options_are_checked(options, message):
    with pytest.raises(OptionError) as caught:
        config_from_options({**BASES["llama"], "num_attention_heads": 4, **options})
    assert str(caught.value) == f"model option {message}"


def test_mamba_options_are_checked():
    assert config_from_options(BASES["mamba"]).time_step_rank == 1
    with pytest.raises(OptionError) as caught:
        config_from_options({**BASES["mamba"], "time_step_rank": "full"})
    assert str(caught.value) == "model option 'time_step_rank' must be an integer >= 1 or 'auto', got 'full'"


def test_a_partial_config_is_checked_for_consistency_only_when_complete():
    # 1024 is not a multiple of the default 12 heads, yet each field is valid on its own.
    config = ImplicitLlamaConfig(hidden_size=1024)
    with pytest.raises(OptionError, match="num_attention_heads"):
        config.check_consistency()
    with pytest.raises(OptionError, match="hidden_size"):
        ImplicitLlamaConfig(hidden_size=1024.5)


@pytest.mark.parametrize("name", preset_names())
def test_shipped_presets_pass_the_schema(name):
    preset = load_preset(name)
    for kind in ("implicit", "explicit"):
        options = {**preset.get("model", {}), **preset.get(f"{kind}_model", {}), "implicit": kind == "implicit"}
        config_from_options({"vocab_size": 8, **options})
        if name.startswith("words") or name == "demo":
            word_train_config(preset, kind)
        else:
            TrainConfig.for_task("lm", **{**preset.get("train", {}), **preset.get(f"{kind}_train", {})})
    if "eval" in preset:
        DemoEval.from_dict(preset["eval"])


@pytest.mark.parametrize("section", ["train", "implicit_model", "eval"])
def test_a_preset_section_that_holds_no_dict_is_refused(tmp_path, section):
    path = tmp_path / "preset.json"
    path.write_text(json.dumps({"model": {}, section: [1]}))
    with pytest.raises(OptionError) as caught:
        load_preset(str(path))
    assert str(caught.value) == f"{path}: preset section '{section}' must be a dict, got [1]"


# ---------------------------------------------------------------- any JSON value: a config or an OptionError

json_scalars = (
    st.none()
    | st.booleans()
    | st.integers(-3, 70)
    | st.integers()
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.floats(0, 1)
    | st.text(max_size=6)
    | st.sampled_from(["auto", "ddp", "fsdp", "S3", "A5", "shifted", "aligned", "bf16", "no"])
)
json_values = st.recursive(
    json_scalars,
    lambda children: st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=8), children, max_size=3),
    max_leaves=6,
)
# Values that are often valid, so that configs get built as well as refused.
option_values = st.one_of(
    st.integers(1, 64),
    st.floats(1e-3, 1),
    st.booleans(),
    st.none(),
    st.lists(st.floats(0.1, 10), min_size=2, max_size=2),
    json_values,
)
fixed_point_names = st.sampled_from(["tau", "train_max_iter", "train_tol", "solver", "stop_mode", "max_iter"])
fixed_point_values = st.dictionaries(fixed_point_names, option_values, max_size=3)


def assert_fields_conform(config: Any) -> None:
    """A config that was built holds values of its declared types only."""
    hints = typing.get_type_hints(type(config))
    for field in dataclasses.fields(config):
        assert conforms(getattr(config, field.name), hints[field.name]), field.name


@pytest.mark.slow
@pytest.mark.parametrize(
    "config_class, build",
    [(TrainConfig, lambda values: TrainConfig.for_task("words", **values)),
     (TrainConfig, lambda values: TrainConfig.for_task("lm", **values)),
     (DemoEval, DemoEval.from_dict)],
    ids=["words", "lm", "demo-eval"],
)
@settings(max_examples=150, deadline=None)
@given(data=st.data())
def test_any_json_training_options_give_a_config_or_an_option_error(config_class, build, data):
    names = [field.name for field in dataclasses.fields(config_class)]
    values = data.draw(st.dictionaries(st.sampled_from(names), option_values, max_size=3))
    try:
        config = build(values)
    except OptionError:
        return
    assert_fields_conform(config)


@pytest.mark.slow
@pytest.mark.parametrize("architecture", list(BASES))
@settings(max_examples=150, deadline=None)
@given(data=st.data())
def test_any_json_model_options_give_a_config_or_an_option_error(architecture, data):
    names = [name for name in model_option_names(architecture) if name != "architecture"]
    values = data.draw(
        st.dictionaries(st.sampled_from(names), option_values, max_size=3)
        | st.fixed_dictionaries({"fixed_point": fixed_point_values})
    )
    try:
        config = config_from_options({**BASES[architecture], **values})
    except OptionError:
        return
    # What a checkpoint stores of a valid config loads back as the same config.
    again = type(config).from_dict(config.to_dict())
    again.check_consistency()
    assert again.to_dict() == config.to_dict()


# ---------------------------------------------------------------- the command line


@pytest.mark.parametrize(
    "option, fragment",
    [
        (["--train", "lr=abc"], "training option 'lr'"),
        (["--model", "hidden_size=abc"], "model option 'hidden_size'"),
        (["--model", "fixed_point=3"], "model option 'fixed_point'"),
        (["--model", "num_hidden_layers=0"], "model option 'num_hidden_layers'"),
        (["--model", "hidden_size=-1"], "model option 'hidden_size'"),
        (["--train", "warmup_steps=-3"], "training option 'warmup_steps'"),
    ],
)
def test_words_train_reports_a_bad_option_in_one_line_and_writes_nothing(tmp_path, capsys, option, fragment):
    out = tmp_path / "run"
    code = main(["words", "train", "--out", str(out), *option, "--no-progress"])
    err = capsys.readouterr().err
    assert code == 2
    assert err.count("\n") == 1 and err.startswith("implicitlm: error: ") and fragment in err, err
    assert not out.exists()


@pytest.mark.parametrize(
    ("command", "preset", "section", "change", "field"),
    [
        ("demo", "demo", "explicit_train", {"lr": "fast"}, "lr"),
        ("demo", "demo", "explicit_model", {"head_dim": 0}, "head_dim"),
        ("lm demo", "lm_demo", "corpus", {"max_bytes": -1}, "max_bytes"),
        ("lm demo", "lm_demo", "explicit_train", {"total_steps": 0}, "total_steps"),
    ],
)
def test_a_demo_preset_is_checked_whole_before_anything_runs(tmp_path, capsys, command, preset, section, change, field):
    from implicitlm.cli import main
    from implicitlm.presets import load_preset

    values = load_preset(preset)
    values[section] = {**values.get(section, {}), **change}
    (tmp_path / "preset.json").write_text(json.dumps(values))
    out = tmp_path / "out"
    code = main([*command.split(), "--preset", str(tmp_path / "preset.json"), "--out", str(out), "--no-progress"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and f"'{field}'" in err[0], err
    assert not out.exists()
