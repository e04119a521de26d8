"""What the families' importers share: the refusal of a transformers setting not implemented
here, the options every source config names alike, and what Mamba1 and Mamba2 checkpoints
have alike (the options their configs name the same, their weights' prefixes)."""

from __future__ import annotations

from typing import Any

from transformers import Mamba2Config, MambaConfig

from .errors import ModelLoadError

# transformers' parameter prefixes of a Mamba1 or Mamba2 checkpoint -> ours; the layers' own
# names are the same in both.
MAMBA_PREFIXES = {
    "backbone.embeddings.": "embeddings.",
    "backbone.layers.": "stack.layers.",
    "backbone.norm_f.": "stack.norm_f.",
}


def refuse(condition: bool, setting: str) -> None:
    if condition:
        raise ModelLoadError(f"unsupported setting of the source model: {setting}")


def shared_options(config) -> dict[str, Any]:
    """The settings every family's transformers config names as ours does."""
    return dict(
        vocab_size=config.vocab_size,
        tie_word_embeddings=config.tie_word_embeddings,
        hidden_size=config.hidden_size,
        num_hidden_layers=config.num_hidden_layers,
        initializer_range=config.initializer_range,
    )


def shared_mamba_options(config: MambaConfig | Mamba2Config) -> dict[str, Any]:
    """The settings Mamba1 and Mamba2 configs name alike, after the refusals they share."""
    refuse(config.use_bias, "use_bias=True (biases in in_proj / out_proj)")
    refuse(not config.use_conv_bias, "use_conv_bias=False")
    # hidden_act is the conv's activation; the gate is silu whatever it says.
    refuse(config.hidden_act != "silu", f"hidden_act={config.hidden_act!r} (only silu)")
    return dict(
        shared_options(config),
        state_size=config.state_size,
        conv_kernel=config.conv_kernel,
        expand=config.expand,
        time_step_min=config.time_step_min,
        time_step_max=config.time_step_max,
        layer_norm_epsilon=config.layer_norm_epsilon,
    )
