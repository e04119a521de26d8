"""Recipes: a task's experiment end to end, from a preset to its table, results and figures
(``words``: implicit vs explicit Mamba2 on a word problem, accuracy by length; ``lm``: the
same pair on Python's standard library, held-out perplexity)."""

from ..core.targets import FolderKind

# What either demo writes into its folder; its results mark it.
DEMO_FOLDER = FolderKind("a demo's results", marks=("results.json",), entries=(
    "results.json", "accuracy_by_length.png", "perplexity.png", "implicit", "explicit", "data", "tokenizer",
))
