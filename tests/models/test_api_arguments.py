"""The Python API checks its arguments as the command line does: a bad one is an OptionError
(a ValueError) of one line naming it, before any work; and the fixed-point budget is bounded
at every entrance (a call's ``max_iter``, the config fields, the CLI options, the lm-eval
adapter)."""

from __future__ import annotations

import math

import pytest
import torch
from lm_eval.api.instance import Instance
from transformers import GenerationConfig

from implicitlm.cli import main
from implicitlm.core.errors import OptionError
from implicitlm.core.targets import TargetExistsError
from implicitlm.data.tokenizer import train_tokenizer
from implicitlm.deq import Budget, FixedPointOptions, FixedPointSolver
from implicitlm.deq.options import MAX_PASSES
from implicitlm.eval.harness import ImplicitLMHarness
from implicitlm.models import config_from_options
from implicitlm.models.argument_checks import MIN_TEMPERATURE
from implicitlm.train.config import TrainConfig

from tests.models.test_generation import VOCAB, make_model, tokens
from tests.eval.test_harness import SENTENCES
from tests.eval.test_harness import make_model as scoring_model
from tests.support.models import tiny_model

HUGE = 10**30  # a budget no solve could spend


def refused(call, *fragments: str) -> str:
    """``call()`` raises an OptionError of one line holding every fragment; its message."""
    with pytest.raises(OptionError) as raised:
        call()
    message = str(raised.value)
    assert "\n" not in message and all(fragment in message for fragment in fragments), message
    return message


@pytest.fixture(scope="module")
def model():
    return make_model("mamba2", True)


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    return train_tokenizer(SENTENCES, 300, tmp_path_factory.mktemp("tokenizer"))


def test_an_attention_mask_of_another_shape_is_refused(model):
    """Before: a (2, 7) mask for (2, 5) ids was accepted and changed the logits; a (1, 5) one
    was an IndexError."""
    ids = tokens(2, 5, seed=0)
    for mask in (torch.ones(2, 7, dtype=torch.long), torch.tensor([[0, 1, 1, 1, 1]]), [[1] * 5] * 2):
        refused(lambda: model(ids, attention_mask=mask), "attention_mask", "(2, 5)")


@pytest.mark.parametrize("mode", ["simultaneous", "sequential"])
@pytest.mark.parametrize("budget, name", [
    (dict(max_iter=-5), "'max_iter'"), (dict(max_iter=0), "'max_iter'"), (dict(max_iter=1.5), "'max_iter'"),
    (dict(max_iter=HUGE), f"[1, {MAX_PASSES}]"),
    (dict(tol=math.nan), "'tol'"), (dict(tol=-1.0), "'tol'"), (dict(tol="1e-3"), "'tol'"),
])
def test_a_call_budget_out_of_range_is_refused(model, mode, budget, name):
    """Before: max_iter=-5 was AttributeError: '_RowTracker' ...; max_iter=0, tol=nan,
    tol=-1 ran (0 returned z=0 as the answer); max_iter=10**30 was taken as the budget."""
    with torch.no_grad():
        refused(lambda: model(tokens(2, 5, seed=1), mode=mode, **budget), name)


def test_a_probe_stops_every_solve_at_its_first_evaluation(model):
    """What a memory probe of one evaluation asks: converged, so no convergence check fails it,
    in this call alone."""
    failing = {"nonconvergence": "error"}
    with torch.no_grad():
        stats = model(tokens(2, 5, seed=1), fixed_point=failing, probe=True).fixed_point
        token_stats = model(tokens(2, 5, seed=1), mode="sequential", fixed_point=failing, probe=True).fixed_point
    assert stats.passes.tolist() == [1, 1] and bool(stats.converged.all())
    assert token_stats.passes.max() == 1 and bool(token_stats.converged.all())
    assert int(model(tokens(2, 5, seed=1)).fixed_point.passes.max()) > 1


@pytest.mark.parametrize("tol", [0, 0.0, math.inf])
def test_a_call_tolerance_is_held_to_the_options_rule(model, tol):
    """Before: forward(tol=0) and forward(tol=inf) ran (one evaluation, counted converged),
    though set_fixed_point_options(tol=...) refuses both."""
    refused(lambda: model.set_fixed_point_options(tol=tol), "'tol'", "> 0")
    with torch.no_grad():
        refused(lambda: model(tokens(1, 3, seed=1), tol=tol), "argument 'tol'", "> 0")
    refused(lambda: model.solve_fixed_point(tokens(1, 3, seed=1), tol=tol), "argument 'tol'")


@pytest.mark.parametrize("ids, expected", [
    (tokens(1, 5, seed=2)[0], "2-d tensor"),  # before: ValueError: not enough values to unpack
    (tokens(1, 5, seed=2)[None], "2-d tensor"),  # before: ValueError: too many values to unpack
    (tokens(1, 5, seed=2).float(), "integer token ids"),  # before: RuntimeError from the embedding
    (torch.full((1, 3), VOCAB), f"[0, {VOCAB})"),  # before: accepted (a padded row of the embedding)
    (torch.full((1, 3), 40), f"[0, {VOCAB})"),  # before: IndexError: index out of range in self
    (torch.full((1, 3), -1), f"[0, {VOCAB})"),  # before: IndexError
    (torch.zeros(1, 0, dtype=torch.long), "at least one"),  # before: ZeroDivisionError in the scan
    (torch.zeros(0, 4, dtype=torch.long), "at least one"),
])
def test_token_ids_of_a_wrong_shape_type_or_range_are_refused(model, ids, expected):
    refused(lambda: model(ids), "input_ids", expected)


def test_embeddings_and_labels_of_a_wrong_shape_or_range_are_refused(model):
    """Before: inputs_embeds of another width was a RuntimeError from a product; labels of
    another shape a ValueError of cross_entropy's, labels >= vocab an IndexError."""
    ids = tokens(2, 5, seed=3)
    refused(lambda: model(inputs_embeds=torch.zeros(2, 5, 8, dtype=torch.float64)), "inputs_embeds", "16")
    refused(lambda: model(inputs_embeds=torch.zeros(5, 16, dtype=torch.float64)), "inputs_embeds")
    refused(lambda: model(ids, labels=ids[:, :3]), "labels", "(2, 5)")
    refused(lambda: model(ids, labels=ids + VOCAB), "labels", f"[0, {VOCAB})")
    ignored = torch.where(ids > 5, ids, -100)  # the ignored label is no error
    with torch.no_grad():
        assert math.isfinite(float(model(ids, labels=ignored).loss))


def test_a_state_of_another_batch_or_no_state_at_all_is_refused(model):
    """Before: RuntimeError: Sizes of tensors must match ...; [1, 2]: AttributeError."""
    with torch.no_grad():
        state = model(tokens(2, 4, seed=4), use_cache=True).state
        for mode in ("simultaneous", "sequential"):
            refused(lambda: model(tokens(3, 2, seed=5), state=state, mode=mode), "state holds 2 rows", "has 3")
        refused(lambda: model(tokens(2, 2, seed=5), state=[1, 2]), "state[0]")
        refused(lambda: model(tokens(2, 2, seed=5), state=state[:1]), "list of 2 block states", "1 items")
        # The state of the same rows goes on as before.
        assert model(tokens(2, 2, seed=5), state=state, mode="sequential").logits.shape == (2, 2, VOCAB)


def test_generate_on_an_empty_prompt_is_refused(model):
    """Before: an IndexError (ZeroDivisionError in the scan, here) from inside the prefill."""
    refused(lambda: model.generate(torch.zeros(1, 0, dtype=torch.long), max_new_tokens=2), "input_ids", "(1, 0)")


@pytest.mark.parametrize("arguments, name", [
    (dict(num_beams=0), "'num_beams'"),  # before: ZeroDivisionError
    (dict(max_new_tokens=0), "'max_new_tokens'"),  # before: transformers' ValueError
    (dict(max_new_tokens=-1), "'max_new_tokens'"),
    (dict(max_new_tokens=1.5), "'max_new_tokens'"),  # before: accepted
    (dict(do_sample=True, num_return_sequences=0), "'num_return_sequences'"),  # before: one sequence
    (dict(do_sample=True, num_return_sequences=1.5), "'num_return_sequences'"),  # before: TypeError
    (dict(do_sample=True, temperature=1e-300), "'temperature'"),  # before: RuntimeError from torch.multinomial
    (dict(do_sample=True, temperature=0.0), "'temperature'"),
    (dict(generation_config=GenerationConfig(max_new_tokens=2, num_beams=0)), "'num_beams'"),
])
def test_generate_arguments_out_of_range_are_refused(model, arguments, name):
    refused(lambda: model.generate(tokens(1, 3, seed=6), **{"max_new_tokens": 2, **arguments}), name)


@pytest.mark.parametrize("arguments, name", [
    (dict(max_length=-1), "'max_length'"),  # before: transformers' ValueError
    (dict(max_length=3), "'max_length'"),  # the prompt's length: before, transformers' ValueError
    (dict(max_length=4.5), "'max_length'"),
    (dict(max_new_tokens=2, repetition_penalty=0.0), "'repetition_penalty'"),  # before: transformers' ValueError
    (dict(max_new_tokens=2, repetition_penalty=math.nan), "'repetition_penalty'"),
    (dict(max_new_tokens=2, do_sample=True, top_p=1.5), "'top_p'"),  # before: accepted
    (dict(max_new_tokens=2, do_sample=True, top_p=math.nan), "'top_p'"),  # before: accepted
    (dict(max_new_tokens=2, do_sample=True, top_p=0), "'top_p'"),
    (dict(max_new_tokens=2, do_sample=True, top_k=-1), "'top_k'"),
    (dict(generation_config=GenerationConfig(max_new_tokens=2, do_sample=True, top_p=2.0)), "'top_p'"),
])
def test_generate_lengths_and_sampling_numbers_out_of_range_are_refused(model, arguments, name):
    refused(lambda: model.generate(tokens(1, 3, seed=6), **arguments), name)


def test_generate_max_length_counts_the_prompt(model):
    assert model.generate(tokens(1, 3, seed=6), max_length=5).shape == (1, 5)
    assert model.generate(tokens(1, 3, seed=6), max_new_tokens=2, do_sample=True, top_p=1, top_k=0).shape == (1, 5)


def test_sampling_at_the_lowest_temperature_draws_the_most_likely_tokens(model):
    """The floor is a temperature whose logits stay finite: sampling there is greedy decoding."""
    ids = tokens(1, 3, seed=6)
    greedy = model.generate(ids, max_new_tokens=4, do_sample=False)
    sampled = model.generate(ids, max_new_tokens=4, do_sample=True, temperature=MIN_TEMPERATURE, top_k=0)
    assert torch.equal(sampled, greedy)


def test_embeddings_of_another_dtype_and_a_state_of_another_model_are_refused(model):
    """Before: float64 inputs_embeds for a float32 model was a RuntimeError from a product; a
    state from a model of another width, a RuntimeError (another family's, an AttributeError)."""
    single = make_model("mamba2", True).float()
    refused(lambda: single(inputs_embeds=torch.zeros(1, 3, 16, dtype=torch.float64)), "inputs_embeds", "float32")
    wider = tiny_model(0, architecture="mamba2", vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, state_size=8,
                       head_dim=8).double()
    with torch.no_grad():
        for other in (wider, make_model("llama", True)):
            state = other(tokens(1, 3, seed=7), use_cache=True).state
            for mode in ("simultaneous", "sequential"):
                refused(lambda: model(tokens(1, 2, seed=8), state=state, mode=mode), "state[0]", "this model's blocks")


@pytest.mark.parametrize("value", [2, 0.5, -1])
def test_an_attention_mask_of_other_values_than_0_and_1_is_refused(model, value):
    """Before: a mask of 2s or 0.5s was accepted (read as real tokens)."""
    mask = torch.ones(1, 4, dtype=torch.float64 if isinstance(value, float) else torch.long)
    mask[0, 0] = value
    refused(lambda: model(tokens(1, 4, seed=9), attention_mask=mask), "attention_mask", "1 at real tokens", str(value))


def test_save_pretrained_onto_a_file_is_refused_and_leaves_it(model, tmp_path):
    """Before: transformers logged an error and returned None, having saved nothing."""
    target = tmp_path / "model"
    target.write_text("mine")
    with pytest.raises(TargetExistsError, match="is a file"):
        model.save_pretrained(target)
    assert target.read_text() == "mine"


# The budget's bound, at each entrance.

@pytest.mark.parametrize("field", ["train_max_iter", "max_iter", "unroll_steps", "phantom_steps"])
def test_a_config_budget_above_the_limit_is_refused(field):
    """Before: max_iter 10**30 in a config ran without end."""
    assert FixedPointOptions(**{field: MAX_PASSES}).to_dict()[field] == MAX_PASSES
    for budget in (MAX_PASSES + 1, HUGE):
        refused(lambda: config_from_options(dict(architecture="mamba2", fixed_point={field: budget})),
                f"'{field}'", str(MAX_PASSES))


def test_a_training_budget_above_the_limit_is_refused_before_the_run(tmp_path, capsys):
    """The curriculum's iterations are train_max_iter: refused before anything is written."""
    refused(lambda: TrainConfig.for_task("words", free_max_iter=HUGE).curriculum(implicit=True), str(MAX_PASSES))
    out = tmp_path / "run"
    code = main(["words", "train", "--out", str(out), "--train", f"free_max_iter={HUGE}", "--train", "total_steps=1",
                 "--no-progress"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and str(MAX_PASSES) in err[0] and "'free_max_iter'" in err[0], err
    assert not out.exists()


@pytest.mark.parametrize("argv", [
    ["words", "eval", "CHECKPOINT", "--max-iter", str(HUGE)],
    ["lm", "eval", "CHECKPOINT", "--max-iter", str(MAX_PASSES + 1)],
    ["jacobian", "CHECKPOINT", "--out", "o", "--max-iter", str(HUGE)],
    ["eval", "budget", "--task", "words", "CHECKPOINT", "--out", "o", "--max-iter", f"1,2,{HUGE}"],
])
def test_a_command_line_budget_above_the_limit_is_refused_naming_the_option(argv, capsys):
    """Before: --max-iter 10**30 parsed, and the evaluation ran without end."""
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    err = capsys.readouterr().err.strip().splitlines()
    option = argv[-2]
    assert exit_info.value.code == 2 and len(err) == 1, err
    assert f"argument {option}" in err[0] and str(MAX_PASSES) in err[0]


def test_a_solver_call_above_the_limit_is_refused_in_every_phase():
    """Before: solve(max_iter=10**30) iterated until every sample converged, or forever."""
    solver = FixedPointSolver(FixedPointOptions())
    z0 = torch.zeros(2, 3)
    for phase in ("training", "simultaneous", "sequential"):
        refused(lambda: solver(lambda z: 0.5 * z + 1, z0, Budget.to_tolerance(1e-3, HUGE), phase=phase), "'max_iter'")
    z, stats = solver(lambda z: 0.5 * z + 1, z0, Budget.to_tolerance(1e-6, MAX_PASSES))
    assert torch.allclose(z, torch.full_like(z0, 2.0), atol=1e-5) and int(stats.passes.max()) < 30


# The lm-eval adapter.

@pytest.mark.parametrize("arguments, name", [
    (dict(max_length=0), "max_length"),  # before: became 2048
    (dict(max_batch_size=0), "max_batch_size"),  # before: became 64
    (dict(tol=math.nan), "'tol'"),  # before: accepted, and recorded in the results as run
    (dict(max_iter=0), "'max_iter'"),
    (dict(max_iter=HUGE), "'max_iter'"),
])
def test_the_adapter_refuses_a_bad_length_or_budget(arguments, name, tokenizer):
    model = scoring_model("mamba2", True, len(tokenizer))
    refused(lambda: ImplicitLMHarness(model, tokenizer=tokenizer, progress=False, **arguments), name)


@pytest.mark.parametrize("until", [[""], ["\n", ""], [None]])
def test_the_adapter_refuses_an_empty_stop_string(until, tokenizer):
    """Before: ValueError: empty separator, from str.split."""
    lm = ImplicitLMHarness(scoring_model("llama", True, len(tokenizer)), tokenizer=tokenizer, progress=False)
    request = Instance("generate_until", {}, ("The sun", {"until": until, "max_gen_toks": 2}), 0)
    refused(lambda: lm.generate_until([request]), "until")


@pytest.mark.slow
def test_the_adapters_batch_probe_passes_a_run_that_fails_on_nonconvergence(tokenizer):
    """Before: the probe's one evaluation missed the tolerance, and with
    nonconvergence="error" the probe raised NumericalFault before any request ran."""
    model = scoring_model("llama", True, len(tokenizer))
    model.set_fixed_point_options(nonconvergence="error")
    lm = ImplicitLMHarness(model, tokenizer=tokenizer, batch_size="auto", max_batch_size=2, progress=False)
    assert lm._fitting_batch_size(6) == 2
