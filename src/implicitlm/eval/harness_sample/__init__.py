"""Sample lm-evaluation-harness tasks on a few self-written sentences, shipped for offline runs.

``SAMPLE_TASKS_DIR`` is an ``--include_path`` for lm-eval; it defines one task per request
type the harness has:

    implicitlm_sample_choice      multiple_choice        (acc, acc_norm; as HellaSwag, PIQA, ARC)
    implicitlm_sample_completion  loglikelihood          (perplexity, acc; as LAMBADA)
    implicitlm_sample_text        loglikelihood_rolling  (word/byte perplexity, bits per byte)
    implicitlm_sample_generate    generate_until         (exact match)

The data are JSON-lines files beside the task files. A task reads its file through
``load_sample`` rather than a ``data_files`` path, which lm-eval would resolve against the
working directory instead of the task file.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

SAMPLE_TASKS_DIR = Path(__file__).parent
SAMPLE_TASKS = (
    "implicitlm_sample_choice",
    "implicitlm_sample_completion",
    "implicitlm_sample_text",
    "implicitlm_sample_generate",
)


def load_sample(sample_file: str, **metadata: Any):
    """The ``test`` split of one of the shipped JSON-lines files, through the datasets
    library's local ``json`` builder (no network). lm-eval passes its task metadata (the
    model's arguments among them) as further keywords; they do not concern the data."""
    import datasets

    return datasets.load_dataset("json", data_files={"test": str(SAMPLE_TASKS_DIR / sample_file)})
