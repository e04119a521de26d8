"""Command-line options take any text: a value of the right kind, or one line naming the option and exit 2."""

from __future__ import annotations

import argparse
import contextlib
import io
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from implicitlm.cli import build_parser

# (command words, required arguments, option, what a valid value satisfies)
POSITIVE_INT = lambda v: isinstance(v, int) and v > 0  # noqa: E731
NON_NEGATIVE_INT = lambda v: isinstance(v, int) and v >= 0  # noqa: E731
POSITIVE_FLOAT = lambda v: math.isfinite(v) and v > 0  # noqa: E731
FRACTION = lambda v: 0 <= v <= 1  # noqa: E731
SEED = lambda v: isinstance(v, int) and 0 <= v <= 2**63 - 1  # noqa: E731  (torch.manual_seed's range)
POSITIVE_INTS = lambda v: bool(v) and all(POSITIVE_INT(x) for x in v)  # noqa: E731
POSITIVE_FLOATS = lambda v: bool(v) and all(POSITIVE_FLOAT(x) for x in v)  # noqa: E731

GENERATE = (["words", "generate"], ["--group", "S3", "--length", "4", "--count", "2", "--out", "x.npy"])
EVAL = (["words", "eval"], ["ckpt"])
BUDGET = (["eval", "budget"], ["--task", "words", "ckpt", "--out", "o"])
CORPUS = (["corpus", "build"], ["src", "--tokenizer", "t", "--out", "o"])
CATBABI = (["catbabi", "eval"], ["ckpt", "--data", "d", "--out", "o"])
JACOBIAN = (["jacobian"], ["m", "--out", "o"])
OPTIONS = [
    (*GENERATE, "--length", POSITIVE_INT),
    (*GENERATE, "--count", POSITIVE_INT),
    (*GENERATE, "--hard-prob", FRACTION),
    (*GENERATE, "--seed", SEED),
    (["generate"], ["ckpt", "--prompt", "a"], "--seed", SEED),
    (["solver", "train"], ["ckpt", "--out", "o"], "--seed", SEED),
    (*EVAL, "--lengths", POSITIVE_INTS),
    (*EVAL, "--batch-size", POSITIVE_INT),
    (*EVAL, "--max-iter", POSITIVE_INT),
    (*EVAL, "--tol", POSITIVE_FLOAT),
    (*EVAL, "--chunk-length", NON_NEGATIVE_INT),
    (*EVAL, "--passes", lambda v: isinstance(v, int) and 0 <= v <= 10_000),
    (*BUDGET, "--max-iter", POSITIVE_INTS),
    (*BUDGET, "--tol", POSITIVE_FLOATS),
    (*BUDGET, "--passes", POSITIVE_INTS),
    (*CORPUS, "--test-fraction", FRACTION),
    (*CORPUS, "--shard-tokens", POSITIVE_INT),
    (*CATBABI, "--sequence-length", POSITIVE_INT),
    (*JACOBIAN, "--positions", lambda v: bool(v) and all(NON_NEGATIVE_INT(x) for x in v)),
]

PARSER = build_parser()

# Text a user might type by mistake, and anything else.
TEXT = st.one_of(
    st.sampled_from(["0", "-1", "1.5", "nan", "inf", "-inf", "1e400", "", ",", "1,,2", "0x10", " 3", "1_000", "٣"]),
    st.integers(-10**30, 10**30).map(str),
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.lists(st.integers(-5, 5), min_size=1, max_size=4).map(lambda xs: ",".join(map(str, xs))),
    st.text(max_size=12),
)


@pytest.mark.slow
@pytest.mark.parametrize(("command", "required", "option", "valid"), OPTIONS, ids=[f"{o[0][-1]} {o[2]}" for o in OPTIONS])
@settings(max_examples=60, deadline=None)
@given(text=TEXT)
def test_an_option_value_parses_to_a_valid_value_or_is_one_line_naming_the_option(command, required, option, valid, text):
    argv = [*command, *required, f"{option}={text}"]
    stderr = io.StringIO()
    try:
        with contextlib.redirect_stderr(stderr):
            args = PARSER.parse_args(argv)
    except SystemExit as exit:
        err = stderr.getvalue().strip().splitlines()
        assert exit.code == 2
        assert len(err) == 1 and f"argument {option}" in err[0], err
        return
    value = getattr(args, destination(command, option))
    assert valid(value), (text, value)


def destination(command: list[str], option: str) -> str:
    """Where ``command``'s parser keeps ``option`` (the budget sweep's ``--max-iter`` list is
    kept apart from the one budget that other commands take)."""
    parser = PARSER
    for name in command:
        commands = next(action for action in parser._actions if isinstance(action, argparse._SubParsersAction))
        parser = commands.choices[name]
    return next(action.dest for action in parser._actions if option in action.option_strings)


@pytest.mark.parametrize("command", [["generate", "ckpt", "--prompt", "a"], ["solver", "train", "ckpt", "--out", "o"],
                                     ["words", "eval", "ckpt"], ["corpus", "build", "src", "--tokenizer", "t", "--out", "o"]])
@pytest.mark.parametrize("seed", [str(2**63), str(2**70), "-1", "9" * 400])
def test_a_seed_beyond_what_torch_takes_is_refused_naming_the_option(command, seed):
    """Before: generate ran to torch.manual_seed's "Overflow when unpacking long long", naming no
    option; solver train took any integer, negative ones too."""
    stderr = io.StringIO()
    with contextlib.redirect_stderr(stderr), pytest.raises(SystemExit) as exit:
        PARSER.parse_args([*command, "--seed", seed])
    err = stderr.getvalue().strip().splitlines()
    assert exit.value.code == 2 and len(err) == 1 and "argument --seed: expected a seed" in err[0], err
    assert PARSER.parse_args([*command, "--seed", str(2**63 - 1)]).seed == 2**63 - 1


def test_a_value_of_two_dashes_is_refused_not_taken_for_the_end_of_options():
    stderr = io.StringIO()
    with contextlib.redirect_stderr(stderr), pytest.raises(SystemExit) as exit:
        PARSER.parse_args(["words", "generate", "--group", "S3", "--length", "4", "--count", "2", "--out", "x.npy",
                           "--hard-prob=--"])
    assert exit.value.code == 2
    assert stderr.getvalue().splitlines() == [
        "implicitlm words generate: error: argument --hard-prob: expected a value, got '--' "
        "(see implicitlm words generate --help)"
    ]


@settings(max_examples=100, deadline=None)
@given(text=st.one_of(TEXT, st.sampled_from(["lr", "=3", "lr=", "lr=[1", "x=" + "[" * 5000, "seed=" + "9" * 5000]),
                      st.tuples(st.text(max_size=6), TEXT).map("=".join)))
def test_a_key_value_option_parses_to_a_pair_or_is_one_line_naming_the_option(text):
    stderr = io.StringIO()
    try:
        with contextlib.redirect_stderr(stderr):
            args = PARSER.parse_args(["words", "train", "--out", "o", f"--train={text}"])
    except SystemExit as exit:
        err = stderr.getvalue().strip().splitlines()
        assert exit.code == 2 and len(err) == 1 and "argument --train" in err[0], err
        return
    [(key, _)] = args.train
    assert key and text.startswith(f"{key}=")


# One command line in a fresh interpreter: its exit code and whether it imported torch.
REFUSAL_IMPORTS = """
import json, sys
from implicitlm.cli import main
try:
    code = main(sys.argv[1:])
except SystemExit as exit:
    code = exit.code
print(json.dumps({"code": code, "torch": "torch" in sys.modules}))
"""

REFUSED_BEFORE_TORCH = {
    "generate ck --prompt a --dtype bf16": ("--dtype", "bfloat16"),
    "generate ck --prompt a --device meta": ("--device", "cpu, cuda or cuda:N"),
    "lm downstream ck --out o --device mps": ("--device", "cpu, cuda or cuda:N"),
    "generate ck --prompt a --device cuda:01": ("--device", "got 'cuda:01'", "no leading zeros"),
    "words eval ck --device cuda:00": ("--device", "got 'cuda:00'"),
    "solver train ck --out o --device cuda:99999999999999999999": ("--device", "0 to 127"),
    "corpus build src --tokenizer ./nonexist --out o": ("--tokenizer", "./nonexist: no such tokenizer folder"),
    "corpus build src --tokenizer a/b/c --out o": ("--tokenizer", "not a hub name"),
    "train --data x --out y --model-preset mamba2-130m-bounde": ("--model-preset", "did you mean mamba2-130m-bounded"),
    "train --data x --out y --config lm_wikitex2": ("--config", "unknown preset 'lm_wikitex2'"),
    "words train --out o --preset dem": ("--preset", "unknown preset 'dem'"),
    "models show nope": ("unknown model preset 'nope'", "implicitlm models list"),
    "train --dta x --out y": ("unknown option --dta", "did you mean --data?"),
    "train --data x --out y --ovewrite": ("unknown option --ovewrite", "did you mean --overwrite?"),
    "words eval ck --lenghts 8": ("unknown option --lenghts", "did you mean --lengths?"),
    "generate ck --promt a": ("unknown option --promt", "did you mean --prompt?"),
    "eval budget ck --out o --tsk words": ("unknown option --tsk", "did you mean --task?"),
    "train --data x --out y --model hiden_size=64": ("--model", "unknown model option 'hiden_size'", "'hidden_size'"),
    "words train --out o --train lrr=1": ("--train", "unknown training option 'lrr'", "did you mean 'lr'?"),
    "train --data x --out y --train train_length=8": ("--train", "'train_length' is now sequence_length"),
    "generate ck --prompt a --passes -1": ("--passes", "expected a number of passes from 0", "got '-1'"),
    "lm eval ck --data d --passes x": ("--passes", "expected a number of passes from 0", "got 'x'"),
    "words eval ck --passes 10001": ("--passes", "to 10000, got '10001'"),
    "catbabi eval ck --data d --out o --passes 1.5": ("--passes", "got '1.5'"),
    "eval budget --task words ck --out o --passes 0,2": ("--passes", "numbers of passes of 1 to 10000"),
    "eval budget --task words ck --out o --max-iter 10001": ("--max-iter", "budgets of 1 to 10000 passes"),
}


@pytest.mark.parametrize("command", REFUSED_BEFORE_TORCH)
def test_a_refusal_the_parser_can_make_is_one_line_without_importing_torch(command, tmp_path):
    import json
    import subprocess
    import sys

    ran = subprocess.run([sys.executable, "-c", REFUSAL_IMPORTS, *command.split()], capture_output=True, text=True,
                         cwd=tmp_path, timeout=60)
    result = json.loads(ran.stdout.strip().splitlines()[-1])
    lines = ran.stderr.strip().splitlines()
    assert result == {"code": 2, "torch": False}, (result, lines)
    assert len(lines) == 1 and ": error: " in lines[0] and all(part in lines[0] for part in REFUSED_BEFORE_TORCH[command]), lines
    assert "required" not in lines[0]


# Folders that hold no model, as a command finds them: each refusal says what the folder is.
NOT_MODELS = {
    "generate nowhere --prompt a": "nowhere: does not exist",
    "words eval nowhere": "nowhere: does not exist",
    "lm eval nowhere --data d": "nowhere: does not exist",
    "solver train nowhere --out o": "nowhere: does not exist",
    "eval budget --task words run --passes 1 --explicit nowhere --out o": "nowhere: does not exist",
    "train --data d --out o --init-from nowhere": "nowhere: does not exist",
    "jacobian preset:mamba2-130m-explicit demo --out o": "demo: holds the runs explicit/ and implicit/",
    "words eval empty": "empty: an empty folder, not a model directory",
    "generate demo --prompt a": "demo: holds the runs explicit/ and implicit/ (a demo's output folder), not a model: "
                                "give one of them",
    "words eval unstarted": "unstarted: a run folder without a checkpoint yet",
    "words eval notes.txt": "notes.txt: a file, not a model directory",
    "train --data d --out nowhere --resume": "nowhere: nothing to resume (no such folder)",
    "words train --out empty --resume": "empty: an empty folder: nothing to resume",
    "words train --out demo --resume": "demo: holds the runs explicit/ and implicit/ (a demo's output folder), not a run "
                                       "itself: resume one of them",
    "words train --out run/checkpoints/step_0000002 --resume": "run/checkpoints/step_0000002: a checkpoint inside the "
                                                               "run ",
}


@pytest.mark.parametrize("command", NOT_MODELS)
def test_a_path_holding_no_model_is_refused_saying_what_it_holds_before_torch_loads(command, tmp_path):
    """Before: refused after torch and the libraries loaded (5 to 15 s), "not a model directory"
    whatever the folder was: a demo's output, a checkpoint of the run to resume."""
    import json
    import subprocess
    import sys

    for folder in ("empty", "demo/implicit/checkpoints/step_0000001", "demo/explicit/checkpoints/step_0000001",
                   "run/checkpoints/step_0000002", "unstarted/checkpoints"):
        (tmp_path / folder).mkdir(parents=True)
    for checkpoint in ("demo/implicit/checkpoints/step_0000001", "demo/explicit/checkpoints/step_0000001",
                       "run/checkpoints/step_0000002"):
        (tmp_path / checkpoint / "config.json").write_text("{}")
    (tmp_path / "notes.txt").write_text("")
    ran = subprocess.run([sys.executable, "-c", REFUSAL_IMPORTS, *command.split()], capture_output=True, text=True,
                         cwd=tmp_path, timeout=60)
    lines = ran.stderr.strip().splitlines()
    assert json.loads(ran.stdout.strip().splitlines()[-1]) == {"code": 2, "torch": False}, lines
    assert len(lines) == 1 and lines[0].startswith(f"implicitlm: error: {NOT_MODELS[command]}"), lines


def test_a_known_option_abbreviated_or_given_with_its_value_is_no_unknown_option():
    args = PARSER.parse_args(["train", "--data=d", "--out", "o", "--overw", "--model", "hidden_size=-3"])
    assert args.overwrite and str(args.data) == "d"
