"""The learned solver's networks beside a checkpoint's weights: a save/load round trip keeps
them and the solves they make; a damaged, missing or mismatched file is refused in one line."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file, save_file

from implicitlm.core.weights_digest import file_sha256
from implicitlm.deq.solvers.anderson import MEMORY
from implicitlm.models import load_model
from implicitlm.models.errors import ModelLoadError
from implicitlm.models.learned_solver import GUESS_FILE, MIXING_FILE, InitialGuess, LearnedMixing

from tests.support.learned_solver import active_mixing, contractive, run


PARTS = ["guess", "state-reading guess", "mixing"]


def with_part(part: str):
    """A contractive model whose config uses a learned guess or mixing (seeded, not zero), and
    the name of its file."""
    model = contractive("mamba2")
    if part.endswith("guess"):
        torch.manual_seed(1)
        readouts = model.stack.readout_sizes() if part == "state-reading guess" else ()
        model.attach_learned_guess(InitialGuess(model.config.hidden_size, readouts=readouts))
        return model, GUESS_FILE
    model.attach_learned_mixing(active_mixing())
    model.set_fixed_point_options(sequential_solver="learned_anderson")
    return model, MIXING_FILE


@pytest.mark.parametrize("part", PARTS)
def test_save_and_load_keep_the_network_and_its_use(tmp_path, part):
    model, file = with_part(part)
    model.save_pretrained(tmp_path / "m")
    assert (tmp_path / "m" / file).is_file() and (tmp_path / "m" / f"{file}.sha256").is_file()
    loaded = load_model(tmp_path / "m")
    assert loaded.config.fixed_point == model.config.fixed_point
    network, loaded_network = ((m.learned_guess if part.endswith("guess") else m.learned_mixing)
                               for m in (model, loaded))
    assert getattr(loaded_network, "reads_state", False) == (part == "state-reading guess")
    for name, tensor in network.state_dict().items():
        assert torch.equal(loaded_network.state_dict()[name], tensor)
    for mode in ("simultaneous", "sequential"):
        torch.testing.assert_close(run(loaded.eval(), mode)[0], run(model, mode)[0], atol=0, rtol=0)


@pytest.mark.parametrize("part", PARTS)
@pytest.mark.parametrize("damage", ["flipped byte", "no digest", "no file", "other sizes"])
def test_a_damaged_or_missing_network_is_refused_in_one_line(tmp_path, part, damage):
    model, file = with_part(part)
    folder = tmp_path / "m"
    model.save_pretrained(folder)
    if damage == "flipped byte":
        data = bytearray((folder / file).read_bytes())
        data[-1] ^= 0xFF
        (folder / file).write_bytes(bytes(data))
        expected = "SHA-256 differs"
    elif damage == "no digest":
        (folder / f"{file}.sha256").unlink()
        expected = "not loaded unchecked"
    elif damage == "no file":
        (folder / file).unlink()
        expected = ("missing, but the config's fixed_point.initial_guess is 'learned'" if part.endswith("guess") else
                    "missing, but the config's fixed_point names solver 'learned_anderson'")
    elif part == "guess":
        InitialGuess(model.config.hidden_size, width=8).save(folder)  # a valid file of another width is fine...
        InitialGuess(model.config.hidden_size + 1).save(folder)  # ...one for another model is not
        expected = "a model of these sizes needs"
    elif part == "state-reading guess":
        # One that reads the state of a model with one block fewer.
        InitialGuess(model.config.hidden_size, readouts=model.stack.readout_sizes()[:1]).save(folder)
        expected = "a model of these sizes needs"
    else:
        LearnedMixing(MEMORY + 1).save(folder)  # a mixing for another history length
        expected = "a model of these sizes needs"
    with pytest.raises(ModelLoadError, match=expected) as refused:
        load_model(folder)
    assert "\n" not in str(refused.value)


@pytest.mark.parametrize("part", PARTS)
@pytest.mark.parametrize("change, expected", [
    (lambda tensor: tensor.flatten()[0], "is a scalar (0-d)"),  # before: IndexError: tuple index out of range
    (lambda tensor: torch.full_like(tensor, float("nan")), "holds NaN or Inf"),  # before: loaded (mixing: a warning)
    (lambda tensor: tensor.long(), "is int64; a learned solver's tensors are float32"),  # before: loaded, cast
], ids=["0-d", "nan", "int64"])
def test_a_tensor_of_another_kind_with_its_digest_remade_is_refused_naming_it(tmp_path, part, change, expected):
    model, file = with_part(part)
    folder = tmp_path / "m"
    model.save_pretrained(folder)
    tensors = load_file(str(folder / file))
    tensors["hidden.weight"] = change(tensors["hidden.weight"])
    save_file(tensors, str(folder / file))
    (folder / f"{file}.sha256").write_text(file_sha256(folder / file) + "\n")
    with pytest.raises(ModelLoadError) as refused:
        load_model(folder)
    message = str(refused.value)
    assert "\n" not in message and message.startswith(str(folder / file)) and f"hidden.weight {expected}" in message
