"""The forward options transformers users pass: inputs_embeds, output_hidden_states,
position_ids, logits_to_keep and transformers' per-call kwargs, in forward and in generate()."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from tests.models.test_generation import IDS, VARIANTS, make_model, tokens


def head_logits(model, hidden: torch.Tensor) -> torch.Tensor:
    return F.linear(hidden, model.embeddings.weight)[..., : model.config.vocab_size]


@pytest.mark.slow
@pytest.mark.parametrize("architecture, implicit", VARIANTS, ids=IDS)
def test_inputs_embeds_give_the_logits_of_their_ids(architecture, implicit):
    model, ids = make_model(architecture, implicit), tokens(2, 7, seed=10)
    with torch.no_grad():
        from_ids = model(ids).logits
        from_embeds = model(inputs_embeds=model.embeddings(ids)).logits
    assert torch.equal(from_embeds, from_ids)


def test_exactly_one_of_ids_and_embeds_is_required():
    model, ids = make_model("mamba2", False), tokens(1, 3, seed=0)
    with pytest.raises(ValueError, match="exactly one of input_ids and inputs_embeds"):
        model(ids, inputs_embeds=model.embeddings(ids))
    with pytest.raises(ValueError, match="exactly one"):
        model()


@pytest.mark.parametrize("architecture", ["mamba2", "llama"])
def test_explicit_hidden_states_are_each_blocks_input_and_the_normed_output(architecture):
    model, ids = make_model(architecture, False), tokens(2, 6, seed=11)
    with torch.no_grad():
        output = model(ids, output_hidden_states=True)
        hidden = output.hidden_states
        layers = model.stack.layers
        assert len(hidden) == len(layers) + 1
        assert torch.equal(hidden[0], model.embeddings(ids))
        for i, layer in enumerate(layers[:-1]):
            torch.testing.assert_close(hidden[i + 1], layer(hidden[i], None, None)[0], atol=1e-12, rtol=0)
        last = model.stack.norm_f(layers[-1](hidden[-2], None, None)[0])
        torch.testing.assert_close(hidden[-1], last, atol=1e-12, rtol=0)
    assert torch.equal(head_logits(model, hidden[-1]), output.logits)


@pytest.mark.parametrize("architecture", ["mamba2", "llama"])
def test_implicit_hidden_states_are_one_pass_at_the_fixed_point(architecture):
    model, ids = make_model(architecture, True), tokens(2, 6, seed=12)
    with torch.no_grad():
        output = model(ids, output_hidden_states=True)
        hidden = output.hidden_states
        assert bool(output.fixed_point.converged.all())
        injection = model.injection(model.injection_norm(model.embeddings(ids)))
        # The first block reads z*, the head reads z*: both are the fixed point itself.
        assert torch.equal(hidden[0], hidden[-1])
        torch.testing.assert_close(hidden[1], model.stack.layers[0](hidden[0], injection, None)[0], atol=1e-12, rtol=0)
        # z* is a fixed point: one more pass of the whole stack returns it.
        torch.testing.assert_close(model.stack(hidden[0], injection)[0], hidden[-1], atol=1e-5, rtol=0)
    assert torch.equal(head_logits(model, hidden[-1]), output.logits)


@pytest.mark.slow
@pytest.mark.parametrize("architecture, implicit", VARIANTS, ids=IDS)
def test_sequential_mode_gives_the_hidden_states_of_simultaneous_mode(architecture, implicit):
    model, ids = make_model(architecture, implicit), tokens(2, 6, seed=13)
    with torch.no_grad():
        parallel = model(ids, output_hidden_states=True).hidden_states
        recurrent = model(ids, mode="sequential", output_hidden_states=True).hidden_states
    # Implicit: two solves of one fixed point, each to a relative residual of 1e-7; the
    # blocks' outputs inside the pass carry that distance amplified by their gain.
    tolerance = 1e-9 if not implicit else 1e-4
    for a, b in zip(parallel, recurrent, strict=True):
        torch.testing.assert_close(b, a, atol=tolerance, rtol=0)


def test_hidden_states_follow_the_config_default_and_the_tuple_form():
    model, ids = make_model("mamba2", False), tokens(1, 4, seed=14)
    with torch.no_grad():
        assert model(ids).hidden_states is None
        model.config.output_hidden_states = True
        assert len(model(ids).hidden_states) == 3
        as_tuple = model(ids, return_dict=False)
    assert len(as_tuple[-1]) == 3  # (logits, state, hidden_states)


@pytest.mark.slow
@pytest.mark.parametrize("architecture, implicit", VARIANTS, ids=IDS)
def test_generate_returns_the_hidden_states_of_every_step(architecture, implicit):
    model, prompt = make_model(architecture, implicit), tokens(2, 5, seed=15)
    plain = model.generate(prompt, max_new_tokens=4)
    out = model.generate(prompt, max_new_tokens=4, output_hidden_states=True, return_dict_in_generate=True)
    assert torch.equal(out.sequences, plain)
    assert len(out.hidden_states) == 4  # the prefill, then one per decoded token but the last
    assert out.hidden_states[0][-1].shape[:2] == (2, 5) and out.hidden_states[1][-1].shape[:2] == (2, 1)
    for step, hidden in enumerate(out.hidden_states):
        chosen = head_logits(model, hidden[-1][:, -1]).argmax(-1)
        assert torch.equal(chosen, out.sequences[:, 5 + step])


@pytest.mark.slow
@pytest.mark.parametrize("architecture, implicit", VARIANTS, ids=IDS)
def test_generate_from_inputs_embeds_equals_generate_from_ids(architecture, implicit):
    model, prompt = make_model(architecture, implicit), tokens(2, 5, seed=16)
    from_ids = model.generate(prompt, max_new_tokens=4)
    with torch.no_grad():
        embeds = model.embeddings(prompt)
    from_embeds = model.generate(inputs_embeds=embeds, max_new_tokens=4)
    # Given embeddings only, generate() returns the new tokens only (transformers' convention).
    assert torch.equal(from_embeds, from_ids[:, 5:])


@pytest.mark.slow
@pytest.mark.parametrize("architecture", ["mamba2", "llama"])
def test_position_ids_of_the_token_order_are_accepted(architecture):
    model, ids = make_model(architecture, True), tokens(2, 6, seed=17)
    mask = torch.ones(2, 6, dtype=torch.long)
    mask[0, :2] = 0  # left padding, as a batched prompt has it
    positions = (mask.cumsum(-1) - 1).masked_fill(mask == 0, 1)  # what generate() computes
    with torch.no_grad():
        without = model(ids, attention_mask=mask).logits
        given = model(ids, attention_mask=mask, position_ids=positions).logits
        shared = model(ids[1:], position_ids=torch.arange(6)[None]).logits
        head = model(ids[1:, :4], mode="sequential")
        tail = model(ids[1:, 4:], mode="sequential", state=head.state, position_ids=torch.tensor([[4, 5]]))
    assert torch.equal(given, without)
    assert torch.equal(shared, model(ids[1:]).logits)
    assert tail.logits.shape == (1, 2, model.config.vocab_size)


@pytest.mark.parametrize(
    "positions, mask",
    [
        (torch.arange(6)[None] + 3, None),  # an offset without a state to continue
        (torch.tensor([[0, 1, 2, 0, 1, 2]]), None),  # packed documents restarting at 0
        (torch.tensor([[1, 1, 0, 1, 2, 4]]), torch.tensor([[0, 0, 1, 1, 1, 1]])),  # a gap after padding
    ],
    ids=["offset", "packed", "gap"],
)
def test_position_ids_the_model_cannot_honour_are_refused(positions, mask):
    model, ids = make_model("llama", False), tokens(1, 6, seed=18)
    with pytest.raises(ValueError, match="position_ids must number the real tokens"):
        model(ids, attention_mask=mask, position_ids=positions)


@pytest.mark.slow
def test_loss_is_normalised_by_num_items_in_batch():
    model, ids = make_model("mamba2", True), tokens(2, 6, seed=19)
    with torch.no_grad():
        mean = model(ids, labels=ids).loss
        summed = model(ids, labels=ids, num_items_in_batch=7).loss
    torch.testing.assert_close(summed * 7, mean * 2 * 5, atol=1e-10, rtol=0)  # 2 rows of 5 shifted labels


def test_trainer_passes_item_counts_only_for_shifted_labels():
    assert make_model("mamba2", True).accepts_loss_kwargs
    words = make_model("mamba2", True)
    words.config.label_alignment = "aligned"
    assert not words.accepts_loss_kwargs


@pytest.mark.parametrize(
    "options, error, message",
    [
        (dict(max_iters=5), TypeError, "unexpected keyword argument.*max_iters"),
        (dict(output_attentions=True), ValueError, "output_attentions is not supported"),
        (dict(cu_seq_lens_q=torch.tensor([0, 3, 6])), ValueError, "packed sequences"),
        (dict(is_causal=False), ValueError, "is_causal=False"),
    ],
    ids=["typo", "attentions", "packed", "bidirectional"],
)
def test_per_call_options_the_model_cannot_honour_are_refused(options, error, message):
    model, ids = make_model("mamba2", True), tokens(1, 6, seed=20)
    with pytest.raises(error, match=message):
        model(ids, **options)


def test_transformers_bookkeeping_options_leave_the_logits_unchanged():
    model, ids = make_model("mamba2", True), tokens(1, 6, seed=21)
    with torch.no_grad():
        plain = model(ids).logits
        with_options = model(ids, output_attentions=False, max_length_q=6, max_length_k=6, is_causal=True).logits
    assert torch.equal(with_options, plain)


@pytest.mark.slow
@pytest.mark.parametrize("architecture, implicit", VARIANTS, ids=IDS)
def test_logits_to_keep_gives_those_positions_of_the_full_logits(architecture, implicit):
    model, ids = make_model(architecture, implicit), tokens(2, 7, seed=21)
    with torch.no_grad():
        full = model(ids).logits
        assert torch.equal(model(ids, logits_to_keep=3).logits, full[:, -3:])
        assert torch.equal(model(ids, logits_to_keep=0).logits, full)
        assert torch.equal(model(ids, logits_to_keep=torch.tensor([0, 4])).logits, full[:, [0, 4]])


@pytest.mark.parametrize("keep, message", [
    (-1, "non-negative integer"), (1.5, "non-negative integer"), (torch.ones(2, 2, dtype=torch.long), "1-d integers"),
])
def test_logits_to_keep_that_names_no_positions_is_refused(keep, message):
    model, ids = make_model("mamba2", False), tokens(1, 4, seed=0)
    with pytest.raises(ValueError, match=message):
        model(ids, logits_to_keep=keep)


def test_a_loss_with_partial_logits_is_refused():
    model, ids = make_model("mamba2", False), tokens(1, 4, seed=0)
    with pytest.raises(ValueError, match="logits_to_keep=0"):
        model(ids, labels=ids, logits_to_keep=1)


@pytest.mark.slow
@pytest.mark.parametrize("architecture, implicit", VARIANTS, ids=IDS)
def test_generate_computes_the_prompts_last_logits_only(architecture, implicit):
    model, prompt = make_model(architecture, implicit), tokens(2, 5, seed=22)
    widths = []
    hook = model.register_forward_hook(lambda module, args, output: widths.append(output.logits.shape[1]))
    try:
        sequences = model.generate(prompt, max_new_tokens=3)
    finally:
        hook.remove()
    assert widths == [1, 1, 1]  # the prefill's last position, then one per new token
    assert torch.equal(model.generate(prompt, max_new_tokens=3, logits_to_keep=0), sequences)


@pytest.mark.parametrize("architecture", ["mamba2", "llama"])
def test_a_calls_fixed_point_options_are_its_own_and_the_models_stay(architecture):
    """``fixed_point`` of one forward or one generation: what the model gives with those options
    set, its own options unchanged for every other call."""
    model, ids = make_model(architecture, True), tokens(2, 7, seed=12)
    configured = make_model(architecture, True)
    configured.load_state_dict(model.state_dict())
    changes = {"solver": "anderson", "max_iter": 3, "tol": 1e-2, "chunk_length": 4, "retry_depth": 0}
    configured.set_fixed_point_options(**changes)
    own = model.solver.options
    with torch.no_grad():
        given, set_on_model = model(ids, fixed_point=changes), configured(ids)
        assert torch.equal(given.logits, set_on_model.logits)
        assert given.fixed_point.solver == "anderson" and int(given.fixed_point.passes.max()) <= 6
        assert model.solver.options == own and not torch.equal(model(ids).logits, given.logits)
        generated = model.generate(ids, max_new_tokens=3, do_sample=False, fixed_point={"passes": 1})
        configured.set_fixed_point_options(passes=1)
        assert torch.equal(generated, configured.generate(ids, max_new_tokens=3, do_sample=False))
    assert model.solver.options == own
