"""``models import`` and ``load_model`` against what a user can do to them: an import onto
finished work, a transformers checkpoint with a missing tensor or a NaN, an import killed
while it writes, a run that removes the checkpoint being read, a refused setting, a digest
written by ``sha256sum``, a broken generation_config.json; and the one loader: every way in
(``from_pretrained`` of our classes, transformers' Auto class, a preset from a checkpoint)
refusing what ``load_model`` refuses, every family loaded, imported and registered from one table."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import AutoConfig, AutoModelForCausalLM
from transformers.utils import logging as transformers_logging

from implicitlm.cli import main
from implicitlm.core.errors import ImplicitLMError
from implicitlm.core.file_digests import write_files_digest
from implicitlm.core.targets import writer_lock
from implicitlm.core.weights_digest import weights_sha256, write_weights_digest
from implicitlm.models import loading
from implicitlm.models import (
    FAMILIES, ImplicitCausalLM, ImplicitLlamaForCausalLM, ImplicitMamba2ForCausalLM, ModelLoadError, build_model,
    config_from_options, load_model,
)
from implicitlm.models.convert import from_hf
from implicitlm.presets.run_presets import load_preset
from implicitlm.train.checkpoint import prune_checkpoints, save_checkpoint
from tests.models.test_convert import llama_reference, mamba2_reference, mamba_reference
from tests.models.test_untrusted import flip_low_bytes
from tests.support.refusals import one_error_line
from tests.support.models import tiny_model

OPTIONS = dict(vocab_size=12, hidden_size=16, num_hidden_layers=1, state_size=8, head_dim=8)


@pytest.fixture
def hf_checkpoint(tmp_path) -> Path:
    """A transformers Mamba2 checkpoint (safetensors), as ``models import`` takes it."""
    path = tmp_path / "hf"
    mamba2_reference().save_pretrained(path)
    return path


def run_cli(capsys, *argv) -> tuple[int, list[str], list[str]]:
    capsys.readouterr()
    code = main([str(arg) for arg in argv])
    captured = capsys.readouterr()
    return code, captured.out.strip().splitlines(), captured.err.strip().splitlines()


@pytest.fixture
def transformers_warnings():
    """transformers at its default verbosity, as a user's command runs it (other test files quieten it)."""
    level = transformers_logging.get_verbosity()
    transformers_logging.set_verbosity_warning()
    yield
    transformers_logging.set_verbosity(level)


def transformers_records(caplog) -> list[str]:
    """What transformers logged: its load report goes to the log, above our one error line."""
    return [record.getMessage() for record in caplog.records if record.name.startswith("transformers")]


# ---------------------------------------------------------------- an import onto finished work


def test_import_refuses_finished_work_unless_overwrite(hf_checkpoint, tmp_path, capsys):
    finished = tmp_path / "checkpoint"
    tiny_model(0, **OPTIONS).save_pretrained(finished)
    before = {path.name: path.read_bytes() for path in finished.iterdir()}
    code, _, err = run_cli(capsys, "models", "import", hf_checkpoint, "--out", finished)
    # Before: exit 0, the trained weights and config replaced by the import.
    assert one_error_line(code, err) == f"implicitlm: error: {finished}: exists; replace it with --overwrite"
    assert {path.name: path.read_bytes() for path in finished.iterdir()} == before
    # Refused before any conversion: a source that is no checkpoint is not even read.
    code, _, err = run_cli(capsys, "models", "import", tmp_path / "no_such_source", "--out", finished)
    assert one_error_line(code, err) == f"implicitlm: error: {finished}: exists; replace it with --overwrite"
    code, out, _ = run_cli(capsys, "models", "import", hf_checkpoint, "--out", finished, "--overwrite")
    assert code == 0 and out == [f"saved the explicit model (0.0M parameters) to {finished}"]
    imported = load_file(finished / "model.safetensors")
    source = load_file(hf_checkpoint / "model.safetensors")
    assert torch.equal(imported["stack.norm_f.weight"], source["backbone.norm_f.weight"])
    assert json.loads((finished / "config.json").read_text())["hidden_size"] == 32


def test_import_refuses_an_out_another_process_is_writing(hf_checkpoint, tmp_path, capsys):
    out = tmp_path / "ours"
    with writer_lock(out):
        code, _, err = run_cli(capsys, "models", "import", hf_checkpoint, "--out", out)
    # Before: both wrote into one folder.
    assert one_error_line(code, err) == f"implicitlm: error: {out}: another process is writing it (process {os.getpid()})"
    assert not out.exists()


# ---------------------------------------------------------------- a source with a tensor missing or NaN


def test_import_refuses_a_missing_tensor_naming_it(hf_checkpoint, tmp_path, capsys, caplog, transformers_warnings):
    tensors = load_file(hf_checkpoint / "model.safetensors")
    del tensors["backbone.layers.1.mixer.D"]
    save_file(tensors, hf_checkpoint / "model.safetensors", metadata={"format": "pt"})
    with caplog.at_level("WARNING"):
        code, _, err = run_cli(capsys, "models", "import", hf_checkpoint, "--out", tmp_path / "ours")
    # Before: exit 0, the tensor initialised at random and a fresh digest written over it.
    assert one_error_line(code, err) == (
        f"implicitlm: error: {hf_checkpoint}: lacks weights the config needs: ['backbone.layers.1.mixer.D']")
    assert transformers_records(caplog) == [] and not (tmp_path / "ours").exists()


def test_import_refuses_a_nan_naming_the_tensor(hf_checkpoint, tmp_path, capsys):
    tensors = load_file(hf_checkpoint / "model.safetensors")
    tensors["backbone.layers.0.mixer.in_proj.weight"][3, 5] = float("nan")
    save_file(tensors, hf_checkpoint / "model.safetensors", metadata={"format": "pt"})
    code, _, err = run_cli(capsys, "models", "import", hf_checkpoint, "--out", tmp_path / "ours")
    # Before: exit 0, a model whose every output is NaN.
    assert one_error_line(code, err) == (
        f"implicitlm: error: {hf_checkpoint}: weight backbone.layers.0.mixer.in_proj.weight holds NaN or Inf")
    assert not (tmp_path / "ours").exists()


def integer_tensor(folder: Path) -> None:
    tensors = load_file(folder / "model.safetensors")
    tensors["backbone.layers.0.mixer.D"] = tensors["backbone.layers.0.mixer.D"].long()
    save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})


def weights_changed_after_their_digest(folder: Path) -> None:
    write_weights_digest(folder)
    flip_low_bytes(folder / "model.safetensors", 1)


@pytest.mark.parametrize("damage, message", [
    (integer_tensor, "model.safetensors: tensor backbone.layers.0.mixer.D is I64; a model's weights are floating point"),
    (weights_changed_after_their_digest, "model.safetensors: SHA-256 differs from model.safetensors.sha256"),
])
def test_import_checks_a_source_as_the_loader_checks_a_model(hf_checkpoint, tmp_path, capsys, damage, message):
    """``convert`` reads its source through the one loader. Before: exit 0, the integers cast
    to floats, the damaged weights imported and given a fresh digest."""
    damage(hf_checkpoint)
    code, _, err = run_cli(capsys, "models", "import", hf_checkpoint, "--out", tmp_path / "ours")
    assert one_error_line(code, err) == f"implicitlm: error: {hf_checkpoint}/{message}" + (
        ": the weights are damaged" if "SHA" in message else " (F16, BF16, F32, F64)")
    assert not (tmp_path / "ours").exists()


def test_import_refuses_a_source_too_large_for_memory_before_building_it(hf_checkpoint, tmp_path, capsys):
    """Before: transformers began building the billion blocks (a MemoryError under a memory limit)."""
    config = json.loads((hf_checkpoint / "config.json").read_text())
    (hf_checkpoint / "config.json").write_text(json.dumps({**config, "num_hidden_layers": 10**9}))
    code, _, err = run_cli(capsys, "models", "import", hf_checkpoint, "--out", tmp_path / "ours")
    line = one_error_line(code, err)
    assert line.startswith(f"implicitlm: error: {hf_checkpoint / 'config.json'}: a model of ") and "of memory" in line, line
    assert not (tmp_path / "ours").exists()


# ---------------------------------------------------------------- an import killed while it writes

# Runs ``implicitlm models import`` with its save held after config.json is written, before the
# weights: the point where a SIGKILL used to leave a config without weights.
HELD_IMPORT = """
import sys, time
from implicitlm.cli import main
from implicitlm.models import ImplicitCausalLM

def held(self, directory, **kwargs):
    self.config.save_pretrained(directory)
    print(directory, flush=True)
    time.sleep(600)

ImplicitCausalLM.save_pretrained = held
sys.exit(main(sys.argv[1:]))
"""


@pytest.mark.slow
def test_an_import_killed_while_writing_leaves_nothing_and_the_rerun_clears_it(hf_checkpoint, tmp_path, capsys, caplog):
    out = tmp_path / "ours"
    command = [sys.executable, "-c", HELD_IMPORT, "models", "import", str(hf_checkpoint), "--out", str(out)]
    with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True) as process:
        try:
            writing = Path(process.stdout.readline().strip())
        finally:
            process.send_signal(signal.SIGKILL)
    assert (writing / "config.json").is_file()
    # Before: --out itself held config.json and no weights.
    assert not out.exists() and writing.parent == tmp_path and writing.name.startswith(".ours.")
    code, out_lines, err = run_cli(capsys, "models", "import", hf_checkpoint, "--out", out)
    # Before: the rerun left the killed one's temporary where it was, without a word.
    assert code == 0 and [r.getMessage() for r in caplog.records if r.name == "implicitlm"] == [
        f"{out}: removed what a killed writer left: {writing}"
    ]
    assert not writing.exists() and sorted(p.name for p in tmp_path.iterdir()) == ["hf", "ours"]
    assert load_model(out).config.hidden_size == 32 and out_lines[0].startswith("saved the explicit model")


# ---------------------------------------------------------------- loading beside a run that prunes


def make_run(run: Path, step: int, seed: int) -> None:
    """The run writes its checkpoint of ``step`` and keeps it alone, as keep_checkpoints=1 does."""
    save_checkpoint(run / "checkpoints" / f"step_{step:07d}", tiny_model(seed, **OPTIONS), meta={"step": step})
    prune_checkpoints(run / "checkpoints", keep=1)


def test_load_model_reads_the_next_checkpoint_when_the_run_removes_the_one_read(tmp_path, monkeypatch):
    run = tmp_path / "run"
    make_run(run, 1, seed=1)
    read_weights = loading.weights_sha256

    def run_moves_on(folder: Path) -> str:
        if folder.name == "step_0000001":
            make_run(run, 2, seed=2)  # between listing the run and reading its weights
        return read_weights(folder)

    monkeypatch.setattr(loading, "weights_sha256", run_moves_on)
    # Before: FileNotFoundError: .../step_0000001/model.safetensors.
    model = load_model(run)
    expected = load_file(run / "checkpoints" / "step_0000002" / "model.safetensors")
    assert all(torch.equal(model.state_dict()[name], tensor) for name, tensor in expected.items())


# A training step of the run beside the loads: the time between its checkpoints.
STEP_SECONDS = 0.05


@pytest.mark.slow
def test_load_model_in_a_loop_beside_a_run_writing_every_step(tmp_path):
    run = tmp_path / "run"
    make_run(run, 0, seed=0)
    stop = threading.Event()

    def write_every_step() -> None:
        step = 0
        while not stop.wait(STEP_SECONDS):
            step += 1
            make_run(run, step, seed=step)

    writer = threading.Thread(target=write_every_step)
    writer.start()
    try:
        # Before: FileNotFoundError or "no config.json" in about one load of four here (2 of 12 beside a real run).
        loads = [load_model(run).config.hidden_size for _ in range(20)]
    finally:
        stop.set()
        writer.join()
    assert loads == [16] * 20


# ---------------------------------------------------------------- a refused setting, in one line


def test_import_of_a_refused_llama_setting_is_one_line(tmp_path, capsys, caplog, transformers_warnings):
    hf = tmp_path / "hf"
    llama_reference().save_pretrained(hf)
    config = json.loads((hf / "config.json").read_text())
    (hf / "config.json").write_text(json.dumps({**config, "attention_bias": True}))
    with caplog.at_level("WARNING"):
        code, _, err = run_cli(capsys, "models", "import", hf, "--out", tmp_path / "ours")
    assert one_error_line(code, err) == "implicitlm: error: unsupported setting of the source model: attention_bias / mlp_bias (biases)"
    # Before: 13 lines of transformers' load report (the biases MISSING) above the error.
    assert transformers_records(caplog) == []


# ---------------------------------------------------------------- the weights' digest as sha256sum writes it


@pytest.fixture
def saved(tmp_path) -> Path:
    path = tmp_path / "model"
    tiny_model(0, **OPTIONS).save_pretrained(path)
    return path


@pytest.mark.parametrize("form", [
    "{digest}  model.safetensors\n", "{digest} *model.safetensors\n", "{digest}  checkpoints/model/model.safetensors",
    "{upper}\n", "{upper}  model.safetensors",
])
def test_a_digest_as_sha256sum_writes_it_or_in_upper_case_is_accepted(saved, form):
    digest = weights_sha256(saved)
    (saved / "model.safetensors.sha256").write_text(form.format(digest=digest, upper=digest.upper()))
    # Before: "SHA-256 differs from model.safetensors.sha256: the weights are damaged".
    expected = load_file(saved / "model.safetensors")
    assert torch.equal(load_model(saved).state_dict()["embeddings.weight"], expected["embeddings.weight"])
    # Still checked: one flipped bit in the weights is refused.
    weights = bytearray((saved / "model.safetensors").read_bytes())
    weights[-3] ^= 0x01
    (saved / "model.safetensors").write_bytes(bytes(weights))
    with pytest.raises(ModelLoadError, match="SHA-256 differs from model.safetensors.sha256"):
        load_model(saved)


@pytest.mark.parametrize("form", [
    "{digest}  other.safetensors", "{digest}\n{digest}", "{digest}0", "sha256:{digest}", "",
])
def test_a_digest_file_of_another_form_is_refused_naming_it(saved, form):
    file = saved / "model.safetensors.sha256"
    file.write_text(form.format(digest=weights_sha256(saved)))
    with pytest.raises(ModelLoadError) as caught:
        load_model(saved)
    message = str(caught.value)
    assert "\n" not in message and message.startswith(f"{file}: expected a SHA-256 hex digest")


# ---------------------------------------------------------------- generation_config.json


@pytest.mark.parametrize("content, problem", [
    ("{not json", "generation_config.json:1: expected JSON (a generation config): Expecting property name"),
    ("[1]", "generation_config.json: expected a JSON object (a generation config), got list"),
    ('{"max_new_token": 17}', "generation_config.json: unknown generation setting 'max_new_token' "
                              "(did you mean 'max_new_tokens'?)"),
    ('{"max_new_tokens": 0}', "generation_config.json: invalid generation config (ValueError: `max_new_tokens` "
                              "must be greater than 0, but is 0.)"),
])
def test_an_invalid_generation_config_is_refused_naming_it(saved, content, problem):
    (saved / "generation_config.json").write_text(content)
    with pytest.raises(ModelLoadError) as caught:
        load_model(saved)
    # Before: loaded as defaults (the first three) or "cannot load weights (...)" without the file.
    assert str(caught.value).startswith(f"{saved}/{problem}")


def test_a_valid_generation_config_loads(saved):
    # temperature without do_sample: transformers would only warn, so it loads (quietly).
    (saved / "generation_config.json").write_text('{"max_new_tokens": 17, "temperature": 0.7, "eos_token_id": 3}')
    write_files_digest(saved)
    config = load_model(saved).generation_config
    assert (config.max_new_tokens, config.temperature, config.eos_token_id) == (17, 0.7, 3)


def test_import_refuses_an_invalid_generation_config_of_the_source(hf_checkpoint, tmp_path, capsys):
    (hf_checkpoint / "generation_config.json").write_text("{not json")
    code, _, err = run_cli(capsys, "models", "import", hf_checkpoint, "--out", tmp_path / "ours")
    assert one_error_line(code, err).startswith(f"implicitlm: error: {hf_checkpoint}/generation_config.json:1: expected JSON")
    assert not (tmp_path / "ours").exists()


def test_an_import_onto_a_full_disk_is_one_line_and_writes_nothing(hf_checkpoint, tmp_path, capsys, monkeypatch):
    """Before: safetensors' own error type reached the user as a traceback."""
    from safetensors import SafetensorError
    from transformers import modeling_utils

    def disk_full(*args, **kwargs):
        raise SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")

    monkeypatch.setattr(modeling_utils, "safe_save_file", disk_full)
    out = tmp_path / "ours"
    code, _, err = run_cli(capsys, "models", "import", hf_checkpoint, "--out", out)
    assert code == 1 and len(err) == 1 and err[0].endswith("No space left on device)"), err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hf"]


# ---------------------------------------------------------------- one loader


LOADERS = {
    "ImplicitCausalLM": ImplicitCausalLM.from_pretrained,
    "family class": ImplicitMamba2ForCausalLM.from_pretrained,
    "AutoModelForCausalLM": AutoModelForCausalLM.from_pretrained,
}


def flip_a_weight_byte(folder: Path) -> None:
    weights = bytearray((folder / "model.safetensors").read_bytes())
    weights[-3] ^= 0x01
    (folder / "model.safetensors").write_bytes(bytes(weights))


@pytest.mark.parametrize("loader", LOADERS.values(), ids=LOADERS.keys())
def test_from_pretrained_refuses_damaged_weights(saved, loader):
    flip_a_weight_byte(saved)
    # Before: from_pretrained loaded the damaged weights without a word.
    with pytest.raises(ModelLoadError, match="SHA-256 differs from model.safetensors.sha256"):
        loader(saved)


@pytest.mark.parametrize("loader", LOADERS.values(), ids=LOADERS.keys())
def test_from_pretrained_refuses_nan_weights(saved, loader):
    weights = load_file(saved / "model.safetensors")
    weights["embeddings.weight"][3, 1] = float("nan")
    save_file(weights, saved / "model.safetensors", metadata={"format": "pt"})
    write_weights_digest(saved)  # NaN saved as such, not damaged on the way
    # Before: loaded, and evaluated to some accuracy with NaN logits.
    with pytest.raises(ModelLoadError, match="weight embeddings.weight holds NaN or Inf"):
        loader(saved)


@pytest.mark.parametrize("loader", LOADERS.values(), ids=LOADERS.keys())
def test_from_pretrained_refuses_a_misspelt_config_key(saved, loader):
    config = json.loads((saved / "config.json").read_text())
    config["hidden_sise"] = config.pop("hidden_size")
    (saved / "config.json").write_text(json.dumps(config))
    # Before: hidden_sise kept as an attribute no one reads, hidden_size at its default (768).
    with pytest.raises(ModelLoadError, match="unknown model option 'hidden_sise'.*hidden_size"):
        loader(saved)


@pytest.mark.parametrize("loader", LOADERS.values(), ids=LOADERS.keys())
def test_from_pretrained_refuses_integer_weights(saved, loader):
    weights = load_file(saved / "model.safetensors")
    weights["embeddings.weight"] = weights["embeddings.weight"].long()
    save_file(weights, saved / "model.safetensors", metadata={"format": "pt"})
    write_weights_digest(saved)
    # Before: loaded, cast to float32 without a word.
    with pytest.raises(ModelLoadError, match="tensor embeddings.weight is I64; a model's weights are floating point"):
        loader(saved)


@pytest.mark.parametrize("loader", LOADERS.values(), ids=LOADERS.keys())
@pytest.mark.parametrize("key", ["dtype", "torch_dtype"])
def test_from_pretrained_refuses_an_unknown_dtype_naming_the_key(saved, loader, key):
    config = json.loads((saved / "config.json").read_text())
    config[key] = "nonsense"
    (saved / "config.json").write_text(json.dumps(config))
    # Before: ignored, the weights loaded in their own dtype.
    with pytest.raises(ImplicitLMError) as refused:  # transformers' Auto class reads the config first
        loader(saved)
    assert f"model option '{key}' must be the name of a floating dtype" in str(refused.value)
    assert str(refused.value).startswith(str(saved / "config.json")) or loader == LOADERS["AutoModelForCausalLM"]


def test_from_pretrained_of_a_run_folder_loads_its_newest_checkpoint(tmp_path):
    run = tmp_path / "run"
    make_run(run, 1, seed=1)
    make_run(run, 2, seed=2)
    # Before: "no file named model.safetensors" (the run folder itself was read).
    model = ImplicitCausalLM.from_pretrained(run, dtype=torch.bfloat16)
    assert type(model) is ImplicitMamba2ForCausalLM and model.dtype == torch.bfloat16
    expected = tiny_model(2, **OPTIONS).state_dict()["embeddings.weight"].to(torch.bfloat16)
    assert torch.equal(model.state_dict()["embeddings.weight"], expected)


def test_a_family_class_refuses_a_model_of_another_family(saved):
    # Before: transformers loaded the Mamba2 weights into a Llama model, initialising the rest at random.
    with pytest.raises(ModelLoadError, match="a model of type implicit_mamba2, not implicit_llama"):
        ImplicitLlamaForCausalLM.from_pretrained(saved)


def test_a_preset_from_a_checkpoint_refuses_a_misspelt_config_key(saved):
    config = json.loads((saved / "config.json").read_text())
    config["num_hiden_layers"] = 3
    (saved / "config.json").write_text(json.dumps(config))
    # Before: the key was dropped and the new run built a model of one block, not three.
    with pytest.raises(ModelLoadError, match="unknown model option 'num_hiden_layers'.*num_hidden_layers"):
        load_preset(str(saved))


# Each family's tiny options and transformers source: a new row of FAMILIES must come with its own.
FAMILY_OPTIONS = {
    "mamba2": dict(state_size=8, head_dim=8),
    "llama": dict(num_attention_heads=2),
    "mamba": dict(state_size=8),
}
SOURCES = {"mamba2": mamba2_reference, "llama": llama_reference, "mamba": mamba_reference}


@pytest.mark.parametrize("family", FAMILIES, ids=[family.architecture for family in FAMILIES])
def test_every_family_of_the_table_is_registered_loadable_and_importable(family, tmp_path):
    assert AutoConfig.for_model(family.model_type).__class__ is family.config_class
    torch.manual_seed(0)
    options = dict(architecture=family.architecture, vocab_size=12, hidden_size=16, num_hidden_layers=1)
    built = build_model(config_from_options({**options, **FAMILY_OPTIONS[family.architecture]}))
    built.save_pretrained(tmp_path / "ours")
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path / "ours")
    assert type(loaded) is family.model_class and type(load_model(tmp_path / "ours")) is family.model_class
    assert torch.equal(loaded.state_dict()["embeddings.weight"], built.state_dict()["embeddings.weight"])
    assert load_preset(str(tmp_path / "ours"))["model"]["architecture"] == family.architecture
    SOURCES[family.architecture]().save_pretrained(tmp_path / "source")
    assert type(from_hf(tmp_path / "source")) is family.model_class
    assert set(FAMILY_OPTIONS) == set(SOURCES) == {family.architecture for family in FAMILIES}


@pytest.fixture
def progress_bars_on():
    """transformers' progress bars on, as a library caller has them (the command line turns
    them off for good), then as they were."""
    enabled = transformers_logging.is_progress_bar_enabled()
    transformers_logging.enable_progress_bar()
    yield
    if not enabled:
        transformers_logging.disable_progress_bar()


def test_loading_shows_no_progress_bar_and_leaves_the_setting_as_it_was(saved, capsys, progress_bars_on):
    """Before: transformers' "Loading weights" bar, under progress=False and --no-progress too."""
    capsys.readouterr()
    load_model(saved)
    assert "Loading weights" not in capsys.readouterr().err
    assert transformers_logging.is_progress_bar_enabled()


def test_saving_writes_nothing_to_stderr_and_leaves_the_bar_setting_as_it_was(tmp_path, capfd, progress_bars_on):
    """Before: transformers' "Writing model shards" bar on every checkpoint of a run trained
    with progress=False."""
    capfd.readouterr()
    model = tiny_model(0, **OPTIONS)
    save_checkpoint(tmp_path / "checkpoint", model, training_state={"step": 1}, meta={"step": 1})
    model.save_pretrained(tmp_path / "model")
    assert capfd.readouterr().err == ""
    assert (tmp_path / "checkpoint" / "model.safetensors").is_file() and (tmp_path / "model" / "model.safetensors").is_file()
    assert transformers_logging.is_progress_bar_enabled()
