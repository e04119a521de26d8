"""The tokenizer the project trains pads batches with the token a trained model's config names."""

from __future__ import annotations

from implicitlm.data.tokenizer import EOS_TOKEN, load_tokenizer, train_tokenizer


def test_a_trained_tokenizer_pads_a_batch_with_the_models_pad_id(tmp_path):
    train_tokenizer(["some text to learn merges from", "and a little more text"], 300, tmp_path / "tok")
    tokenizer = load_tokenizer(tmp_path / "tok")  # as saved, not as trained in memory
    batch = tokenizer(["a", "some text"], padding=True)
    # tasks.lm.mark_end_of_text: a trained model's pad_token_id is the eos id, 0.
    assert tokenizer.pad_token == EOS_TOKEN and tokenizer.pad_token_id == tokenizer.eos_token_id == 0
    short, long = batch["input_ids"]
    assert len(short) == len(long) > 1 and short[-1] == 0 and batch["attention_mask"][0][-1] == 0
