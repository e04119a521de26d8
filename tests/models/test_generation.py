"""Recurrent state across calls, generation, and Auto-class loading, for all four variants."""

from __future__ import annotations

import dataclasses
import logging
from functools import partial

import pytest
import torch
from transformers import AutoModelForCausalLM

from implicitlm.models import FAMILIES  # (and registers the Auto classes)
from implicitlm.deq import OptionError
from implicitlm.core.errors import NumericalFault

from tests.support.models import family_model, token_ids, with_stack

VOCAB = 24
VARIANTS = [("mamba2", False), ("mamba2", True), ("llama", False), ("llama", True)]
IDS = [f"{arch}-{'implicit' if implicit else 'explicit'}" for arch, implicit in VARIANTS]
EVERY_FAMILY = [(family.architecture, implicit) for family in FAMILIES for implicit in (False, True)]


tokens = partial(token_ids, vocab=VOCAB)


def make_model(architecture: str, implicit: bool):
    return family_model(architecture, implicit, VOCAB, fixed_point=dict(max_iter=400, tol=1e-7))


@pytest.mark.slow
@pytest.mark.parametrize("architecture, implicit", VARIANTS, ids=IDS)
def test_sequential_run_resumes_exactly_from_its_state(architecture, implicit):
    model, ids = make_model(architecture, implicit), tokens(2, 9, seed=1)
    with torch.no_grad():
        whole = model(ids, mode="sequential")
        head = model(ids[:, :4], mode="sequential")
        tail = model(ids[:, 4:], mode="sequential", state=head.state)
    assert torch.equal(torch.cat([head.logits, tail.logits], dim=1), whole.logits)


@pytest.mark.slow
@pytest.mark.device
@pytest.mark.parametrize("architecture, implicit", VARIANTS, ids=IDS)
def test_parallel_prefill_then_recurrent_decoding_equals_full_forward(architecture, implicit, device):
    model, ids = make_model(architecture, implicit).to(device), tokens(2, 9, seed=2).to(device)
    with torch.no_grad():
        reference = model(ids, mode="sequential")
        prefill = model(ids[:, :5], mode="simultaneous", use_cache=True)
        decoded = model(ids[:, 5:], mode="sequential", state=prefill.state)
    if implicit:
        assert bool(reference.fixed_point.converged.all()) and bool(prefill.fixed_point.converged.all())
    # Explicit: the same arithmetic in another order; implicit: two solves of the same fixed
    # point, each to a relative residual of 1e-7.
    tolerance = 1e-9 if not implicit else 1e-5
    torch.testing.assert_close(torch.cat([prefill.logits, decoded.logits], dim=1), reference.logits, atol=tolerance, rtol=0)


@pytest.mark.slow
@pytest.mark.device
@pytest.mark.parametrize("architecture, implicit", VARIANTS, ids=IDS)
def test_greedy_generation_equals_argmax_of_a_full_sequential_forward(architecture, implicit, device):
    model, prompt = make_model(architecture, implicit).to(device), tokens(3, 5, seed=3).to(device)
    generated = model.generate(prompt, max_new_tokens=7)
    assert generated.shape == (3, 12) and torch.equal(generated[:, :5], prompt)
    with torch.no_grad():
        logits = model(generated, mode="sequential").logits
    assert torch.equal(logits[:, 4:-1].argmax(-1), generated[:, 5:])


@pytest.mark.slow
def test_generation_stops_at_eos_and_pads_finished_sequences():
    model, prompt = make_model("mamba2", True), tokens(3, 4, seed=4)
    free_run = model.generate(prompt, max_new_tokens=6)
    eos = int(free_run[0, 5])  # the second token the first sequence generates
    stopped = model.generate(prompt, max_new_tokens=6, eos_token_id=eos)
    assert torch.equal(stopped[0, :6], free_run[0, :6])
    assert bool((stopped[0, 6:] == eos).all())
    for row in range(3):  # every sequence either reached eos or matches the free run
        cut = (stopped[row, 4:] == eos).nonzero()
        end = 4 + int(cut[0]) + 1 if len(cut) else stopped.shape[1]
        assert torch.equal(stopped[row, :end], free_run[row, :end])


def test_sampling_is_reproducible_under_a_seed_and_respects_top_k():
    model, prompt = make_model("llama", False), tokens(4, 3, seed=5)

    def sample(seed, **settings):
        torch.manual_seed(seed)
        return model.generate(prompt, max_new_tokens=5, do_sample=True, **settings)

    assert torch.equal(sample(0, top_k=1), model.generate(prompt, max_new_tokens=5)), "top_k=1 sampling is greedy"
    wide = [sample(seed, top_k=0, temperature=5.0) for seed in (1, 1, 2)]
    assert torch.equal(wide[0], wide[1]) and not torch.equal(wide[0], wide[2])


@pytest.mark.slow
@pytest.mark.device
@pytest.mark.parametrize("architecture, implicit", VARIANTS, ids=IDS)
def test_beam_search_scores_equal_the_log_probability_of_its_sequences(architecture, implicit, device):
    # Beams are reordered at every step; a state that did not follow its beam would give
    # scores that a fresh forward pass over the returned sequence does not reproduce.
    model, prompt = make_model(architecture, implicit).to(device), tokens(2, 4, seed=11).to(device)
    out = model.generate(
        prompt, max_new_tokens=5, num_beams=3, length_penalty=0.0, return_dict_in_generate=True, output_scores=True
    )
    sequences = out.sequences
    assert sequences.shape == (2, 9)
    with torch.no_grad():
        log_probs = torch.log_softmax(model(sequences, mode="sequential").logits[:, 3:-1], dim=-1)
    expected = log_probs.gather(-1, sequences[:, 4:, None]).sum(dim=(1, 2))
    torch.testing.assert_close(out.sequences_scores.double(), expected, atol=1e-5, rtol=0)


@pytest.mark.slow
@pytest.mark.device
@pytest.mark.parametrize("architecture, implicit", VARIANTS, ids=IDS)
def test_generation_continues_from_a_given_state(architecture, implicit, device):
    model, ids = make_model(architecture, implicit).to(device), tokens(2, 6, seed=12).to(device)
    whole = model.generate(ids, max_new_tokens=4)
    with torch.no_grad():
        head = model(ids[:, :4], mode="sequential")
    continued = model.generate(ids[:, 4:], state=head.state, max_new_tokens=4)
    assert torch.equal(continued, whole[:, 4:])


@pytest.mark.slow
def test_generation_without_cache_rereads_the_sequence_and_agrees():
    model, prompt = make_model("mamba2", True), tokens(2, 4, seed=13)
    assert torch.equal(model.generate(prompt, max_new_tokens=4, use_cache=False), model.generate(prompt, max_new_tokens=4))


@pytest.mark.parametrize("architecture, implicit", VARIANTS, ids=IDS)
def test_generate_reads_the_prompt_once_then_each_token_alone_from_the_carried_state(architecture, implicit):
    # Whatever transformers' version and the name it carries caches under: were the state
    # dropped between steps, each step would re-read the whole sequence (the tokens would
    # still agree, the cost per token would grow with the sequence).
    model, prompt = make_model(architecture, implicit), tokens(2, 5, seed=15)
    calls = []
    model.register_forward_hook(lambda module, args, kwargs, output: calls.append((kwargs, output)), with_kwargs=True)
    model.generate(prompt, max_new_tokens=4)
    assert [kwargs["input_ids"].shape[1] for kwargs, _ in calls] == [5, 1, 1, 1]
    assert [kwargs["mode"] for kwargs, _ in calls] == ["simultaneous", "sequential", "sequential", "sequential"]
    assert calls[0][0].get("state") is None
    for (kwargs, _), (_, previous) in zip(calls[1:], calls[:-1]):
        assert kwargs["state"] is previous.state


def test_solver_budget_reaches_every_decoding_step():
    model, prompt = make_model("llama", True), tokens(2, 4, seed=14)
    calls = []
    model.register_forward_hook(lambda module, args, kwargs, output: calls.append((kwargs, output)), with_kwargs=True)
    model.generate(prompt, max_new_tokens=3, max_iter=2)
    assert [kwargs["mode"] for kwargs, _ in calls] == ["simultaneous", "sequential", "sequential"]
    assert all(kwargs["max_iter"] == 2 for kwargs, _ in calls)
    assert all(int(output.fixed_point.passes.max()) <= 2 for _, output in calls)


@pytest.mark.parametrize("architecture, implicit", VARIANTS, ids=IDS)
def test_auto_class_round_trip_gives_identical_logits(architecture, implicit, tmp_path):
    model, ids = make_model(architecture, implicit), tokens(2, 6, seed=6)
    model.save_pretrained(tmp_path, safe_serialization=True)
    reloaded = AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    assert type(reloaded) is type(model)
    with torch.no_grad():
        assert torch.equal(reloaded(ids).logits, model(ids).logits)


@pytest.mark.slow
@pytest.mark.parametrize("architecture, implicit", VARIANTS, ids=IDS)
def test_left_padding_leaves_the_real_tokens_logits_unchanged(architecture, implicit):
    model = make_model(architecture, implicit)
    short, long = tokens(1, 4, seed=7), tokens(1, 7, seed=8)
    batch = torch.cat([torch.cat([torch.zeros(1, 3, dtype=torch.long), short], dim=1), long])
    mask = torch.tensor([[0, 0, 0, 1, 1, 1, 1], [1] * 7])
    with torch.no_grad():
        padded = model(batch, attention_mask=mask)
        alone = model(short)
    # Explicit: the same arithmetic; implicit: two solves of one fixed point to 1e-7.
    tolerance = 1e-10 if not implicit else 1e-5
    torch.testing.assert_close(padded.logits[0, 3:], alone.logits[0], atol=tolerance, rtol=0)
    with torch.no_grad():
        torch.testing.assert_close(padded.logits[1], model(long).logits[0], atol=tolerance, rtol=0)


@pytest.mark.slow
@pytest.mark.parametrize("architecture, implicit", VARIANTS, ids=IDS)
def test_left_padding_after_a_state_leaves_the_real_tokens_and_the_next_state_unchanged(architecture, implicit):
    # Mamba's convolution must show the first real tokens the inputs before the padding
    # (held in the state), not the padding's zeros.
    model = make_model(architecture, implicit)
    head, tail, following = tokens(1, 5, seed=25), tokens(1, 3, seed=26), tokens(1, 2, seed=27)
    padded = torch.cat([torch.zeros(1, 2, dtype=torch.long), tail], dim=1)
    with torch.no_grad():
        state = model(head, use_cache=True).state
        alone = model(tail, state=state, use_cache=True)
        in_padding = model(padded, attention_mask=torch.tensor([[0, 0, 1, 1, 1]]), state=state, use_cache=True)
        after_alone = model(following, state=alone.state, mode="sequential")
        after_padding = model(following, state=in_padding.state, mode="sequential")
    tolerance = 1e-10 if not implicit else 1e-5
    torch.testing.assert_close(in_padding.logits[:, 2:], alone.logits, atol=tolerance, rtol=0)
    torch.testing.assert_close(after_padding.logits, after_alone.logits, atol=tolerance, rtol=0)


@pytest.mark.slow
@pytest.mark.parametrize("architecture, implicit", VARIANTS, ids=IDS)
def test_generation_from_a_left_padded_prompt_equals_unpadded_generation(architecture, implicit):
    model = make_model(architecture, implicit)
    short = tokens(1, 3, seed=9)
    padded = torch.cat([torch.zeros(1, 2, dtype=torch.long), short], dim=1)
    mask = torch.tensor([[0, 0, 1, 1, 1]])
    generated = model.generate(padded, max_new_tokens=5, attention_mask=mask)
    assert torch.equal(generated[:, 5:], model.generate(short, max_new_tokens=5)[:, 3:])


def padded_batch(prompts: list[torch.Tensor], side: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(ids, attention mask) of ``prompts`` (1-d) padded with id 0 on ``side`` to the longest."""
    width = max(len(prompt) for prompt in prompts)
    ids, mask = torch.zeros(len(prompts), width, dtype=torch.long), torch.zeros(len(prompts), width, dtype=torch.long)
    for row, prompt in enumerate(prompts):
        real = slice(width - len(prompt), None) if side == "left" else slice(None, len(prompt))
        ids[row, real], mask[row, real] = prompt, 1
    return ids, mask


@pytest.mark.slow
@pytest.mark.parametrize("side", ["left", "right"])
@pytest.mark.parametrize("architecture, implicit", EVERY_FAMILY,
                         ids=[f"{arch}-{'implicit' if implicit else 'explicit'}" for arch, implicit in EVERY_FAMILY])
def test_a_padded_batch_generates_what_its_prompts_generate_one_by_one(architecture, implicit, side):
    """Before: a right-padded prompt was continued from its last padding token (Mamba's convolution
    state held the padding's zeros, the head read a padding position), so its text differed."""
    model = make_model(architecture, implicit)
    prompts = [tokens(1, 3, seed=9)[0], tokens(1, 6, seed=10)[0], tokens(1, 1, seed=11)[0]]
    ids, mask = padded_batch(prompts, side)
    warnings = []
    handler = logging.Handler()
    handler.emit = warnings.append
    logging.getLogger("transformers.generation.utils").addHandler(handler)
    try:
        generated = model.generate(ids, attention_mask=mask, max_new_tokens=5, pad_token_id=0)
    finally:
        logging.getLogger("transformers.generation.utils").removeHandler(handler)
    # transformers' warning that right padding generates wrong text does not hold here.
    assert not [record for record in warnings if "right-padding" in record.getMessage()]
    # Re-reading the whole sequence at each token pads it the same way.
    assert torch.equal(model.generate(ids, attention_mask=mask, max_new_tokens=5, pad_token_id=0, use_cache=False),
                       generated)
    assert torch.equal(generated[:, :ids.shape[1]], ids)  # the prompts as given
    for row, prompt in enumerate(prompts):
        alone = model.generate(prompt[None], attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                               max_new_tokens=5, pad_token_id=0)
        assert torch.equal(generated[row, ids.shape[1]:], alone[0, len(prompt):])


def test_a_state_returned_after_right_padding_is_refused():
    """Before: the state held the padding (Mamba's convolution its zeros), and decoding from it
    continued the padding, not the text."""
    model = make_model("mamba2", False)
    ids, mask = padded_batch([tokens(1, 2, seed=12)[0], tokens(1, 4, seed=13)[0]], "right")
    with pytest.raises(ValueError, match=r"use_cache=True\) would hold the padding .*padding_side='left'"):
        model(ids, attention_mask=mask, use_cache=True)
    with torch.no_grad():
        scored = model(ids, attention_mask=mask)  # no state: the real tokens' logits, as alone
        alone = model(ids[:1, :2])
    torch.testing.assert_close(scored.logits[:1, :2], alone.logits, atol=1e-10, rtol=0)


def test_padded_sequential_run_is_refused():
    model = make_model("mamba2", True)
    with pytest.raises(ValueError, match="simultaneous"):
        model(tokens(1, 3, seed=10), attention_mask=torch.tensor([[0, 1, 1]]), mode="sequential")


IMPLICIT_VARIANTS = [("mamba2", True), ("llama", True)]


@pytest.mark.slow
@pytest.mark.parametrize("architecture, implicit", IMPLICIT_VARIANTS, ids=["mamba2", "llama"])
def test_chunked_simultaneous_solve_equals_the_whole_sequence_solve(architecture, implicit):
    # Left padding longer than a chunk (row 0's first chunk is all padding), a partial last
    # chunk, a state to start from, and the state left behind for decoding.
    model = make_model(architecture, implicit)
    ids, head = tokens(2, 11, seed=16), tokens(2, 3, seed=17)
    mask = torch.ones(2, 11, dtype=torch.long)
    mask[0, :5] = 0
    with torch.no_grad():
        start = model(head, use_cache=True).state
        whole = model(ids, attention_mask=mask, state=start, use_cache=True, chunk_length=0)
        chunked = model(ids, attention_mask=mask, state=start, use_cache=True, chunk_length=4)
        next_token = tokens(2, 1, seed=18)
        after_whole = model(next_token, state=whole.state, mode="sequential")
        after_chunked = model(next_token, state=chunked.state, mode="sequential")
    assert bool(whole.fixed_point.converged.all()) and bool(chunked.fixed_point.converged.all())
    real = mask.bool()
    torch.testing.assert_close(chunked.logits[real], whole.logits[real], atol=1e-5, rtol=0)
    torch.testing.assert_close(after_chunked.logits, after_whole.logits, atol=1e-5, rtol=0)
    assert chunked.fixed_point.passes.shape == (2,)


def test_a_left_padded_row_is_chunked_as_it_is_alone():
    # Its real tokens fall into the same chunks, so the same solves run: equal to float rounding.
    model, ids = make_model("mamba2", True), tokens(1, 7, seed=22)
    padded = torch.cat([torch.zeros(1, 3, dtype=torch.long), ids], dim=1)
    mask = torch.tensor([[0, 0, 0] + [1] * 7])
    with torch.no_grad():
        alone = model(ids, chunk_length=3, tol=1e-3)
        in_padding = model(padded, attention_mask=mask, chunk_length=3, tol=1e-3)
    torch.testing.assert_close(in_padding.logits[:, 3:], alone.logits, atol=1e-10, rtol=0)
    # The one more: the chunk of padding alone, settled at its first evaluation.
    assert torch.equal(in_padding.fixed_point.passes, alone.fixed_point.passes + 1)


@pytest.mark.slow
def test_chunked_solve_stats_add_up_the_chunks_solves():
    model, ids = make_model("mamba2", True), tokens(3, 10, seed=19)
    with torch.no_grad():
        chunked = model(ids, chunk_length=4).fixed_point
        # Counted back from the end: 2 + 4 + 4 tokens.
        first = model(ids[:, :2], use_cache=True)
        second = model(ids[:, 2:6], state=first.state, use_cache=True)
        third = model(ids[:, 6:], state=second.state)
    parts = [first.fixed_point, second.fixed_point, third.fixed_point]
    assert torch.equal(chunked.passes, sum(part.passes for part in parts))
    # A chunk reads a slice of the whole sequence's inputs, the separate call its own
    # contiguous copy: the same sums, in another memory layout, may round differently in
    # the last bit, and a residual of 1e-7 (a difference of two iterates) carries that
    # rounding as a relative 1e-16 / 1e-7.
    worst = torch.stack([part.rel_residual for part in parts]).amax(dim=0)
    torch.testing.assert_close(chunked.rel_residual, worst, rtol=1e-8, atol=0)
    # No pass beyond the solves': each chunk's state is kept from the pass that gave its answer.
    assert chunked.batch_passes == sum(part.batch_passes for part in parts)
    assert chunked.row_passes == sum(part.row_passes for part in parts)


def test_chunk_length_reaches_the_prefill_of_generate_and_defaults_to_the_options():
    model, prompt = make_model("llama", True), tokens(2, 9, seed=20)
    calls = []
    model.register_forward_hook(lambda module, args, kwargs, output: calls.append(output), with_kwargs=True)
    whole = model.generate(prompt, max_new_tokens=3, chunk_length=0)
    model.set_fixed_point_options(chunk_length=3)
    chunked = model.generate(prompt, max_new_tokens=3)
    assert torch.equal(chunked, whole)
    assert len(calls) == 6  # a prefill and two steps each
    with torch.no_grad():
        by_hand = [model(prompt, chunk_length=c, use_cache=True, logits_to_keep=1).fixed_point for c in (0, 3)]
    for prefill, expected in zip((calls[0], calls[3]), by_hand):
        assert prefill.fixed_point.batch_passes == expected.batch_passes
        assert torch.equal(prefill.fixed_point.passes, expected.passes)
    assert by_hand[0].batch_passes != by_hand[1].batch_passes


def test_chunk_length_is_checked_and_training_solves_the_whole_sequence():
    model, ids = make_model("mamba2", True), tokens(2, 8, seed=21)
    with pytest.raises(ValueError, match="chunk_length"):
        model(ids, chunk_length=-1)
    with pytest.raises(OptionError, match="chunk_length"):
        model.set_fixed_point_options(chunk_length=2.5)
    model.train()
    with torch.no_grad():
        assert torch.equal(model(ids, chunk_length=2).logits, model(ids, chunk_length=0).logits)


@dataclasses.dataclass
class PreviousOutput:
    z: torch.Tensor  # (batch, hidden): the last token's output, which the next token reads


class LinearChainStack(torch.nn.Module):
    """f(z)_t = a z_t + b z_{t-1} + u_t. One token alone contracts by a per iteration; a
    chain of them iterated together carries each error down the chain, where it grows as
    b^k (s choose k) before it decays, so a longer chunk needs many more iterations."""

    def __init__(self, hidden: int, a: float, b: float) -> None:
        super().__init__()
        self.hidden, self.a, self.b = hidden, a, b
        self.gradient_checkpointing = False

    def forward(self, z, injection, states=None, padding=None):
        previous = torch.zeros_like(z[:, 0]) if states is None else states[0].z
        shifted = torch.cat([previous[:, None], z[:, :-1]], dim=1)
        out = self.a * z + self.b * shifted + injection[..., : self.hidden]
        return out, [PreviousOutput(out[:, -1])]

    def select_state(self, states, rows):
        return [PreviousOutput(states[0].z.index_select(0, rows))]

    def replace_state_rows(self, states, rows, new):
        return [PreviousOutput(states[0].z.index_copy(0, rows, new[0].z))]


def test_chunk_rows_that_miss_the_tolerance_are_solved_again_in_smaller_chunks():
    model = make_model("llama", True)
    with_stack(model, LinearChainStack(model.config.hidden_size, a=0.5, b=0.4))
    ids = tokens(3, 8, seed=24)
    with torch.no_grad():
        exact = model(ids, chunk_length=0, max_iter=4000, tol=1e-9)
        four_tokens = model(ids[:, :4], chunk_length=0, max_iter=25, tol=1e-6)
        chunked = model(ids, chunk_length=4, max_iter=25, tol=1e-6)
    assert bool(exact.fixed_point.converged.all())
    assert not bool(four_tokens.fixed_point.converged.any()), "the case under test: 4 tokens together miss at 25"
    assert bool(chunked.fixed_point.converged.all())
    torch.testing.assert_close(chunked.logits, exact.logits, atol=1e-4, rtol=1e-5)
    # Both attempts of each chunk are counted: two of 4 tokens at the full budget, then the retries.
    assert bool((chunked.fixed_point.passes > 2 * 25).all())


def test_a_chunked_solve_fails_on_nonconvergence_only_after_its_retries():
    model = make_model("llama", True)
    with_stack(model, LinearChainStack(model.config.hidden_size, a=0.5, b=0.4))
    model.set_fixed_point_options(nonconvergence="error")
    ids = tokens(2, 8, seed=28)
    with torch.no_grad():
        assert bool(model(ids, chunk_length=4, max_iter=25, tol=1e-6).fixed_point.converged.all())
        with pytest.raises(NumericalFault, match="fixed point not reached for 2 of 2 samples"):
            model(ids, chunk_length=0, max_iter=25, tol=1e-6)
        with pytest.raises(NumericalFault, match="budget of 3"):  # single tokens miss too: retried, then refused
            model(ids, chunk_length=4, max_iter=3, tol=1e-6)



@pytest.mark.parametrize("depth, budgets", [(0, 1), (1, 3), (2, 7), (None, 15)])
def test_retries_are_bounded_by_the_retry_depth_and_counted_apart(depth, budgets):
    """Every piece misses a tolerance no 3 passes reach: each level of retries halves the chunk
    and spends the budget on every piece, and ``retry_depth`` bounds the levels (default 3: a
    chunk of 16 stops at pieces of 2, 15 budgets; before, single tokens: 31, unbounded by any
    option). The retries' passes are counted apart, per sample and in the tally."""
    model = make_model("llama", True)
    with_stack(model, LinearChainStack(model.config.hidden_size, a=0.5, b=0.4))
    if depth is not None:
        model.set_fixed_point_options(retry_depth=depth)
    ids = tokens(2, 16, seed=24)
    with torch.no_grad(), model.track_convergence() as tally:
        stats = model(ids, chunk_length=16, max_iter=3, tol=1e-12).fixed_point
    assert stats.passes.tolist() == [3 * budgets] * 2 and stats.retried.tolist() == [3 * budgets - 3] * 2
    figures = tally.as_dict()
    assert figures["fp_retried"] == (2 if budgets > 1 else 0) and figures["fp_retry_passes_mean"] == 3 * budgets - 3
