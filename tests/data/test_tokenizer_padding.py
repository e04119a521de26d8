"""The tokenizer the project trains pads batches with the token a trained model's config names,
on the left, where generation continues each row."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from transformers import AutoTokenizer

from implicitlm.data.tokenizer import EOS_TOKEN, load_tokenizer, save_tokenizer, train_tokenizer


def test_a_trained_tokenizer_pads_a_batch_with_the_models_pad_id(tmp_path):
    train_tokenizer(["some text to learn merges from", "and a little more text"], 300, tmp_path / "tok")
    tokenizer = load_tokenizer(tmp_path / "tok")  # as saved, not as trained in memory
    batch = tokenizer(["a", "some text"], padding=True)
    # tasks.lm.mark_end_of_text: a trained model's pad_token_id is the eos id, 0.
    assert tokenizer.pad_token == EOS_TOKEN and tokenizer.pad_token_id == tokenizer.eos_token_id == 0
    short, long = batch["input_ids"]
    assert len(short) == len(long) > 1 and short[0] == 0 and batch["attention_mask"][0] == [0] * (len(short) - 1) + [1]
    saved = json.loads((tmp_path / "tok" / "tokenizer_config.json").read_text())
    assert saved["padding_side"] == "left"  # transformers' own loader reads it too


def test_a_tokenizer_saved_padding_on_the_right_loads_and_is_saved_again_padding_on_the_left(tmp_path):
    """Before: a tokenizer from the hub or an older folder padded on the right, and a batch of
    prompts was continued from its padding; the checkpoints a run saved kept that side."""
    train_tokenizer(["some text to learn merges from", "and a little more text"], 300, tmp_path / "tok")
    config = tmp_path / "tok" / "tokenizer_config.json"
    config.write_text(json.dumps({**json.loads(config.read_text()), "padding_side": "right"}))
    tokenizer = load_tokenizer(tmp_path / "tok")
    assert tokenizer.padding_side == "left"
    assert tokenizer(["a", "some text"], padding=True)["attention_mask"][0][0] == 0
    save_tokenizer(tokenizer, tmp_path / "again")
    assert AutoTokenizer.from_pretrained(tmp_path / "again").padding_side == "left"


def test_a_tokenizer_saved_after_a_local_load_says_nothing_of_where_it_was_loaded(tmp_path):
    """Before: load_tokenizer's local_files_only=True was saved in tokenizer_config.json, so a
    shipped checkpoint refreshed (or a run's checkpoint written) after a load changed its files."""
    train_tokenizer(["some text to learn merges from", "and a little more text"], 300, tmp_path / "tok")
    save_tokenizer(load_tokenizer(tmp_path / "tok"), tmp_path / "again")
    saved = json.loads((tmp_path / "again" / "tokenizer_config.json").read_text())
    assert "local_files_only" not in saved and saved["eos_token"] == EOS_TOKEN


SHIPPED = Path(__file__).parents[2] / "checkpoints" / "wikitext2" / "warm_start" / "implicit"


def test_a_model_folder_s_tokenizer_loads_without_a_word_about_the_model_s_config():
    """Before: ``corpus build --tokenizer CHECKPOINT`` printed transformers' warning that the
    config's model type ``implicit_mamba2`` was not the one it instantiated, where implicitlm's
    models were not imported (a process that loads only the tokenizer)."""
    loading = ("import logging, sys; logging.basicConfig()\nfrom implicitlm.data.tokenizer import load_tokenizer\n"
               "print(len(load_tokenizer(sys.argv[1])))\nassert 'implicitlm.models' not in sys.modules")
    ran = subprocess.run([sys.executable, "-c", loading, str(SHIPPED)], capture_output=True, text=True, timeout=300)
    assert ran.returncode == 0 and int(ran.stdout) > 0 and ran.stderr == "", ran.stderr
