"""Zero-shot downstream tasks through lm-evaluation-harness, reported as the paper's table.

The paper's table of downstream performance has LAMBADA perplexity and accuracy, the
accuracy of HellaSwag, PIQA, ARC-e, ARC-c, WinoGrande and OpenBookQA, and the average of
those seven accuracies (plain ``acc``, LAMBADA's included: e.g. implicit Llama (32+4) 1.3B,
0.5892). Length-normalised ``acc_norm`` is shown beside ``acc`` where a task has it; the
average does not use it. The authors ran lighteval, so lm-eval's numbers may differ slightly.
"""

from __future__ import annotations

import contextlib
import functools
import json
import subprocess
from pathlib import Path
from typing import Any, Sequence

from ..core.errors import MissingFileError, OptionError
from ..core.log_lines import without_log_lines
from ..data.downstream_sets import LocalSet, MissingLocalSet, read_local_set
from .plots import plot_metric_bars
from .records import make_record, record_files, write_record

PAPER_TASKS = ("lambada_openai", "hellaswag", "piqa", "arc_easy", "arc_challenge", "winogrande", "openbookqa")
# lm-eval's folders that define them, indexed alone for speed.
PAPER_TASK_FOLDERS = ("lambada", "hellaswag", "piqa", "arc", "winogrande", "openbookqa")
# (column, task, metric), in the paper's order.
PAPER_COLUMNS = (
    ("LAMBADA ppl", "lambada_openai", "perplexity"),
    ("LAMBADA acc", "lambada_openai", "acc"),
    ("HellaSwag acc", "hellaswag", "acc"),
    ("PIQA acc", "piqa", "acc"),
    ("Arc-E acc", "arc_easy", "acc"),
    ("Arc-C acc", "arc_challenge", "acc"),
    ("WinoGrande acc", "winogrande", "acc"),
    ("OpenbookQA acc", "openbookqa", "acc"),
)
AVERAGE_COLUMN = "Average acc"
EXPERIMENT = "downstream"
BAR_METRICS = ("acc", "acc_norm", "exact_match")  # the scores in [0, 1] the figure shows


def run_tasks(
    model,
    tasks: Sequence[str] = PAPER_TASKS,
    limit: int | float | None = None,
    include_path: str | Path | None = None,
    num_fewshot: int | None = None,
    bootstrap_iters: int = 1000,
    seed: int = 0,
    local_sets: dict[str, LocalSet] | None = None,
    log_samples: bool = False,
    **model_args: Any,
) -> dict[str, Any]:
    """lm-eval's result dict for ``tasks`` on ``model`` (a checkpoint folder or a loaded
    model); ``model_args`` go to ``ImplicitLMHarness`` (tokenizer, mode, max_iter, tol,
    batch_size, ...). ``include_path``: a folder of further task definitions (YAML).
    ``limit``: documents per task (a fraction if below 1), for quick checks only.
    ``bootstrap_iters``: draws for the standard errors that need them (0: none).
    ``local_sets``: the tasks' documents read from local files (``read_local_sets``), scored by
    lm-eval's own definitions of the same tasks instead of the hub's copies.
    ``log_samples``: keep every document's requests and scores (``results["samples"]``)."""
    from lm_eval import simple_evaluate

    from .harness import ImplicitLMHarness

    if local_sets is not None and num_fewshot:
        raise OptionError(
            "few-shot prompts need a training split, which local sets do not have: drop num_fewshot",
            arguments=("num_fewshot",),
        )
    lm = ImplicitLMHarness(model, **model_args)  # before the task index, which takes a while
    manager = task_manager(tasks, include_path)
    if local_sets is not None:
        tasks = local_task_specs(local_sets, manager)
    with quiet_lm_eval_notes(), _request_bars(model_args.get("progress", True)):
        return simple_evaluate(
            model=lm,
            tasks=list(tasks),
            task_manager=manager,
            limit=limit,
            num_fewshot=num_fewshot,
            bootstrap_iters=bootstrap_iters,
            log_samples=log_samples,
            random_seed=seed,
            numpy_random_seed=seed,
            torch_random_seed=seed,
            fewshot_random_seed=seed,
        )


def task_manager(tasks: Sequence[str], include_path: str | Path | None):
    """lm-eval's task index: ``include_path``'s tasks, or the folders of the paper's, when they
    hold every task asked for; all its built-in tasks (half a minute to index) otherwise."""
    import lm_eval.tasks
    from lm_eval.tasks import TaskManager

    if include_path is not None:
        if not Path(include_path).is_dir():
            raise MissingFileError(f"{include_path}: no such task folder")
        folders = [str(include_path)]
    else:
        built_in = Path(lm_eval.tasks.__file__).parent
        folders = [str(built_in / name) for name in PAPER_TASK_FOLDERS if (built_in / name).is_dir()]
    local = TaskManager(include_path=folders, include_defaults=False)
    if all(task in local.all_tasks for task in tasks):
        return local
    manager = TaskManager(include_path=None if include_path is None else str(include_path))
    unknown = [task for task in tasks if task not in manager.all_tasks]
    if unknown:
        raise OptionError(f"unknown lm-eval task(s): {', '.join(unknown)} (list them with: lm-eval ls tasks)")
    return manager


@contextlib.contextmanager
def quiet_lm_eval_notes():
    """lm-eval's notes that are only noise before the results of our tasks (below)."""
    # lm-eval logs, for every task whose documents come from a function, how to pass it
    # options; ours take none, so the note is only noise before the results.
    with without_log_lines("lm_eval.api.task", "Custom kwargs can be passed"), _quiet_git_hash():
        yield


@contextlib.contextmanager
def _request_bars(shown: bool):
    """lm-eval draws a bar while it builds each task's requests, whatever the model was told:
    without progress (``--no-progress``), none."""
    import lm_eval.api.task

    drawn = lm_eval.api.task.tqdm
    if not shown:
        lm_eval.api.task.tqdm = functools.partial(drawn, disable=True)
    try:
        yield
    finally:
        lm_eval.api.task.tqdm = drawn


@contextlib.contextmanager
def _quiet_git_hash():
    """lm-eval records the working directory's git commit by running git with its stderr
    left open, so outside a repository "fatal: not a git repository" lands before the
    results. The same question, with git's complaint discarded."""
    import lm_eval.evaluator

    asked = lm_eval.evaluator.get_git_commit_hash
    lm_eval.evaluator.get_git_commit_hash = _git_commit_hash
    try:
        yield
    finally:
        lm_eval.evaluator.get_git_commit_hash = asked


def _git_commit_hash() -> str | None:
    try:
        found = subprocess.run(["git", "describe", "--always"], capture_output=True, text=True, check=False)
    except FileNotFoundError:  # no git on this machine
        return None
    return found.stdout.strip() if found.returncode == 0 else None


def read_local_sets(
    tasks: Sequence[str], data_dir: str | Path, skip_missing: bool = False
) -> tuple[dict[str, LocalSet], dict[str, str]]:
    """The evaluation documents of ``tasks`` from ``data_dir`` (layout: ``data.downstream_sets``),
    and, with ``skip_missing``, why each task left out has none there."""
    if not Path(data_dir).is_dir():
        raise MissingFileError(f"{data_dir}: no such data folder")
    sets, skipped = {}, {}
    for task in tasks:
        try:
            sets[task] = read_local_set(task, Path(data_dir))
        except MissingLocalSet as missing:
            if not skip_missing:
                raise
            skipped[task] = str(missing)
    if not sets:
        raise MissingLocalSet(f"{data_dir}: none of the tasks' files are there ({'; '.join(skipped.values())})")
    return sets, skipped


def local_task_specs(local_sets: dict[str, LocalSet], manager) -> list[dict[str, Any]]:
    """lm-eval's own configuration of each task (prompt, choices, metrics), its documents taken
    from ``local_sets`` rather than downloaded; for ``simple_evaluate(tasks=...)`` with any model."""
    from lm_eval.tasks._yaml_loader import load_yaml

    specs = []
    for task, local in local_sets.items():
        entry = manager.task_index.get(task)
        if entry is None or entry.yaml_path is None:
            raise OptionError(f"{task}: lm-eval has no task definition of that name to score the local documents with")
        config = load_yaml(entry.yaml_path, resolve_func=True)
        config.update(
            custom_dataset=functools.partial(_local_dataset, local), dataset_kwargs=None,
            training_split=None, fewshot_split=None,
            validation_split="validation" if local.split == "validation" else None,
            test_split="test" if local.split == "test" else None,
            **local.task_options,
        )
        specs.append(config)
    return specs


def _local_dataset(local: LocalSet, **_task_metadata: Any):
    """lm-eval calls a custom dataset with the task's metadata, which the local documents do not need."""
    from datasets import Dataset, DatasetDict

    return DatasetDict({local.split: Dataset.from_list(local.documents)})


def task_metrics(results: dict[str, Any]) -> dict[str, float]:
    """Every number lm-eval reports per task, as ``task/metric`` (``task/metric,filter`` for
    a filter other than none), standard errors left out; plus the paper's average."""
    metrics = {}
    for task, values in _scores(results).items():
        for key, value in values.items():
            name, _, kind = key.partition(",")  # keys without a filter (alias, sample_len) are no metrics
            if kind and isinstance(value, (int, float)) and not isinstance(value, bool) and not name.endswith("_stderr"):
                metrics[f"{task}/{name}" if kind == "none" else f"{task}/{key}"] = float(value)
    rows, _ = paper_table(results)
    average = rows[-1]["value"]
    if average is not None:
        metrics["average_acc"] = average
    return metrics


def paper_table(results: dict[str, Any]) -> tuple[list[dict[str, Any]], str]:
    """The paper's columns from lm-eval's ``results`` (the whole output or its "results").

    Returns rows ``{"column", "task", "metric", "value", "acc_norm"}``, one per column and
    the average last (``value`` None where the task did not run), and a Markdown table:
    the scores, then acc_norm where there is one.
    """
    scores = _scores(results)
    rows = []
    for column, task, metric in PAPER_COLUMNS:
        ran = task in scores
        rows.append({
            "column": column, "task": task, "metric": metric,
            "value": _metric(scores[task], metric) if ran else None,
            "acc_norm": _metric(scores[task], "acc_norm") if ran and metric == "acc" else None,
        })
    accuracies = [row["value"] for row in rows if row["metric"] == "acc" and row["value"] is not None]
    average = sum(accuracies) / len(accuracies) if accuracies else None
    rows.append({"column": AVERAGE_COLUMN, "task": None, "metric": "acc", "value": average, "acc_norm": None})
    return rows, _markdown(rows, len(accuracies))


def _markdown(rows: list[dict[str, Any]], averaged: int) -> str:
    lines = [
        "| | " + " | ".join(row["column"] for row in rows) + " |",
        "|---" + "|---:" * len(rows) + "|",
        "| score | " + " | ".join(_format(row["value"], row["metric"]) for row in rows) + " |",
    ]
    if any(row["acc_norm"] is not None for row in rows):
        lines.append("| acc_norm | " + " | ".join(_format(row["acc_norm"], "acc") for row in rows) + " |")
    if averaged:
        lines.append(
            f"\n{AVERAGE_COLUMN}: mean of the {averaged} acc column(s) above (plain acc, LAMBADA's "
            f"included, as in the paper; of 7 in the paper's table)."
        )
    return "\n".join(lines)


def _format(value: float | None, metric: str) -> str:
    if value is None:
        return "-"
    return f"{value:.2f}" if metric == "perplexity" else f"{value:.4f}"


def downstream_record(
    model, checkpoint: str | Path, results: dict[str, Any], out_dir: str | Path,
    fixed_point: dict[str, Any] | None = None, **settings: Any
) -> dict[str, Any]:
    """Write ``downstream.json`` (the metrics, the paper table, lm-eval's own results under
    ``lm_eval``) and ``downstream.png`` (the accuracies by task) into ``out_dir``; the model's
    forwards were given ``fixed_point``."""
    rows, _ = paper_table(results)
    record = make_record(
        EXPERIMENT, checkpoint, model, task_metrics(results), fixed_point=fixed_point,
        paper_table=rows, settings=settings, lm_eval=_serialisable(results),
    )
    write_record(out_dir, record)
    bars = {metric: _per_task(results, metric) for metric in BAR_METRICS}
    if rows[-1]["value"] is not None:
        bars["acc"]["average (paper)"] = rows[-1]["value"]
    figure = record_files(out_dir, EXPERIMENT)[1]
    plot_metric_bars({m: v for m, v in bars.items() if v}, figure, "zero-shot downstream tasks")
    return record


def _per_task(results: dict[str, Any], metric: str) -> dict[str, float]:
    return {task: value for task, values in _scores(results).items() if (value := _metric(values, metric)) is not None}


def _scores(results: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return results.get("results", results)


def _metric(values: dict[str, Any], metric: str) -> float | None:
    """A task's ``metric`` under the "none" filter, else under its first filter."""
    keys = [f"{metric},none"] + [key for key in values if key.startswith(f"{metric},")]
    for key in keys:
        if isinstance(values.get(key), (int, float)):
            return float(values[key])
    return None


def _serialisable(results: dict[str, Any]) -> dict[str, Any]:
    """lm-eval's result dict as plain JSON: numpy numbers as numbers, anything else
    (functions in the task configs) as text, as lm-eval's own writer does."""
    from lm_eval.utils import handle_non_serializable

    return json.loads(json.dumps(results, default=handle_non_serializable))
