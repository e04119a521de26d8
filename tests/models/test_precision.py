"""Half precision is a first-class dtype: every inference path of every family, implicit and
explicit, in float32, bfloat16 and float16, against a float64 model of the same weights; the
lm-eval adapter and a training step in bfloat16; and the sums and states that stay in float32
whatever the model's dtype (SSM states, residual norms, the loss's logits).

How close is close enough. Errors are measured relative to the largest |logit| of the float64
reference and stated in units of the dtype's machine epsilon (bfloat16 7.8e-3, float16 9.8e-4,
float32 1.2e-7), so one bound serves all three dtypes:
- explicit models: one pass, every operation rounded once; measured at most 2.6 epsilons,
  bound 6;
- implicit models: the solve stops at a relative residual of the precision's floor (two
  epsilons, ``deq.residuals.residual_floor``: a half-precision map cannot get much closer), and an
  iterate that close to the fixed point is off by about that residual over one minus the map's
  contraction rate; these test models contract at about 0.7 per iteration, so a few floors:
  measured at most 12 epsilons (float32 Mamba2), bound 24.
On CUDA, Mamba2's scan is mamba_ssm's fused kernel, whose float32 products are TF32 (a 10-bit
mantissa, as torch's "high" matmul precision): there float32 Mamba2 is held to TF32's epsilon,
2^-10 (the H100 run of 2026-11-27: at most 0.014 of it, 115 float32 epsilons).
"""

from __future__ import annotations

import copy
import json

import pytest
import torch
import torch.nn.functional as F

import implicitlm.models  # noqa: F401  (registers the Auto classes)
from implicitlm.cli import main
from implicitlm.data.tokenizer import train_tokenizer
from implicitlm.deq import FixedPointOptions, FixedPointSolver
from implicitlm.deq import residuals
from implicitlm.deq.residuals import residual_floor
from implicitlm.layers.ssd import ssd_chunked, ssd_reference
from implicitlm.layers.ssd_kernel import fused_ssd_kernel
from implicitlm.models import build_model, config_from_options
from implicitlm.models.loss import token_cross_entropy

from tests.support.contractive import make_contractive
from tests.support.solving import solved

FAMILIES = {
    "mamba2": dict(state_size=8, head_dim=8, chunk_size=4),
    "mamba": dict(state_size=8),
    "llama": dict(num_attention_heads=2),
}
VARIANTS = [(family, implicit) for family in FAMILIES for implicit in (False, True)]
VARIANT_IDS = [f"{family}-{'implicit' if implicit else 'explicit'}" for family, implicit in VARIANTS]
DTYPES = [torch.float32, torch.bfloat16, torch.float16]
DTYPE_IDS = ["float32", "bfloat16", "float16"]
# The error bounds, in epsilons of the dtype relative to the largest reference |logit| (see above).
EXPLICIT_EPSILONS = 6
IMPLICIT_EPSILONS = 24
TF32_EPSILON = 2.0**-10
SENTENCES = [
    "The sun rises in the east and sets in the west.",
    "Bees make honey from the flowers in the field.",
    "A small village lay at the foot of the mountain.",
] * 4
PROMPT, NEW_TOKENS = 5, 5


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    return train_tokenizer(SENTENCES, 300, tmp_path_factory.mktemp("tokenizer"))


@pytest.fixture(scope="module")
def float64_models(tokenizer):
    """One float64 model per variant, contractive where implicit; every solve tolerance is
    below every floor, so each dtype's solves stop at its own floor."""
    models = {}
    for family, implicit in VARIANTS:
        torch.manual_seed(0)
        config = config_from_options(dict(
            architecture=family, vocab_size=len(tokenizer), hidden_size=16, num_hidden_layers=2, implicit=implicit,
            initializer_range=0.1, fixed_point=dict(max_iter=400, tol=1e-12), **FAMILIES[family],
        ))
        model = build_model(config).double().eval()
        models[family, implicit] = faster_contracting(make_contractive(model)) if implicit else model
    return models


def faster_contracting(model):
    """``make_contractive``'s Mamba2 contracts at about 0.9 per iteration (its error would be
    tens of floors); a larger update that reads z less, as it makes Llama's and Mamba's
    (input projection halved, output projection tripled), brings it to about 0.7."""
    if model.config.model_type == "implicit_mamba2":
        with torch.no_grad():
            for layer in model.stack.layers:
                layer.mixer.in_proj.parametrizations.weight.original0.mul_(0.5)
                layer.mixer.out_proj.parametrizations.weight.original0.mul_(3.0)
    return model


def tokens(tokenizer, batch: int, length: int, seed: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(0, len(tokenizer), (batch, length), generator=generator)


def largest_difference(actual: torch.Tensor, reference: torch.Tensor) -> float:
    return float((actual.double().cpu() - reference.double().cpu()).abs().max())


def relative_error(actual: torch.Tensor, reference: torch.Tensor) -> float:
    return largest_difference(actual, reference) / float(reference.abs().max())


def reference_logits(reference, ids: torch.Tensor) -> torch.Tensor:
    """The float64 model's logits, on the CPU whatever the device of ``ids``."""
    with torch.no_grad():
        return reference(ids.cpu()).logits


def epsilon(dtype: torch.dtype, family: str, device: str) -> float:
    """The machine epsilon of the arithmetic the model runs: TF32's for float32 Mamba2 on CUDA."""
    fused = family == "mamba2" and torch.device(device).type == "cuda" and fused_ssd_kernel() is not None
    return TF32_EPSILON if dtype == torch.float32 and fused else torch.finfo(dtype).eps


def bound(epsilon: float, implicit: bool) -> float:
    return (IMPLICIT_EPSILONS if implicit else EXPLICIT_EPSILONS) * epsilon


def parallel(model, reference, ids, tokenizer):
    """The whole sequence in one simultaneous solve."""
    with torch.no_grad():
        output = model(ids, chunk_length=0)
        return output.logits, reference_logits(reference, ids), output.fixed_point


def chunked(model, reference, ids, tokenizer):
    """Simultaneous mode in chunks of 4 tokens, each from the state the previous one left."""
    with torch.no_grad():
        output = model(ids, chunk_length=4)
        return output.logits, reference_logits(reference, ids), output.fixed_point


def sequential(model, reference, ids, tokenizer):
    """Token by token, as an RNN."""
    with torch.no_grad():
        output = model(ids, mode="sequential")
        return output.logits, reference_logits(reference, ids), output.fixed_point


def prefill_then_decode(model, reference, ids, tokenizer):
    """A parallel prefill whose state (float32 SSM states from the chunked scan) the
    one-token steps continue."""
    with torch.no_grad():
        prefill = model(ids[:, :PROMPT], use_cache=True)
        decoded = model(ids[:, PROMPT:], mode="sequential", state=prefill.state)
        return torch.cat([prefill.logits, decoded.logits], dim=1), reference_logits(reference, ids), decoded.fixed_point


def _generated_logits(model, reference, out, prompt_length: int):
    """generate()'s raw logits of each new token, and the float64 model's for the same tokens."""
    return torch.stack(out.logits, dim=1), reference_logits(reference, out.sequences)[:, prompt_length - 1 : -1]


def greedy(model, reference, ids, tokenizer):
    """Greedy decoding: each token the argmax of its own logits, which match the float64
    model's on the generated sequence."""
    out = model.generate(ids[:, :PROMPT], max_new_tokens=NEW_TOKENS, do_sample=False, output_logits=True,
                         return_dict_in_generate=True)
    logits, expected = _generated_logits(model, reference, out, PROMPT)
    assert torch.equal(out.sequences[:, PROMPT:], logits.argmax(-1))
    return logits, expected, model.generation_convergence


def sampling(model, reference, ids, tokenizer):
    """Sampling under a seed: reproducible, every token among the top k of its logits."""
    def sample():
        torch.manual_seed(3)
        return model.generate(ids[:, :PROMPT], max_new_tokens=NEW_TOKENS, do_sample=True, top_k=4,
                              output_logits=True, return_dict_in_generate=True)

    out = sample()
    assert torch.equal(sample().sequences, out.sequences)
    logits, expected = _generated_logits(model, reference, out, PROMPT)
    # Ties at the fourth logit (common in half precision) are all kept, as top-k sampling keeps them.
    fourth = logits.topk(4, dim=-1).values[..., -1:]
    assert bool((logits.gather(-1, out.sequences[:, PROMPT:, None]) >= fourth).all())
    return logits, expected, model.generation_convergence


def beams(model, reference, ids, tokenizer):
    """Beam search: each returned sequence's score is its log-probability under the float64
    model; the comparison is of log-probabilities (sums over the new tokens), not logits."""
    out = model.generate(ids[:, :PROMPT], max_new_tokens=NEW_TOKENS, num_beams=3, length_penalty=0.0,
                         return_dict_in_generate=True, output_scores=True)
    sequences = out.sequences.cpu()
    logits = reference_logits(reference, sequences)
    log_probs = F.log_softmax(logits[:, PROMPT - 1 : -1], dim=-1)
    expected = log_probs.gather(-1, sequences[:, PROMPT:, None]).sum(dim=(1, 2))
    # A log-softmax moves by at most twice its logits' error, and the sum adds NEW_TOKENS of them.
    scale = 2 * NEW_TOKENS * logits.abs().max()
    return out.sequences_scores[:, None], expected[:, None], model.generation_convergence, scale


def left_padding(model, reference, ids, tokenizer):
    """A batch whose first row is left-padded by two tokens: its real tokens' generation
    is the float64 model's, unpadded."""
    prompt, mask = ids[:, :PROMPT].clone(), torch.ones(ids.shape[0], PROMPT, dtype=torch.long, device=ids.device)
    prompt[0, :2], mask[0, :2] = 0, 0
    out = model.generate(prompt, attention_mask=mask, max_new_tokens=NEW_TOKENS, do_sample=False, output_logits=True,
                         return_dict_in_generate=True)
    expected = reference_logits(reference, out.sequences[:1, 2:])[:, PROMPT - 3 : -1]
    return torch.stack(out.logits, dim=1)[:1], expected, model.generation_convergence


def lm_eval_adapter(model, reference, ids, tokenizer):
    """lm-eval's loglikelihood requests through the adapter, against the adapter over the
    float64 model: log-probabilities of whole continuations. (A machine set up for the
    GPU check has no lm-eval: there this path alone is skipped.)"""
    Instance = pytest.importorskip("lm_eval.api.instance").Instance
    from implicitlm.eval.harness import ImplicitLMHarness
    pairs = [("The sun rises in the", " east and sets"), ("Bees make", " honey from the flowers")]
    requests = [Instance("loglikelihood", {}, pair, index) for index, pair in enumerate(pairs)]

    def scores(lm_model):
        lm = ImplicitLMHarness(lm_model, tokenizer=tokenizer, progress=False, batch_size=2, device=str(lm_model.device))
        return torch.tensor([[logprob] for logprob, _ in lm.loglikelihood(requests)], dtype=torch.float64), lm

    actual, lm = scores(model)
    expected, _ = scores(reference)
    longest = max(len(tokenizer.encode(context + continuation)) for context, continuation in pairs)
    scale = 2 * longest * reference_logits(reference, ids).abs().max()
    return actual, expected, lm.convergence.as_dict(), scale


# Each path returns (its output, the float64 model's, its convergence: stats or a tally) and,
# where the output is not logits, the scale its error is measured against.
PATHS = [parallel, chunked, sequential, prefill_then_decode, greedy, sampling, beams, left_padding, lm_eval_adapter]


@pytest.mark.slow
@pytest.mark.device
@pytest.mark.parametrize("path", PATHS, ids=[path.__name__ for path in PATHS])
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("family, implicit", VARIANTS, ids=VARIANT_IDS)
def test_every_path_in_every_dtype_agrees_with_float64(family, implicit, dtype, path, float64_models, tokenizer, device):
    reference = float64_models[family, implicit]
    model = copy.deepcopy(reference).to(device=device, dtype=dtype)
    ids = tokens(tokenizer, 2, PROMPT + NEW_TOKENS, seed=1).to(device)
    actual, expected, convergence, *scale = path(model, reference, ids, tokenizer)
    assert actual.dtype in (dtype, torch.float32, torch.float64) and bool(torch.isfinite(actual).all())
    scale = float(scale[0]) if scale else float(expected.abs().max())
    error = largest_difference(actual, expected) / scale
    eps = epsilon(dtype, family, device)
    assert error <= bound(eps, implicit), f"{error / eps:.3g} epsilons"
    if implicit:
        _assert_converged(convergence)


def _assert_converged(convergence) -> None:
    """Every fixed point under its tolerance, the floor of its dtype: none spun to the budget."""
    if isinstance(convergence, dict):
        assert convergence["fp_not_converged"] == 0, convergence
    else:
        assert bool(convergence.converged.all()), convergence.residual.max()


# What stays in float32 whatever the model's dtype.


@pytest.mark.parametrize("scan", ["chunked", "step"])
def test_a_half_precision_ssm_keeps_its_state_in_float32_and_loses_no_small_contribution(scan):
    """Decay near 1 and small inputs: the state grows to hundreds of times each token's
    contribution. A bfloat16 state (8 bits) would round every late contribution away; the
    float32 state keeps them, so the bfloat16 scan's state is the float64 scan's of the same
    rounded inputs to bfloat16's rounding of the inputs, not to the drift of a rounded sum."""
    generator = torch.Generator().manual_seed(0)
    batch, length, heads, headdim, d_state = 1, 1024, 2, 4, 8
    x = (torch.rand(batch, length, heads, headdim, generator=generator) + 0.5).bfloat16()
    dt = torch.full((batch, length, heads), 0.01).bfloat16()
    B = (torch.rand(batch, length, 1, d_state, generator=generator) + 0.5).bfloat16()
    C = torch.rand(batch, length, 1, d_state, generator=generator).bfloat16()
    A = torch.full((heads,), -1e-3)
    if scan == "chunked":
        _, state = ssd_chunked(x, dt, A, B, C, chunk_size=16)
    else:
        _, state = ssd_reference(x, dt, A, B, C)
    _, exact = ssd_reference(*(t.double() for t in (x, dt, A, B, C)))
    assert state.dtype == torch.float32 and exact.abs().min() > 100 * (dt[0, 0, 0] * 0.5 * 0.5)
    # The chunked scan rounds each chunk's products to bfloat16 once; the state does not drift.
    assert relative_error(state, exact) < 2 * torch.finfo(torch.bfloat16).eps


@pytest.mark.parametrize("family", ["mamba2", "mamba"])
def test_every_mamba_state_is_float32_in_a_bfloat16_model(family, float64_models):
    model = copy.deepcopy(float64_models[family, True]).bfloat16()
    ids = torch.arange(10)[None] % 50
    with torch.no_grad():
        prefill = model(ids[:, :6], use_cache=True)
        decoded = model(ids[:, 6:], mode="sequential", state=prefill.state)
    for state in (model.stack.initial_state(1, dtype=torch.bfloat16), prefill.state, decoded.state):
        assert all(layer.ssm.dtype == torch.float32 and layer.conv.dtype == torch.bfloat16 for layer in state)


def test_residual_norms_are_float32_sums_where_a_float16_sum_of_squares_overflows():
    """70,000 entries of about 2: their sum of squares (2.8e5) is past float16's largest
    number (65,504); a float16 norm is infinite, and the solve would take every sample for
    diverged."""
    z0 = torch.zeros(2, 70_000, dtype=torch.float16)
    solver = FixedPointSolver(FixedPointOptions(max_iter=64))
    z, stats = solved(solver, lambda z: 0.5 * z + 1, z0, tol=1e-3)
    assert stats.rel_residual.dtype == torch.float32 and bool(torch.isfinite(stats.abs_residual).all())
    assert bool(stats.converged.all()) and not bool(stats.diverged.any())
    assert z.dtype == torch.float16 and relative_error(z, torch.full_like(z, 2.0)) <= residual_floor(torch.float16)


def contraction(z: torch.Tensor) -> torch.Tensor:
    """A map whose iterates settle: z -> 0.6 z + sin(z) / 4 + 1, elementwise."""
    return 0.6 * z + torch.sin(z) / 4 + 1


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bfloat16", "float16"])
def test_a_tolerance_below_the_precisions_floor_is_raised_to_it_and_the_solve_stops(dtype, caplog, monkeypatch):
    """The default evaluation tolerance, 1e-3, is below bfloat16's floor: without the floor
    every bfloat16 solve would spin to its budget; with it, each stops in a few iterations,
    the stats say which tolerance was held, and one line (once, not at every solve) says why."""
    solver = FixedPointSolver(FixedPointOptions(max_iter=200))
    z0 = torch.zeros(4, 512, dtype=dtype)
    monkeypatch.setattr(residuals, "_RAISED_TOLERANCES", set())  # as in a fresh process
    with caplog.at_level("WARNING", logger="implicitlm"):
        z, stats = solved(solver, contraction, z0, tol=1e-6)
        solved(solver, contraction, z0, tol=1e-6)
    [line] = [record.getMessage() for record in caplog.records]
    assert "below what a" in line and f"{residual_floor(dtype):.3g}" in line
    assert stats.tol == residual_floor(dtype) == 2 * torch.finfo(dtype).eps
    assert bool(stats.converged.all()) and int(stats.passes.max()) < 40
    exact, _ = solved(solver, contraction, z0.double(), tol=1e-12)
    assert relative_error(z, exact) < 8 * torch.finfo(dtype).eps
    # A float64 map keeps the tolerance it was given.
    assert solved(solver, contraction, z0.double(), tol=1e-6)[1].tol == 1e-6


def test_under_autocast_the_floor_is_the_autocast_dtypes():
    """Training with precision=bf16 runs float32 iterates through bfloat16 matrix products:
    the map's rounding, and so the floor, is bfloat16's."""
    weight = torch.randn(64, 64, generator=torch.Generator().manual_seed(0)) / 64
    solver = FixedPointSolver(FixedPointOptions(train_max_iter=200))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        z, stats = solved(solver, lambda z: torch.tanh(z @ weight + 1), torch.zeros(2, 64), training=True, tol=1e-6)
    assert stats.tol == residual_floor(torch.bfloat16) and bool(stats.converged.all())


def test_the_loss_is_computed_from_float32_logits():
    """Cross-entropy over a vocabulary sums thousands of exponentials: in bfloat16 its
    log-sum-exp would be off by a percent."""
    logits = torch.randn(2, 7, 5000, generator=torch.Generator().manual_seed(0)).mul(4).bfloat16()
    labels = torch.randint(0, 5000, (2, 7), generator=torch.Generator().manual_seed(1))
    loss = token_cross_entropy(logits, labels, "shifted")
    exact = token_cross_entropy(logits.double(), labels, "shifted")
    assert loss.dtype == torch.float32 and float(loss) == pytest.approx(float(exact), rel=1e-6)


@pytest.mark.parametrize("family, implicit", VARIANTS, ids=VARIANT_IDS)
def test_a_bfloat16_autocast_training_step_gives_the_float64_gradient(family, implicit, float64_models, tokenizer):
    """precision=bf16 (what the trainer's "auto" picks on CUDA): float32 weights, bfloat16
    autocast; the phantom-gradient step's gradient is the float64 one to bfloat16's rounding."""
    reference = float64_models[family, implicit]
    ids = tokens(tokenizer, 2, 10, seed=5)
    gradients = {}
    for name, model, dtype in (("float64", copy.deepcopy(reference), torch.float64),
                               ("bf16", copy.deepcopy(reference).float(), torch.bfloat16)):
        model.train()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=dtype == torch.bfloat16):
            loss = model(ids, labels=ids).loss
        loss.backward()
        gradients[name] = torch.cat([p.grad.flatten().double() for p in model.parameters() if p.grad is not None])
    exact, autocast = gradients["float64"], gradients["bf16"]
    assert float((autocast - exact).norm() / exact.norm()) < 0.05


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["simultaneous", "sequential"])
def test_words_eval_in_bfloat16_scores_the_trained_model_as_float32_does(mode, trained_s3, tmp_path):
    """``words eval --dtype bfloat16`` on a trained S3 model: the record says the dtype, no
    more fixed points miss the tolerance than in float32 (whose 1e-3 bfloat16 raises to its
    floor, 1.6e-2), and last-10 accuracy is float32's."""
    _, run = trained_s3
    rows = {}
    for dtype in ("float32", "bfloat16"):
        out = tmp_path / dtype
        command = ["words", "eval", str(run), "--lengths", "12,24", "--count", "64", "--mode", mode, "--dtype", dtype,
                   "--no-progress", "--out", str(out)]
        assert main(command) == 0
        record = json.loads((out / "word_length.json").read_text())
        assert record["model"]["dtype"] == dtype
        rows[dtype] = record["rows"]
    for exact, half in zip(rows["float32"], rows["bfloat16"]):
        assert half["fp_not_converged_share"] <= exact["fp_not_converged_share"]
        assert half["accuracy_last10"] == pytest.approx(exact["accuracy_last10"], abs=0.02)
