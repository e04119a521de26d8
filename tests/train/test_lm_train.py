"""Language-model training: curriculum, accumulation, resume after SIGKILL, DDP and FSDP over
torchrun, activation checkpointing, weight-decay groups, clear errors for damaged checkpoints,
and the command chain (tokenizer, corpus, train, eval); the LM demo is tests/recipes/test_lm_demo.py."""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from implicitlm.cli import main
from implicitlm.data.corpus import read_documents
from implicitlm.data.shard_writer import write_shards
from implicitlm.data.shards import TokenShards
from implicitlm.data.tokenizer import load_tokenizer, train_tokenizer
from implicitlm.core.run_folder import latest_checkpoint
from implicitlm.models import build_model, config_from_options, load_model
from implicitlm.train.config import TrainConfig
from implicitlm.train.trainer import parameter_groups, train

from tests.support.contractive import make_contractive
from tests.support.cost_names import former_cost_names
from tests.support.signals import signal_this_thread
from tests.support.models import tiny_model

SEQUENCE = 32


@pytest.fixture(scope="module")
def shards(tmp_path_factory) -> Path:
    """Token shards of a few of this package's own source files, with a 320-token BPE."""
    root = tmp_path_factory.mktemp("corpus")
    sources = sorted((Path(__file__).parents[2] / "src" / "implicitlm").rglob("*.py"))[:12]
    tokenizer = train_tokenizer(read_documents(sources), 320, root / "tokenizer")
    write_shards(read_documents(sources), tokenizer, root / "data", test_fraction=0.2, progress=False)
    return root / "data"


def lm_model(implicit: bool = True, vocab: int = 320):
    return tiny_model(architecture="mamba2", vocab_size=vocab, hidden_size=16, num_hidden_layers=1, state_size=8,
                      head_dim=8, chunk_size=16, implicit=implicit)


def train_config(**changes) -> TrainConfig:
    values = dict(
        sequence_length=SEQUENCE, batch_size=4, batch_tokens=4 * SEQUENCE, total_steps=4, lr=1e-2,
        warmup_steps=1, log_every=1, checkpoint_every=2, keep_checkpoints=2, bounded_fraction=0.5, free_max_iter=6,
        free_phantom_steps=2,
    )
    return TrainConfig.for_task("lm", **{**values, **changes})


def logged(run_dir: Path, key: str) -> list:
    return [json.loads(line).get(key) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_curriculum_switches_phase_and_budget_at_the_configured_step(shards, tmp_path):
    train(lm_model(), train_config(), tmp_path, data=shards, progress=False)
    assert logged(tmp_path, "phase") == ["bounded", "bounded", "free", "free"]
    assert logged(tmp_path, "train_max_iter") == [4, 4, 6, 6]
    assert all(n <= 4 for n in logged(tmp_path, "fp_passes_max")[:2])
    for key in ("loss", "ppl", "lr", "tokens_per_s", "fp_rel_residual_max"):
        assert all(isinstance(v, float) for v in logged(tmp_path, key)), key


def test_gradient_accumulation_equals_one_large_batch(shards, tmp_path):
    whole = train_config(batch_size=4, total_steps=3, checkpoint_every=10)
    split = train_config(batch_size=2, total_steps=3, checkpoint_every=10)
    assert split.accumulation_steps(1) == 2
    train(lm_model(False), whole, tmp_path / "whole", data=shards, progress=False)
    train(lm_model(False), split, tmp_path / "split", data=shards, progress=False)
    torch.testing.assert_close(logged(tmp_path / "split", "loss"), logged(tmp_path / "whole", "loss"), atol=1e-6, rtol=0)


def test_batch_that_does_not_divide_is_refused():
    with pytest.raises(ValueError, match="not a multiple"):
        train_config(batch_tokens=100).accumulation_steps(1)


def test_keeps_the_last_checkpoints_only(shards, tmp_path):
    train(lm_model(), train_config(total_steps=6, checkpoint_every=1), tmp_path, data=shards, progress=False)
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["step_0000005", "step_0000006"]


def test_weight_decay_spares_norms_biases_ssm_parameters_and_weight_norm_magnitudes():
    model = lm_model()
    decay, no_decay = parameter_groups(model, 0.1)
    names = {id(p): n for n, p in model.named_parameters()}
    decayed = sorted(names[id(p)] for p in decay["params"])
    spared = sorted(names[id(p)] for p in no_decay["params"])
    assert "embeddings.weight" in decayed and "injection.weight" in decayed
    assert all("original1" in n for n in decayed if n.startswith("stack."))
    assert any(n.endswith("A_log") for n in spared) and any(n.endswith("conv1d.bias") for n in spared)
    assert any("norm" in n for n in spared) and any(n.endswith("original0") for n in spared)
    assert decay["weight_decay"] == 0.1 and no_decay["weight_decay"] == 0.0
    assert len(decayed) + len(spared) == len(list(model.parameters()))


def test_activation_checkpointing_gives_the_same_gradients():
    ids = torch.randint(0, 320, (2, 12), generator=torch.Generator().manual_seed(0))
    gradients = []
    for checkpointing in (False, True):
        model = make_contractive(lm_model()).train()
        if checkpointing:
            model.activation_checkpointing_enable()
            assert model.stack.gradient_checkpointing
        model(ids, labels=ids).loss.backward()
        gradients.append({n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None})
    assert gradients[0].keys() == gradients[1].keys() and len(gradients[0]) > 5
    for name in gradients[0]:
        torch.testing.assert_close(gradients[1][name], gradients[0][name], rtol=1e-5, atol=1e-7, msg=name)


# ---------------------------------------------------------------- through the command line


def cli_command(shards: Path, out: Path, *train: str) -> list[str]:
    model = ["--model", "hidden_size=16", "--model", "num_hidden_layers=1", "--model", "state_size=8",
             "--model", "head_dim=8", "--model", "chunk_size=16"]
    settings = [f"sequence_length={SEQUENCE}", "lr=0.01", "warmup_steps=1", "log_every=1", "bounded_fraction=0.5",
                "free_max_iter=6", "free_phantom_steps=2", *train]
    return ["train", "--data", str(shards), "--out", str(out), "--no-progress", *model,
            *[arg for setting in settings for arg in ("--train", setting)]]


def subprocess_env() -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(Path(__file__).parents[1])}


@pytest.mark.slow
def test_sigkill_after_a_checkpoint_then_resume_continues_exactly(shards, tmp_path):
    settings = ["total_steps=10", "checkpoint_every=2", "keep_checkpoints=10", "batch_size=8",
                f"batch_tokens={8 * SEQUENCE * 4}"]
    assert main(cli_command(shards, tmp_path / "whole", *settings)) == 0
    command = [sys.executable, "-m", "implicitlm", *cli_command(shards, tmp_path / "killed", *settings)]
    process = subprocess.Popen(command, env=subprocess_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    first = tmp_path / "killed" / "checkpoints" / "step_0000002"
    deadline = time.monotonic() + 120
    while not first.exists() and process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    process.send_signal(signal.SIGKILL)
    process.wait()
    saved = sorted(p.name for p in (tmp_path / "killed" / "checkpoints").glob("step_*"))
    assert saved and saved[-1] < "step_0000010", "the run finished before it could be killed"
    assert main(["train", "--data", str(shards), "--out", str(tmp_path / "killed"), "--resume", "--no-progress"]) == 0
    assert logged(tmp_path / "killed", "step") == list(range(10))
    assert logged(tmp_path / "killed", "loss") == logged(tmp_path / "whole", "loss")


@pytest.mark.slow
@pytest.mark.parametrize("distributed", ["ddp", "fsdp"])
def test_two_processes_equal_one_process_with_the_same_global_batch(shards, tmp_path, distributed):
    settings = ["total_steps=3", "checkpoint_every=3", f"batch_tokens={4 * SEQUENCE}"]
    assert main(cli_command(shards, tmp_path / "single", "batch_size=4", *settings)) == 0
    two = cli_command(shards, tmp_path / "two", "batch_size=2", f"distributed={distributed}", *settings)
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", "-m", "implicitlm", *two]
    result = subprocess.run(command, env=subprocess_env(), capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    torch.testing.assert_close(logged(tmp_path / "two", "loss"), logged(tmp_path / "single", "loss"), atol=1e-5, rtol=0)


def test_damaged_checkpoint_is_a_clear_error_on_resume(shards, tmp_path, capsys):
    assert main(cli_command(shards, tmp_path, "total_steps=2", "checkpoint_every=2", "batch_size=4",
                            f"batch_tokens={4 * SEQUENCE}")) == 0
    weights = tmp_path / "checkpoints" / "step_0000002" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:100])
    capsys.readouterr()
    code = main(["train", "--data", str(shards), "--out", str(tmp_path), "--resume", "--no-progress"])
    err = capsys.readouterr().err
    assert code == 2 and "step_0000002" in err and "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_resume_without_a_checkpoint_is_a_clear_error(shards, tmp_path, capsys):
    code = main(["train", "--data", str(shards), "--out", str(tmp_path), "--resume"])
    assert code == 2 and "nothing to resume" in capsys.readouterr().err


def test_resume_after_an_overwriting_run_killed_before_its_first_checkpoint_continues_the_earlier(shards, tmp_path):
    """Before: "nothing to resume", the finished run hidden in .earlier_run.XXXX.tmp, which the
    next run deleted as a temporary."""
    finished = ["total_steps=2", "bounded_fraction=1.0", "checkpoint_every=2", "batch_size=4",
                f"batch_tokens={4 * SEQUENCE}"]
    assert main(cli_command(shards, tmp_path, *finished)) == 0
    steps = logged(tmp_path, "step")
    aside = tmp_path / ".earlier_run"  # as SIGKILL leaves it: the earlier run set aside, the new one begun
    aside.mkdir()
    for entry in [entry for entry in tmp_path.iterdir() if entry != aside]:
        os.replace(entry, aside / entry.name)
    (tmp_path / "checkpoints").mkdir()
    (tmp_path / "metrics.jsonl").write_text('{"step": 1, "loss": 9.0}\n')
    assert main(["train", "--data", str(shards), "--out", str(tmp_path), "--resume", "--no-progress",
                 "--train", "total_steps=3"]) == 0
    assert logged(tmp_path, "step") == [*steps, steps[-1] + 1] and not aside.exists()


def test_a_bounded_run_resumes_into_the_free_phase(shards, tmp_path):
    bounded_only = ["total_steps=2", "bounded_fraction=1.0", "checkpoint_every=2", "batch_size=4",
                    f"batch_tokens={4 * SEQUENCE}"]
    assert main(cli_command(shards, tmp_path, *bounded_only)) == 0
    more = ["--train", "total_steps=4", "--train", "bounded_fraction=0.5"]
    assert main(["train", "--data", str(shards), "--out", str(tmp_path), "--resume", "--no-progress", *more]) == 0
    assert logged(tmp_path, "phase") == ["bounded", "bounded", "free", "free"]
    assert logged(tmp_path, "train_max_iter") == [4, 4, 6, 6]


@pytest.mark.slow
def test_a_checkpoint_of_the_former_lm_trainer_loads_and_resumes_exactly(shards, tmp_path):
    """The former LM trainer's checkpoints lie where today's do, spell the batch size
    ``micro_batch_size`` and hold no task, warm-up or word options."""
    settings = ["total_steps=4", "checkpoint_every=2", "keep_checkpoints=2", "batch_size=4", f"batch_tokens={8 * SEQUENCE}"]
    assert main(cli_command(shards, tmp_path / "whole", *settings)) == 0
    assert main(cli_command(shards, tmp_path / "run", *settings)) == 0
    shutil.rmtree(tmp_path / "run" / "checkpoints" / "step_0000004")  # as if stopped after step 2
    meta_file = latest_checkpoint(tmp_path / "run") / "trainer.json"
    meta = json.loads(meta_file.read_text())
    former = {k: v for k, v in meta["train"].items() if k not in ("task", "unroll_steps", "unroll_depth", "group", "hard_prob")}
    former["micro_batch_size"] = former.pop("batch_size")
    meta_file.write_text(json.dumps({"step": meta["step"], "train": former, "processes": 1}))
    assert main(["train", "--data", str(shards), "--out", str(tmp_path / "run"), "--resume", "--no-progress"]) == 0
    assert logged(tmp_path / "run", "loss") == logged(tmp_path / "whole", "loss")
    resumed, uninterrupted = (load_model(tmp_path / run).state_dict() for run in ("run", "whole"))
    for name in resumed:
        assert torch.equal(resumed[name], uninterrupted[name]), name


@pytest.mark.slow
def test_tokenizer_corpus_train_and_eval_commands_chain(tmp_path, capsys):
    sources = str(Path(__file__).parents[2] / "src" / "implicitlm" / "data")
    assert main(["tokenizer", "train", sources, "--pattern", "*.py", "--vocab-size", "300", "--out", str(tmp_path / "tok")]) == 0
    assert main(["corpus", "build", sources, "--pattern", "*.py", "--tokenizer", str(tmp_path / "tok"),
                 "--out", str(tmp_path / "shards"), "--test-fraction", "0.3", "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "a tokenizer of 300 tokens" in out and "held-out tokens" in out
    assert main(cli_command(tmp_path / "shards", tmp_path / "run", "total_steps=1", "checkpoint_every=1",
                            "batch_size=2", f"batch_tokens={2 * SEQUENCE}")) == 0
    checkpoint = tmp_path / "run" / "checkpoints" / "step_0000001"
    assert main(["lm", "eval", str(checkpoint), "--data", str(tmp_path / "shards"), "--multiples", "1,2",
                 "--batch-size", "2", "--max-tokens", str(4 * SEQUENCE), "--out", str(tmp_path / "ppl")]) == 0
    rows = json.loads((tmp_path / "ppl" / "lm_length.json").read_text())["rows"]
    assert [row["length"] for row in rows] == [SEQUENCE, 2 * SEQUENCE]
    result = rows[0]
    assert result["tokens"] == 4 * SEQUENCE and result["perplexity"] == pytest.approx(math.exp(result["loss"]))
    assert 100 < result["perplexity"] < 1000  # one step from a uniform start over 300 tokens
    data = ["--data", str(tmp_path / "shards"), "--lengths", str(SEQUENCE), "--max-tokens", str(2 * SEQUENCE), "--no-progress"]
    assert main(["eval", "budget", "--task", "lm", str(checkpoint), *data, "--max-iter", "1,3",
                 "--out", str(tmp_path / "budget")]) == 0
    budget = json.loads((tmp_path / "budget" / "lm_budget.json").read_text())
    assert [(row["max_iter"], row["tokens"]) for row in budget["rows"]] == [(1, 2 * SEQUENCE), (3, 2 * SEQUENCE)]
    assert main(["eval", "convergence", "--task", "lm", str(checkpoint), *data, "--max-iter", "5",
                 "--out", str(tmp_path / "conv")]) == 0
    summary = json.loads((tmp_path / "conv" / "convergence.json").read_text())["summary"]
    assert summary["all"]["tokens"] == 2 * SEQUENCE and summary["max_iter"] == 5


def test_a_training_preset_gives_each_kind_its_own_widths_under_the_command_line(shards, tmp_path):
    preset = {
        "model": {"hidden_size": 16, "num_hidden_layers": 1, "state_size": 8, "head_dim": 8, "chunk_size": 16},
        "explicit_model": {"hidden_size": 24, "head_dim": 12},
        "train": {"sequence_length": SEQUENCE, "batch_size": 2, "batch_tokens": 2 * SEQUENCE,
                  "total_steps": 1, "checkpoint_every": 1},
    }
    (tmp_path / "preset.json").write_text(json.dumps(preset))
    runs = {"implicit": [], "explicit": ["--model", "implicit=false"],
            "given": ["--model", "implicit=false", "--model", "hidden_size=36"]}
    for name, options in runs.items():
        command = ["train", "--data", str(shards), "--out", str(tmp_path / name), "--config", str(tmp_path / "preset.json")]
        assert main([*command, "--no-progress", *options]) == 0
    widths = {
        name: json.loads((tmp_path / name / "checkpoints" / "step_0000001" / "config.json").read_text())
        for name in runs
    }
    assert {name: (config["implicit"], config["hidden_size"], config["head_dim"]) for name, config in widths.items()} == {
        "implicit": (True, 16, 8), "explicit": (False, 24, 12), "given": (False, 36, 12),
    }


def test_wikitext_validation_file_is_the_held_out_split(shared_data, tmp_path, capsys):
    import lzma

    # A slice of the real validation file stands in for both splits: the train file is 10 MB.
    text = lzma.open(shared_data / "wikitext-2" / "valid.txt.xz", "rt", encoding="utf-8").read(60_000)
    assert text.startswith(" \n = Homarus gammarus = \n")
    with lzma.open(tmp_path / "train.txt.xz", "wt", encoding="utf-8") as handle:
        handle.write(text[:50_000])
    (tmp_path / "valid.txt").write_text(text[50_000:], encoding="utf-8")
    assert main(["tokenizer", "train", str(tmp_path / "train.txt.xz"), "--vocab-size", "300",
                 "--out", str(tmp_path / "tok")]) == 0
    shards = tmp_path / "shards"
    assert main(["corpus", "build", str(tmp_path / "train.txt.xz"), "--test-sources", str(tmp_path / "valid.txt"),
                 "--tokenizer", str(tmp_path / "tok"), "--out", str(shards), "--no-progress"]) == 0
    tokenizer = load_tokenizer(tmp_path / "tok")
    for split, part in (("train", text[:50_000]), ("test", text[50_000:])):
        expected = [*tokenizer(part, add_special_tokens=False)["input_ids"], tokenizer.eos_token_id]
        assert TokenShards(shards, split).read(0, len(expected)).tolist() == expected
    both = ["corpus", "build", str(tmp_path / "train.txt.xz"), "--tokenizer", str(tmp_path / "tok"),
            "--out", str(tmp_path / "other"), "--test-fraction", "0.1", "--test-sources", str(tmp_path / "valid.txt")]
    with pytest.raises(SystemExit) as refused:
        main(both)
    assert refused.value.code == 2 and "not allowed with argument" in capsys.readouterr().err


def test_sigterm_checkpoints_after_the_step_and_resume_continues_exactly(shards, tmp_path):
    from implicitlm.train.guard import TrainingInterrupted

    config = train_config(total_steps=6, checkpoint_every=4, keep_checkpoints=4)
    train(lm_model(), config, tmp_path / "whole", data=shards, progress=False)
    model, calls = lm_model(), []

    def sigterm_on_third_forward(module, inputs, output):
        calls.append(1)
        if len(calls) == 3:
            signal_this_thread(signal.SIGTERM)

    model.get_input_embeddings().register_forward_hook(sigterm_on_third_forward)
    with pytest.raises(TrainingInterrupted, match="SIGTERM after step 3") as stopped:
        train(model, config, tmp_path / "stopped", data=shards, progress=False)
    assert stopped.value.checkpoint.name == "step_0000003" and stopped.value.checkpoint.is_dir()
    train(lm_model(), config, tmp_path / "stopped", data=shards, resume=True, progress=False)
    assert logged(tmp_path / "stopped", "step") == list(range(6))
    assert logged(tmp_path / "stopped", "loss") == logged(tmp_path / "whole", "loss")


def signal_every_process_naming(marker: str, number: int) -> int:
    """Send ``number`` to every process whose command line holds ``marker`` (as ``pkill -f``
    or a scheduler ending a job step does); returns how many were signalled."""
    signalled = 0
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and marker in (entry / "cmdline").read_bytes().decode(errors="replace"):
                os.kill(int(entry.name), number)
                signalled += 1
        except (OSError, ProcessLookupError):
            continue  # gone meanwhile
    return signalled


@pytest.mark.slow
@pytest.mark.parametrize("every_process", [False, True], ids=["torchrun", "every-process"])
def test_sigterm_to_torchrun_stops_both_processes_at_one_step_with_one_checkpoint(shards, tmp_path, every_process):
    """Signalled all at once (``pkill -f``, a scheduler ending the job step), each worker
    gets SIGTERM twice, its own and the one torchrun forwards: the second must not lose
    the stop."""
    settings = ["total_steps=200", "checkpoint_every=1000", "batch_size=2", f"batch_tokens={4 * SEQUENCE}"]
    two = cli_command(shards, tmp_path, *settings)
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", "-m", "implicitlm", *two]
    process = subprocess.Popen(command, env=subprocess_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    log = tmp_path / "metrics.jsonl"
    deadline = time.monotonic() + 120
    while (not log.exists() or len(log.read_text().splitlines()) < 3) and process.poll() is None:
        assert time.monotonic() < deadline, "training did not start"
        time.sleep(0.05)
    if every_process:
        assert signal_every_process_naming(str(tmp_path), signal.SIGTERM) == 3  # torchrun and its two workers
    else:
        process.send_signal(signal.SIGTERM)  # torchrun passes it on to both workers
    _, err = process.communicate(timeout=120)
    assert err.count("implicitlm: stopped by SIGTERM after step") == 2, err[-3000:]
    saved = sorted(p.name for p in (tmp_path / "checkpoints").glob("step_*"))
    steps = {line.split("after step ")[1].split(";")[0] for line in err.splitlines() if "after step" in line}
    assert len(saved) == 1 and steps == {str(int(saved[0][len("step_"):]))}, (saved, steps)
    assert 3 <= int(saved[0][len("step_"):]) < 200


def test_a_fresh_run_never_lands_on_an_earlier_one(shards, tmp_path):
    train(lm_model(), train_config(total_steps=6, keep_checkpoints=3), tmp_path, data=shards, progress=False)
    before = {path: path.read_bytes() for path in tmp_path.rglob("*") if path.is_file() and "tensorboard" not in path.parts}
    with pytest.raises(FileExistsError, match="holds a training run .*resume=True.*overwrite=True"):
        train(lm_model(), train_config(total_steps=2), tmp_path, data=shards, progress=False)
    assert {path: path.read_bytes() for path in before} == before  # nothing appended, nothing pruned
    (tmp_path / "notes.txt").write_text("mine")
    train(lm_model(), train_config(total_steps=2), tmp_path, data=shards, progress=False, overwrite=True)
    assert logged(tmp_path, "step") == [0, 1]
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["step_0000002"]
    assert (tmp_path / "notes.txt").read_text() == "mine"


def test_train_command_refuses_an_earlier_run_in_one_line(shards, tmp_path, capsys):
    command = ["train", "--data", str(shards), "--out", str(tmp_path), "--no-progress", "--model", "hidden_size=16",
               "--model", "num_hidden_layers=1", "--model", "head_dim=8", "--model", "state_size=8",
               "--train", f"sequence_length={SEQUENCE}", "--train", "batch_size=2",
               "--train", f"batch_tokens={2 * SEQUENCE}", "--train", "total_steps=1", "--train", "eval_every=0"]
    assert main(command) == 0
    capsys.readouterr()
    assert main(command) == 2
    err = capsys.readouterr().err
    assert "holds a training run" in err and "--overwrite" in err and len(err.strip().splitlines()) == 1
    assert main([*command, "--overwrite", "--resume"]) == 2 and "pass one" in capsys.readouterr().err
    assert main([*command, "--overwrite"]) == 0


def test_the_cost_of_a_step_is_said_before_the_first_and_its_pace_after(shards, tmp_path, capsys):
    train(lm_model(), train_config(total_steps=3, batch_size=2, batch_tokens=4 * SEQUENCE), tmp_path, data=shards)
    err = capsys.readouterr().err
    tokens = 4 * SEQUENCE
    expected = f"one step: {tokens} tokens = 2 micro-batch(es) of 2 x {SEQUENCE} tokens on each of 1 process(es); 3 steps = {3 * tokens} tokens"
    assert expected in err
    assert re.search(r"the first step took \d+\.\d s; the 2 steps left take about \d+ s", err)


def test_paper_scale_defaults_are_warned_about_on_a_cpu_only():
    from implicitlm.train.trainer import unsuited_defaults

    warning = unsuited_defaults(TrainConfig.for_task("lm"), on_gpu=False)
    assert "batch_tokens=1,048,576, sequence_length=2,048" in warning and "--train batch_tokens=..." in warning
    assert unsuited_defaults(TrainConfig.for_task("lm"), on_gpu=True) is None
    assert unsuited_defaults(train_config(), on_gpu=False) is None
    assert "sequence_length" not in unsuited_defaults(TrainConfig.for_task("lm", sequence_length=256), on_gpu=False)


def test_a_trained_checkpoint_carries_the_end_of_text_id_that_generate_stops_at(shards, tmp_path):
    train(lm_model(), train_config(total_steps=2), tmp_path, data=shards, progress=False)
    model = load_model(latest_checkpoint(tmp_path))
    eos = TokenShards(shards, "train").eos_token_id
    assert model.config.eos_token_id == model.generation_config.eos_token_id == eos
    assert model.generation_config.pad_token_id == eos


def test_both_tasks_run_the_one_loop(shards, tmp_path, capsys):
    """The loop's own records and messages are the same for word problems and language
    modelling: only the task's metrics differ (accuracy, perplexity)."""
    words = build_model(config_from_options(dict(
        vocab_size=6, hidden_size=16, num_hidden_layers=1, state_size=8, head_dim=8, chunk_size=4,
        label_alignment="aligned",
    )))
    config = TrainConfig.for_task("words", group="S3", sequence_length=6, batch_size=8, total_steps=2, log_every=1)
    train(words, config, tmp_path / "words")
    words_err = capsys.readouterr().err
    train(lm_model(), train_config(total_steps=2, bounded_fraction=1.0), tmp_path / "lm", data=shards)
    lm_err = capsys.readouterr().err
    loop_keys = {"step", "loss", "grad_norm", "lr", "phase", "tokens_per_s", "train_max_iter", "fp_passes_mean"}
    for run, own in (("words", "accuracy"), ("lm", "ppl")):
        records = [json.loads(line) for line in (tmp_path / run / "metrics.jsonl").read_text().splitlines()]
        assert [r["step"] for r in records] == [0, 1] and all(loop_keys | {own} <= set(r) for r in records), run
        assert former_cost_names(records) == [], run  # a solve's cost is in passes: fp_passes_mean, fp_row_passes
    assert "the first step took" in words_err and "the first step took" in lm_err


def test_an_update_that_blows_the_weights_up_is_never_checkpointed(shards, tmp_path):
    from implicitlm.core.errors import NumericalFault

    config = train_config(lr=1e30, warmup_steps=2, total_steps=6, checkpoint_every=1, keep_checkpoints=10)
    with pytest.raises(NumericalFault, match="not checkpointed|before its update"):
        train(lm_model(), config, tmp_path, data=shards, progress=False)
    saved = latest_checkpoint(tmp_path)
    if saved is not None:
        from safetensors.torch import load_file

        assert max(float(value.abs().max()) for value in load_file(saved / "model.safetensors").values()) < 100


@pytest.mark.slow
def test_lm_eval_refuses_a_shard_with_a_flipped_byte(shards, tmp_path, capsys):
    import shutil

    train(lm_model(), train_config(total_steps=1), tmp_path / "run", data=shards, progress=False)
    checkpoint = latest_checkpoint(tmp_path / "run")
    damaged = tmp_path / "damaged"
    shutil.copytree(shards, damaged)
    index = json.loads((damaged / "index.json").read_text())
    shard = damaged / index["splits"]["test"]["shards"][0]["file"]
    data = bytearray(shard.read_bytes())
    data[5] ^= 0x01  # still a valid token id: only the checksum tells
    shard.write_bytes(bytes(data))
    evaluate = ["lm", "eval", str(checkpoint), "--split", "test", "--lengths", str(SEQUENCE), "--no-progress"]
    assert main([*evaluate, "--data", str(shards)]) == 0
    capsys.readouterr()
    assert main([*evaluate, "--data", str(damaged)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "sha256 checksum differs" in err[0]


# The trainer runs where accelerate puts it, on CUDA wherever there is a GPU: the `device`
# fixture only skips it where cuda is asked for and missing; the GPU check runs it on CUDA.
@pytest.mark.slow
@pytest.mark.device
@pytest.mark.usefixtures("device")
@pytest.mark.parametrize("architecture", ["mamba2", "llama"])
def test_bf16_autocast_trains_and_evaluates_as_float32_does(shards, tmp_path, architecture):
    """The trainers' ``precision="bf16"`` (what "auto" picks on CUDA) runs its autocast on the
    CPU here: the bounded and free phases' solves and phantom gradients, and the held-out
    evaluation, give the float32 run's losses to bf16's precision."""
    sizes = (dict(state_size=8, head_dim=8, chunk_size=16) if architecture == "mamba2"
             else dict(num_attention_heads=2, num_key_value_heads=1, intermediate_size=32))

    def model():
        return tiny_model(architecture=architecture, vocab_size=320, hidden_size=16, num_hidden_layers=1, implicit=True,
                          **sizes)

    losses = {}
    for precision in ("no", "bf16"):
        run = tmp_path / precision
        train(model(), train_config(precision=precision, eval_every=4, eval_batches=1), run, data=shards, progress=False)
        losses[precision] = logged(run, "loss")[:4], [v for v in logged(run, "test_loss") if v is not None]
    (train32, held32), (train16, held16) = losses["no"], losses["bf16"]
    assert len(held16) == len(held32) == 1 and all(math.isfinite(v) for v in train16 + held16)
    # bf16 keeps 8 bits of mantissa: about 0.4% of each activation, a few hundredths of a nat here.
    torch.testing.assert_close(train16, train32, rtol=0, atol=0.05)
    torch.testing.assert_close(held16, held32, rtol=0, atol=0.05)
    assert train16 != train32  # the autocast did run in bf16
