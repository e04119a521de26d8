"""Checkpoint directories from anywhere: nothing in them is unpickled or executed, and a bad
one is refused with one line naming the file and the problem."""

from __future__ import annotations

import ast
import json
import pickle
import runpy
import shutil
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM

import implicitlm
from implicitlm.cli import main
from implicitlm.core.errors import DataError
from implicitlm.core.file_digests import write_files_digest
from implicitlm.core.run_folder import latest_checkpoint
from implicitlm.core.weights_digest import write_weights_digest
from implicitlm.data.tokenizer import load_tokenizer, train_tokenizer
from implicitlm.models import ImplicitMamba2ForCausalLM, build_model, config_from_options, load_model
from implicitlm.models.loading import ModelLoadError
from implicitlm.train.checkpoint import TRAINING_STATE, CheckpointError, load_training_state, save_checkpoint
from tests.support.refusals import one_error_line

OPTIONS = dict(vocab_size=8, hidden_size=16, num_hidden_layers=1, state_size=8, head_dim=8)


class CreatesFile:
    """Unpickling this object creates ``path``: what a malicious checkpoint file would run."""

    def __init__(self, path: Path) -> None:
        self.path = str(path)

    def __reduce__(self):
        return open, (self.path, "w")


def evil_module(marker: Path) -> str:
    """Python source that creates ``marker`` when imported, with the classes an auto_map names."""
    return (
        f"open({str(marker)!r}, 'w').close()\n"
        "from implicitlm.models import ImplicitMamba2Config, ImplicitMamba2ForCausalLM\n"
        "class EvilConfig(ImplicitMamba2Config):\n    pass\n"
        "class EvilModel(ImplicitMamba2ForCausalLM):\n    pass\n"
    )


@pytest.fixture(scope="module")
def saved(tmp_path_factory) -> Path:
    """A saved model: config.json + model.safetensors."""
    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("saved") / "model"
    build_model(config_from_options(OPTIONS)).save_pretrained(path)
    return path


def copy_of(saved: Path, tmp_path: Path, config: dict | list | None = None) -> Path:
    """A copy of ``saved``, with ``config`` as its config.json, its digest recorded: a config
    from elsewhere, not one changed behind the model's back."""
    path = tmp_path / "checkpoint"
    shutil.copytree(saved, path)
    if config is not None:
        (path / "config.json").write_text(json.dumps(config))
        write_files_digest(path)
    return path


def rewrite_weights(path: Path, tensors: dict[str, torch.Tensor]) -> None:
    """Replace ``path``'s weights, their digest recorded: a file from elsewhere, not a damaged one."""
    save_file(tensors, path / "model.safetensors", metadata={"format": "pt"})
    write_weights_digest(path)


def saved_config(saved: Path) -> dict:
    return json.loads((saved / "config.json").read_text())


def refusal(path: Path) -> str:
    with pytest.raises(ModelLoadError) as caught:
        load_model(path)
    message = str(caught.value)
    assert "\n" not in message
    return message


# ---------------------------------------------------------------- weights: safetensors only


def test_a_saved_model_loads_back(saved):
    model = load_model(saved)
    assert isinstance(model, ImplicitMamba2ForCausalLM) and model.config.hidden_size == 16
    stored = load_file(saved / "model.safetensors")
    assert all(torch.equal(model.state_dict()[name], tensor) for name, tensor in stored.items())


def test_pickled_weights_are_never_read(saved, tmp_path):
    path = copy_of(saved, tmp_path)
    marker = tmp_path / "unpickled"
    (path / "model.safetensors").unlink()
    torch.save({"payload": CreatesFile(marker)}, path / "pytorch_model.bin")
    assert refusal(path) == f"{path}: no model.safetensors"
    assert not marker.exists()


def test_weights_that_do_not_fit_the_config_are_refused(saved, tmp_path):
    # transformers would initialise the missing head at random and only warn.
    path = copy_of(saved, tmp_path, {**saved_config(saved), "tie_word_embeddings": False})
    assert refusal(path) == f"{path}/model.safetensors: lacks weights the config needs: ['lm_head.weight']"
    shutil.rmtree(path)
    path = copy_of(saved, tmp_path)
    rewrite_weights(path, {**load_file(path / "model.safetensors"), "extra": torch.zeros(2)})
    assert refusal(path) == f"{path}/model.safetensors: holds weights the config has no place for: ['extra']"
    shutil.rmtree(path)
    path = copy_of(saved, tmp_path, {**saved_config(saved), "state_size": 16})
    message = refusal(path)  # before: "cannot load weights (... look at the above report!)", no report above
    assert message.startswith(f"{path}/model.safetensors: ") and "conv1d.bias [48] (config.json: [64])" in message
    assert message.endswith("look like implicit=true, weight_norm=true, num_hidden_layers=1, hidden_size=16, vocab_size<=16")


def test_a_damaged_safetensors_file_is_refused(saved, tmp_path):
    path = copy_of(saved, tmp_path)
    data = (path / "model.safetensors").read_bytes()
    (path / "model.safetensors").write_bytes(data[: len(data) // 2])
    assert refusal(path) == f"{path}/model.safetensors: SHA-256 differs from model.safetensors.sha256: the weights are damaged"
    (path / "model.safetensors.sha256").unlink()
    assert refusal(path).startswith(f"{path}: cannot load weights (")


# ---------------------------------------------------------------- training state: no unpickling of objects


@pytest.mark.filterwarnings("ignore:Detected pickle protocol")
@pytest.mark.parametrize("writer", ["torch.save", "pickle.dump"])
def test_a_malicious_training_state_is_refused_unexecuted(saved, tmp_path, writer):
    checkpoint = save_checkpoint(tmp_path / "step", load_model(saved), training_state={"step": torch.tensor(3)})
    assert load_training_state(checkpoint)["step"].item() == 3
    marker = tmp_path / "unpickled"
    payload = {"step": torch.tensor(3), "optimizer": CreatesFile(marker)}
    with open(checkpoint / TRAINING_STATE, "wb") as handle:
        if writer == "torch.save":
            torch.save(payload, handle)
        else:
            pickle.dump(payload, handle)
    with pytest.raises(CheckpointError, match=f"{TRAINING_STATE}: unreadable training state"):
        load_training_state(checkpoint)
    assert not marker.exists()
    # The payload is live: plain unpickling runs it.
    pickle.loads(pickle.dumps(CreatesFile(marker)))
    assert marker.exists()


# ---------------------------------------------------------------- code in a checkpoint directory is never run


def test_auto_map_code_in_a_checkpoint_is_never_run(saved, tmp_path):
    marker = tmp_path / "imported"
    auto_map = {"AutoConfig": "evil.EvilConfig", "AutoModelForCausalLM": "evil.EvilModel"}
    path = copy_of(saved, tmp_path, {**saved_config(saved), "auto_map": auto_map})
    (path / "evil.py").write_text(evil_module(marker))
    assert type(load_model(path)) is ImplicitMamba2ForCausalLM
    # transformers' Auto classes, as the README shows: the registered model_type wins.
    assert type(AutoModelForCausalLM.from_pretrained(path)) is ImplicitMamba2ForCausalLM
    assert not marker.exists()
    runpy.run_path(str(path / "evil.py"))  # the module is live: importing it creates the marker
    assert marker.exists()


def test_auto_map_code_beside_a_tokenizer_is_never_run(tmp_path):
    marker = tmp_path / "imported"
    folder = tmp_path / "tokenizer"
    train_tokenizer(["one two three four " * 20], 300, folder)
    settings_file = folder / "tokenizer_config.json"
    tokenizer_config = json.loads(settings_file.read_text())
    tokenizer_config.pop("tokenizer_class", None)  # else the local class is used without a question
    auto_map = {"AutoTokenizer": [None, "evil.EvilTokenizer"]}
    settings_file.write_text(json.dumps({**tokenizer_config, "auto_map": auto_map}))
    (folder / "evil.py").write_text(evil_module(marker))
    with pytest.raises(DataError, match="cannot load a tokenizer"):
        load_tokenizer(folder)
    assert not marker.exists()


def test_the_package_unpickles_nothing():
    """Every torch.load passes weights_only=True; no pickle, no np.load(allow_pickle=True), no remote code."""
    for file in Path(implicitlm.__file__).parent.rglob("*.py"):
        tree = ast.parse(file.read_text(), filename=str(file))
        for node in ast.walk(tree):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                modules = [alias.name for alias in node.names] + [getattr(node, "module", None) or ""]
                assert not {"pickle", "dill", "joblib", "cloudpickle"} & set(modules), f"{file}:{node.lineno}"
            if not isinstance(node, ast.Call):
                continue
            keywords = {k.arg: k.value for k in node.keywords}
            name = ast.unparse(node.func)
            if name == "torch.load":
                flag = keywords.get("weights_only")
                assert isinstance(flag, ast.Constant) and flag.value is True, f"{file}:{node.lineno}"
            for unsafe in ("allow_pickle", "trust_remote_code"):
                flag = keywords.get(unsafe)
                assert flag is None or isinstance(flag, ast.Constant) and flag.value is False, f"{file}:{node.lineno}"


# ---------------------------------------------------------------- config.json: every field checked


@pytest.mark.parametrize(
    "change, problem",
    [
        ({"hidden_size": -1}, "model option 'hidden_size' must be an integer >= 1, got -1"),
        ({"num_hidden_layers": "2"}, "model option 'num_hidden_layers' must be an integer >= 1, got '2'"),
        ({"head_dim": 3}, "model option 'head_dim' must be a divisor of expand * hidden_size = 32, got 3"),
        ({"fixed_point": 3}, "model option 'fixed_point' must be a dict or null, got 3"),
        ({"fixed_point": {"zz": 1}}, "unknown fixed-point option 'zz'"),
        ({"a_init_range": "1,16"}, "model option 'a_init_range' must be a list of 2 numbers with 0 < low <= high"),
        ({"model_type": ["implicit_mamba2"]}, "model_type ['implicit_mamba2'] is not one of"),
        ({"model_type": "llama"}, "model_type 'llama' is not one of"),
        ({"dtype": "nonsense"}, "model option 'dtype' must be the name of a floating dtype"),
        ({"torch_dtype": "int64"}, "model option 'torch_dtype' must be the name of a floating dtype"),
    ],
)
def test_an_invalid_config_json_is_refused_naming_the_field(saved, tmp_path, change, problem):
    path = copy_of(saved, tmp_path, {**saved_config(saved), **change})
    assert refusal(path).startswith(f"{path}/config.json: {problem}")


@pytest.mark.parametrize(
    "content, problem",
    [(b"[1, 2]", "expected a JSON object"), (b'{"model_type": ', "expected JSON"), (b"\xff\xfe{}", "expected UTF-8")],
)
def test_a_config_json_that_is_no_object_is_refused(saved, tmp_path, content, problem):
    path = copy_of(saved, tmp_path)
    (path / "config.json").write_bytes(content)
    assert problem in refusal(path)


# What transformers writes into a config.json, or a model's config holds, beside our fields.
TRANSFORMERS_FIELDS = {
    "transformers_version": "5.0.0", "architectures": ["ImplicitMamba2ForCausalLM"], "dtype": "float32",
    "torch_dtype": "float32", "_name_or_path": "somewhere", "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 2,
    "use_cache": True, "return_dict": True, "output_hidden_states": False, "id2label": {"0": "a", "1": "b"},
    "num_labels": 2, "auto_map": {},
}


@pytest.mark.parametrize("key", [*TRANSFORMERS_FIELDS, "to_dict"])
def test_keys_that_transformers_writes_into_config_json_load(saved, tmp_path, key):
    # "to_dict": every key a loaded model's config holds, not only those save_pretrained writes.
    change = load_model(saved).config.to_dict() if key == "to_dict" else {key: TRANSFORMERS_FIELDS[key]}
    assert load_model(copy_of(saved, tmp_path, {**saved_config(saved), **change})).config.hidden_size == 16


# Bounded numbers: a config.json of huge but valid sizes would build a huge model first.
config_values = st.recursive(
    st.none() | st.booleans() | st.integers(-2, 40) | st.floats(-1, 40) | st.text(max_size=6),
    lambda children: st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=6), children, max_size=2),
    max_leaves=5,
)


@settings(max_examples=40, deadline=None)
@given(data=st.data())
def test_any_json_in_a_config_field_loads_or_is_refused(saved, tmp_path_factory, data):
    config = saved_config(saved)
    names = sorted(config) + ["id2label", "pad_token_id", "eos_token_id", "num_labels", "auto_map", "unknown"]
    changes = data.draw(st.dictionaries(st.sampled_from(names), config_values, min_size=1, max_size=2))
    path = copy_of(saved, tmp_path_factory.mktemp("any"), {**config, **changes})
    try:
        model = load_model(path)
    except ModelLoadError as error:
        assert "\n" not in str(error) and str(error).startswith(str(path))
        return
    assert model.config.hidden_size == config["hidden_size"]


@pytest.mark.parametrize("config", [{"model_type": "mamba2", "hidden_size": "abc"}, [1, 2], {"model_type": 3}])
def test_import_of_a_foreign_checkpoint_with_a_bad_config_is_one_line(tmp_path, capsys, config):
    from implicitlm.cli import main

    (tmp_path / "hf").mkdir()
    (tmp_path / "hf" / "config.json").write_text(json.dumps(config))
    code = main(["models", "import", str(tmp_path / "hf"), "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and str(tmp_path / "hf") in err[0]
    assert not (tmp_path / "out").exists()


def test_damaged_or_non_finite_weights_are_refused_at_load(tmp_path):
    from safetensors.torch import load_file

    from implicitlm.models import ModelLoadError, build_model, config_from_options, load_model
    from implicitlm.train.checkpoint import save_checkpoint

    model = build_model(config_from_options(dict(vocab_size=12, hidden_size=16, num_hidden_layers=1, state_size=8, head_dim=8)))
    save_checkpoint(tmp_path / "ckpt", model)
    assert (tmp_path / "ckpt" / "model.safetensors.sha256").is_file() and load_model(tmp_path / "ckpt") is not None
    weights = tmp_path / "ckpt" / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-3] ^= 0x01  # one bit of one weight: still a loadable file
    weights.write_bytes(bytes(data))
    with pytest.raises(ModelLoadError, match="SHA-256 differs from model.safetensors.sha256"):
        load_model(tmp_path / "ckpt")
    # NaN weights with their digest: the file is as it was written.
    model.save_pretrained(tmp_path / "plain")
    tensors = load_file(tmp_path / "plain" / "model.safetensors")
    name = next(iter(tensors))
    tensors[name][0] = float("nan")
    rewrite_weights(tmp_path / "plain", tensors)
    with pytest.raises(ModelLoadError, match=f"weight {name} holds NaN or Inf"):
        load_model(tmp_path / "plain")


# ---------------------------------------------------------------- the command line on a checkpoint from elsewhere

WORDS_RUN = ["--model", "hidden_size=16", "--model", "state_size=8", "--model", "head_dim=8", "--model", "num_hidden_layers=1",
             "--train", "group=S3", "--train", "total_steps=1", "--train", "sequence_length=4", "--train", "batch_size=4"]
DIGEST_WARNING = "no model.safetensors.sha256 beside the weights: loaded without checking them for damage"


@pytest.fixture(scope="module")
def words_checkpoint(tmp_path_factory) -> Path:
    """The checkpoint of a one-step implicit S3 words run (hidden_size 16, one block)."""
    run = tmp_path_factory.mktemp("words") / "run"
    assert main(["words", "train", "--out", str(run), "--no-progress", *WORDS_RUN]) == 0
    return latest_checkpoint(run)


def words_eval(capsys, checkpoint: Path) -> tuple[int, list[str]]:
    capsys.readouterr()
    code = main(["words", "eval", str(checkpoint), "--lengths", "4", "--count", "8", "--no-progress"])
    return code, capsys.readouterr().err.strip().splitlines()


def flip_low_bytes(weights: Path, count: int) -> None:
    """Flip the lowest bit of ``count`` float32 weights: still a loadable file of finite weights."""
    data = bytearray(weights.read_bytes())
    start = 8 + int.from_bytes(data[:8], "little")  # after the JSON header
    for offset in torch.randperm((len(data) - start) // 4, generator=torch.Generator().manual_seed(0))[:count]:
        data[start + 4 * int(offset)] ^= 0x01
    weights.write_bytes(bytes(data))


def test_words_eval_names_the_shapes_of_weights_from_another_config(words_checkpoint, tmp_path, capsys):
    # Explicit weights of half the width, with their digest, in the implicit run's checkpoint.
    explicit = tmp_path / "explicit"
    build_model(config_from_options(dict(vocab_size=6, hidden_size=8, num_hidden_layers=1, state_size=8, head_dim=8,
                                         implicit=False))).save_pretrained(explicit)
    checkpoint = copy_of(words_checkpoint, tmp_path)
    for name in ("model.safetensors", "model.safetensors.sha256"):
        shutil.copy(explicit / name, checkpoint / name)
    line = one_error_line(*words_eval(capsys, checkpoint))
    # Before: "cannot load weights (RuntimeError: ... look at the above report!)", with no report above.
    assert line.startswith(f"implicitlm: error: {checkpoint}/model.safetensors: ") and "above report" not in line
    assert "first embeddings.weight [16, 8] (config.json: [16, 16]), stack.layers.0.norm.weight [8] (config.json: [16])" in line
    assert line.endswith("the weights look like implicit=false, num_hidden_layers=1, hidden_size=8, vocab_size<=16")


def test_save_pretrained_writes_the_digest_that_words_eval_checks(words_checkpoint, tmp_path, capsys):
    checkpoint = copy_of(words_checkpoint, tmp_path)
    (checkpoint / "model.safetensors.sha256").unlink()
    load_model(checkpoint).save_pretrained(checkpoint)  # before: no digest written
    assert (checkpoint / "model.safetensors.sha256").is_file()
    flip_low_bytes(checkpoint / "model.safetensors", 1000)
    line = one_error_line(*words_eval(capsys, checkpoint))
    assert line == f"implicitlm: error: {checkpoint}/model.safetensors: SHA-256 differs from model.safetensors.sha256: the weights are damaged"


def test_weights_without_their_digest_load_with_one_warning(words_checkpoint, tmp_path, capsys, caplog):
    checkpoint = copy_of(words_checkpoint, tmp_path)
    (checkpoint / "model.safetensors.sha256").unlink()
    flip_low_bytes(checkpoint / "model.safetensors", 1000)
    with caplog.at_level("WARNING", logger="implicitlm"):
        code, _ = words_eval(capsys, checkpoint)
    # A warning, not an error: folders that transformers itself saves have no digest.
    assert code == 0
    warnings = [record.getMessage() for record in caplog.records if "sha256" in record.getMessage()]
    assert warnings == [f"{checkpoint}: {DIGEST_WARNING}"]


@pytest.mark.parametrize("key, value, hint", [
    ("hiden_size", 8, "did you mean 'hidden_size'?"),
    ("fixed_piont", {"max_iter": 64}, "did you mean 'fixed_point'?"),
])
def test_words_eval_refuses_an_unknown_key_in_config_json(words_checkpoint, tmp_path, capsys, key, value, hint):
    checkpoint = copy_of(words_checkpoint, tmp_path, {**saved_config(words_checkpoint), key: value})
    line = one_error_line(*words_eval(capsys, checkpoint))
    assert line == f"implicitlm: error: {checkpoint}/config.json: unknown model option '{key}' ({hint})"
