"""The WikiText-2 pairs the repository ships (``checkpoints/wikitext2``: trained from scratch,
and continued from an explicit checkpoint, ``warm_start``; docs/results/language-modelling.md):
each model loads with its checksum and tokenizer, and scores the start of the real validation
file as it did when it was saved."""

from __future__ import annotations

import json
import lzma
import re
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from implicitlm.cli import main
from implicitlm.core.file_digests import FILES_DIGEST
from implicitlm.core.run_folder import read_trainer_meta
from implicitlm.models import load_model
from implicitlm.train.model_card import MODEL_CARD, model_card

SHIPPED = Path(__file__).parents[2] / "checkpoints" / "wikitext2"
# Each model's parameters (the warm-started implicit one has the injection on top of the
# explicit one's weights), and its perplexity by `implicitlm lm eval` on the first 4,096 tokens of
# WikiText-2's validation file, as this test tokenises it (its first 40,000 characters), at the
# training length, measured when it was saved. The handbook's table scores the first 65,536 tokens.
SAVED = {
    "explicit": (1_783_176, 46.0924),
    "implicit": (1_780_128, 44.9703),
    "warm_start/explicit": (1_783_176, 45.2135),
    "warm_start/explicit_2_layers": (2_353_640, 41.8580),
    "warm_start/explicit_4_layers": (3_494_568, 40.1502),
    "warm_start/implicit": (2_176_528, 40.8835),
}
# The implicit ones as shipped (no flags): the warm-started one at the 2 passes it declares
# (fixed_point.passes, from its few-pass stage), below its explicit twin's perplexity; the one
# trained from scratch solves to its tolerance.
AS_SHIPPED = {"implicit": 45.0260, "warm_start/implicit": 43.6381}
# Each model's stages of training, oldest first (docs/results/language-modelling.md): the
# explicit runs of 240 steps the warm starts began from, the runs of 720 steps, the few-pass stages.
LINEAGE = {
    "explicit": [("explicit", 720)],
    "implicit": [("implicit", 720), ("implicit", 120)],
    "warm_start/explicit": [("explicit", 240), ("explicit", 720)],
    "warm_start/explicit_2_layers": [("explicit", 240), ("explicit", 720)],
    "warm_start/explicit_4_layers": [("explicit", 240), ("explicit", 720)],
    "warm_start/implicit": [("explicit", 240), ("implicit", 720), ("implicit", 120)],
}
TWIN = {"implicit": "explicit", "warm_start/implicit": "warm_start/explicit"}
# The explicit references of the compute frontier: the twin's recipe at 2 and 4 layers.
LAYERS = {"warm_start/explicit_2_layers": 2, "warm_start/explicit_4_layers": 4}


@pytest.fixture(scope="module")
def validation_shards(shared_data, tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("wikitext2")
    text = lzma.open(shared_data / "wikitext-2" / "valid.txt.xz", "rt", encoding="utf-8").read(50_000)
    (root / "valid.txt").write_text(text[:40_000], encoding="utf-8")
    (root / "train.txt").write_text(text[40_000:], encoding="utf-8")  # not read: eval scores the test split
    command = ["corpus", "build", str(root / "train.txt"), "--test-sources", str(root / "valid.txt"),
               "--tokenizer", str(SHIPPED / "implicit"), "--out", str(root / "shards"), "--no-progress"]
    assert main(command) == 0
    return root / "shards"


@pytest.mark.slow
@pytest.mark.parametrize("kind", sorted(SAVED))
def test_a_shipped_wikitext2_checkpoint_scores_the_validation_file_as_when_saved(kind, validation_shards, tmp_path):
    parameters, perplexity = SAVED[kind]
    model = load_model(SHIPPED / kind)
    implicit = kind.endswith("implicit")
    assert model.config.implicit == implicit and model.config.num_hidden_layers == LAYERS.get(kind, 1)
    assert model.num_parameters() == parameters
    def evaluate(*flags: str) -> dict:
        out = tmp_path / str(len(list(tmp_path.iterdir())))
        command = ["lm", "eval", str(SHIPPED / kind), "--data", str(validation_shards), "--max-tokens", "4096",
                   "--batch-size", "16", "--no-progress", "--out", str(out), *flags]
        assert main(command) == 0
        row = json.loads((out / "lm_length.json").read_text())["rows"][0]
        assert row["tokens"] == 4096
        return row

    # Saved solving to the tolerance with safeguarded Anderson; the implicit ones ship with a
    # learned solver (implicitlm solver train) for such solves.
    plain = ["--passes", "0", "--solver", "safeguarded_anderson"] if implicit else []
    row = evaluate(*plain)
    assert row["perplexity"] == pytest.approx(perplexity, rel=1e-4) and row.get("fp_not_converged_share", 0.0) == 0.0
    if implicit:
        assert model.learned_guess is not None and model.learned_mixing is not None
        tight = evaluate(*plain, "--tol", "1e-4", "--max-iter", "400")
        assert tight["perplexity"] == pytest.approx(perplexity, rel=5e-3) and tight["fp_not_converged_share"] == 0.0
        shipped = evaluate()
        assert shipped["perplexity"] == pytest.approx(AS_SHIPPED[kind], rel=1e-4)
        if model.solver.options.passes:
            # Each of the 16 windows of 256 tokens one solve of the declared passes, none to the tolerance.
            assert shipped["fp_in_passes"] == 4096 // 256
            assert shipped["perplexity"] < SAVED[TWIN[kind]][1]


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("kind", ["warm_start/implicit", "warm_start/explicit"])
def test_a_shipped_checkpoint_generates_in_half_precision_as_a_user_loads_it(kind, dtype):
    """transformers' Auto class with ``dtype``, then greedy decoding (the step form, RNN mode):
    each token the float32 model's argmax up to the half precision's rounding of the logits
    (the explicit model's two best first tokens lie 0.007 apart: bfloat16 may swap them)."""
    model = AutoModelForCausalLM.from_pretrained(SHIPPED / kind, dtype=getattr(torch, dtype))
    prompt = AutoTokenizer.from_pretrained(SHIPPED / kind)("The history of the", return_tensors="pt").input_ids
    generated = model.generate(prompt, max_new_tokens=8, do_sample=False)
    with torch.no_grad():
        logits = load_model(SHIPPED / kind)(generated, mode="sequential").logits[0, prompt.shape[1] - 1 : -1]
    chosen = logits.gather(-1, generated[0, prompt.shape[1]:, None])[:, 0]
    assert float((logits.max(-1).values - chosen).max()) <= 8 * torch.finfo(model.dtype).eps * float(logits.abs().max())
    if model.config.implicit:  # each token in the passes the checkpoint declares (2), else to its tolerance
        convergence = model.generation_convergence
        assert convergence["fp_fixed_points"] > 0
        if model.config.fixed_point["passes"]:
            assert convergence["fp_in_passes"] == convergence["fp_fixed_points"]
        else:
            assert convergence["fp_not_converged"] == 0


@pytest.mark.slow
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_the_implicit_checkpoint_scores_in_half_precision_as_in_float32(dtype, validation_shards, tmp_path):
    """``lm eval --dtype`` as shipped (its 2 passes) and solving to the tolerance (bfloat16's
    raised from the checkpoint's 0.01 to its floor, 0.0156; every fixed point converges): the
    perplexity is float32's to 0.5%."""
    for flags, perplexity in (([], AS_SHIPPED["warm_start/implicit"]), (["--passes", "0"], SAVED["warm_start/implicit"][1])):
        out = tmp_path / str(len(flags))
        command = ["lm", "eval", str(SHIPPED / "warm_start/implicit"), "--data", str(validation_shards), "--max-tokens",
                   "4096", "--batch-size", "16", "--dtype", dtype, "--no-progress", "--out", str(out), *flags]
        assert main(command) == 0
        record = json.loads((out / "lm_length.json").read_text())
        row = record["rows"][0]
        assert record["model"]["dtype"] == dtype and row["perplexity"] == pytest.approx(perplexity, rel=5e-3)
        if flags:  # solved to the tolerance: every fixed point converges
            assert row["fp_not_converged_share"] == 0.0
        else:  # its 2 passes: reported as a budget spent, never as "not converged"
            assert row["fp_in_passes"] == row["fp_fixed_points"] and "fp_not_converged_share" not in row


@pytest.mark.parametrize("kind", sorted(SAVED))
def test_a_shipped_checkpoint_pads_has_a_card_and_records_its_files(kind, caplog):
    """Before: ``tok(["a", "a b"], padding=True)`` raised (no pad token) though config.json says
    pad_token_id 0, no model card, and nothing checked the config and tokenizer at load."""
    folder = SHIPPED / kind
    with caplog.at_level("WARNING", logger="implicitlm"):
        model = load_model(folder)
    assert not caplog.records  # the weights, config and tokenizer checked against their digests
    tokenizer = AutoTokenizer.from_pretrained(folder)
    batch = tokenizer(["a", "a b"], padding=True)
    assert tokenizer.pad_token_id == model.config.pad_token_id == model.generation_config.pad_token_id == 0
    assert len(batch["input_ids"][0]) == len(batch["input_ids"][1]) and batch["attention_mask"][0][0] == 0  # on the left
    assert (folder / MODEL_CARD).read_text() == model_card(model, read_trainer_meta(folder))
    assert {line.split()[1] for line in (folder / FILES_DIGEST).read_text().splitlines()} == {
        "config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json"}


@pytest.mark.parametrize("padding_side", ["left", "right"])
@pytest.mark.parametrize("kind", ["explicit", "implicit"])
def test_a_padded_batch_of_prompts_gives_the_texts_each_prompt_gives_alone(kind, padding_side):
    """Before: the tokenizers padded on the right, and the short prompt was continued from its
    padding ("The city of" gave "The city of " instead of its own continuation); a batch padded
    on the right by the caller's choice is now read as if padded on the left."""
    model = AutoModelForCausalLM.from_pretrained(SHIPPED / kind).eval()
    tokenizer = AutoTokenizer.from_pretrained(SHIPPED / kind)
    assert tokenizer.padding_side == "left"  # as shipped
    prompts = ["The city of", "In the first season of the series , the"]
    greedy = dict(max_new_tokens=12, do_sample=False)
    alone = [tokenizer.decode(model.generate(**tokenizer(prompt, return_tensors="pt"), **greedy)[0], skip_special_tokens=True)
             for prompt in prompts]
    tokenizer.padding_side = padding_side
    batch = tokenizer(prompts, padding=True, return_tensors="pt")
    assert tokenizer.batch_decode(model.generate(**batch, **greedy), skip_special_tokens=True) == alone
    assert len(alone[0]) > len(prompts[0]) + 12  # continued with words, not with padding


@pytest.mark.parametrize("kind", sorted(SAVED))
def test_a_shipped_card_tells_every_stage_and_each_solve_as_the_model_loads(kind):
    """Before: the implicit cards said "trained: 120 steps" (the few-pass stage alone) and named
    themselves as their origin; the explicit twins had no measurements; every implicit card
    listed "solver: fixed_point_iter", which no solve of the loaded model runs."""
    folder = SHIPPED / kind
    model, card = load_model(folder), (folder / MODEL_CARD).read_text()
    stages = re.findall(r"^\d+\. (\w+), [^\n]*?: ([\d,]+) steps, ([\d,]+) tokens", card, flags=re.MULTILINE)
    assert [(kind, int(steps.replace(",", ""))) for kind, steps, _ in stages] == LINEAGE[kind]
    assert all(int(tokens.replace(",", "")) == 4096 * int(steps.replace(",", "")) for _, steps, tokens in stages)
    assert re.findall(r"^\d+\. \w+, from scratch", card, flags=re.MULTILINE) == [f"1. {LINEAGE[kind][0][0]}, from scratch"]
    assert "## Measured" in card
    if model.config.implicit:
        options = model.solver.options
        assert all(f"(reports say `{options.described_solver(mode)}`)" in card for mode in ("simultaneous", "sequential"))
        assert "solver: fixed_point_iter" not in card
