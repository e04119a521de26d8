"""What checking a forward's inputs costs a decoded token: one-token sequential forwards of the
shipped WikiText-2 pair from a 64-token prompt's state, with the checks and without them.

    python benchmarks/input_checks.py [--checkpoints checkpoints/wikitext2] [--repeats 15]

Every forward checks its ids, mask and state (``models/argument_checks.py``: a mask of values
other than 0 and 1, a state of another model). The baseline in the same run is the same forward with
``check_forward_inputs`` replaced by a no-op, timed in alternation with it; the implicit row
also gives the cost of a pass, so the checks' share of a token's work shows beside the passes.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from unittest import mock

import torch
from common import Table, paired_median_seconds

from implicitlm.models import load_model

PROMPT, STEPS = 64, 50


@torch.no_grad()
def token_steps(model, steps: int):
    """A run of ``steps`` one-token forwards, each from the prompt's state."""
    ids = torch.randint(1, model.config.vocab_size, (1, PROMPT), generator=torch.Generator().manual_seed(0))
    state = model(ids).state
    token, mask = ids[:, -1:], torch.ones(1, 1, dtype=torch.long)

    def run() -> None:
        for _ in range(steps):
            model(token, state=state, attention_mask=mask, mode="sequential")

    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoints", type=Path, default=Path("checkpoints/wikitext2"))
    parser.add_argument("--repeats", type=int, default=15)
    args = parser.parse_args()
    torch.set_num_threads(1)
    table = Table(
        f"Input checks per decoded token: the shipped pair, one-token forwards after {PROMPT} tokens, 1 torch thread",
        ["model", "ms/token unchecked", "ms/token checked", "checked / unchecked", "checks µs/token"],
    )
    for kind in ("explicit", "implicit"):
        model = load_model(args.checkpoints / kind).eval()
        checked = token_steps(model, STEPS)

        def unchecked() -> None:
            with mock.patch("implicitlm.models.implicit_lm.check_forward_inputs"):
                checked()

        paired = paired_median_seconds(unchecked, checked, args.repeats)
        per_token = (paired.baseline / STEPS * 1e3, paired.candidate / STEPS * 1e3)
        # From the paired ratio, which load elsewhere on the machine moves less than either median.
        table.add(kind, f"{per_token[0]:.3f}", f"{per_token[1]:.3f}", f"{paired.ratio:.3f}x",
                  f"{(paired.ratio - 1) * per_token[0] * 1e3:.0f}")
    table.notes.append(f"medians of {args.repeats} alternated runs of {STEPS} token steps; the ratio is the median of per-pair ratios")
    table.publish(None)


if __name__ == "__main__":
    main()
