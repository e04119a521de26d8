"""Multiple-choice scoring through the lm-eval adapter: each context solved once, or once per choice.

The first HellaSwag items of ``../shared/data`` (4 endings each), as lm-eval builds their
loglikelihood requests, scored by ``ImplicitLMHarness`` with ``share_contexts`` on (the
context solved once, each ending going on from its state) and off (every context + ending
solved whole); the explicit model of the same shape in the same run is the baseline. Every
solve runs a fixed number of passes (tolerance out of reach), the LM evaluation's 12, so
both ways do the work a converging solve would; that the scores agree where solves converge
is the tests' job (tests/eval/test_harness.py). The tokenizer is a byte-level BPE trained on the first
lines of WikiText-2, the model random, d_model 272, 4 layers (the README's WikiText-2 shape).
"""

from __future__ import annotations

import lzma
import tempfile
from pathlib import Path

import torch
from common import Table, median_seconds
from lm_eval.api.instance import Instance

from implicitlm.data.downstream_sets import read_local_set
from implicitlm.data.tokenizer import train_tokenizer
from implicitlm.eval.harness import ImplicitLMHarness
from implicitlm.models import build_model, config_from_options

SHARED_DATA = Path(__file__).resolve().parents[2] / "shared" / "data"
ITERATIONS = 12


def requests(items: int) -> list[Instance]:
    documents = read_local_set("hellaswag", SHARED_DATA).documents[:items]
    pairs = [(doc["query"], " " + ending) for doc in documents for ending in doc["choices"]]
    return [Instance("loglikelihood", {}, pair, index) for index, pair in enumerate(pairs)]


def tokenizer(folder: str):
    with lzma.open(SHARED_DATA / "wikitext-2" / "train.txt.xz", "rt", encoding="utf-8") as lines:
        text = [line for _, line in zip(range(20000), lines) if line.strip()]
    return train_tokenizer(text, 2048, folder)


def build(vocab_size: int, implicit: bool):
    torch.manual_seed(0)
    options = dict(architecture="mamba2", implicit=implicit, vocab_size=vocab_size, hidden_size=272,
                   num_hidden_layers=4, state_size=64, head_dim=34,
                   fixed_point=dict(max_iter=ITERATIONS, tol=1e-12))
    return build_model(config_from_options(options)).eval()


def run(quick: bool, device: str = "cpu") -> Table:
    items, repeats = (8, 1) if quick else (32, 3)
    batch = requests(items)
    with tempfile.TemporaryDirectory() as folder:
        tok = tokenizer(folder)
        seconds = {}
        for implicit in (False, True):
            model = build(len(tok), implicit).to(device)
            for share in (False, True):
                lm = ImplicitLMHarness(model, tokenizer=tok, batch_size=32, device=device, share_contexts=share,
                                       progress=False)

                def score(lm=lm, model=model) -> None:
                    with model.track_convergence():  # the unreachable tolerance is not news here
                        lm.loglikelihood(batch)

                seconds[implicit, share] = median_seconds(score, repeats)
    baseline = seconds[False, False]
    table = Table(
        f"{items} HellaSwag items ({len(batch)} requests), lm-eval adapter, batch 32, d_model 272, 4 layers, {device}",
        ["model", "contexts", "s", "/ explicit, each context per choice", "share / whole"],
    )
    for implicit in (False, True):
        name = f"implicit ({ITERATIONS} passes)" if implicit else "explicit"
        for share in (False, True):
            table.add(name, "once" if share else "per choice", f"{seconds[implicit, share]:.2f}",
                      f"{seconds[implicit, share] / baseline:.2f}x",
                      f"{seconds[implicit, True] / seconds[implicit, False]:.2f}x" if share else "-")
    table.notes.append(f"medians of {repeats} runs after one untimed; the explicit model solving each context per "
                       "choice is the baseline")
    return table
