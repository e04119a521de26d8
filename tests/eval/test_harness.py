"""lm-evaluation-harness adapter: its scores against plain forwards, batching, generation,
the budget reaching the model, the shipped sample tasks end to end (offline), the CLI, the
paper table, and the trainer's checkpoints carrying their tokenizer."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from lm_eval.api.instance import Instance
from lm_eval.api.registry import get_model, model_registry

from implicitlm.cli import main
from implicitlm.core.errors import OptionError
from implicitlm.data.shard_writer import write_shards
from implicitlm.data.downstream_sets import read_local_set
from implicitlm.data.tokenizer import train_tokenizer
from implicitlm.eval.downstream import paper_table, run_tasks
from implicitlm.eval.harness import ImplicitLMHarness
from implicitlm.eval.harness_sample import SAMPLE_TASKS, SAMPLE_TASKS_DIR
from implicitlm.models import build_model, config_from_options, load_model
from implicitlm.train.config import TrainConfig
from implicitlm.train.trainer import train

from tests.support.models import family_model
from tests.support.models import tiny_model

SENTENCES = [
    "The sun rises in the east and sets in the west.",
    "Bees make honey from the flowers in the field.",
    "The baker bakes fresh bread every morning.",
    "Question: What do bees make?\nAnswer: honey.",
    "A small village lay at the foot of the mountain.",
] * 4
VARIANTS = [("mamba2", True), ("mamba2", False), ("llama", True)]
IDS = ["mamba2-implicit", "mamba2-explicit", "llama-implicit"]

pytestmark = pytest.mark.usefixtures("offline_hub")  # the sample tasks and sets are local files


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    return train_tokenizer(SENTENCES, 300, tmp_path_factory.mktemp("tokenizer"))


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory, tokenizer) -> Path:
    """A one-step LM training run's checkpoint, on shards made with a local tokenizer folder."""
    root = tmp_path_factory.mktemp("run")
    write_shards(SENTENCES, tokenizer, root / "shards", test_fraction=0.2, progress=False)
    model = tiny_model(
        architecture="mamba2", vocab_size=len(tokenizer), hidden_size=16, num_hidden_layers=1, state_size=8,
        head_dim=8, chunk_size=16, fixed_point=dict(max_iter=8),
    )
    config = TrainConfig.for_task(
        "lm", sequence_length=16, batch_size=2, batch_tokens=32, total_steps=1, warmup_steps=1, eval_every=0,
    )
    train(model, config, root / "out", data=root / "shards", progress=False)
    return root / "out" / "checkpoints" / "step_0000001"


def make_model(architecture: str, implicit: bool, vocab: int):
    """Float64, contractive. Llama converges (to 1e-9 in some 30 iterations); Mamba2, which
    converges slowly, runs a fixed budget of 10 iterations (the tolerance is out of reach),
    the same whatever else is in the batch."""
    budget = dict(max_iter=10, tol=1e-30) if architecture == "mamba2" else dict(max_iter=200, tol=1e-9)
    return family_model(architecture, implicit, vocab, fixed_point=budget)


def requests(kind: str, *args_list) -> list[Instance]:
    return [Instance(kind, {}, args, index) for index, args in enumerate(args_list)]


def token_logprobs(model, ids: list[int]) -> torch.Tensor:
    """log p(ids[i + 1] | ids[: i + 1]) from one plain forward over ids[:-1]."""
    with torch.no_grad():
        logits = model(torch.tensor([ids[:-1]])).logits[0]
    return F.log_softmax(logits, dim=-1).gather(-1, torch.tensor(ids[1:])[:, None])[:, 0]


@pytest.mark.parametrize("architecture, implicit", VARIANTS, ids=IDS)
def test_loglikelihood_is_the_sum_of_token_logprobs_of_a_plain_forward(architecture, implicit, tokenizer):
    model = make_model(architecture, implicit, len(tokenizer))
    lm = ImplicitLMHarness(model, tokenizer=tokenizer, progress=False)
    pairs = [("The sun rises in the", " east and sets"), ("", "Bees make honey")]
    results = lm.loglikelihood(requests("loglikelihood", *pairs))
    for (context, continuation), (logprob, greedy) in zip(pairs, results):
        if context:
            context_ids, ids = tokenizer.encode(context), tokenizer.encode(context + continuation)
        else:  # the eos token stands in for an empty context
            context_ids = [tokenizer.eos_token_id]
            ids = context_ids + tokenizer.encode(continuation)
        scored = token_logprobs(model, ids)[len(context_ids) - 1:]
        assert logprob == pytest.approx(float(scored.sum()), abs=1e-6)
        assert logprob < 0 and not greedy  # a random model does not happen to predict these texts


def test_is_greedy_exactly_when_each_continuation_token_is_the_argmax(tokenizer):
    model = make_model("llama", True, len(tokenizer))
    lm = ImplicitLMHarness(model, tokenizer=tokenizer, progress=False)
    context = tokenizer.encode("The baker bakes")
    greedy = []
    with torch.no_grad():
        for _ in range(3):
            greedy.append(int(model(torch.tensor([context + greedy])).logits[0, -1].argmax()))
    other = greedy[:2] + [(greedy[2] + 1) % len(tokenizer)]
    (_, is_greedy), (_, is_other_greedy) = lm._loglikelihood_tokens([(None, context, greedy), (None, context, other)])
    assert is_greedy and not is_other_greedy


def test_rolling_loglikelihood_is_the_text_logprob_and_windows_keep_the_longest_context(tokenizer):
    model = make_model("mamba2", True, len(tokenizer))
    text = "A small village lay at the foot of the mountain. The baker bakes fresh bread."
    ids = tokenizer.encode(text)
    eos = tokenizer.eos_token_id
    whole = float(token_logprobs(model, [eos] + ids).sum())
    [rolled] = ImplicitLMHarness(model, tokenizer=tokenizer, progress=False).loglikelihood_rolling(requests("r", (text,)))
    assert rolled == pytest.approx(whole, abs=1e-6)
    # A window of L < n tokens: the first L tokens after eos, then the remaining ones, each
    # read with the L tokens before it.
    n = len(ids)
    window = n - n // 3
    first = token_logprobs(model, [eos] + ids[: window]).sum()
    rest = token_logprobs(model, ids[n - window - 1:])[-(n - window):].sum()
    lm = ImplicitLMHarness(model, tokenizer=tokenizer, max_length=window, progress=False)
    [windowed] = lm.loglikelihood_rolling(requests("r", (text,)))
    assert windowed == pytest.approx(float(first + rest), abs=1e-6)
    assert abs(windowed - whole) > 1e-3  # the windows did cut the context


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["simultaneous", "sequential"])
def test_batching_and_left_padding_leave_the_scores_unchanged(mode, tokenizer):
    model = make_model("mamba2", True, len(tokenizer))
    # Two shared contexts (each solved once, its continuations going on from its state), two
    # of whose continuations and two unshared pairs are of equal length (sequential batches);
    # the rest of other lengths (padding).
    pairs = [("The sun", " rises"), ("The sun", " sets"), ("Bees make honey from the", " flowers"),
             ("The baker", " bakes"), ("A small village lay", " at the foot"), ("Question:", " What"),
             ("Question:", " Who"), ("The moon", " bakes")]
    texts = [(s,) for s in SENTENCES[:3]]

    def scores(batch_size):
        lm = ImplicitLMHarness(model, tokenizer=tokenizer, batch_size=batch_size, mode=mode, max_iter=4, progress=False)
        return lm.loglikelihood(requests("l", *pairs)), lm.loglikelihood_rolling(requests("r", *texts))

    one, one_rolled = scores(1)
    batches = []
    model.register_forward_hook(lambda m, args, kwargs, out: batches.append(kwargs["attention_mask"]), with_kwargs=True)
    four, four_rolled = scores(4)
    assert max(len(mask) for mask in batches) > 1
    assert any(not mask.all() for mask in batches) == (mode == "simultaneous")  # padded, where the mode takes it
    assert [g for _, g in one] == [g for _, g in four]
    torch.testing.assert_close([s for s, _ in four], [s for s, _ in one], atol=1e-5, rtol=0)
    torch.testing.assert_close(four_rolled, one_rolled, atol=1e-5, rtol=0)


@pytest.mark.slow
def test_auto_batch_size_is_the_largest_that_fits_and_scores_the_same(tokenizer):
    model = make_model("mamba2", True, len(tokenizer))
    pairs = [(s[:12], s[12:20]) for s in SENTENCES]
    fixed = ImplicitLMHarness(model, tokenizer=tokenizer, batch_size=1, max_iter=4, progress=False)
    auto = ImplicitLMHarness(model, tokenizer=tokenizer, batch_size="auto:4", max_batch_size=16, max_iter=4, progress=False)
    widths = []
    forward = model.forward

    def short_of_memory_above_four(input_ids, **kwargs):
        widths.append(len(input_ids))
        if len(input_ids) > 4:  # what the CPU allocator raises when a batch does not fit
            raise RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried to allocate 1 bytes.")
        return forward(input_ids, **kwargs)

    model.forward = short_of_memory_above_four
    scored = auto.loglikelihood(requests("l", *pairs))
    # Probed from max_batch_size down (accelerate's steps) to the first that fits, then used.
    fits = next(i for i, width in enumerate(widths) if width <= 4)
    probes, batches = widths[: fits + 1], widths[fits + 1:]
    assert probes[0] == 16 and probes == sorted(probes, reverse=True) and max(batches) == probes[-1]
    torch.testing.assert_close([s for s, _ in scored], [s for s, _ in fixed.loglikelihood(requests("l", *pairs))],
                               atol=1e-5, rtol=0)


@pytest.mark.parametrize("value", [0, "many", "-2", 1.5])
def test_batch_size_must_be_a_positive_integer_or_auto(value, tokenizer):
    with pytest.raises(ValueError, match="batch_size must be a positive integer or auto"):
        ImplicitLMHarness(make_model("mamba2", False, len(tokenizer)), tokenizer=tokenizer, batch_size=value)


@pytest.mark.slow
def test_generate_until_is_greedy_decoding_cut_at_the_stop_string(tokenizer):
    model = make_model("llama", True, len(tokenizer))
    contexts = ["The sun rises", "Question: What do bees make?\nAnswer:", "A"]

    def greedy(context: str, steps: int) -> list[int]:
        """Argmax of a whole-text forward per token, up to the eos token."""
        ids = tokenizer.encode(context)
        new = []
        with torch.no_grad():
            while len(new) < steps and tokenizer.eos_token_id not in new[-1:]:
                new.append(int(model(torch.tensor([ids + new])).logits[0, -1].argmax()))
        return [token for token in new if token != tokenizer.eos_token_id]

    free = [tokenizer.decode(greedy(context, 8)) for context in contexts]
    lm = ImplicitLMHarness(model, tokenizer=tokenizer, batch_size=3, progress=False)
    assert lm.generate_until(requests("g", *[(c, {"max_gen_toks": 8, "until": []}) for c in contexts])) == free
    # A stop string the first text reaches after a few tokens: cut there, and decoding stops early.
    stop = next(char for char in free[0][3:] if char != "\ufffd")
    calls = []
    model.register_forward_hook(lambda *_: calls.append(1))
    [cut] = lm.generate_until(requests("g", (contexts[0], {"max_gen_toks": 8, "until": [stop], "do_sample": False})))
    assert cut == free[0].split(stop)[0] and stop not in cut
    assert len(calls) < 8


def test_mode_and_budget_reach_the_model(tokenizer):
    model = make_model("llama", True, len(tokenizer))
    seen = []
    model.register_forward_hook(lambda module, args, kwargs, out: seen.append((kwargs, out)), with_kwargs=True)
    lm = ImplicitLMHarness(model, tokenizer=tokenizer, mode="sequential", max_iter=2, tol=1e-9, progress=False)
    lm.loglikelihood(requests("l", ("The sun", " rises")))
    lm.generate_until(requests("g", ("The sun", {"max_gen_toks": 2, "until": []})))
    assert [kwargs["mode"] for kwargs, _ in seen] == ["sequential"] * 3  # a score, a prompt, one more token
    assert all(kwargs["max_iter"] == 2 and kwargs["tol"] == 1e-9 for kwargs, _ in seen)
    assert all(int(out.fixed_point.passes.max()) == 2 for _, out in seen)  # tol 1e-9 is out of reach in 2


def test_a_checkpoint_loads_in_the_dtype_asked_as_every_loader_loads_it(tokenizer, tmp_path):
    """Before: loaded in float32, then cast: Mamba1's A_log, which the loader keeps in float32,
    was cast too, and the config still said float32."""
    torch.manual_seed(0)
    build_model(config_from_options(dict(
        architecture="mamba", vocab_size=len(tokenizer), hidden_size=16, num_hidden_layers=1, state_size=4,
    ))).save_pretrained(tmp_path)
    adapted = ImplicitLMHarness(str(tmp_path), tokenizer=tokenizer, dtype="bfloat16", progress=False).model
    loaded = load_model(tmp_path, "bfloat16")
    assert adapted.config.dtype == loaded.config.dtype == torch.bfloat16
    assert adapted.stack.layers[0].mixer.A_log.dtype == torch.float32
    for name, tensor in loaded.state_dict().items():
        assert adapted.state_dict()[name].dtype == tensor.dtype and torch.equal(adapted.state_dict()[name], tensor)


@pytest.mark.parametrize("mode", ["simultaneous", "sequential"])
def test_passes_from_model_args_reach_every_forward_and_the_results_config(tokenizer, mode):
    model = make_model("llama", True, len(tokenizer))
    seen = []
    model.register_forward_hook(lambda module, args, kwargs, out: seen.append((kwargs, out)), with_kwargs=True)
    lm = ImplicitLMHarness.create_from_arg_obj({"pretrained": model, "tokenizer": tokenizer, "mode": mode,
                                                "passes": 2, "progress": False})
    lm.loglikelihood(requests("l", ("The sun", " rises"), ("The sun", " sets")))
    lm.generate_until(requests("g", ("The sun", {"max_gen_toks": 2, "until": []})))
    assert seen and all(kwargs["passes"] == 2 for kwargs, _ in seen)
    assert all(out.fixed_point.solver == "2_passes" and bool((out.fixed_point.passes == 2).all()) for _, out in seen)
    assert lm.get_model_info()["passes"] == 2 and model.solver.options.passes == 0
    with pytest.raises(OptionError, match="argument 'passes' must be"):
        ImplicitLMHarness(model, tokenizer=tokenizer, passes=-1)


def test_fixed_point_options_reach_every_forward_and_leave_the_model_s_own_as_they_are(tokenizer):
    """What ``lm downstream``'s flags become: before, they were set on the model it loaded."""
    model = make_model("llama", True, len(tokenizer))
    own = model.solver.options
    seen = []
    model.register_forward_hook(lambda module, args, kwargs, out: seen.append(out), with_kwargs=True)
    lm = ImplicitLMHarness(model, tokenizer=tokenizer, batch_size="auto:2", max_batch_size=2, progress=False,
                           fixed_point={"passes": 3, "retry_depth": 0})
    lm.loglikelihood(requests("l", ("The sun", " rises"), ("The sun", " sets")))
    lm.generate_until(requests("g", ("The sun", {"max_gen_toks": 2, "until": []})))
    probes = [out.fixed_point for out in seen if out.fixed_point.solver != "3_passes"]  # the batch size's: one pass
    scored = [out.fixed_point for out in seen if out.fixed_point.solver == "3_passes"]
    assert probes and all(int(stats.passes.max()) == 1 and bool(stats.converged.all()) for stats in probes)
    assert len(scored) >= 3 and all(bool((stats.passes == 3).all()) for stats in scored)
    assert lm.get_model_info()["passes"] == 3 and model.solver.options == own
    with pytest.raises(OptionError, match="^fixed_point: a dict of FixedPointOptions fields, got str$"):
        ImplicitLMHarness(model, tokenizer=tokenizer, fixed_point="passes=3")


def test_fixed_points_short_of_the_tolerance_are_reported_and_warned_about(tokenizer, caplog):
    model = make_model("llama", True, len(tokenizer))
    lm = ImplicitLMHarness(model, tokenizer=tokenizer, mode="sequential", max_iter=2, tol=1e-9, progress=False)
    with caplog.at_level("WARNING", logger="implicitlm"):
        lm.loglikelihood(requests("l", ("The sun", " rises")))
        lm.generate_until(requests("g", ("The sun", {"max_gen_toks": 2, "until": []})))
    # One line per request type, none from the generate() calls inside the adapter.
    lines = [record.getMessage() for record in caplog.records if record.name == "implicitlm"]
    assert len(lines) == 2 and lines[0].startswith("lm-eval loglikelihood requests (sequential mode): ")
    assert lines[1].startswith("lm-eval generate_until requests") and "at the budget of passes" in lines[1]
    info = lm.get_model_info()
    assert info["fp_not_converged_share"] == 1.0 and info["fp_fixed_points"] == info["fp_stopped_at_budget"] > 0


def test_registered_by_name_from_model_args_without_hiding_the_built_in_models(checkpoint):
    assert get_model("implicitlm") is ImplicitLMHarness and "hf" in model_registry and "dummy" in model_registry
    lm = get_model("implicitlm").create_from_arg_string(
        f"pretrained={checkpoint},mode=sequential,max_iter=3,tol=0.01,max_length=64", {"batch_size": "4", "device": "cpu"}
    )
    assert (lm.mode, lm.max_iter, lm.tol, lm.max_length, lm.batch_size) == ("sequential", 3, 0.01, 64, 4)
    assert lm.tokenizer.eos_token_id is not None  # the trainer saved it into the checkpoint
    with pytest.raises(ValueError, match="mode"):
        ImplicitLMHarness(checkpoint, mode="parallel")


@pytest.mark.slow
def test_sample_tasks_run_end_to_end_and_agree_with_the_adapters_own_scores(checkpoint):
    results = run_tasks(checkpoint, SAMPLE_TASKS, include_path=SAMPLE_TASKS_DIR, batch_size=4, bootstrap_iters=0,
                        progress=False)["results"]
    assert set(results) == set(SAMPLE_TASKS)
    assert 0 <= results["implicitlm_sample_generate"]["exact_match,none"] <= 1
    assert results["implicitlm_sample_completion"]["perplexity,none"] > 1
    assert results["implicitlm_sample_text"]["byte_perplexity,none"] > 1
    # Multiple choice: acc is the share of documents whose labelled choice scores highest.
    lm = ImplicitLMHarness(checkpoint, progress=False)
    docs = [json.loads(line) for line in (SAMPLE_TASKS_DIR / "choice.jsonl").read_text().splitlines()]
    correct = []
    for doc in docs:
        scores = lm.loglikelihood(requests("l", *[(doc["context"], " " + choice) for choice in doc["choices"]]))
        correct.append(max(range(len(scores)), key=lambda i: scores[i][0]) == doc["label"])
    assert results["implicitlm_sample_choice"]["acc,none"] == pytest.approx(sum(correct) / len(docs))


@pytest.mark.slow
def test_downstream_command_writes_its_record_and_figure(checkpoint, tmp_path, capsys):
    out = tmp_path / "downstream"
    code = main(["lm", "downstream", str(checkpoint), "--tasks", "implicitlm_sample_choice,implicitlm_sample_completion",
                 "--include-path", str(SAMPLE_TASKS_DIR), "--limit", "4", "--max-iter", "3", "--out", str(out),
                 "--no-progress"])
    assert code == 0
    record = json.loads((out / "downstream.json").read_text())
    assert record["experiment"] == "downstream" and record["settings"]["max_iter"] == 3
    assert 0 <= record["metrics"]["implicitlm_sample_choice/acc"] <= 1
    assert record["metrics"]["implicitlm_sample_completion/perplexity"] > 1
    assert record["lm_eval"]["n-samples"]["implicitlm_sample_choice"]["effective"] == 4
    assert (out / "downstream.png").stat().st_size > 0
    assert "implicitlm_sample_choice" in capsys.readouterr().out


def test_downstream_command_reports_bad_input_in_one_line(checkpoint, tmp_path, capsys):
    bare = tmp_path / "bare"
    build_model(config_from_options(dict(architecture="mamba2", vocab_size=300, hidden_size=16, num_hidden_layers=1,
                                         state_size=8, head_dim=8))).save_pretrained(bare)
    assert main(["lm", "downstream", str(bare), "--tasks", SAMPLE_TASKS[0], "--include-path", str(SAMPLE_TASKS_DIR),
                 "--out", str(tmp_path / "o")]) == 2
    assert "no tokenizer saved with the model" in capsys.readouterr().err
    assert main(["lm", "downstream", str(checkpoint), "--include-path", str(tmp_path / "none"), "--out", str(tmp_path)]) == 2
    assert "no such task folder" in capsys.readouterr().err


def test_paper_table_reproduces_the_papers_average():
    # Implicit Llama (32+4), first block of the paper's table: its average is 0.5535.
    paper = {"lambada_openai": {"perplexity,none": 4.82, "acc,none": 0.6703},
             "hellaswag": {"acc,none": 0.5995, "acc_norm,none": 0.7712}, "piqa": {"acc,none": 0.7416},
             "arc_easy": {"acc,none": 0.6187}, "arc_challenge": {"acc,none": 0.3012},
             "winogrande": {"acc,none": 0.5991}, "openbookqa": {"acc,none": 0.344}}
    rows, markdown = paper_table({"results": paper})
    assert [row["column"] for row in rows][-1] == "Average acc"
    assert rows[-1]["value"] == pytest.approx(0.5535, abs=5e-5)
    assert rows[2]["acc_norm"] == 0.7712 and rows[3]["acc_norm"] is None
    assert "| score | 4.82 | 0.6703 | 0.5995 | 0.7416 | 0.6187 | 0.3012 | 0.5991 | 0.3440 | 0.5535 |" in markdown
    assert "| acc_norm | - | - | 0.7712 |" in markdown
    rows, markdown = paper_table({"piqa": {"acc,none": 0.7}, "hellaswag": {"acc,none": 0.5}})
    assert rows[0]["value"] is None and rows[-1]["value"] == pytest.approx(0.6)
    assert "| score | - | - | 0.5000 | 0.7000 | - |" in markdown and "mean of the 2 acc column(s)" in markdown


def real_items(task: str, shared_data: Path, count: int) -> list[tuple[str, str]]:
    """(context, continuation) pairs of the first ``count`` items of a local downstream set,
    every choice of an item continuing the same context, as lm-eval's task builds them."""
    documents = read_local_set(task, shared_data).documents[:count]
    if task == "hellaswag":
        return [(doc["query"], " " + choice) for doc in documents for choice in doc["choices"]]
    return [(f"Question: {doc['goal']}\nAnswer:", " " + doc[key]) for doc in documents for key in ("sol1", "sol2")]


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["simultaneous", "sequential"])
@pytest.mark.parametrize("task", ["hellaswag", "piqa"])
def test_shared_contexts_score_as_whole_texts_on_real_items_and_read_fewer_tokens(task, mode, shared_data, tokenizer):
    model = make_model("llama", True, len(tokenizer))  # converges to 1e-9
    pairs = real_items(task, shared_data, 3 if mode == "simultaneous" else 1)  # token by token is slow
    read = []
    model.register_forward_hook(lambda m, args, kwargs, out: read.append(int(kwargs["attention_mask"].sum())), with_kwargs=True)

    def scores(share_contexts: bool):
        read.clear()
        lm = ImplicitLMHarness(model, tokenizer=tokenizer, batch_size=4, mode=mode, share_contexts=share_contexts, progress=False)
        with model.track_convergence() as tally:
            result = lm.loglikelihood(requests("l", *pairs))
        assert tally.not_converged == 0
        return result, sum(read)

    (shared, shared_tokens), (whole, whole_tokens) = scores(True), scores(False)
    torch.testing.assert_close([s for s, _ in shared], [s for s, _ in whole], atol=1e-6, rtol=0)
    assert [g for _, g in shared] == [g for _, g in whole]
    # Each context read once instead of once per choice; a continuation's last token is never read.
    encoded = [ImplicitLMHarness(model, tokenizer=tokenizer, progress=False)._encode_pair(*pair) for pair in pairs]
    contexts = {tuple(context) for context, _ in encoded}
    assert whole_tokens == sum(len(context) + len(continuation) - 1 for context, continuation in encoded)
    assert shared_tokens == sum(map(len, contexts)) + sum(len(continuation) - 1 for _, continuation in encoded)


def test_share_contexts_takes_lm_evals_text_flags(tokenizer):
    model = make_model("llama", True, len(tokenizer))
    assert ImplicitLMHarness(model, tokenizer=tokenizer, share_contexts="False", progress=False).share_contexts is False
    with pytest.raises(ValueError, match="share_contexts"):
        ImplicitLMHarness(model, tokenizer=tokenizer, share_contexts="sometimes", progress=False)
