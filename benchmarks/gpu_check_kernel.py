"""The GPU check's kernel step, in a process of its own (gpu_check.py --step kernel)."""

from __future__ import annotations

import contextlib
import importlib
import sys
import time
from typing import Any, Callable

import torch
from gpu_check_shared import ROOT, device, report_figures

from implicitlm.layers import ssd_chunked, ssd_reference, ssd_scan
from implicitlm.layers.ssd_kernel import fused_ssd_kernel

# On a GPU every shape has the 130M mixer's heads, head and state sizes and chunk, which are
# what Triton tunes the kernels for (the length and groups are not): the training step has
# tuned them in bf16 already, and the fp32 tuning is paid once for all three.
KERNEL_SHAPES = {
    "gpu": [
        (1, 1000, 24, 64, 1, 128, 256, False),  # the 130M model's mixer, from a zero state
        (2, 700, 24, 64, 2, 128, 256, True),  # a partial last chunk, two groups
        (3, 100, 24, 64, 4, 128, 256, True),  # shorter than one chunk, six heads a group
    ],
    # Triton's interpreter takes seconds per call; its bfloat16 is not the GPU's (it returns
    # garbage), so the rehearsal checks float32 only.
    "rehearsal": [(2, 24, 4, 8, 2, 8, 16, True)],
}
# Relative error ||fused - oracle|| / ||oracle|| allowed, by dtype. float32: the kernel's dots
# run in TF32 (10-bit mantissa, ~5e-4 per product; sums of hundreds stay near 1e-3), and a
# convention error (B and C swapped, a wrong state layout) gives errors of order 1. bfloat16:
# inputs and outputs rounded to 8 bits (~4e-3 each), a few of them compounding.
KERNEL_THRESHOLDS = {"float32": 5e-3, "bfloat16": 3e-2}
# A limit of the precision itself, which the pure scan at the same precision shows too (a
# gradient summed over the whole sequence, as dA), is not held against the kernel. On a GPU the
# pure scan's float32 products are TF32 as the kernel's are (torch's "high" matmul precision):
# in IEEE float32 a sum with cancellations, as dA over a 100-token batch of three, is exact where
# TF32 is not (the H100 run of 2026-11-27: kernel 6.2e-3, IEEE pure scan 6.2e-6). The kernel
# rounds more of its sums' terms to TF32 than the pure scan's matmuls do (its chunk states and
# their passing): 2.3 times the pure scan's TF32 error there (2.7e-3), so a margin of 3. With
# IEEE dots (TRITON_F32_DEFAULT=ieee) the kernel's float32 errors fall to 1-5e-6.
PURE_MARGIN = 3.0
KERNEL_QUANTITIES = ["y", "final state", "dx", "ddt", "dA", "dB", "dC", "dstate"]


def run(rehearse: bool, limit_s: float) -> None:
    """mamba_ssm's fused SSD through the library's dispatch (``ssd_scan``) and the pure scan
    (``ssd_chunked``) at each dtype, both against the pure scan in float64 on the same
    (dtype-rounded) inputs; the float64 scan against the token-by-token recurrence first."""
    dtypes = ["float32"] if rehearse else ["float32", "bfloat16"]
    figures: dict[str, Any] = {"checks": 0, "failed": 0}
    with fused_dispatch(rehearse) as kernel:
        figures["oracle vs recurrence"] = oracle_against_recurrence(device(rehearse))
        print(f"{'shape':<40}{'dtype':<10}{'quantity':<13}{'fused':>10}{'pure':>10}{'limit':>9}  verdict", flush=True)
        for shape in KERNEL_SHAPES["rehearsal" if rehearse else "gpu"]:
            for dtype in dtypes:
                calls, started = len(kernel.calls), time.perf_counter()
                compare_kernel(shape, getattr(torch, dtype), device(rehearse), figures)
                # The first call of a dtype compiles and autotunes the kernels.
                figures.setdefault(f"{dtype} first call s", round(time.perf_counter() - started, 1))
                if len(kernel.calls) == calls:
                    figures.setdefault("not dispatched to the kernel", []).append(dtype)
                report_figures(figures)
    if figures["failed"] or "not dispatched to the kernel" in figures:
        raise SystemExit(f"{figures['failed']} of {figures['checks']} kernel checks above their limit, "
                         f"{len(figures.get('not dispatched to the kernel', []))} not run by the kernel")


@contextlib.contextmanager
def fused_dispatch(rehearse: bool):
    """Inside, ``ssd_scan`` runs mamba_ssm's fused kernel and records each call (the tests'
    ``FusedKernel``): on a GPU as the library finds it, on a CPU through Triton's interpreter
    and the tests' shims (tests/support/interpreted_kernel.py)."""
    import pytest

    sys.path.insert(0, str(ROOT))
    from tests.support.interpreted_kernel import FusedKernel, interpreted_fused_kernel, kernel_packages_missing

    with pytest.MonkeyPatch.context() as monkeypatch:
        if rehearse:
            if kernel_packages_missing():
                raise SystemExit(kernel_packages_missing())
            with interpreted_fused_kernel(monkeypatch) as kernel:
                yield kernel
            return
        if fused_ssd_kernel() is None:
            raise SystemExit("the library does not find mamba_ssm's fused kernel (see the setup step)")
        yield FusedKernel(importlib.import_module("mamba_ssm.ops.triton.ssd_combined"), monkeypatch)


def kernel_inputs(shape: tuple, device_name: str) -> list:
    """x, dt (softplus'd), A (negative), B, C, initial state (or None), in float32."""
    batch, length, heads, headdim, groups, d_state, _, with_state = shape
    generator = torch.Generator().manual_seed(sum(shape[:6]))

    def randn(*dims):
        return torch.randn(*dims, generator=generator).to(device_name)

    x, dt = randn(batch, length, heads, headdim), torch.nn.functional.softplus(randn(batch, length, heads))
    A, B, C = -torch.exp(randn(heads)), randn(batch, length, groups, d_state), randn(batch, length, groups, d_state)
    return [x, dt, A, B, C, randn(batch, heads, headdim, d_state) if with_state else None]


def scan_with_gradients(scan: Callable, leaves: list, chunk: int) -> list:
    """Outputs and the gradients of every input, of a weighted sum whose weights are fixed."""
    leaves = [None if t is None else t.detach().clone().requires_grad_() for t in leaves]
    y, final = scan(*leaves[:5], chunk, initial_state=leaves[5])
    generator = torch.Generator().manual_seed(1)
    weights = [torch.randn(t.shape, generator=generator, dtype=torch.float64).to(t.device) for t in (y, final)]
    (sum((t.double() * w).sum() for t, w in zip((y, final), weights))).backward()
    return [y.detach(), final.detach()] + [None if t is None else t.grad for t in leaves]


def compare_kernel(shape: tuple, dtype, device_name: str, figures: dict[str, Any]) -> None:
    chunk = shape[6]
    x, dt, A, B, C, state = kernel_inputs(shape, device_name)
    # As the model hands them over: A and the state stay float32 whatever the activations' dtype.
    rounded = [x.to(dtype), dt.to(dtype), A, B.to(dtype), C.to(dtype), state]
    oracle = scan_with_gradients(ssd_chunked, [None if t is None else t.double() for t in rounded], chunk)
    fused = scan_with_gradients(ssd_scan, rounded, chunk)
    with matmul_precision("high" if device_name == "cuda" else "highest"):
        pure = scan_with_gradients(ssd_chunked, rounded, chunk)
    name = "b{}-l{}-h{}-p{}-g{}-n{}-chunk{}".format(*shape[:7]) + ("" if shape[7] else "-zero-state")
    dtype_name = str(dtype).removeprefix("torch.")
    limit = KERNEL_THRESHOLDS[dtype_name]
    for quantity, got, mine, want in zip(KERNEL_QUANTITIES, fused, pure, oracle):
        if want is None:
            continue
        error, pure_error = relative_error(got, want), relative_error(mine, want)
        passed = error <= max(limit, PURE_MARGIN * pure_error)
        figures["checks"] += 1
        figures["failed"] += not passed
        key = f"{dtype_name} max rel err"
        if error >= figures.get(key, -1.0):
            figures[key], figures[f"{dtype_name} worst"] = error, f"{quantity} at {name}"
        print(f"{name:<40}{dtype_name:<10}{quantity:<13}{error:>10.2e}{pure_error:>10.2e}{limit:>9.0e}  "
              f"{'ok' if passed else 'ABOVE LIMIT'}", flush=True)


@contextlib.contextmanager
def matmul_precision(precision: str):
    """torch's float32 matmul precision inside ("high": TF32 on CUDA), restored after."""
    before = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision(precision)
    try:
        yield
    finally:
        torch.set_float32_matmul_precision(before)


def relative_error(got, want) -> float:
    want = want.double()
    return float((got.double() - want).norm() / want.norm().clamp_min(1e-300))


def oracle_against_recurrence(device_name: str) -> float:
    """The float64 chunked scan, the oracle here, against the naive recurrence (its own oracle
    in the tests) on a short input with a partial chunk: rounding only, ~1e-15."""
    shape = (2, 40, 4, 16, 2, 16, 16, True)
    x, dt, A, B, C, state = (t.double() for t in kernel_inputs(shape, device_name))
    y, final = ssd_chunked(x, dt, A, B, C, shape[6], initial_state=state)
    y_ref, final_ref = ssd_reference(x, dt, A, B, C, initial_state=state)
    return max(relative_error(y, y_ref), relative_error(final, final_ref))


