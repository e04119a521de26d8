"""Shared fixtures: a demo-size implicit model trained briefly on S3, token shards of the
project's own source, the real datasets, no network."""

from __future__ import annotations

import os
from pathlib import Path

import torch

# Without a GPU, Triton's interpreter runs the fused GPU kernels on the CPU
# (tests/support/interpreted_kernel.py). Triton reads the setting once, when it is first imported,
# and importing transformers imports it: so here, before anything else.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import datasets  # noqa: E402
import huggingface_hub  # noqa: E402
import pytest  # noqa: E402
from hypothesis import settings  # noqa: E402

from implicitlm.data.corpus import read_documents  # noqa: E402
from implicitlm.data.shard_writer import write_shards  # noqa: E402
from implicitlm.data.tokenizer import train_tokenizer  # noqa: E402
from implicitlm.presets import load_preset  # noqa: E402
from implicitlm.models import ImplicitMamba2ForCausalLM, config_from_options  # noqa: E402
from implicitlm.train.config import TrainConfig  # noqa: E402
from implicitlm.train.trainer import train  # noqa: E402

# Property tests draw the same examples on every run: CI is reproducible, and the
# fuzzing run (tests/data/test_fuzz_parsers.py) is where fresh inputs come from.
settings.register_profile("implicitlm", derandomize=True, database=None)
settings.load_profile("implicitlm")

# Test models are tiny: one thread avoids synchronisation overhead that dominates their cost.
torch.set_num_threads(1)

# Copies of the real datasets (WikiText-2, bAbI, the downstream sets), beside the project.
SHARED_DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"


# The device of the tests marked ``device`` (pyproject.toml): the GPU check
# (benchmarks/gpu_check.py) runs them with IMPLICITLM_TEST_DEVICE=cuda; cpu everywhere else.
DEVICE_VARIABLE = "IMPLICITLM_TEST_DEVICE"


@pytest.fixture(scope="session")
def device() -> str:
    """The device a ``device``-marked test builds its models and tensors on."""
    name = os.environ.get(DEVICE_VARIABLE, "cpu")
    if name.startswith("cuda") and not torch.cuda.is_available():
        pytest.skip(f"{DEVICE_VARIABLE}={name}, but no CUDA device is available")
    return name


@pytest.fixture
def offline_hub(monkeypatch, tmp_path):
    """No network: data must come from local files, and lm-eval or datasets may not fetch more."""
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(datasets.config, "HF_DATASETS_OFFLINE", True)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "datasets_cache")


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """The folder of real datasets; tests that read it are skipped on machines without it."""
    if not SHARED_DATA.is_dir():
        pytest.skip(f"no real datasets at {SHARED_DATA}")
    return SHARED_DATA


TRAINED_GROUP = "S3"
TRAINED_LENGTH = 12


@pytest.fixture(scope="session")
def shards(tmp_path_factory) -> Path:
    """Token shards of a frozen copy of the trainer's source files, with a 300-token tokenizer.
    Frozen: the tests that train on it compare a few dozen steps of tiny models, whose outcome
    would otherwise shift with every edit of the trainer's code."""
    root = tmp_path_factory.mktemp("corpus")
    sources = sorted((Path(__file__).parent / "support" / "frozen_corpus").glob("*.py.txt"))
    tokenizer = train_tokenizer(read_documents(sources), 300, root / "tokenizer")
    write_shards(read_documents(sources), tokenizer, root / "data", test_fraction=0.2, progress=False)
    return root / "data"


@pytest.fixture(scope="session")
def trained_s3(tmp_path_factory):
    """(model, run folder): the demo preset's implicit model after a short unroll + free schedule."""
    preset = load_preset("demo")
    run = tmp_path_factory.mktemp("trained_s3")
    config = TrainConfig.for_task(
        "words",
        **{
            **preset["train"],
            **preset["implicit_train"],
            "sequence_length": TRAINED_LENGTH,
            "batch_size": 64,
            "total_steps": 180,
            "unroll_steps": 150,
            "log_every": 50,
        },
    )
    torch.manual_seed(config.seed)
    model = ImplicitMamba2ForCausalLM(
        config_from_options({**preset["model"], "vocab_size": 6, "label_alignment": "aligned"})
    )
    train(model, config, run, progress=False)
    model.eval()
    return model, run
