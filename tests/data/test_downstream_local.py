"""The paper's downstream sets from local files: the readers against the hub schema lm-eval's
tasks expect, their refusals, the command, and the scores against lm-eval's own ``hf`` model
on the same weights."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
import torch
from transformers import Mamba2Config, Mamba2ForCausalLM
from transformers.utils import logging as transformers_logging

from implicitlm.cli import main
from implicitlm.data.downstream_sets import READERS, MissingLocalSet, read_local_set
from implicitlm.core.errors import DataError
from implicitlm.data.tokenizer import train_tokenizer
from implicitlm.eval.downstream import task_manager, local_task_specs, read_local_sets, run_tasks
from tests.support.models import tiny_model

SLICES = Path(__file__).parents[1] / "support" / "downstream"
SLICE_TASKS = ("lambada_openai", "hellaswag", "piqa", "arc_easy", "arc_challenge", "winogrande")
# The published sizes of the evaluation splits lm-eval scores.
FULL_SIZES = {"lambada_openai": 5153, "hellaswag": 10042, "piqa": 1838, "arc_easy": 2376, "arc_challenge": 1172,
              "winogrande": 1267}

transformers_logging.set_verbosity_error()
pytestmark = pytest.mark.usefixtures("offline_hub")  # the sample tasks and sets are local files


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    texts = [json.dumps(read_local_set(task, SLICES).documents) for task in SLICE_TASKS]
    return train_tokenizer(texts, 320, tmp_path_factory.mktemp("tokenizer"))


def copy_slices(tmp_path: Path) -> Path:
    target = tmp_path / "data"
    for path in SLICES.rglob("*"):
        if path.is_file():
            (target / path.relative_to(SLICES)).parent.mkdir(parents=True, exist_ok=True)
            (target / path.relative_to(SLICES)).write_bytes(path.read_bytes())
    return target


def test_readers_give_the_schema_of_the_hub_datasets_lm_eval_loads():
    piqa = read_local_set("piqa", SLICES)
    assert piqa.split == "validation" and len(piqa.documents) == 8
    assert set(piqa.documents[0]) == {"goal", "sol1", "sol2", "label"} and piqa.documents[0]["label"] == 0
    arc = read_local_set("arc_easy", SLICES)
    first = arc.documents[0]
    assert arc.split == "test" and first["answerKey"] == "A" and first["choices"]["label"] == ["A", "B", "C", "D"]
    assert first["question"].startswith("Which statement best explains why photosynthesis")
    winogrande = read_local_set("winogrande", SLICES).documents
    assert [doc["answer"] for doc in winogrande[:3]] == ["2", "1", "2"]
    assert read_local_set("lambada_openai", SLICES).documents[0]["text"].startswith("In my palm is a clear stone")
    hellaswag = read_local_set("hellaswag", SLICES)
    assert hellaswag.documents[0] == {
        "query": "Roof shingle removal: A man is sitting on a roof. he", "label": "3",
        "choices": ["is using wrap to wrap a pair of skis.", "is ripping level tiles off.", "is holding a rubik's cube.",
                    "starts pulling up roofing on a roof."],
    }
    assert hellaswag.task_options == {"process_docs": None}  # already in processed form


def test_hellaswag_in_its_original_layout_goes_through_lm_evals_own_processing(tmp_path):
    record = {"ind": 24, "activity_label": "Roof shingle removal", "ctx_a": "A man is sitting on a roof.",
              "ctx_b": "he", "endings": ["a.", "b.", "c [title] d.", "e."], "label": 3, "split": "val"}
    (tmp_path / "hellaswag").mkdir()
    (tmp_path / "hellaswag" / "hellaswag_val.jsonl").write_text(json.dumps(record) + "\n")
    local = read_local_set("hellaswag", tmp_path)
    assert local.task_options == {} and local.documents[0]["label"] == "3"
    [spec] = local_task_specs({"hellaswag": local}, task_manager(["hellaswag"], None))
    processed = spec["process_docs"](spec["custom_dataset"]()["validation"])
    assert processed[0]["query"] == "Roof shingle removal: A man is sitting on a roof. He"
    assert processed[0]["choices"] == ["a.", "b.", "c. d.", "e."]


@pytest.mark.parametrize(
    "damage, message",
    [
        (lambda d: (d / "piqa" / "valid-labels.lst").write_text("0\n1\n"), "2 labels for 8 documents"),
        (lambda d: (d / "piqa" / "valid-labels.lst").write_text("0\n" * 7 + "2\n"), "valid-labels.lst:8: expected one of"),
        (lambda d: (d / "arc" / "ARC-Easy-Test.jsonl").write_text(
            '{"question": {"stem": "q", "choices": [{"text": "t", "label": "A"}]}, "answerKey": "E"}\n'),
         "answer 'E' is not among the choice labels"),
        (lambda d: (d / "hellaswag" / "hellaswag_val_full.txt").write_text("context\n3\na\nb\n"), "not a multiple of 6"),
        (lambda d: (d / "winogrande" / "dev-labels.lst").write_text("1\n" * 8), "disagrees with dev-labels.lst"),
        (lambda d: (d / "lambada" / "lambada_test.jsonl.xz").write_bytes(b"\xfd7zXZ\x00junk"), "cannot read"),
        (lambda d: (d / "arc" / "ARC-Easy-Test.jsonl").write_text("[1, 2]\n"), "expected a JSON object"),
    ],
    ids=["label-count", "label-value", "answer-key", "hellaswag-lines", "winogrande-labels", "damaged-xz", "not-object"],
)
def test_damaged_local_files_are_one_line_errors_naming_the_file(tmp_path, damage, message):
    data = copy_slices(tmp_path)
    damage(data)
    with pytest.raises(DataError, match=message) as error:
        read_local_sets(SLICE_TASKS, data)
    assert "\n" not in str(error.value) and str(data) in str(error.value)


def test_missing_files_are_skipped_only_when_asked():
    with pytest.raises(MissingLocalSet, match="openbookqa/test.jsonl not found"):
        read_local_sets(["piqa", "openbookqa"], SLICES)
    sets, skipped = read_local_sets(["piqa", "openbookqa"], SLICES, skip_missing=True)
    assert list(sets) == ["piqa"] and list(skipped) == ["openbookqa"]
    with pytest.raises(DataError, match="no local reader"):
        read_local_set("mmlu", SLICES)


@pytest.mark.slow
def test_full_shared_copies_have_the_published_sizes(shared_data):
    for task, size in FULL_SIZES.items():
        assert len(read_local_set(task, shared_data).documents) == size, task
    assert set(READERS) == {*FULL_SIZES, "openbookqa"}


def explicit_pair(tmp_path: Path, tokenizer) -> tuple[Path, Path]:
    """A transformers Mamba2 saved as it is and imported into implicitlm: the same weights."""
    torch.manual_seed(0)
    hf = Mamba2ForCausalLM(Mamba2Config(
        vocab_size=len(tokenizer), hidden_size=32, num_hidden_layers=2, num_heads=4, head_dim=16, expand=2,
        state_size=16, n_groups=1, chunk_size=16, tie_word_embeddings=True, eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.eos_token_id, bos_token_id=tokenizer.eos_token_id,
    ))
    hf.save_pretrained(tmp_path / "hf")
    tokenizer.save_pretrained(tmp_path / "hf")
    assert main(["models", "import", str(tmp_path / "hf"), "--out", str(tmp_path / "ours")]) == 0
    return tmp_path / "hf", tmp_path / "ours"


@pytest.mark.slow
def test_scores_equal_lm_evals_hf_model_on_the_same_weights(tmp_path, tokenizer):
    from lm_eval import simple_evaluate

    hf_dir, ours_dir = explicit_pair(tmp_path, tokenizer)
    local_sets, _ = read_local_sets(SLICE_TASKS, SLICES)
    ours = run_tasks(ours_dir, SLICE_TASKS, local_sets=local_sets, tokenizer=str(hf_dir), batch_size=4,
                     bootstrap_iters=0)
    reference = simple_evaluate(
        model="hf", model_args={"pretrained": str(hf_dir), "dtype": "float32", "device": "cpu"}, batch_size=4,
        tasks=local_task_specs(local_sets, task_manager(SLICE_TASKS, None)), bootstrap_iters=0,
    )
    for task in SLICE_TASKS:
        ours_scores, reference_scores = ours["results"][task], reference["results"][task]
        for metric in ("acc,none", "acc_norm,none", "perplexity,none"):
            if metric in reference_scores:
                assert ours_scores[metric] == pytest.approx(reference_scores[metric], rel=1e-4), (task, metric)


def small_implicit_checkpoint(folder: Path, tokenizer) -> None:
    model = tiny_model(
        architecture="mamba2", vocab_size=len(tokenizer), hidden_size=16, num_hidden_layers=1, state_size=8,
        head_dim=8, chunk_size=16, implicit=True, fixed_point=dict(max_iter=6),
    )
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)


@pytest.mark.slow
def test_downstream_command_reads_a_data_folder_and_skips_what_is_missing(tmp_path, tokenizer, capfd, monkeypatch):
    monkeypatch.chdir(tmp_path)  # outside any git repository, where lm-eval's git question fails
    small_implicit_checkpoint(tmp_path / "model", tokenizer)
    code = main(["lm", "downstream", str(tmp_path / "model"), "--data-dir", str(SLICES), "--out", str(tmp_path / "out"),
                 "--no-progress", "--batch-size", "4"])
    captured = capfd.readouterr()  # the file descriptors: what child processes print too
    assert code == 0 and "warning: skipped openbookqa" in captured.err
    assert "not a git repository" not in captured.err
    record = json.loads((tmp_path / "out" / "downstream.json").read_text())
    assert record["settings"]["data_dir"] == str(SLICES) and list(record["settings"]["skipped"]) == ["openbookqa"]
    assert set(record["lm_eval"]["results"]) == set(SLICE_TASKS)
    assert [row["column"] for row in record["paper_table"] if row["value"] is None] == ["OpenbookQA acc"]
    # Named tasks must all be there; few-shot prompts have no training split to come from.
    for extra, message in [(["--tasks", "piqa,openbookqa"], "openbookqa/test.jsonl not found"),
                           (["--tasks", "piqa", "--num-fewshot", "2"], "few-shot prompts need a training split")]:
        code = main(["lm", "downstream", str(tmp_path / "model"), "--data-dir", str(SLICES),
                     "--out", str(tmp_path / "bad"), "--no-progress", *extra])
        err = capfd.readouterr().err
        assert code == 2 and message in err and "Traceback" not in err


def test_an_unreachable_hub_is_one_line_pointing_to_local_copies(tmp_path, tokenizer, capfd, monkeypatch):
    import datasets

    def unreachable_hub(*args, **kwargs):
        # What datasets does without a network: the hub logs its retries, then the request fails.
        for attempt in range(1, 6):
            logging.getLogger("huggingface_hub.utils._http").warning(
                "'[Errno -2] Name or service not known' thrown while requesting HEAD https://huggingface.co/x")
            logging.getLogger("huggingface_hub.utils._http").warning(f"Retrying in 1s [Retry {attempt}/5].")
        raise ConnectionError("Couldn't reach 'baber/piqa' on the Hub (LocalEntryNotFoundError)")

    monkeypatch.setattr(datasets, "load_dataset", unreachable_hub)
    small_implicit_checkpoint(tmp_path / "model", tokenizer)
    code = main(["lm", "downstream", str(tmp_path / "model"), "--tasks", "piqa", "--out", str(tmp_path / "out"),
                 "--no-progress"])
    err_lines = capfd.readouterr().err.splitlines()
    assert code == 1 and len(err_lines) == 1, err_lines
    assert "Couldn't reach 'baber/piqa'" in err_lines[0] and "--data-dir DIR" in err_lines[0]
