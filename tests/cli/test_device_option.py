"""``--device`` on every command that runs a model: ``auto`` by default (a GPU where torch sees
one, else the CPU), the device used said with the command's output and named in the records
written, and a device this machine lacks refused in one line before anything is written."""

from __future__ import annotations

import json

import pytest
import torch

from implicitlm.cli import build_parser, main
from implicitlm.models import build_model, config_from_options

# Each command that runs a model, with the arguments it requires.
COMMANDS = [
    "generate CK --prompt a", "lm downstream CK --out O", "lm eval CK --data D", "words eval CK",
    "words convergence CK --out O", "catbabi eval CK --data D --out O", "eval length --task words CK",
    "eval budget --task lm CK --data D --out O", "eval convergence --task words CK --out O", "solver train CK --out O",
    "jacobian CK --out O", "train --data D --out O", "words train --out O", "demo", "lm demo",
]
NO_GPU = pytest.mark.skipif(torch.cuda.is_available(), reason="refusing cuda needs a machine without a GPU")


@pytest.mark.parametrize("command", COMMANDS)
def test_every_command_that_runs_a_model_takes_a_device_and_defaults_to_auto(command):
    parser = build_parser()
    assert parser.parse_args(command.split()).device == "auto"
    assert parser.parse_args([*command.split(), "--device", "cuda:1"]).device == "cuda:1"


@pytest.fixture
def words_model(tmp_path):
    torch.manual_seed(0)
    options = dict(architecture="mamba2", vocab_size=6, hidden_size=16, num_hidden_layers=1, state_size=8, head_dim=8,
                   chunk_size=8, implicit=True, fixed_point=dict(max_iter=4))
    build_model(config_from_options(options)).save_pretrained(tmp_path / "model")
    return tmp_path / "model"


def words_eval(capsys, model, out, *options: str) -> tuple[int, list[str], list[str]]:
    """Exit code and the lines of standard output and error of ``implicitlm words eval``."""
    capsys.readouterr()  # what saving printed
    code = main(["words", "eval", str(model), "--group", "S3", "--lengths", "6", "--count", "4", "--out", str(out),
                 "--no-progress", *options])
    captured = capsys.readouterr()
    return code, captured.out.splitlines(), captured.err.strip().splitlines()


def test_the_default_device_is_said_and_recorded(words_model, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # auto: the CPU, here and on a GPU machine
    code, out, _ = words_eval(capsys, words_model, tmp_path / "out")
    assert code == 0 and out[0] == "device: cpu", out
    assert json.loads((tmp_path / "out" / "word_length.json").read_text())["model"]["device"] == "cpu"

    json_model = tmp_path / "implicit.json"
    json_model.write_text(json.dumps(dict(architecture="mamba2", vocab_size=6, hidden_size=16, num_hidden_layers=1,
                                          state_size=8, head_dim=8, chunk_size=8, implicit=True)))
    assert main(["jacobian", str(json_model), "--out", str(tmp_path / "jacobian"), "--length", "4", "--count", "1",
                 "--coordinates", "4", "--no-progress"]) == 0
    assert "device: cpu" in capsys.readouterr().out.splitlines()
    assert json.loads((tmp_path / "jacobian" / "jacobian.json").read_text())["model"]["device"] == "cpu"


@NO_GPU
@pytest.mark.parametrize("device", ["cuda", "cuda:0"])
def test_a_gpu_this_machine_lacks_is_one_line_and_nothing_is_written(words_model, tmp_path, capsys, device):
    code, out, err = words_eval(capsys, words_model, tmp_path / "out", "--device", device)
    assert code == 2 and len(err) == 1 and err[0].startswith("implicitlm: error:") and "no CUDA GPU" in err[0], err
    assert out == [] and not (tmp_path / "out").exists()


TINY_WORDS_RUN = ["--no-progress", "--model", "hidden_size=16", "--model", "num_hidden_layers=1", "--model", "state_size=4",
                  "--model", "head_dim=8", "--train", "sequence_length=4", "--train", "batch_size=2",
                  "--train", "total_steps=1"]


def test_a_training_run_takes_the_device_says_it_and_checks_its_memory(tmp_path, capsys, monkeypatch):
    """before: ``words train`` and ``train`` had no --device, though the GPU guide says every
    command that runs a model takes one."""
    import implicitlm.train.step_memory

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # auto: the CPU, here and on a GPU machine
    asked = []
    available = implicitlm.train.step_memory.available_bytes
    monkeypatch.setattr(implicitlm.train.step_memory, "available_bytes",
                        lambda device: asked.append(str(device)) or available(device))
    assert main(["words", "train", "--out", str(tmp_path / "auto"), *TINY_WORDS_RUN]) == 0
    assert main(["words", "train", "--out", str(tmp_path / "cpu"), "--device", "cpu", *TINY_WORDS_RUN]) == 0
    said = [line for line in capsys.readouterr().out.splitlines() if line.startswith("device:")]
    assert said == ["device: cpu", "device: cpu"]
    assert set(asked) == {"cpu"}


@NO_GPU
@pytest.mark.parametrize("command", [["words", "train", *TINY_WORDS_RUN], ["demo"], ["lm", "demo"]],
                         ids=["words-train", "demo", "lm-demo"])
def test_a_training_run_on_a_gpu_this_machine_lacks_is_one_line_and_nothing_is_written(tmp_path, capsys, command):
    assert main([*command, "--out", str(tmp_path / "out"), "--device", "cuda"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0] == "implicitlm: error: --device cuda: this machine has no CUDA GPU (use cpu)", err
    assert not (tmp_path / "out").exists()
