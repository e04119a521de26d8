"""A Hub checkpoint (``owner/name``) is fetched as a folder and loaded as a local one is: every
check a local folder gets (config keys, digests, generation config, memory) refuses it in the
same line, and its learned solver is attached. No network here: the fetch copies a local folder
into the cache path, as the hub client would."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
import torch

from implicitlm.core import hub
from implicitlm.core.errors import ImplicitLMError
from implicitlm.models import ImplicitCausalLM, ImplicitLlamaForCausalLM, ModelLoadError, load_model
from implicitlm.models.learned_solver import InitialGuess

from tests.models.test_import_and_load import tiny_model
from tests.models.test_untrusted import flip_low_bytes
from tests.support.learned_solver import contractive, run

pytestmark = pytest.mark.usefixtures("offline_hub")
REPO = "owner/name"


@pytest.fixture
def fetches() -> list[dict]:
    """The options of each fetch from the fake Hub."""
    return []


@pytest.fixture
def hub_repo(tmp_path, monkeypatch, fetches) -> Path:
    """The folder the fake Hub serves as ``REPO``."""
    served = tmp_path / "served"

    def fetch(repo_id, *, cache_dir=None, revision=None, **options):
        fetches.append({"repo_id": repo_id, "revision": revision, **options})
        snapshot = Path(cache_dir or tmp_path / "cache", f"models--{repo_id.replace('/', '--')}", "snapshots",
                        revision or "main")
        shutil.copytree(served, snapshot, dirs_exist_ok=True)
        return str(snapshot)

    monkeypatch.setattr(hub, "snapshot_download", fetch)
    return served


def refusal(name) -> str:
    with pytest.raises(ImplicitLMError) as raised:
        load_model(name)
    message = str(raised.value)
    assert "\n" not in message, message
    return message


def test_a_hub_checkpoint_with_a_learned_guess_has_it_attached(hub_repo):
    """Before: the Hub branch attached no learned guess; its config's first solve failed."""
    model = contractive("mamba2")
    torch.manual_seed(1)
    model.attach_learned_guess(InitialGuess(model.config.hidden_size))
    model.save_pretrained(hub_repo)
    loaded = load_model(REPO).eval()
    assert loaded.solver.options.initial_guess_for("sequential") == "learned"
    for name, tensor in model.learned_guess.state_dict().items():
        assert torch.equal(loaded.learned_guess.state_dict()[name], tensor)
    torch.testing.assert_close(run(loaded, "sequential")[0], run(model, "sequential")[0], atol=0, rtol=0)


def add_config_key(folder: Path, key: str, value) -> None:
    values = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**values, key: value}))


DAMAGES = {
    "weights byte": (lambda folder: flip_low_bytes(folder / "model.safetensors", 1), "SHA-256 differs"),
    "unknown config key": (lambda folder: add_config_key(folder, "hiden_size", 8), "hiden_size"),
    "misspelt generation setting": (
        lambda folder: (folder / "generation_config.json").write_text('{"max_new_tokns": 3}'), "max_new_tokns"),
    "a model too large for memory": (
        lambda folder: add_config_key(folder, "num_hidden_layers", 10**9), "parameters"),
}


@pytest.mark.parametrize("damage", DAMAGES)
def test_a_damaged_hub_checkpoint_is_refused_as_a_local_one_is(hub_repo, tmp_path, damage):
    """Before: the Hub branch checked neither config keys, digests, the generation config nor
    memory: each of these loaded (or failed deep in transformers)."""
    damaged, expected = DAMAGES[damage]
    tiny_model(0).save_pretrained(hub_repo)
    damaged(hub_repo)
    local = refusal(hub_repo)
    assert expected in local
    from_hub = refusal(REPO)
    snapshot = Path(tmp_path, "cache", "models--owner--name", "snapshots", "main")
    # The memory available is read anew by each refusal: compared as a figure, not to the digit.
    available = re.compile(r"[\d.]+ GiB is available")
    assert available.sub("N GiB is available", from_hub) == \
        available.sub("N GiB is available", local.replace(str(hub_repo), str(snapshot)))


def test_the_fetch_names_the_revision_and_keeps_to_the_cache_offline(hub_repo, fetches):
    tiny_model(0).save_pretrained(hub_repo)
    loaded = ImplicitCausalLM.from_pretrained(REPO, revision="v1")
    assert torch.equal(loaded.embeddings.weight, tiny_model(0).embeddings.weight)
    assert fetches[-1]["revision"] == "v1" and fetches[-1]["local_files_only"]
    assert "*.bin" in fetches[-1]["ignore_patterns"]  # pickled weights are never fetched


def test_a_family_class_refuses_a_hub_model_of_another_family(hub_repo):
    tiny_model(0).save_pretrained(hub_repo)
    with pytest.raises(ModelLoadError, match="a model of type implicit_mamba2, not implicit_llama"):
        ImplicitLlamaForCausalLM.from_pretrained(REPO)


def test_a_hub_id_found_nowhere_offline_names_why():
    message = refusal("someone/no-such-model")
    assert message.startswith("someone/no-such-model: not a folder here, and no model from the Hub (")
    assert message.endswith("; HF_HUB_OFFLINE is set")
