"""What a weights file's header says of its tensors, read without loading them: dtypes that
are not weights, and shapes that differ from those a config gives them (and what the shapes
show of the config that wrote the file)."""

from __future__ import annotations

import re
from pathlib import Path

from safetensors import SafetensorError, safe_open
from torch import nn

from .errors import ModelLoadError

# How many of the tensors whose shapes differ from the config's a message names.
SHAPES_NAMED = 3
# safetensors' names of the floating dtypes a model's weights are saved in.
FLOATING_DTYPES = ("F16", "BF16", "F32", "F64")


def _header(file: Path, read) -> dict | None:
    """``read(slice)`` of each tensor of ``file``, by name; None where its header cannot be read
    (transformers' own load then names what is wrong with the file)."""
    try:
        with safe_open(file, "pt") as weights:
            return {name: read(weights.get_slice(name)) for name in weights.keys()}
    except (SafetensorError, OSError):
        return None


def check_floating_weights(file: Path) -> None:
    """Every tensor of ``file`` is floating point: transformers casts an integer tensor into the
    model's dtype without a word, and what it held was no weight."""
    dtypes = _header(file, lambda tensor: tensor.get_dtype()) or {}
    other = [name for name, dtype in dtypes.items() if dtype not in FLOATING_DTYPES]
    if other:
        raise ModelLoadError(f"{file}: tensor {other[0]} is {dtypes[other[0]]}; a model's weights are floating point "
                             f"({', '.join(FLOATING_DTYPES)})")


def shape_mismatch(file: Path, model: nn.Module) -> str | None:
    """A line naming the first tensors of weights ``file`` whose shapes differ from those of
    ``model`` (built from the config, on the meta device), and what the file's shapes show of
    the config that wrote it; None when the shapes agree (or the file's header cannot be read)."""
    found = _header(file, lambda tensor: list(tensor.get_shape()))
    if found is None:
        return None
    expected = {name: list(tensor.shape) for name, tensor in model.state_dict().items()}
    differing = [name for name in expected if name in found and found[name] != expected[name]]
    if not differing:
        return None
    named = ", ".join(f"{name} {found[name]} (config.json: {expected[name]})" for name in differing[:SHAPES_NAMED])
    return (f"{file}: {len(differing)} tensor(s) of other shapes than config.json gives them, first "
            f"{named}; the weights look like {_shapes_config(found)}")


def _shapes_config(shapes: dict[str, list[int]]) -> str:
    """The config fields that tensor names and shapes show: an injection only in an implicit
    model, weight-normalised weights only where weight_norm applies, the blocks by their
    index, the embedding's width and rows (the vocabulary padded up)."""
    implicit = "injection.weight" in shapes
    fields = [f"implicit={str(implicit).lower()}"]
    if implicit:
        fields.append(f"weight_norm={str(any('.parametrizations.' in name for name in shapes)).lower()}")
    layers = [int(match[1]) for name in shapes if (match := re.match(r"stack\.layers\.(\d+)\.", name))]
    if layers:
        fields.append(f"num_hidden_layers={max(layers) + 1}")
    embedding = shapes.get("embeddings.weight", [])
    if len(embedding) == 2:
        fields += [f"hidden_size={embedding[1]}", f"vocab_size<={embedding[0]}"]
    return ", ".join(fields)
