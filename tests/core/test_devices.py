"""A device is checked by name before any model is loaded: one that nothing here runs on, or
that this machine lacks, is one line (an OptionError), never a failure deep inside a forward;
``auto`` is the GPU where torch sees one, else the CPU."""

from __future__ import annotations

import pytest
import torch

from implicitlm.core.devices import check_device_name, usable_device
from implicitlm.core.errors import OptionError


@pytest.mark.parametrize("name", ["meta", "mps", "xpu", "cuda:", "cuda:-1", "CPU", "", " cpu", "cuda:0:1", "cuda:01",
                                  "cuda:00", "cuda:128", "cuda:" + "9" * 20])
def test_a_device_models_do_not_run_on_is_refused_by_name(name):
    with pytest.raises(OptionError, match="device must be auto, cpu, cuda or cuda:N"):
        usable_device(name)
    with pytest.raises(OptionError):
        check_device_name(name)


def test_a_gpu_index_as_torch_writes_it_is_a_name():
    """Before: "cuda:01" and an index past torch's 8-bit range passed, and failed (or wrapped
    to another index) deep inside the command."""
    assert [check_device_name(name) for name in ("cuda:0", "cuda:7", "cuda:127")] == ["cuda:0", "cuda:7", "cuda:127"]
    with pytest.raises(OptionError, match=r"got 'cuda:01' \(N: a GPU's index, 0 to 127, no leading zeros\)"):
        check_device_name("cuda:01")


def test_the_cpu_is_usable_and_a_gpu_only_where_there_is_one():
    assert usable_device(None) == usable_device("cpu") == torch.device("cpu")
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    with pytest.raises(OptionError, match=f"cuda:{count}: this machine has "):
        usable_device(f"cuda:{count}")
    if count == 0:
        with pytest.raises(OptionError, match="no CUDA GPU"):
            usable_device("cuda")
        assert usable_device("cuda:0", cuda_fallback=True) == torch.device("cpu")


def test_auto_is_the_cpu_without_a_gpu_and_cuda_with_one(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert usable_device("auto") == torch.device("cpu")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    assert usable_device("auto") == torch.device("cuda")
