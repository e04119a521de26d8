"""The few-pass stage (train/few_pass.py): it lowers the loss after K passes from z = 0 while the
fixed point keeps its loss, its options are refused in one line where wrong, a run resumes
through it as through the curriculum's phases, and its terms are logged."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from implicitlm.cli import main
from implicitlm.core.errors import OptionError
from implicitlm.data.shards import TokenShards
from implicitlm.models import load_model
from implicitlm.train.config import TrainConfig
from implicitlm.train.few_pass import distillation

from tests.support.lm_run import SEQUENCE, train_tiny_lm

TIGHT = dict(max_iter=200, tol=1e-4)


def held_out_windows(shards: Path, count: int = 8) -> torch.Tensor:
    tokens = torch.as_tensor(TokenShards(shards, "test").read(0, count * (SEQUENCE + 1)).astype("int64"))
    return tokens.view(count, SEQUENCE + 1)


def k_pass_loss(model, windows: torch.Tensor, passes: int) -> float:
    """Cross-entropy of the head on z_K, K passes of the stack from z = 0."""
    inputs, labels = windows[:, :-1], windows[:, 1:]
    with torch.no_grad(), model.fixed_point_map(inputs) as (embedded, f):
        z = torch.zeros_like(embedded)
        for _ in range(passes):
            z = f(z)
        logits = F.linear(z, model.embeddings.weight)[..., : model.config.vocab_size]
    return F.cross_entropy(logits.flatten(0, 1), labels.flatten()).item()


def tight_loss(model, windows: torch.Tensor) -> tuple[float, bool]:
    """Cross-entropy at the fixed point solved to 1e-4, and whether every window reached it."""
    with torch.no_grad():
        output = model(windows[:, :-1], **TIGHT)
    logits, labels = output.logits, windows[:, 1:]
    return F.cross_entropy(logits.flatten(0, 1), labels.flatten()).item(), bool(output.fixed_point.converged.all())


def few_pass_command(shards: Path, source: Path, out: Path, *train: str) -> list[str]:
    settings = [f"sequence_length={SEQUENCE}", "batch_size=2", f"batch_tokens={2 * SEQUENCE}", "lr=0.003",
                "warmup_steps=0", "log_every=1", "checkpoint_every=2", "free_max_iter=12", "free_phantom_steps=2",
                *train]
    return ["train", "--data", str(shards), "--out", str(out), "--init-from", str(source), "--no-progress",
            *[arg for setting in settings for arg in ("--train", setting)]]


def logged(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def base(shards, tmp_path_factory) -> Path:
    """A tiny implicit model trained by the curriculum, the stage's starting point."""
    return train_tiny_lm(shards, tmp_path_factory.mktemp("base"), total_steps=40, bounded_fraction=0.5)


def test_the_stage_closes_the_gap_of_k_passes_to_the_fixed_point_and_keeps_it(shards, base, tmp_path):
    """Against the same steps of the free phase from the same model: after one pass from z = 0
    the loss is lower and under half as far above the fixed point's, which stays as good."""
    windows = held_out_windows(shards)
    continued, staged = tmp_path / "continued", tmp_path / "staged"
    assert main(few_pass_command(shards, base, continued, "total_steps=12", "bounded_fraction=0")) == 0
    assert main(few_pass_command(shards, base, staged, "total_steps=12", "few_pass_steps=12", "few_pass_passes=1")) == 0
    figures = {}
    for run in (continued, staged):
        model = load_model(run).eval()
        tight, converged = tight_loss(model, windows)
        assert converged
        figures[run] = k_pass_loss(model, windows, 1), tight
    (one_pass, tight), (own_one_pass, own_tight) = figures[staged], figures[continued]
    assert one_pass < own_one_pass
    assert one_pass - tight < (own_one_pass - own_tight) / 2
    assert tight < own_tight + 0.02


def test_the_stage_logs_its_terms_after_the_curriculum(shards, base, tmp_path):
    assert main(few_pass_command(shards, base, tmp_path, "total_steps=4", "few_pass_steps=2", "few_pass_distance=1",
                                 "few_pass_logits=1", "bounded_fraction=0.5")) == 0
    rows = logged(tmp_path)
    assert [row["phase"] for row in rows] == ["bounded", "free", "few_pass", "few_pass"]
    for row in rows[2:]:
        assert row["fixed_point_loss"] > 0 and row["distance"] > 0 and row["distillation"] > 0
        assert row["fp_solver"] == "unroll" and row["fp_batch_passes"] == 2  # the K passes of the step's loss
    assert not {"fixed_point_loss", "distance", "distillation"} & set(rows[0])


def test_distillation_is_the_kl_divergence_from_the_teacher_per_token():
    generator = torch.Generator().manual_seed(0)
    logits, teacher = torch.randn(2, 5, 7, generator=generator), torch.randn(2, 5, 7, generator=generator)
    p = teacher.softmax(-1)
    expected = (p * (p.log() - logits.log_softmax(-1))).sum(-1).mean()
    torch.testing.assert_close(distillation(logits, teacher), expected)
    assert distillation(teacher + 3.0, teacher).abs() < 1e-6  # a shift of the logits is the same distribution


def test_distillation_brings_the_k_pass_distribution_to_the_fixed_points(shards, base, tmp_path):
    """Against the same stage without it, from the same model: after one pass from z = 0 the
    next-token distribution is nearer the fixed point's."""
    windows = held_out_windows(shards)
    gaps = []
    for weight in (0, 10):
        run = tmp_path / f"logits_{weight}"
        assert main(few_pass_command(shards, base, run, "total_steps=8", "few_pass_steps=8", "few_pass_passes=1",
                                     f"few_pass_logits={weight}")) == 0
        model = load_model(run).eval()
        with torch.no_grad():
            gaps.append(distillation(model(windows[:, :-1], passes=1).logits, model(windows[:, :-1], **TIGHT).logits))
    assert gaps[1] < 0.8 * gaps[0]


def test_the_stage_without_a_teacher_runs_the_passes_alone(shards, base, tmp_path):
    assert main(few_pass_command(shards, base, tmp_path, "total_steps=1", "few_pass_steps=1", "few_pass_passes=3",
                                 "few_pass_distance=0", "few_pass_fixed_point=0")) == 0
    (row,) = logged(tmp_path)
    assert row["fp_batch_passes"] == 3 and not {"distance", "distillation", "fixed_point_loss"} & set(row)


def test_a_teacher_without_the_fixed_points_loss_runs_without_gradient(shards, base, tmp_path):
    assert main(few_pass_command(shards, base, tmp_path, "total_steps=1", "few_pass_steps=1", "few_pass_logits=1",
                                 "few_pass_fixed_point=0")) == 0
    (row,) = logged(tmp_path)
    assert row["distillation"] > 0 and "fixed_point_loss" not in row and "distance" not in row


def test_a_run_resumes_into_and_through_the_stage_exactly(shards, base, tmp_path):
    whole = few_pass_command(shards, base, tmp_path / "whole", "total_steps=4", "few_pass_steps=3", "few_pass_distance=1")
    assert main(whole) == 0
    stopped = few_pass_command(shards, base, tmp_path / "stopped", "total_steps=2", "few_pass_steps=1",
                               "few_pass_distance=1")
    assert main(stopped) == 0
    more = ["--train", "total_steps=4", "--train", "few_pass_steps=3"]
    assert main(["train", "--data", str(shards), "--out", str(tmp_path / "stopped"), "--resume", "--no-progress",
                 *more]) == 0
    resumed, uninterrupted = logged(tmp_path / "stopped"), logged(tmp_path / "whole")
    phases = [row["phase"] for row in uninterrupted]
    assert phases == [row["phase"] for row in resumed] == ["bounded", "few_pass", "few_pass", "few_pass"]
    for key in ("loss", "fixed_point_loss", "distance"):
        assert [row.get(key) for row in resumed] == [row.get(key) for row in uninterrupted]


@pytest.mark.slow
def test_two_processes_run_the_stage_as_one_does(shards, base, tmp_path):
    """Each micro-step's two forwards are each followed by their own backward, as DDP needs."""
    settings = ["total_steps=2", "few_pass_steps=2", "few_pass_distance=1", f"batch_tokens={4 * SEQUENCE}"]
    assert main(few_pass_command(shards, base, tmp_path / "single", *settings, "batch_size=4")) == 0
    two = few_pass_command(shards, base, tmp_path / "two", *settings, "batch_size=2")
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", "-m", "implicitlm", *two]
    source = Path(__file__).parents[2]
    environment = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": f"{source / 'src'}{os.pathsep}{source}"}
    result = subprocess.run(command, env=environment, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    for key in ("loss", "fixed_point_loss", "distance"):
        torch.testing.assert_close([row[key] for row in logged(tmp_path / "two")],
                                   [row[key] for row in logged(tmp_path / "single")], atol=1e-5, rtol=0)


@pytest.mark.parametrize("setting, named", [
    ("few_pass_passes=0", "few_pass_passes"), ("few_pass_distance=-1", "few_pass_distance"),
    ("few_pass_fixed_point=-0.5", "few_pass_fixed_point"), ("few_pass_jacobian=-1", "few_pass_jacobian"),
    ("few_pass_logits=-1", "few_pass_logits"),
    ("few_pass_steps=5", "few_pass_steps"),
])
def test_bad_stage_options_are_refused_in_one_line(shards, base, tmp_path, capsys, setting, named):
    assert main(few_pass_command(shards, base, tmp_path / "run", "total_steps=4", setting)) == 2
    error = capsys.readouterr().err.strip()
    assert error.startswith("implicitlm: error:") and named in error and "\n" not in error
    assert not (tmp_path / "run").exists()


def test_an_explicit_model_refuses_the_stage():
    config = TrainConfig.for_task("lm", total_steps=4, few_pass_steps=2)
    with pytest.raises(OptionError, match="few_pass_steps.*implicit"):
        config.curriculum(implicit=False)


def test_a_run_from_a_checkpoint_with_a_learned_solver_solves_from_zero(shards, base, tmp_path):
    """The learned guess and mixing were fitted to the source's weights and stay with its
    checkpoint: the run's held-out evaluation and its checkpoint solve without them."""
    fitted = tmp_path / "fitted"
    assert main(["solver", "train", str(base), "--data", str(shards), "--out", str(fitted), "--steps", "2",
                 "--no-progress"]) == 0
    model = load_model(fitted)
    model.set_fixed_point_options(initial_guess="learned", simultaneous_solver="learned_anderson")
    model.save_pretrained(fitted)
    run = tmp_path / "run"
    assert main(few_pass_command(shards, fitted, run, "total_steps=1", "few_pass_steps=1", "eval_every=1",
                                 "eval_batches=1")) == 0
    options = load_model(run).solver.options
    assert (options.initial_guess_for("simultaneous"), options.solver_for("simultaneous")) == ("zero", "safeguarded_anderson")
    assert logged(run)[-1]["test_ppl"] > 0
