"""``implicitlm-lm-eval``: lm-eval's command line with the model registered and the shipped
local tasks (``eval.lm_eval_tasks``) included, offline on the downstream slices; its scores
against ``lm downstream --data-dir``'s and the adapter's own."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from lm_eval.api.instance import Instance

from implicitlm.data.downstream_sets import read_local_set
from implicitlm.eval.downstream import read_local_sets, run_tasks
from implicitlm.eval.harness import ImplicitLMHarness
from implicitlm.eval.harness_sample import SAMPLE_TASKS_DIR
from implicitlm.eval.lm_eval_command import run_command
from implicitlm.eval.lm_eval_tasks import DATA_DIR_VARIABLE, LOCAL_TASKS_DIR

from tests.support.lm_run import train_tiny_lm

SLICES = Path(__file__).parents[1] / "support" / "downstream"
# The sets the slices hold, each as lm-eval's task and the shipped local task.
TASKS = ("lambada_openai", "hellaswag", "piqa", "arc_easy", "arc_challenge", "winogrande")
# A loose tolerance: the tiny model's fixed points converge in a few iterations.
SOLVE = {"max_iter": 4, "tol": 0.5}
MODEL_ARGS = ",".join(f"{key}={value}" for key, value in SOLVE.items())



@pytest.fixture(autouse=True)
def lm_eval_logging(monkeypatch):
    """lm-eval's command line logs to the stderr of the first test that ran it, which pytest
    closes after it: each test's own, for every test here."""
    import logging

    import lm_eval.utils

    monkeypatch.setattr(lm_eval.utils, "_LOGGING_CONFIGURED", False)
    monkeypatch.setattr(logging.getLogger("lm_eval"), "handlers", [])


pytestmark = pytest.mark.usefixtures("offline_hub")


@pytest.fixture(scope="module")
def run(shards, tmp_path_factory) -> Path:
    return train_tiny_lm(shards, tmp_path_factory.mktemp("lm_eval") / "run", total_steps=1)


def results(output: Path) -> dict:
    [file] = output.rglob("results_*.json")
    return json.loads(file.read_text())["results"]


@pytest.mark.slow
def test_the_shipped_local_tasks_score_as_lm_downstream_data_dir_and_the_adapter(run, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    local = [f"{task}_local" for task in TASKS]
    code = run_command(["--model", "implicitlm", "--model_args", f"pretrained={run},{MODEL_ARGS}",
                        "--tasks", ",".join(local), "--metadata", f"data_dir={SLICES}", "--limit", "4",
                        "--batch_size", "4", "--device", "cpu", "--output_path", str(tmp_path / "out")])
    assert code == 0
    ours = results(tmp_path / "out")
    assert set(ours) == set(local)
    assert "piqa_local" in capsys.readouterr().out  # lm-eval's table
    downstream = run_tasks(run, TASKS, limit=4, local_sets=read_local_sets(TASKS, SLICES)[0], batch_size=4,
                           progress=False, **SOLVE)["results"]
    for task in TASKS:
        for metric in ("acc,none", "acc_norm,none", "perplexity,none"):
            if metric in downstream[task]:
                assert ours[f"{task}_local"][metric] == pytest.approx(downstream[task][metric], rel=1e-6), (task, metric)
    # PIQA's acc: the share of its first 4 items whose labelled solution scores highest.
    lm = ImplicitLMHarness(run, progress=False, **SOLVE)
    correct = []
    for item in read_local_set("piqa", SLICES).documents[:4]:
        context = f"Question: {item['goal']}\nAnswer:"
        scores = [score for score, _ in lm.loglikelihood(
            [Instance("loglikelihood", {}, (context, f" {solution}"), index)
             for index, solution in enumerate((item["sol1"], item["sol2"]))])]
        correct.append(scores.index(max(scores)) == item["label"])
    assert ours["piqa_local"]["acc,none"] == pytest.approx(sum(correct) / 4)


@pytest.mark.slow
def test_a_folder_of_ones_own_tasks_is_read_beside_the_shipped_ones(run, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv(DATA_DIR_VARIABLE, str(SLICES))  # the data folder without --metadata
    code = run_command(["--model", "implicitlm", "--model_args", f"pretrained={run},{MODEL_ARGS}",
                        "--tasks", "implicitlm_sample_choice,winogrande_local", "--include_path", str(SAMPLE_TASKS_DIR),
                        "--limit", "2", "--device", "cpu", "--output_path", str(tmp_path / "out")])
    assert code == 0
    assert set(results(tmp_path / "out")) == {"implicitlm_sample_choice", "winogrande_local"}


@pytest.mark.slow
def test_a_missing_data_folder_is_one_line(run, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv(DATA_DIR_VARIABLE, raising=False)
    argv = ["--model", "implicitlm", "--model_args", f"pretrained={run}", "--tasks", "piqa_local", "--limit", "1",
            "--device", "cpu"]
    assert run_command(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1] == f"implicitlm-lm-eval: error: piqa_local: no data folder: pass --metadata data_dir=DIR (or set " \
                      f"{DATA_DIR_VARIABLE})" and "Traceback" not in "\n".join(err)
    assert run_command([*argv, "--metadata", f"data_dir={tmp_path}"]) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1].endswith(f"piqa: {tmp_path}/piqa/valid.jsonl not found "
                                                                     "(nor a .xz, .gz or .bz2 copy)")


@pytest.mark.slow
@pytest.mark.parametrize("options, message", [
    (["--num_fewshot", "1"], "piqa_local: a local set has no training split"),
    (["--device", "meta"], "device must be auto, cpu, cuda or cuda:N; got 'meta'"),
], ids=["fewshot", "device"])
def test_few_shot_examples_from_the_scored_split_or_an_unusable_device_are_one_line(run, tmp_path, monkeypatch, capsys,
                                                                                     options, message):
    monkeypatch.chdir(tmp_path)
    argv = ["--model", "implicitlm", "--model_args", f"pretrained={run},{MODEL_ARGS}", "--tasks", "piqa_local",
            "--metadata", f"data_dir={SLICES}", "--limit", "2", "--output_path", str(tmp_path / "out"), *options]
    assert run_command(["--device", "cpu", *argv] if "--device" not in options else argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert message in err[-1] and err[-1].startswith("implicitlm-lm-eval: error: ") and "Traceback" not in "\n".join(err)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("devices", [["--model_args", "pretrained=nowhere,device=cuda:01"],
                                     ["--model_args", "pretrained=nowhere", "--device", "cuda:" + "9" * 20]])
def test_a_device_name_torch_cannot_read_is_one_line_before_the_tasks_load(devices, tmp_path, monkeypatch, capsys):
    """Before: lm-eval read its tasks and the model loaded (a minute) before torch met the name, a traceback."""
    import lm_eval

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(lm_eval, "simple_evaluate", lambda *a, **k: pytest.fail("the evaluation started"))
    assert run_command(["--model", "implicitlm", *devices, "--tasks", "piqa_local"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("implicitlm-lm-eval: error: device must be auto, cpu, cuda or cuda:N; got 'cuda:")
    assert "no leading zeros" in err[-1] and "Traceback" not in "\n".join(err)


def test_every_paper_task_has_a_shipped_local_task():
    from implicitlm.data.downstream_sets import READERS

    assert sorted(path.stem for path in LOCAL_TASKS_DIR.glob("*.yaml")) == sorted(f"{task}_local" for task in READERS)


@pytest.mark.slow
def test_the_console_command_runs_offline_as_lm_eval_does(run, tmp_path):
    env = {**os.environ, "HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1", DATA_DIR_VARIABLE: str(SLICES),
           "PYTHONPATH": os.pathsep.join([str(Path(__file__).parents[2] / "src"), str(Path(__file__).parents[2])]),
           "HF_DATASETS_CACHE": str(tmp_path / "cache")}
    done = subprocess.run(
        [sys.executable, "-m", "implicitlm.eval.lm_eval_command", "--model", "implicitlm", "--model_args",
         f"pretrained={run},{MODEL_ARGS}", "--tasks", ",".join(f"{task}_local" for task in TASKS), "--limit", "1",
         "--device", "cpu"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600, check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    for task in TASKS:
        assert f"{task}_local" in done.stdout  # lm-eval's table
