"""The CUDA path on a CPU: ``ssd_scan`` dispatching to mamba_ssm's fused SSD kernel, run by
Triton's interpreter, against the pure-PyTorch scan and the float64 recurrence; and a whole
implicit Mamba2 trained one step through it (solve + phantom gradient) against the pure path.

What this verifies: the dispatch, the layouts and state conventions we hand the kernel
(dt already softplus'd, B and C per group, (b, h, p, n) states in and out) and the kernel's
arithmetic, forward and backward. What it cannot: compilation for a GPU, TF32 / bf16
numerics of ``tl.dot`` on real tensor cores, speed (see the handbook's GPU page, docs/gpu.md)."""

from __future__ import annotations

import pytest
import torch

from implicitlm.layers import ssd_chunked, ssd_reference, ssd_scan
from implicitlm.models import build_model, config_from_options
from tests.support.interpreted_kernel import interpreted_fused_kernel, kernel_packages_missing

pytestmark = pytest.mark.skipif(kernel_packages_missing() is not None, reason=str(kernel_packages_missing()))

# (batch, length, heads, headdim, ngroups, d_state, chunk): a partial last chunk (24 = 16 + 8),
# two groups of two heads, and one chunk only.
SHAPES = [(2, 24, 4, 8, 2, 8, 16), (1, 16, 2, 8, 1, 16, 16)]


def inputs(batch, length, heads, headdim, ngroups, d_state, seed=0):
    gen = torch.Generator().manual_seed(seed)

    def randn(*shape):
        return torch.randn(*shape, generator=gen)

    return (randn(batch, length, heads, headdim), torch.nn.functional.softplus(randn(batch, length, heads)),
            -torch.exp(randn(heads)), randn(batch, length, ngroups, d_state), randn(batch, length, ngroups, d_state),
            randn(batch, heads, headdim, d_state))


def scan_with_grads(scan, leaves, with_state: bool, chunk: int):
    leaves = [t.detach().clone().requires_grad_() for t in leaves]
    x, dt, A, B, C, state = leaves
    y, final = scan(x, dt, A, B, C, chunk, initial_state=state if with_state else None)
    # Weighted sums, so that every output element's gradient differs.
    gen = torch.Generator().manual_seed(1)
    loss = (y * torch.randn(y.shape, generator=gen)).sum() + (final * torch.randn(final.shape, generator=gen)).sum()
    loss.backward()
    return y.detach(), final.detach(), [None if t.grad is None else t.grad.detach() for t in leaves]


@pytest.mark.slow
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "b{}-l{}-h{}-p{}-g{}-n{}-chunk{}".format(*s))
@pytest.mark.parametrize("with_state", [False, True], ids=["zero-state", "initial-state"])
def test_ssd_scan_dispatches_to_the_fused_kernel_and_matches_the_pure_scan(monkeypatch, shape, with_state):
    *dims, chunk = shape
    leaves = inputs(*dims)
    with interpreted_fused_kernel(monkeypatch) as fused_kernel:
        fused = scan_with_grads(ssd_scan, leaves, with_state, chunk)
    # The dispatch ran the kernel once, on the inputs padded to whole chunks.
    batch, length, *rest = leaves[0].shape
    assert fused_kernel.calls == [torch.Size([batch, -(-length // chunk) * chunk, *rest])]
    pure = scan_with_grads(ssd_chunked, leaves, with_state, chunk)
    names = ["y", "final state", "dx", "ddt", "dA", "dB", "dC", "dstate"]
    for name, got, want in zip(names, [fused[0], fused[1], *fused[2]], [pure[0], pure[1], *pure[2]]):
        if want is None:
            assert got is None, name
            continue
        scale = want.abs().max().item()
        torch.testing.assert_close(got, want, rtol=0, atol=2e-5 * scale, msg=lambda m, name=name: f"{name}: {m}")
    # And the float64 recurrence, the oracle of both.
    x, dt, A, B, C, state = (t.double() for t in leaves)
    y64, final64 = ssd_reference(x, dt, A, B, C, initial_state=state if with_state else None)
    torch.testing.assert_close(fused[0].double(), y64, rtol=0, atol=1e-5 * y64.abs().max().item())
    torch.testing.assert_close(fused[1].double(), final64, rtol=0, atol=1e-5 * final64.abs().max().item())


@pytest.mark.slow
@pytest.mark.parametrize("with_state", [False, True], ids=["zero-state", "initial-state"])
def test_padding_to_whole_chunks_gives_the_kernels_unpadded_results(monkeypatch, with_state):
    """Every length runs the kernel's one compiled variant: padded with dt = 0, the outputs, the
    final state and every gradient are those of the kernel on the unpadded inputs."""
    *dims, chunk = SHAPES[0]  # 24 tokens: 16 + a partial chunk of 8
    leaves = inputs(*dims)
    with interpreted_fused_kernel(monkeypatch) as fused_kernel:
        padded = scan_with_grads(ssd_scan, leaves, with_state, chunk)
        unpadded = scan_with_grads(lambda x, dt, A, B, C, chunk_size, initial_state: fused_kernel.kernel(
            x, dt, A, B, C, chunk_size, initial_states=initial_state, return_final_states=True), leaves, with_state, chunk)
    assert [call[1] for call in fused_kernel.calls] == [32]  # the direct call is not the dispatch's
    names = ["y", "final state", "dx", "ddt", "dA", "dB", "dC", "dstate"]
    for name, got, want in zip(names, [padded[0], padded[1], *padded[2]], [unpadded[0], unpadded[1], *unpadded[2]]):
        if want is None:
            assert got is None, name
            continue
        torch.testing.assert_close(got, want, rtol=0, atol=1e-6 * want.abs().max().item(),
                                   msg=lambda m, name=name: f"{name}: {m}")


@pytest.mark.slow
def test_a_wrong_convention_is_caught(monkeypatch):
    """B and C swapped: the check above is able to fail."""
    leaves = inputs(2, 24, 4, 8, 2, 8)
    with interpreted_fused_kernel(monkeypatch) as fused_kernel:
        fused_kernel.replace(lambda kernel, x, dt, A, B, C, *rest, **options: kernel(x, dt, A, C, B, *rest, **options))
        with torch.no_grad():
            y, _ = ssd_scan(*leaves[:5], 16)
    assert fused_kernel.calls
    y_pure, _ = ssd_chunked(*leaves[:5], 16)
    assert (y - y_pure).abs().max() > 0.1 * y_pure.abs().max()


@pytest.mark.slow
def test_an_implicit_mamba2_trains_through_the_fused_kernel_as_through_the_pure_path(monkeypatch):
    torch.manual_seed(0)
    options = dict(architecture="mamba2", implicit=True, vocab_size=11, hidden_size=16, num_hidden_layers=1,
                   state_size=8, head_dim=8, chunk_size=16, n_groups=2,
                   fixed_point=dict(train_max_iter=2, phantom_steps=1, train_tol=1e-9))
    model = build_model(config_from_options(options)).train()
    ids = torch.randint(0, 11, (2, 20), generator=torch.Generator().manual_seed(3))

    def step():
        model.zero_grad()
        output = model(ids, labels=ids)
        output.loss.backward()
        return output.loss.detach(), {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}

    loss_pure, grads_pure = step()
    with interpreted_fused_kernel(monkeypatch) as fused_kernel:
        loss_fused, grads_fused = step()
    # Two solver iterations and one phantom step, each a pass of the one layer.
    assert len(fused_kernel.calls) == 3
    torch.testing.assert_close(loss_fused, loss_pure, rtol=1e-5, atol=0)
    assert grads_fused.keys() == grads_pure.keys() and len(grads_pure) > 5
    for name, grad in grads_pure.items():
        torch.testing.assert_close(grads_fused[name], grad, rtol=0, atol=1e-4 * grad.abs().max().item() + 1e-8,
                                   msg=lambda m, name=name: f"{name}: {m}")


@pytest.mark.slow
def test_state_reads_through_the_fused_kernel_equal_the_pure_path(monkeypatch):
    """A learned guess's fit reads the SSM states with queries in C's place, on sliced inputs
    (every token but the last): forward and gradient to the queries as the pure scan gives them."""
    from implicitlm.layers import Mamba2Dims, Mamba2Mixer

    torch.manual_seed(0)
    mixer = Mamba2Mixer(Mamba2Dims(d_model=16, d_state=8, headdim=8, chunk_size=16, ngroups=2)).requires_grad_(False)
    gen = torch.Generator().manual_seed(2)
    hidden, prefix = torch.randn(2, 20, 16, generator=gen), torch.randn(2, 5, 16, generator=gen)
    queries = torch.randn(2, 20, mixer.query_size, generator=gen)
    weights = torch.randn(2, 20, mixer.readout_size, generator=gen)

    def reads_and_gradient():
        _, state = mixer(prefix)
        leaf = queries.clone().requires_grad_()
        reads = mixer.state_reader(hidden, None, state)(leaf)
        (reads * weights).sum().backward()
        return reads.detach(), leaf.grad

    pure = reads_and_gradient()
    with interpreted_fused_kernel(monkeypatch) as fused_kernel:
        fused = reads_and_gradient()
    assert len(fused_kernel.calls) == 2  # the prefix's pass and the reads' scan
    for got, want in zip(fused, pure):
        torch.testing.assert_close(got, want, rtol=0, atol=2e-5 * want.abs().max().item())


@pytest.mark.parametrize("tuning", ["tuned", "smallest"])
def test_the_kernels_are_held_to_their_smallest_configuration_only_when_asked(monkeypatch, tuning):
    from implicitlm.layers import ssd_kernel

    with interpreted_fused_kernel(monkeypatch):
        held = []
        monkeypatch.setattr(ssd_kernel, "keep_smallest_configurations", lambda: held.append(True))
        monkeypatch.setenv(ssd_kernel.KERNEL_TUNING, tuning)
        ssd_kernel.fused_ssd_kernel.cache_clear()
        assert ssd_kernel.fused_ssd_kernel() is not None
        assert held == ([True] if tuning == "smallest" else [])
