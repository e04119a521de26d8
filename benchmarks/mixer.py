"""Mamba2 mixer forward + backward tokens/s: ours against transformers' Mamba2Mixer.

Both mixers get the same configuration (the 130M model's: d_model 768, d_state 128,
head_dim 64, expand 2, one group, chunk 256) and the same weights, and are checked to
compute the same output before they are timed. On a CPU transformers runs its
pure-PyTorch path; on CUDA each runs its fused kernels when installed, and ours is also
timed with the kernel switched off (its pure-PyTorch path).
"""

from __future__ import annotations

import torch
from common import Table, median_seconds, paired_median_seconds, ratio, synchronize, verdict
from transformers import Mamba2Config
from transformers.models.mamba2.modeling_mamba2 import Mamba2Mixer as TransformersMixer
from transformers.utils import logging as transformers_logging

from implicitlm.layers import Mamba2Dims, Mamba2Mixer
from implicitlm.layers import ssd as ssd_module

D_MODEL, D_STATE, HEAD_DIM, EXPAND, CHUNK = 768, 128, 64, 2, 256
TARGET = 2.0


def build_pair(device: str) -> tuple[Mamba2Mixer, TransformersMixer]:
    torch.manual_seed(0)
    ours = Mamba2Mixer(Mamba2Dims(d_model=D_MODEL, d_state=D_STATE, headdim=HEAD_DIM, expand=EXPAND, chunk_size=CHUNK))
    config = Mamba2Config(
        hidden_size=D_MODEL,
        state_size=D_STATE,
        head_dim=HEAD_DIM,
        expand=EXPAND,
        num_heads=EXPAND * D_MODEL // HEAD_DIM,
        n_groups=1,
        chunk_size=CHUNK,
        use_conv_bias=True,
    )
    theirs = TransformersMixer(config, layer_idx=0)
    theirs.load_state_dict(ours.state_dict())
    return ours.to(device), theirs.to(device)


def forward_backward(mixer: torch.nn.Module, hidden: torch.Tensor) -> None:
    hidden = hidden.detach().requires_grad_()
    output = mixer(hidden)
    output = output[0] if isinstance(output, tuple) else output
    output.sum().backward()
    synchronize(hidden.device)


def pure_pytorch(run):
    """``run`` with our fused-kernel dispatch switched off."""

    def without_kernel():
        devices = ssd_module.KERNEL_DEVICES
        ssd_module.KERNEL_DEVICES = ()
        try:
            run()
        finally:
            ssd_module.KERNEL_DEVICES = devices

    return without_kernel


def run(quick: bool, device: str = "cpu") -> Table:
    transformers_logging.set_verbosity_error()  # its one-line "falling back" notices
    lengths = [128, 512, 2048] if quick else [128, 512, 2048, 4096]
    repeats = 3 if quick else 7
    ours, theirs = build_pair(device)
    columns = ["length", "transformers tok/s", "ours tok/s", "ours / transformers"]
    if device == "cuda":
        columns += ["ours pure PyTorch tok/s", "ours / ours pure"]
    table = Table(f"Mamba2 mixer forward + backward, batch 1, {device}", columns)
    ratios = []
    for length in lengths:
        hidden = torch.randn(1, length, D_MODEL, device=device)
        with torch.no_grad():
            torch.testing.assert_close(ours(hidden)[0], theirs(hidden), rtol=1e-3, atol=1e-3)
        timed = paired_median_seconds(
            lambda: forward_backward(theirs, hidden), lambda: forward_backward(ours, hidden), repeats
        )
        theirs_s, ours_s = timed.baseline, timed.candidate
        ratios.append(1 / timed.ratio)
        row = [length, f"{length / theirs_s:,.0f}", f"{length / ours_s:,.0f}", f"{1 / timed.ratio:.2f}x"]
        if device == "cuda":
            pure_s = median_seconds(pure_pytorch(lambda: forward_backward(ours, hidden)), repeats)
            row += [f"{length / pure_s:,.0f}", ratio(pure_s, ours_s)]
        table.add(*row)
    table.notes.append(
        f"target ours >= {TARGET:.0f}x transformers at every length: {verdict(min(ratios) >= TARGET)} "
        f"(lowest {min(ratios):.2f}x); medians of {repeats} runs, the two mixers timed in alternation (speed-up: median of the per-pair ratios)"
    )
    return table
