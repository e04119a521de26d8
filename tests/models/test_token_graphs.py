"""Decoding from captured token steps (``decoding_graphs``, ``generate(cuda_graphs=True)``): the
same tokens, logits and states as plain decoding. On a CUDA device (the GPU check) the steps
are captured graphs; on a CPU the same buffers run eagerly."""

from __future__ import annotations

import pytest
import torch

from implicitlm.core.errors import OptionError
from implicitlm.models.learned_solver import InitialGuess
from implicitlm.models.token_graphs import _tensors

from tests.support.models import family_model, token_ids

VOCAB = 24
PASSES = 3
# (family, implicit): Llama's state grows with every token, so its tokens decode eagerly in
# the block; they must still come out the same.
VARIANTS = [("mamba2", False), ("mamba2", True), ("llama", True)]
IDS = [f"{family}-{'implicit' if implicit else 'explicit'}" for family, implicit in VARIANTS]


def make_model(family: str, implicit: bool, device: str, dtype=torch.float64, guess: bool = False):
    model = family_model(family, implicit, VOCAB, torch.float32, fixed_point=dict(max_iter=50, tol=1e-6, passes=PASSES))
    if guess:
        model.attach_learned_guess(InitialGuess(16, readouts=model.stack.readout_sizes()).eval().requires_grad_(False))
    return model.to(device=device, dtype=dtype)


def decode(model, prompt: torch.Tensor, following: torch.Tensor):
    """Per token after the prompt: (logits, copies of the state's tensors)."""
    state = model(prompt, use_cache=True).state
    steps = []
    for t in range(following.shape[1]):
        output = model(following[:, t : t + 1], state=state, mode="sequential")
        state = output.state
        steps.append((output.logits, [None if x is None else x.clone() for x in _tensors(state)]))
    return steps


def assert_same_steps(graphed, plain, exact: bool) -> None:
    tolerance = dict(rtol=0, atol=0) if exact else {}
    for (logits, states), (plain_logits, plain_states) in zip(graphed, plain, strict=True):
        torch.testing.assert_close(logits, plain_logits, **tolerance)
        assert len(states) == len(plain_states)
        for state, plain_state in zip(states, plain_states):
            if plain_state is not None:
                torch.testing.assert_close(state, plain_state, **tolerance)


@pytest.mark.device
@pytest.mark.parametrize("family, implicit", VARIANTS, ids=IDS)
@pytest.mark.parametrize("guess", [False, True], ids=["from-zero", "learned-guess"])
def test_tokens_decoded_in_the_block_have_the_logits_and_states_of_plain_decoding(family, implicit, guess, device):
    if guess and not implicit:
        pytest.skip("an explicit model makes no solve to guess for")
    model = make_model(family, implicit, device, guess=guess)
    prompt, following = token_ids(2, 5, seed=1, vocab=VOCAB).to(device), token_ids(2, 6, seed=2, vocab=VOCAB).to(device)
    with torch.no_grad():
        plain = decode(model, prompt, following)
        with model.decoding_graphs():
            graphed = decode(model, prompt, following)
    # Eagerly the same operations run on the same numbers; a replayed graph runs the kernels
    # it captured, which cuBLAS may pick otherwise than an eager call.
    assert_same_steps(graphed, plain, exact=not device.startswith("cuda"))


@pytest.mark.device
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["float32", "bfloat16"])
@pytest.mark.parametrize("implicit", [False, True], ids=["explicit", "implicit"])
def test_graphed_generation_gives_the_tokens_of_plain_generation(implicit, dtype, device):
    model = make_model("mamba2", implicit, device, dtype=dtype)
    prompt = token_ids(3, 4, seed=3, vocab=VOCAB).to(device)
    # The prompt read token by token: a parallel prefill would tune the fused kernel (on a GPU,
    # a minute per dtype) for what this test does not look at.
    options = dict(max_new_tokens=8, do_sample=False, mode="sequential")
    plain = model.generate(prompt, cuda_graphs=False, **options)
    graphed = model.generate(prompt, cuda_graphs=True, **options)
    assert torch.equal(graphed, plain)
    if implicit:
        assert model.generation_convergence["fp_fixed_points"] == 3 * (4 + 7)  # each prompt token, then 7


@pytest.mark.device
def test_a_state_from_outside_the_block_is_read_never_written(device):
    """Two continuations of one prefill, and two sequences decoded in turn: each token starts
    from the state it is given, which the step copies in and leaves as it was."""
    model = make_model("mamba2", True, device)
    prompt, other, following = (token_ids(1, 4, seed=seed, vocab=VOCAB).to(device) for seed in (4, 5, 6))
    with torch.no_grad():
        plain = [decode(model, start, following) for start in (prompt, other)]
        with model.decoding_graphs():
            prefill = model(prompt, use_cache=True).state
            kept = [x.clone() for x in _tensors(prefill)]
            first = model(following[:, :1], state=prefill, mode="sequential").logits
            again = model(following[:, :1], state=prefill, mode="sequential").logits
            assert all(torch.equal(x, y) for x, y in zip(_tensors(prefill), kept))
            states = [model(start, use_cache=True).state for start in (prompt, other)]
            interleaved = [[], []]
            for t in range(following.shape[1]):
                for index in (0, 1):
                    output = model(following[:, t : t + 1], state=states[index], mode="sequential")
                    # The step's buffers are shared: the other sequence's next token overwrites them.
                    states[index] = [block.__class__(**{k: v.clone() for k, v in vars(block).items()})
                                     for block in output.state]
                    interleaved[index].append((output.logits, [x.clone() for x in _tensors(states[index])]))
    torch.testing.assert_close(again, first, rtol=0, atol=0)
    for graphed, reference in zip(interleaved, plain):
        assert_same_steps(graphed, reference, exact=not device.startswith("cuda"))


def test_a_solve_to_the_tolerance_decodes_as_without_the_block():
    model = make_model("mamba2", True, "cpu")
    prompt, following = token_ids(2, 4, seed=7, vocab=VOCAB).to("cpu"), token_ids(2, 3, seed=8, vocab=VOCAB).to("cpu")
    model.set_fixed_point_options(passes=0)
    with torch.no_grad():
        plain = decode(model, prompt, following)
        with model.decoding_graphs():
            graphed = decode(model, prompt, following)
            assert not any(model._token_graphs._steps.values())
    assert_same_steps(graphed, plain, exact=True)


def test_capturing_graphs_of_a_model_off_cuda_is_refused():
    model = make_model("mamba2", True, "cpu")
    with pytest.raises(OptionError, match="CUDA graphs need a model on a CUDA device; this one is on cpu"):
        with model.decoding_graphs(capture=True):
            pass
