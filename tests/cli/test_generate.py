"""``implicitlm generate`` and ``tasks.generation.generate_text``: the text of the model's own
``generate``, streamed as decoded, seeded sampling, the fixed-point flags, ``--out``, and bad
input in one line."""

from __future__ import annotations

import io
import sys

import pytest
import torch

from implicitlm.cli import main
from implicitlm.data.tokenizer import load_tokenizer
from implicitlm.models import build_model, config_from_options, load_model
from implicitlm.tasks.generation import SEQUENCE_SEPARATOR, Decoding, format_texts, generate_text

from tests.support.lm_run import train_tiny_lm

PROMPT = "def train(model, config"


@pytest.fixture(scope="module")
def run(shards, tmp_path_factory):
    """A two-step LM run: its latest checkpoint carries the shards' tokenizer."""
    return train_tiny_lm(shards, tmp_path_factory.mktemp("generate") / "run", total_steps=2)


def generate(capsys, *argv: str) -> tuple[int, str, list[str]]:
    """Exit code, standard output and the lines of standard error of ``implicitlm generate``."""
    capsys.readouterr()  # what the fixtures printed
    code = main(["generate", *argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err.strip().splitlines()


@pytest.mark.slow
def test_greedy_text_is_the_models_own_generate_and_streams_as_printed(run, capsys):
    model, tokenizer = load_model(run), load_tokenizer(run / "latest")
    ids = tokenizer.encode(PROMPT, return_tensors="pt")
    expected = tokenizer.decode(model.generate(ids, max_new_tokens=12, do_sample=False)[0, ids.shape[1]:],
                                skip_special_tokens=True)
    pieces: list[str] = []
    texts = generate_text(run, PROMPT, Decoding(max_new_tokens=12, greedy=True), on_text=pieces.append)
    assert texts == [expected] and len(expected) > 0
    assert len(pieces) > 2 and "".join(pieces) == format_texts(texts) == expected + "\n"  # streamed piece by piece
    code, out, _ = generate(capsys, str(run), "--prompt", PROMPT, "--max-new-tokens", "12", "--greedy")
    assert code == 0 and out == PROMPT + expected + "\n"  # the prompt echoed, then its continuation


@pytest.mark.slow
def test_seeded_sampling_repeats_and_leaves_the_callers_random_state_alone(run):
    model = load_model(run)
    decoding = Decoding(max_new_tokens=16, seed=3, num_return_sequences=2, temperature=1.5)
    torch.manual_seed(11)
    before = torch.get_rng_state()
    first = generate_text(model, PROMPT, decoding)
    assert torch.equal(torch.get_rng_state(), before)
    assert generate_text(model, PROMPT, decoding) == first and len(first) == 2 and first[0] != first[1]
    assert generate_text(model, PROMPT, Decoding(max_new_tokens=16, seed=4, temperature=1.5)) != first[:1]


@pytest.mark.slow
def test_the_fixed_point_flags_reach_the_model(run, capsys, caplog):
    model, configured = load_model(run), load_model(run)
    own = model.solver.options
    decoding = Decoding(max_new_tokens=4, greedy=True)
    texts = generate_text(model, PROMPT, decoding, fixed_point={"max_iter": 2, "tol": 0.5})
    # The settings are the generation's, not the caller's model's (before: left set on it).
    assert model.solver.options == own
    configured.set_fixed_point_options(max_iter=2, tol=0.5)
    assert generate_text(configured, PROMPT, decoding) == texts
    assert model.generation_convergence == configured.generation_convergence
    assert model.generation_convergence["fp_fixed_points"] == 4  # the prefill and three decoded tokens
    caplog.clear()
    code, _, err = generate(capsys, str(run), "--prompt", PROMPT, "--max-new-tokens", "4", "--max-iter", "1",
                            "--tol", "1e-6", "--solver", "anderson", "--chunk-length", "0")
    assert code == 0 and "generate: 4 of 4 fixed points (100.00%) stopped above the tolerance: 4 at the budget of passes" \
        in caplog.text
    # What the fixed points came to, printed as every evaluation prints it (before: nothing).
    assert err[-1] == ("fixed points: 4; not converged 100.00% (4 at the budget, 0 diverged), 0 retried (0.0 retry "
                       "passes per fixed point); 0 non-finite")
    code, _, err = generate(capsys, str(run), "--prompt", PROMPT, "--max-new-tokens", "4", "--passes", "2")
    assert code == 0 and err[-1].startswith("fixed points: 4; 4 of exactly 2 passes, last residual mean ")


@pytest.mark.slow
def test_prompt_from_a_file_or_stdin_and_text_to_a_new_file(run, capsys, tmp_path, monkeypatch):
    (tmp_path / "prompt.txt").write_text(PROMPT + "\n")
    common = ["--max-new-tokens", "6", "--seed", "1", "--num-return-sequences", "2"]
    code, printed, _ = generate(capsys, str(run), "--prompt", PROMPT, *common)
    assert code == 0 and printed.count(SEQUENCE_SEPARATOR) == 1
    code, from_file, _ = generate(capsys, str(run), "--prompt-file", str(tmp_path / "prompt.txt"), *common,
                                  "--out", str(tmp_path / "text.txt"))
    assert code == 0 and from_file == printed and (tmp_path / "text.txt").read_text() == printed
    monkeypatch.setattr(sys, "stdin", io.StringIO(PROMPT))
    assert generate(capsys, str(run), "--prompt-file", "-", *common)[:2] == (0, printed)
    # An existing --out is refused before anything is generated.
    code, out, err = generate(capsys, str(run), "--prompt", PROMPT, "--out", str(tmp_path / "text.txt"))
    assert code == 2 and out == "" and len(err) == 1 and "text.txt: exists" in err[0]


def test_the_command_prints_and_writes_the_prompt_then_each_continuation(run, capsys, tmp_path):
    options = ["--max-new-tokens", "3", "--seed", "2", "--num-return-sequences", "2"]
    code, out, _ = generate(capsys, str(run), "--prompt", PROMPT, *options, "--out", str(tmp_path / "text.txt"))
    texts = generate_text(run, PROMPT, Decoding(max_new_tokens=3, seed=2, num_return_sequences=2))
    assert code == 0 and out == format_texts([PROMPT + text for text in texts]) == (tmp_path / "text.txt").read_text()
    assert out.startswith(PROMPT) and f"{SEQUENCE_SEPARATOR}{PROMPT}" in out


@pytest.mark.parametrize("device", ["meta", "mps", "cuda:99"])
def test_a_device_this_machine_cannot_run_on_is_one_line(run, capsys, device):
    try:
        code = main(["generate", str(run), "--prompt", PROMPT, "--device", device])
    except SystemExit as parser_exit:  # a name of no device models run on: the parser's refusal
        code = parser_exit.code
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "--device" in err[0] and ("cpu, cuda or cuda:N" in err[0] or "this machine" in err[0]), err


def test_a_prompt_file_that_never_ends_or_is_too_long_is_one_line(run, capsys, tmp_path):
    from implicitlm.tasks.generation import MAX_PROMPT_LENGTH

    with open(tmp_path / "long.txt", "wb") as long:
        long.truncate(MAX_PROMPT_LENGTH + 1)  # sparse: no disk used
    for source, message in [("/dev/zero", "/dev/zero: expected a prompt file, got a device, FIFO or socket"),
                            (str(tmp_path / "long.txt"), "long.txt: a prompt of more than 16 MiB")]:
        code, out, err = generate(capsys, str(run), "--prompt-file", source)
        assert code == 2 and out == "" and len(err) == 1 and message in err[0], err


def test_a_model_without_a_tokenizer_is_refused_in_one_line_unless_given_one(run, tmp_path, capsys):
    bare = tmp_path / "words_model"
    build_model(config_from_options(dict(architecture="mamba2", vocab_size=300, hidden_size=16, num_hidden_layers=1,
                                         state_size=8, head_dim=8))).save_pretrained(bare)
    code, out, err = generate(capsys, str(bare), "--prompt", PROMPT)
    assert code == 2 and out == "" and len(err) == 1
    assert "no tokenizer saved with the model; pass --tokenizer FOLDER_OR_HUB_NAME" in err[0]
    code, out, _ = generate(capsys, str(bare), "--prompt", PROMPT, "--tokenizer", str(run / "latest"),
                            "--max-new-tokens", "3", "--greedy")
    assert code == 0 and out.endswith("\n")


@pytest.mark.parametrize("options, message", [
    (["--prompt", ""], "the prompt is empty"),
    (["--prompt", "x", "--greedy", "--temperature", "0.5"], "temperature applies to sampling only"),
    (["--prompt", "x", "--greedy", "--num-return-sequences", "2"], "num_return_sequences > 1 needs sampling"),
    (["--prompt", "x", "--top-p", "1.5"], "top_p must be a number in (0, 1]"),
    (["--prompt", "x", "--max-new-tokens", "0"], "expected a positive integer"),
    (["--prompt", "x", "--temperature", "nan"], "expected a positive number"),
    # before: a torch.multinomial RuntimeError (the logits / 1e-300 overflowed)
    (["--prompt", "x", "--temperature", "1e-300"], "temperature must be a number >= 1e-30 (a lower one overflows"),
    (["--prompt", "x", "--max-iter", "0"], "expected a budget of 1 to"),
    (["--prompt", "x", "--device", "nowhere"], "device must be auto, cpu, cuda"),
    (["--prompt", "x", "--dtype", "int8"], "dtype must be one of"),
    (["--prompt", "x", "--solver", "newton"], "solver"),
    (["--prompt-file", "no_such_prompt.txt"], "no_such_prompt.txt: No such file"),
    (["--prompt", "x", "--prompt-file", "-"], "not allowed with argument"),
    ([], "one of the arguments --prompt --prompt-file is required"),
], ids=["empty", "greedy-temperature", "greedy-sequences", "top-p", "max-new", "temperature-nan", "temperature-overflow",
        "max-iter",
        "device", "dtype", "solver", "prompt-file", "two-prompts", "no-prompt"])
def test_bad_input_is_one_line(run, capsys, options, message, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    capsys.readouterr()  # what the fixtures printed
    try:
        code = main(["generate", str(run), *options])
    except SystemExit as parser_exit:  # the parser's refusals
        code = parser_exit.code
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and message in err[0], err


def test_bad_decoding_options_are_refused_in_the_library_too():
    with pytest.raises(ValueError, match="top_k must be a positive integer"):
        Decoding(top_k=0)
    with pytest.raises(ValueError, match="seed must be an integer >= 0"):
        Decoding(seed=-1)
    with pytest.raises(ValueError, match="temperature must be a number >= 1e-30"):
        Decoding(temperature=1e-300)



def test_more_sequences_than_the_time_limit_allows_are_refused_before_the_first(run, capsys):
    # before: decoded one sequence after another until killed, the prompt printed first
    code, out, err = generate(capsys, str(run), "--prompt", "x", "--num-return-sequences", str(10**9))
    assert code == 2 and out == "" and len(err) == 1, err
    assert err[0].startswith("implicitlm: error: 1,000,000,000 sequences would take at least")
    assert "past the limit of 1.0 days" in err[0] and "--num-return-sequences" in err[0]


def test_decoding_from_graphs_is_asked_for_by_default_and_eager_turns_it_off(run, capsys, monkeypatch):
    """On a CPU the graphs' buffers run eagerly when asked for (``cuda_graphs=True``) and give
    the text of plain decoding; the command asks for the device's default (graphs on CUDA) unless
    ``--eager``."""
    from implicitlm.models import ImplicitCausalLM
    from implicitlm.tasks import generation

    entered, asked = [], []
    original_block, original_text = ImplicitCausalLM.decoding_graphs, generation.generate_text
    monkeypatch.setattr(ImplicitCausalLM, "decoding_graphs",
                        lambda self, capture=None: entered.append(capture) or original_block(self, capture))
    monkeypatch.setattr(generation, "generate_text",
                        lambda *args, **kwargs: asked.append(kwargs["cuda_graphs"]) or original_text(*args, **kwargs))
    decoding, budget = Decoding(max_new_tokens=6, greedy=True), {"passes": 2}
    graphed = generate_text(run, PROMPT, decoding, fixed_point=budget, cuda_graphs=True)
    assert entered == [False]  # the block, its buffers run eagerly on a CPU
    assert generate_text(run, PROMPT, decoding, fixed_point=budget) == graphed and entered == [False]
    for flags, expected in (((), None), (("--eager",), False)):
        code, out, _ = generate(capsys, str(run), "--prompt", PROMPT, "--max-new-tokens", "6", "--greedy",
                                "--passes", "2", *flags)
        assert code == 0 and out == PROMPT + graphed[0] + "\n" and asked[-1] is expected
