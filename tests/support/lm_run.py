"""A tiny language-model training run on token shards, as the LM tests need one: its
checkpoints carry the shards' tokenizer."""

from __future__ import annotations

from pathlib import Path

from implicitlm.data.shards import TokenShards
from implicitlm.train.config import TrainConfig
from implicitlm.train.trainer import train

from tests.support.models import tiny_model

SEQUENCE = 16


def train_tiny_lm(shards: Path, out: Path, total_steps: int, resume: bool = False, **changes) -> Path:
    """Train (or with ``resume`` continue) a one-block implicit Mamba2 on ``shards`` into
    ``out`` up to ``total_steps``, a checkpoint every step, the last ``keep_checkpoints``
    (default 1) kept; returns ``out``."""
    model = tiny_model(
        architecture="mamba2", vocab_size=TokenShards(shards, "train").vocab_size, hidden_size=16, num_hidden_layers=1,
        state_size=8, head_dim=8, chunk_size=16, fixed_point=dict(max_iter=6),
    )
    settings = dict(sequence_length=SEQUENCE, batch_size=2, batch_tokens=2 * SEQUENCE, lr=1e-2, warmup_steps=1,
                    eval_every=0, checkpoint_every=1, keep_checkpoints=1, bounded_fraction=1.0)
    config = TrainConfig.for_task("lm", **{**settings, "total_steps": total_steps, **changes})
    train(model, config, out, data=shards, resume=resume, progress=False)
    return out
