"""The names of the training settings and of the model options, known without the classes
that check their values.

Those classes live above ``core`` (``train.TrainConfig``, the families' configs in ``models``)
and import torch; the names are needed below them (every reader of a checkpoint's
``trainer.json``) and before torch is imported (the parser refusing a mistyped
``--train`` / ``--model`` key at once). A test holds these tables to the classes.
"""

from __future__ import annotations

# The most passes (evaluations of the map) that one solve, unroll or phantom gradient may spend
# (``deq.options``): well above any budget a model here has needed (the shipped presets'
# largest is 2,048), and low enough that a slip of the keyboard (10**30) is refused at once
# rather than run without end. Here, so that the parser holds a budget to it without torch.
MAX_PASSES = 10_000

# Where an inference solve starts (``deq.options``): z = 0, or a small network's guess saved
# with the checkpoint (models/learned_solver.py; implicitlm solver train). Here, so that the
# parser offers them as ``--initial-guess``'s choices without torch.
INITIAL_GUESSES = ("zero", "learned")

# ``TrainConfig``'s fields, in its order.
TRAINING_SETTINGS = (
    "task", "sequence_length", "batch_size", "batch_tokens", "total_steps", "lr", "min_lr", "betas",
    "weight_decay", "warmup_steps", "decay_fraction", "grad_clip", "unroll_steps", "unroll_depth",
    "bounded_fraction", "bounded_max_iter", "bounded_phantom_steps", "free_max_iter", "free_phantom_steps",
    "free_tol", "contraction_steps", "contraction_jacobian", "few_pass_steps", "few_pass_passes", "few_pass_distance", "few_pass_fixed_point",
    "few_pass_jacobian", "few_pass_logits", "precision", "distributed", "activation_checkpointing", "compile", "seed", "log_every",
    "eval_every", "eval_batches", "checkpoint_every", "keep_checkpoints", "group", "hard_prob",
)

# The options of any family's config, ``architecture`` included: which of them a family takes
# depends on the family, checked once the model classes are imported.
MODEL_OPTIONS = (
    "architecture", "vocab_size", "hidden_size", "num_hidden_layers", "implicit", "weight_norm",
    "pad_vocab_size_multiple", "layer_norm_epsilon", "initializer_range", "label_alignment", "fixed_point",
    "tie_word_embeddings", "state_size", "conv_kernel", "expand", "head_dim", "n_groups", "chunk_size",
    "time_step_min", "time_step_max", "time_step_rank", "a_init_range", "num_attention_heads",
    "num_key_value_heads", "intermediate_size", "rope_theta",
)
