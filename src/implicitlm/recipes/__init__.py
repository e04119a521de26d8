"""Recipes: a task's experiment end to end, from a preset to its table, results and figures
(``words``: implicit vs explicit Mamba2 on a word problem, accuracy by length; ``lm``: the
same pair on Python's standard library, held-out perplexity)."""
