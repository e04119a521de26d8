"""Recipes: a task's experiment end to end, from a preset to its table, results and figures
(``words``: implicit vs explicit Mamba2 on a word problem, accuracy by length; ``lm``: the
same pair on Python's standard library, held-out perplexity)."""

import time

from ..core.targets import FolderKind

# What either demo writes into its folder; its results mark it.
DEMO_FOLDER = FolderKind("a demo's results", marks=("results.json",), entries=(
    "results.json", "accuracy_by_length.png", "perplexity.png", "implicit", "explicit", "data", "tokenizer",
))


def clock() -> tuple[float, float]:
    """Now, as wall and CPU seconds (user + system, of all this process's threads)."""
    return time.perf_counter(), time.process_time()


def seconds_since(began: tuple[float, float]) -> dict[str, float]:
    """The wall and CPU seconds since ``began`` (a ``clock()``): other work on the machine
    stretches the wall time most, the CPU time too (torch's threads wait for each other
    longer on shared cores), so a run's record says both."""
    wall, cpu = clock()
    return {"wall_seconds": round(wall - began[0], 1), "cpu_seconds": round(cpu - began[1], 1)}
