"""Speed options of the trainers: compiled stack and mixed precision."""

from __future__ import annotations

import pytest
import torch

from implicitlm.deq import OptionError
from implicitlm.train.speed import accelerator_for, compile_stack, resolve_precision
from implicitlm.train.trainer import train
from implicitlm.train.config import TrainConfig

from tests.train.test_words_train import WORDS_MODEL
from tests.support.models import tiny_model


# Inductor's own code calls the deprecated torch.jit.script_method: torch's warning, not ours.
INDUCTOR_JIT_WARNING = "ignore:`torch.jit.script_method` is deprecated:DeprecationWarning"


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["eager", pytest.param("inductor", marks=pytest.mark.filterwarnings(INDUCTOR_JIT_WARNING))])
def test_compiled_stack_keeps_names_outputs_and_gradients(backend):
    # "eager" runs dynamo's tracing of the stack (custom autograd function, weight-norm
    # parametrisation, per-layer states); "inductor", what the trainers' compile option uses,
    # also generates and compiles the fused kernels (C++ on a CPU).
    eager, compiled = tiny_model(**WORDS_MODEL), tiny_model(**WORDS_MODEL)
    compile_stack(compiled, backend=backend)
    assert list(compiled.state_dict()) == list(eager.state_dict())
    input_ids = torch.randint(0, 6, (2, 7), generator=torch.Generator().manual_seed(0))
    losses = []
    for model in (eager, compiled):
        model.train()
        loss = model(input_ids, labels=input_ids).loss
        loss.backward()
        losses.append(loss)
    torch.testing.assert_close(losses[1], losses[0], rtol=1e-6, atol=1e-6)
    for (name, p_eager), p_compiled in zip(eager.named_parameters(), compiled.parameters()):
        torch.testing.assert_close(p_compiled.grad, p_eager.grad, rtol=1e-5, atol=1e-6, msg=lambda m, n=name: f"{n}: {m}")


def test_precision_resolves_to_full_precision_without_cuda():
    expected = "bf16" if torch.cuda.is_available() else "no"
    assert resolve_precision("auto") == expected
    assert resolve_precision("bf16") == "bf16"


def test_the_trainer_rejects_an_unknown_precision():
    with pytest.raises(OptionError, match="'precision' must be one of 'auto', 'no', 'bf16'"):
        TrainConfig.for_task("words", precision="fp8")


def test_bf16_autocast_forward_stays_close_to_float32():
    model = tiny_model(**WORDS_MODEL).eval()
    input_ids = torch.randint(0, 6, (2, 9), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        reference = model(input_ids, max_iter=4).logits
        with torch.autocast("cpu", dtype=torch.bfloat16):
            autocast = model(input_ids, max_iter=4).logits
    assert autocast.dtype in (torch.bfloat16, torch.float32)
    torch.testing.assert_close(autocast.float(), reference, rtol=0.05, atol=0.05)


def test_auto_precision_follows_the_device_a_run_trains_on(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert resolve_precision("auto") == "bf16"
    assert resolve_precision("auto", "cpu") == "no"  # before: bf16 autocast for a run on the CPU of a GPU machine
    assert resolve_precision("auto", "cuda:1") == "bf16"


def test_a_device_index_under_torchrun_is_refused(monkeypatch):
    monkeypatch.setenv("LOCAL_RANK", "0")
    with pytest.raises(OptionError, match=r"^device cuda:1: under torchrun each process trains on the GPU of its local"):
        accelerator_for("auto", "cuda:1")


def test_a_run_trains_on_the_device_asked_for(tmp_path):
    model = tiny_model(**WORDS_MODEL)
    config = TrainConfig.for_task("words", group="S3", sequence_length=4, batch_size=2, total_steps=1)
    train(model, config, tmp_path, progress=False, device="cpu")
    assert model.device.type == "cpu"
    assert accelerator_for("auto", "cpu").device == torch.device("cpu")
