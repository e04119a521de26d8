"""A tokenizer (or model) name is looked up as a folder first, and sent to the hub only when it
can be a hub name and the hub can be reached: otherwise one line at once, not a minute of retries."""

from __future__ import annotations

import time

import pytest

from implicitlm.core.errors import DataError
from implicitlm.core.hub import check_local_or_hub, hub_unreachable


@pytest.mark.parametrize("name", ["./nonexist", "/no/such/folder", "a/b/c", "owner/", "../tok", "name with space", ""])
def test_a_name_that_is_no_folder_and_no_hub_name_is_refused(name):
    with pytest.raises(DataError, match="no such tokenizer folder, and not a hub name"):
        check_local_or_hub(name, "tokenizer")


def test_a_folder_or_a_hub_name_passes_and_a_file_is_refused(tmp_path):
    for name in [tmp_path, "gpt2", "EleutherAI/gpt-neox-20b"]:
        check_local_or_hub(name, "tokenizer")
    (tmp_path / "tokenizer.json").write_text("{}")
    with pytest.raises(DataError, match="expected a tokenizer folder or hub name, got a file"):
        check_local_or_hub(tmp_path / "tokenizer.json", "tokenizer")


def test_the_hub_is_not_asked_offline_or_unreachable(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert hub_unreachable("https://huggingface.co") == "HF_HUB_OFFLINE is set"
    monkeypatch.delenv("HF_HUB_OFFLINE")
    assert "cannot be reached" in hub_unreachable("https://no-such-host.invalid")
    monkeypatch.setenv("https_proxy", "http://proxy.invalid:3128")
    assert hub_unreachable("https://huggingface.co").startswith("proxy.invalid cannot be reached")


def test_a_hub_name_not_cached_and_unreachable_is_refused_at_once(monkeypatch):
    from implicitlm.data import tokenizer

    monkeypatch.setattr(tokenizer, "HF_ENDPOINT", "https://no-such-host.invalid")
    started = time.monotonic()
    with pytest.raises(DataError, match="owner/nonexist: no such tokenizer folder, nor in the hub's cache; no-such-host"):
        tokenizer.load_tokenizer("owner/nonexist")
    assert time.monotonic() - started < 10
