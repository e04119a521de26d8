"""lm-evaluation-harness tasks that read the paper's downstream sets from a local data folder.

``LOCAL_TASKS_DIR`` holds one task file per set, shipped with the package; ``implicitlm-lm-eval``
includes it by default (``lm_eval`` itself takes it as ``--include_path``)::

    lambada_openai_local  hellaswag_local  piqa_local  arc_easy_local  arc_challenge_local
    winogrande_local      openbookqa_local

Each is lm-eval's own definition of the task (prompt, choices, metrics), its documents read
by ``data.downstream_sets`` from the folder ``--metadata data_dir=DIR`` names (or, without it,
the environment variable ``IMPLICITLM_DATA_DIR``), in the layout ``implicitlm lm downstream
--data-dir`` reads: nothing is downloaded. The scores are those of ``lm downstream --data-dir``.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from lm_eval.api.task import ConfigurableTask

from ...core.errors import OptionError
from ..downstream import local_task_specs, read_local_sets, task_manager

LOCAL_TASKS_DIR = Path(__file__).parent
DATA_DIR_VARIABLE = "IMPLICITLM_DATA_DIR"
# The key of a task file naming the lm-eval task whose definition scores the local documents.
SOURCE_KEY = "local_copy_of"
# What lm-eval's index reads of a task file, and no task's configuration.
INDEX_KEYS = ("tag", "group", "task_list", "class", SOURCE_KEY)


class LocalTask(ConfigurableTask):
    """lm-eval's definition of the task a shipped file names (``local_copy_of``), under the
    file's task name, its documents from the local data folder."""

    def __init__(self, config: dict[str, Any]) -> None:
        name, source = config["task"], config.get(SOURCE_KEY)
        metadata = config.get("metadata") or {}
        data_dir = metadata.get("data_dir") or os.environ.get(DATA_DIR_VARIABLE)
        if not data_dir:
            raise OptionError(f"{name}: no data folder: pass --metadata data_dir=DIR (or set {DATA_DIR_VARIABLE})")
        local_sets, _ = read_local_sets([source], data_dir)
        [spec] = local_task_specs(local_sets, task_manager([source], None))
        for key in INDEX_KEYS:
            spec.pop(key, None)
        spec.update(task=name, metadata={**(spec.get("metadata") or {}), **metadata, "data_dir": str(data_dir)})
        super().__init__(config=spec)

    def fewshot_context(self, doc, num_fewshot: int, *args: Any, **kwargs: Any):
        # lm-eval would draw the examples from the one split there is, the split being scored.
        if num_fewshot:
            raise OptionError(f"{self.config.task}: a local set has no training split, and few-shot examples drawn "
                              "from the scored split would score the model on answers it was shown: drop --num_fewshot")
        return super().fewshot_context(doc, num_fewshot, *args, **kwargs)
