"""Chunked SSD scan against the naive token-by-token recurrence."""

from __future__ import annotations

import os
import sys
import types

import pytest
import torch

from implicitlm.core.errors import OptionError
from implicitlm.layers import ssd as ssd_module
from implicitlm.layers import ssd_chunked, ssd_kernel, ssd_reference, ssd_scan, ssd_step
from implicitlm.layers.ssd import chunk_size_for
from implicitlm.layers.ssd_kernel import KEEP_AUTOTUNING, KERNEL_TUNING, pad_to_chunks

# Tiny tensors: a second intra-op thread only adds synchronisation cost on a shared CPU.


# (batch, length, heads, headdim, ngroups, d_state, chunk_size)
SHAPES = [
    (2, 16, 2, 3, 1, 4, 4),  # length a multiple of the chunk
    (2, 13, 2, 3, 1, 4, 4),  # last chunk partial
    (1, 3, 4, 2, 2, 5, 8),  # length < chunk, ngroups > 1
    (3, 1, 2, 2, 1, 3, 4),  # a single token
    (2, 9, 6, 2, 3, 2, 2),  # many chunks, three groups
    (1, 7, 2, 2, 2, 3, 1),  # chunk of one token: the scan across chunks does all the work
]


def random_inputs(batch, length, heads, headdim, ngroups, d_state, seed=0, dtype=torch.float64):
    gen = torch.Generator().manual_seed(seed)

    def randn(*shape):
        return torch.randn(*shape, generator=gen, dtype=dtype)

    x = randn(batch, length, heads, headdim)
    dt = torch.nn.functional.softplus(randn(batch, length, heads))
    A = -torch.exp(randn(heads))
    B = randn(batch, length, ngroups, d_state)
    C = randn(batch, length, ngroups, d_state)
    state = randn(batch, heads, headdim, d_state)
    return x, dt, A, B, C, state


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "b{}-l{}-h{}-p{}-g{}-n{}-chunk{}".format(*s))
@pytest.mark.parametrize("with_state", [False, True], ids=["zero-state", "initial-state"])
def test_chunked_matches_recurrence(shape, with_state):
    *dims, chunk = shape
    x, dt, A, B, C, state = random_inputs(*dims)
    initial = state if with_state else None

    y, final = ssd_chunked(x, dt, A, B, C, chunk, initial_state=initial)
    y_ref, final_ref = ssd_reference(x, dt, A, B, C, initial_state=initial)

    assert y.shape == x.shape
    assert final.shape == (dims[0], dims[2], dims[3], dims[5])
    torch.testing.assert_close(y, y_ref, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(final, final_ref, rtol=1e-10, atol=1e-10)


def test_chunk_size_does_not_change_result():
    x, dt, A, B, C, state = random_inputs(2, 11, 2, 3, 1, 4, seed=1)
    outputs = [ssd_chunked(x, dt, A, B, C, chunk, initial_state=state) for chunk in (1, 3, 4, 11, 64)]
    for y, final in outputs[1:]:
        torch.testing.assert_close(y, outputs[0][0], rtol=1e-10, atol=1e-10)
        torch.testing.assert_close(final, outputs[0][1], rtol=1e-10, atol=1e-10)


def test_strong_decay_underflows_cleanly():
    # dt * A down to about -1000 per token: the decays underflow to exactly zero, and
    # neither the output nor the gradient may turn into NaN (0 * inf, -inf - -inf).
    x, dt, A, B, C, _ = random_inputs(1, 32, 2, 2, 1, 3, seed=2)
    dt = (dt * 20.0).requires_grad_()
    A = torch.tensor([-16.0, -1.0], dtype=torch.float64)
    y, final = ssd_chunked(x, dt, A, B, C, chunk_size=32)
    y_ref, final_ref = ssd_reference(x, dt, A, B, C)
    torch.testing.assert_close(y, y_ref, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(final, final_ref, rtol=1e-10, atol=1e-10)
    (grad,) = torch.autograd.grad(y.sum() + final.sum(), dt)
    assert torch.isfinite(grad).all()


def test_split_sequence_continues_from_final_state():
    x, dt, A, B, C, _ = random_inputs(2, 10, 2, 3, 1, 4, seed=3)
    y_full, final_full = ssd_chunked(x, dt, A, B, C, chunk_size=4)
    y_head, mid = ssd_chunked(x[:, :6], dt[:, :6], A, B[:, :6], C[:, :6], chunk_size=4)
    y_tail, final = ssd_chunked(x[:, 6:], dt[:, 6:], A, B[:, 6:], C[:, 6:], chunk_size=4, initial_state=mid)
    torch.testing.assert_close(torch.cat([y_head, y_tail], dim=1), y_full, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(final, final_full, rtol=1e-10, atol=1e-10)


def test_step_does_not_modify_its_state():
    x, dt, A, B, C, state = random_inputs(2, 1, 2, 3, 1, 4, seed=4)
    before = state.clone()
    ssd_step(state, x[:, 0], dt[:, 0], A, B[:, 0], C[:, 0])
    assert torch.equal(state, before)


@pytest.mark.device
@pytest.mark.parametrize("length, chunk", [(7, 3), (2, 4)])
def test_gradients_match_recurrence(length, chunk, device):
    inputs = [t.to(device) for t in random_inputs(2, length, 4, 2, 2, 3, seed=5)]
    weights = torch.randn(2, length, 4, 2, generator=torch.Generator().manual_seed(6), dtype=torch.float64).to(device)
    weights_state = torch.randn(2, 4, 2, 3, generator=torch.Generator().manual_seed(7), dtype=torch.float64).to(device)

    def grads(run):
        leaves = [t.clone().requires_grad_() for t in inputs]
        x, dt, A, B, C, state = leaves
        y, final = run(x, dt, A, B, C, state)
        ((y * weights).sum() + (final * weights_state).sum()).backward()
        return [t.grad for t in leaves]

    chunked = grads(lambda x, dt, A, B, C, s: ssd_chunked(x, dt, A, B, C, chunk, initial_state=s))
    reference = grads(lambda x, dt, A, B, C, s: ssd_reference(x, dt, A, B, C, initial_state=s))
    for name, g, g_ref in zip(["x", "dt", "A", "B", "C", "state"], chunked, reference):
        assert torch.isfinite(g).all(), name
        torch.testing.assert_close(g, g_ref, rtol=1e-9, atol=1e-9, msg=lambda m, name=name: f"{name}: {m}")


@pytest.mark.device
@pytest.mark.parametrize("length", [5, 128, 200])
def test_scan_matches_recurrence_whatever_chunk_it_picks(length, device):
    x, dt, A, B, C, state = (t.to(device) for t in random_inputs(1, length, 2, 3, 1, 4, seed=8))
    y, final = ssd_scan(x, dt, A, B, C, chunk_size=256, initial_state=state)
    y_ref, final_ref = ssd_reference(x, dt, A, B, C, initial_state=state)
    torch.testing.assert_close(y, y_ref, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(final, final_ref, rtol=1e-10, atol=1e-10)


def test_chunk_size_never_exceeds_the_configured_one():
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert chunk_size_for(100, 256, cpu) == 100  # one chunk for short sequences
    assert chunk_size_for(4096, 256, cpu) == 64
    assert chunk_size_for(4096, 32, cpu) == 32
    assert chunk_size_for(100, 16, cpu) == 16
    assert chunk_size_for(4096, 256, cuda) == 256  # the fused kernel's own chunking


def test_missing_kernel_falls_back_with_one_notice(monkeypatch):
    monkeypatch.setattr(ssd_module, "KERNEL_DEVICES", ("cpu",))
    monkeypatch.setattr(ssd_module, "fused_ssd_kernel", lambda: None)
    monkeypatch.setattr(ssd_kernel, "_notified", False)
    x, dt, A, B, C, state = random_inputs(1, 9, 2, 3, 1, 4, seed=9, dtype=torch.float32)
    with pytest.warns(UserWarning, match="pure-PyTorch") as notices:
        first = ssd_scan(x, dt, A, B, C, chunk_size=4, initial_state=state)
        second = ssd_scan(x, dt, A, B, C, chunk_size=4, initial_state=state)
    assert len(notices) == 1
    expected = ssd_chunked(x, dt, A, B, C, 4, initial_state=state)
    for got in (first, second):
        torch.testing.assert_close(got, expected, rtol=0, atol=0)


def test_kernel_is_called_with_its_own_conventions(monkeypatch):
    # A stand-in with mamba_ssm's signature: dt is passed already softplus'd, the final
    # state is asked for, and the result is returned as (y, final state).
    calls = []

    def kernel(x, dt, A, B, C, chunk_size, initial_states=None, return_final_states=False, dt_softplus=False):
        calls.append((chunk_size, return_final_states, dt_softplus, A.dtype))
        return ssd_reference(x, dt, A.to(x.dtype), B, C, initial_state=initial_states)

    monkeypatch.setattr(ssd_module, "KERNEL_DEVICES", ("cpu",))
    monkeypatch.setattr(ssd_module, "fused_ssd_kernel", lambda: kernel)
    x, dt, A, B, C, state = random_inputs(1, 9, 2, 3, 1, 4, seed=10, dtype=torch.float32)
    y, final = ssd_scan(x, dt, A, B, C, chunk_size=256, initial_state=state)
    assert calls == [(256, True, False, torch.float32)]
    y_ref, final_ref = ssd_reference(x, dt, A, B, C, initial_state=state)
    torch.testing.assert_close(y, y_ref, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(final, final_ref, rtol=1e-6, atol=1e-6)
    # float64 asks for more than the kernel's float32 sums: the pure scan runs it.
    ssd_scan(*(t.double() for t in (x, dt, A, B, C)), chunk_size=256, initial_state=state.double())
    assert len(calls) == 1


@pytest.mark.device
@pytest.mark.skipif(
    not torch.cuda.is_available() or ssd_kernel.fused_ssd_kernel() is None, reason="needs CUDA and mamba_ssm"
)
def test_fused_kernel_matches_pure_path_on_cuda():
    inputs = [t.float().cuda() for t in random_inputs(2, 300, 4, 64, 1, 16, seed=11)]
    leaves = [t.clone().requires_grad_() for t in inputs]
    x, dt, A, B, C, state = leaves
    y, final = ssd_scan(x, dt, A, B, C, chunk_size=64, initial_state=state)
    (y.square().sum() + final.sum()).backward()
    fused_grads = [t.grad for t in leaves]
    leaves = [t.clone().requires_grad_() for t in inputs]
    x, dt, A, B, C, state = leaves
    y_ref, final_ref = ssd_chunked(x, dt, A, B, C, 64, initial_state=state)
    (y_ref.square().sum() + final_ref.sum()).backward()
    # Relative to each tensor's norm: the kernel's float32 products are TF32 (Triton's default for
    # a float32 tl.dot, about 3e-4 a product), whose error follows the sums' size, not each
    # output's: elementwise, outputs near 0 beside ones of 120 here are off by 0.2 on an H200.
    # The GPU check's kernel step holds the kernel to the same 5e-3 against a float64 oracle.
    names = ["y", "final", "dx", "ddt", "dA", "dB", "dC", "dstate"]
    wanted = [y_ref, final_ref, *(t.grad for t in leaves)]
    for name, got, want in zip(names, [y, final, *fused_grads], wanted, strict=True):
        assert float((got - want).norm() / want.norm()) < 5e-3, name


def test_padding_to_whole_chunks_changes_no_output_state_or_gradient():
    """What lets every length run whole chunks: tokens with dt = 0 added at the end leave the
    state as it was, so the outputs, the final state and the gradients are the unpadded ones."""
    inputs = random_inputs(2, 13, 4, 3, 2, 5, seed=12)
    padded = pad_to_chunks(8, *inputs[:2], *inputs[3:5])
    assert [t.shape[1] for t in padded] == [16] * 4 and all(t[:, 13:].abs().sum() == 0 for t in padded)
    assert pad_to_chunks(13, *inputs[:2]) == inputs[:2]  # whole chunks already: the tensors themselves

    def run(scan):
        leaves = [t.clone().requires_grad_() for t in inputs]
        x, dt, A, B, C, state = leaves
        y, final = scan(x, dt, A, B, C, state)
        (y.square().sum() + (final * final.detach().sign()).sum()).backward()
        return [y, final, *(t.grad for t in leaves)]

    chunked = run(lambda *t: ssd_chunked(*t[:5], 8, initial_state=t[5]))  # padded to 16 inside
    reference = run(lambda *t: ssd_reference(*t[:5], initial_state=t[5]))
    for name, got, want in zip(["y", "final", "dx", "ddt", "dA", "dB", "dC", "dstate"], chunked, reference):
        torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-10, msg=lambda m, name=name: f"{name}: {m}")


@pytest.mark.parametrize("users", [None, "0"])
def test_the_kernel_is_imported_with_autotuning_kept_across_processes_unless_the_user_says(monkeypatch, users):
    monkeypatch.setenv(KEEP_AUTOTUNING, "unset below")  # restored, or removed, after the test
    if users is None:
        monkeypatch.delenv(KEEP_AUTOTUNING)
    else:
        monkeypatch.setenv(KEEP_AUTOTUNING, users)
    ssd_kernel.fused_ssd_kernel.cache_clear()
    try:
        ssd_kernel.fused_ssd_kernel()
    finally:
        ssd_kernel.fused_ssd_kernel.cache_clear()
    assert os.environ[KEEP_AUTOTUNING] == (users or "1")


def test_a_kernel_tuning_other_than_tuned_or_smallest_is_refused_before_any_import(monkeypatch):
    monkeypatch.setenv(KERNEL_TUNING, "fastest")
    ssd_kernel.fused_ssd_kernel.cache_clear()
    try:
        with pytest.raises(OptionError, match=r"IMPLICITLM_KERNEL_TUNING='fastest' is not one of tuned, smallest"):
            ssd_kernel.fused_ssd_kernel()
    finally:
        ssd_kernel.fused_ssd_kernel.cache_clear()


def test_smallest_tuning_keeps_each_mamba_kernel_its_configuration_of_least_shared_memory(monkeypatch):
    triton = pytest.importorskip("triton")
    configs = [triton.Config({"BLOCK_SIZE_M": 128, "BLOCK_SIZE_N": 256}, num_stages=3),  # 98,304 elements in flight
               triton.Config({"BLOCK_SIZE_M": 64, "BLOCK_SIZE_N": 64}, num_stages=4),  # 16,384
               triton.Config({"BLOCK_SIZE_M": 32, "BLOCK_SIZE_N": 128}, num_stages=5)]  # 20,480

    def autotuned():
        @triton.autotune(configs=list(configs), key=["n"])
        @triton.jit
        def copy(x, n, BLOCK_SIZE_M: triton.language.constexpr, BLOCK_SIZE_N: triton.language.constexpr):
            pass

        return copy

    ours, elsewhere = autotuned(), autotuned()
    for name, kernel in [("mamba_ssm.ops.triton.tuned_here", ours), ("other_package.kernels", elsewhere)]:
        module = types.ModuleType(name)
        module.kernel = kernel
        monkeypatch.setitem(sys.modules, name, module)
    assert [ssd_kernel.tile_cost(c) for c in configs] == [98_304, 16_384, 20_480]
    ssd_kernel.keep_smallest_configurations()
    assert ours.configs == [configs[1]]
    assert elsewhere.configs == configs  # another package's kernels are not ours to change
