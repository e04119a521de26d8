"""Language modelling as a task: training batches of token windows, held-out loss and
perplexity of a causal language model on a shard split, overall and by context length, and the
``lm_length`` record; the split's leading windows for convergence."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Iterable, Iterator

import numpy as np
import torch
from tqdm.auto import tqdm

from ..core.errors import DataError, OptionError
from ..core.run_folder import TRAINER_META, model_folder, read_trainer_meta
from ..data.shards import TokenShards, tokenizer_digest
from ..data.token_windows import TokenSampler, evaluation_windows
from ..data.tokenizer import load_tokenizer
from ..deq import warn_not_converged
from ..models.loss import token_cross_entropy
from . import TASKS
from .base import Figure, FolderTask, TaskRecord, forward_seconds, missed_cell, missed_header, retries_cell

# Tokens a convergence report counts unless --max-tokens says otherwise.
CONVERGENCE_TOKENS = 4096
# What a folder that holds a saved tokenizer (a checkpoint's copy) holds.
TOKENIZER_CONFIG = "tokenizer_config.json"


@torch.no_grad()
def perplexity(
    model,
    windows: Iterable[torch.Tensor],
    mode: str = "simultaneous",
    max_iter: int | None = None,
    tol: float | None = None,
    warn: bool = True,
    fixed_point: dict[str, Any] | None = None,
) -> dict[str, float]:
    """Token-weighted mean loss and its exponential over ``windows`` ((b, L + 1) token
    batches: inputs are the first L tokens, each predicts the next), in evaluation mode
    with the evaluation budget unless ``max_iter`` / ``tol`` say otherwise, every forward given
    ``fixed_point`` (``forward``'s argument). Implicit
    models also report the mean passes used (per sequence in simultaneous
    mode, per token in sequential mode) and how many fixed points stopped above the
    tolerance, and why; ``warn``: say so in one logged line when any did."""
    was_training = model.training
    model.eval()
    total_loss, total_tokens, passes = 0.0, 0, []
    try:
        with model.track_convergence() as tally:
            for window in windows:
                window = window.to(model.device)
                output = model(window[:, :-1], mode=mode, max_iter=max_iter, tol=tol, fixed_point=fixed_point)
                targets = window[:, 1:]
                total_loss += token_cross_entropy(output.logits, targets, "aligned").item() * targets.numel()
                total_tokens += targets.numel()
                if output.fixed_point is not None:
                    passes.append(output.fixed_point.passes.float().flatten().cpu())
    finally:
        model.train(was_training)
    if total_tokens == 0:
        raise DataError("no held-out tokens to evaluate")
    loss = total_loss / total_tokens
    result = {"loss": loss, "perplexity": math.exp(loss), "tokens": total_tokens}
    if passes:
        result["fp_passes_mean"] = torch.cat(passes).mean().item()
        result.update(tally.as_dict())
        if warn:
            warn_not_converged(tally, f"perplexity ({mode} mode)")
    return result


def perplexity_by_length(
    model,
    shards: TokenShards,
    lengths: Iterable[int],
    batch_size: int,
    max_tokens: int | None = None,
    progress: bool = False,
    **budget: Any,
) -> list[dict[str, Any]]:
    """``perplexity_at_length`` at each length."""
    return [
        perplexity_at_length(model, shards, length, batch_size, max_tokens, **budget)
        for length in tqdm(list(lengths), desc="eval", disable=not progress)
    ]


def perplexity_at_length(
    model, shards: TokenShards, length: int, batch_size: int, max_tokens: int | None = None, **budget: Any
) -> dict[str, Any]:
    """``perplexity`` with contexts of ``length`` tokens, on the split's leading windows, as a
    row with its ``length``.

    ``max_tokens`` caps the tokens scored; every length then reads (about) the same leading
    stretch of the split, so the lengths differ in context, not in text.
    """
    windows = evaluation_windows(shards, length, batch_size)
    if max_tokens is not None:
        windows = _leading_windows(windows, max(1, max_tokens // length))
    return {"length": length, **perplexity(model, windows, **budget)}


def _leading_windows(batches: Iterator[torch.Tensor], count: int) -> Iterator[torch.Tensor]:
    for batch in batches:
        if count <= 0:
            return
        yield batch[:count]
        count -= len(batch)


class LMTask(FolderTask):
    """Language modelling on the ``split`` of a shard folder (``data``), with contexts of
    ``lengths`` tokens (default: the training context, or ``multiples`` of it), scoring at
    most ``max_tokens`` per length (default: the whole split); rows are ``perplexity``'s."""

    entry = TASKS["lm"]
    FOLDER = "token shards"
    OPTIONS = ("data", "split", "lengths", "multiples", "batch_size", "max_tokens")
    quality = "perplexity"
    quality_scale = "log"

    def __init__(
        self, checkpoint: str | Path, *, data: Any = None, split: str | None = None, lengths: list[int] | None = None,
        multiples: list[int] | None = None, batch_size: int | None = None, max_tokens: int | None = None,
    ):
        super().__init__(checkpoint, data, split, batch_size)
        self.lengths, self.multiples, self.max_tokens = lengths, multiples, max_tokens
        self.train_length: int | None = None
        self.shards: TokenShards | None = None

    def resolve(self) -> None:
        self.train_length = self.training().get("sequence_length")
        if not self.lengths:
            if self.train_length is None:
                raise OptionError("the checkpoint does not record its training context; give lengths", arguments=("lengths",))
            self.lengths = [self.train_length * m for m in self.multiples or [1]]
        self.shards = TokenShards(self.data, self.split, verify=True)
        check_tokens_of_model(self.shards, self.model)

    def evaluation_sets(self) -> list[int]:
        return list(self.lengths)

    def evaluate(self, model, test_set, mode="simultaneous", fixed_point=None, warn=True, progress=False):
        return perplexity_at_length(model, self.shards, test_set, self.batch_size, self.max_tokens, mode=mode, warn=warn,
                                    fixed_point=self.settings(fixed_point))

    def one_pass_seconds(self, model, test_set, mode):
        # The windows perplexity_at_length reads: the split's whole ones, at most max_tokens' worth.
        windows = len(self.shards) // (test_set + 1)
        if self.max_tokens is not None:
            windows = min(windows, max(1, self.max_tokens // test_set))
        return forward_seconds(model, mode, min(self.batch_size, windows), test_set, -(-windows // self.batch_size),
                               self.fixed_point)

    def format_rows(self, rows: list[dict[str, Any]]) -> str:
        # "passes" per fixed point; "retries": of those, the passes retries spent.
        lines = [f"{'length':>8}{'loss':>9}{'perplexity':>12}{'tokens':>11}{'passes':>9}{'retries':>9}{missed_header(rows)}"]
        for row in rows:
            passes = f"{row['fp_passes_mean']:>9.1f}" if "fp_passes_mean" in row else f"{'-':>9}"
            lines.append(f"{row['length']:>8}{row['loss']:>9.4f}{row['perplexity']:>12.2f}{row['tokens']:>11,}{passes}"
                         f"{retries_cell(row)}{missed_cell(row)}")
        return "\n".join(lines)

    def length_record(self, rows, mode) -> TaskRecord:
        """``lm_length``: perplexity by context length, the training context marked."""
        metrics = {f"perplexity@{row['length']}": row["perplexity"] for row in rows}
        curve = {"label": f"{mode} mode", "x": [r["length"] for r in rows], "y": [r["perplexity"] for r in rows]}
        axes = {"x": "context length (tokens)", "y": "perplexity", "xscale": "log2", "yscale": "log"}
        marks = {"training context": self.train_length} if self.train_length else {}
        figure = Figure("curves", "perplexity by context length", [curve], axes, vertical=marks)
        details = {"mode": mode, "train_length": self.train_length, "rows": rows}
        return TaskRecord(self.experiment, metrics, figure, figure.series, axes, details)

    def convergence_inputs(self) -> list[tuple[np.ndarray, None]]:
        """The split's leading windows of the one context length, as many as --max-tokens fill."""
        if len(self.lengths) != 1:
            raise OptionError("convergence statistics take one context length")
        length = self.lengths[0]
        max_tokens = CONVERGENCE_TOKENS if self.max_tokens is None else self.max_tokens
        windows = next(evaluation_windows(self.shards, length, max(1, max_tokens // length)))
        return [(windows[:, :-1].numpy(), None)]


class TokenBatches:
    """Language modelling: windows of ``sequence_length + 1`` tokens from the training shards,
    the first ``sequence_length`` as inputs, the last ``sequence_length`` as labels."""

    # The LM defaults are the paper's GPU settings; on a CPU a step of them takes minutes.
    PAPER_SCALE_DEFAULTS = ("batch_tokens", "sequence_length")
    # What the training data is, as a message asking for it names it.
    DATA_FORM = "FOLDER"

    def __init__(
        self, shards: TokenShards, sequence_length: int, batch_size: int, seed: int = 0, rank: int = 0, world_size: int = 1,
    ):
        self.shards = shards
        # A local tokenizer folder may not travel with the checkpoints, so they carry a copy;
        # a hub name stays findable.
        self.tokenizer = load_tokenizer(shards.tokenizer) if Path(shards.tokenizer).is_dir() else None
        if self.tokenizer is not None:
            _check_tokenizer_unchanged(shards, self.tokenizer)
        self.sampler = TokenSampler(shards, sequence_length, batch_size, seed=seed, rank=rank, world_size=world_size)

    @classmethod
    def for_training(cls, config, data: str | Path | None, rank: int = 0, world_size: int = 1) -> TokenBatches:
        """The batches of a run with the training options ``config`` on ``data``, the folder of
        its token shards."""
        if data is None:
            raise OptionError("language-model training needs the folder of its token shards")
        shards = TokenShards(data, "train", verify_on_read=True)
        return cls(shards, config.sequence_length, config.batch_size, config.seed, rank=rank, world_size=world_size)

    @classmethod
    def from_path(cls, config, data: str | Path | None) -> TokenBatches:
        """``for_training``: the shards are the folder ``data`` names."""
        return cls.for_training(config, data)

    def held_out(self) -> TokenShards:
        """The test split of the training shards' folder, its files checked."""
        return TokenShards(self.shards.path, "test", verify=True)

    def longer_inputs(self, multiple: int, count: int) -> None:
        """None: a language model's scores are read at its training context."""
        return None

    def step_metrics(self, loss: float, logits: torch.Tensor, labels: torch.Tensor, mean_over_processes) -> dict[str, float]:
        """The loss and its perplexity (capped where the loss is huge, early in a run)."""
        return {"loss": loss, "ppl": math.exp(min(loss, 50.0))}

    def __iter__(self) -> TokenBatches:
        return self

    def __next__(self) -> tuple[torch.Tensor, torch.Tensor]:
        window = next(self.sampler)
        return window[:, :-1], window[:, 1:]

    def state_dict(self) -> dict[str, Any]:
        return self.sampler.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.sampler.load_state_dict(state)

    def description(self) -> dict[str, Any]:
        """What identifies the training tokens without reading them: their count and the
        digest of the shards' checksums, and the tokenizer that wrote them."""
        return {"tokens": len(self.shards), "shards_sha256": self.shards.sha256,
                "tokenizer_sha256": self.shards.tokenizer_sha256}

    def data_named(self, description: dict[str, Any]) -> str:
        """The training shards a ``description`` identifies, in words; these shards' folder
        named where they are the ones described."""
        where = f"{self.shards.path}: " if description == self.description() else ""
        tokens, digest = description.get("tokens"), str(description.get("shards_sha256"))[:12]
        return f"token shards ({where}{tokens} tokens, sha256 {digest})"

    def prepare(self, model) -> None:
        """The shards' tokens must be the model's (``check_tokens_of_model``); their eos id goes
        into its configs."""
        check_tokens_of_model(self.shards, model)
        mark_end_of_text(model, self.shards.eos_token_id)


def _check_tokenizer_unchanged(shards: TokenShards, tokenizer) -> None:
    """The tokenizer folder the shards name must hold the tokenizer that wrote them, since
    the checkpoints carry a copy of it."""
    now = tokenizer_digest(tokenizer)
    if now is not None and shards.tokenizer_sha256 not in (None, now):
        raise OptionError(
            f"{shards.path}: written by another tokenizer than the one now in {shards.tokenizer} "
            f"(sha256 {shards.tokenizer_sha256[:12]}, now {now[:12]}): the checkpoints would carry the wrong one"
        )


def check_tokens_of_model(shards: TokenShards, model) -> None:
    """Refuse, in one line, shards whose token ids are not the model's: ids past its
    vocabulary, or, where the shards record their tokenizer's digest and the model's
    checkpoint carries its tokenizer, the tokens of another tokenizer than that one."""
    if shards.vocab_size > model.config.vocab_size:
        raise OptionError(
            f"{shards.path}: the shards' tokenizer ({shards.tokenizer}) has {shards.vocab_size} tokens, "
            f"more than the model's vocab_size {model.config.vocab_size}"
        )
    # A model read from a folder (a checkpoint) is named by it; a model built here, by nothing.
    if model.name_or_path:
        check_shards_tokenizer(shards, Path(model.name_or_path))


def check_shards_tokenizer(shards: TokenShards, checkpoint: Path) -> None:
    """Refuse, in one line, shards written by another tokenizer than the one saved beside
    ``checkpoint``, where the shards record their tokenizer's digest and the checkpoint has one."""
    if shards.tokenizer_sha256 is None or not (checkpoint / TOKENIZER_CONFIG).is_file():
        return
    trained = tokenizer_digest(load_tokenizer(checkpoint))
    if trained is not None and trained != shards.tokenizer_sha256:
        raise OptionError(
            f"{shards.path}: tokens of the tokenizer {shards.tokenizer} (sha256 {shards.tokenizer_sha256[:12]}), "
            f"but {checkpoint} was trained with another (sha256 {trained[:12]}, saved beside it); "
            f"give shards written with that one"
        )


def model_tokenizer(model, tokenizer: Any = None, option: str = "--tokenizer "):
    """``tokenizer`` (loaded if it is a name or folder); by default the one saved in the folder
    the model was loaded from (its ``name_or_path``), as the trainer's LM checkpoints have it.
    A model without one (a word-problem model) is refused in one line that says how to give
    one: ``option``, the caller's spelling (a flag, or lm-eval's ``tokenizer=``). So is a
    tokenizer the model cannot serve (``check_tokenizer_of_model``)."""
    folder = Path(model.name_or_path) if model.name_or_path else None
    saved = folder if folder is not None and (folder / TOKENIZER_CONFIG).is_file() else None
    if tokenizer is None:
        if saved is None:
            raise OptionError(f"{folder or 'the model'}: no tokenizer saved with the model; "
                              f"pass {option}FOLDER_OR_HUB_NAME")
        tokenizer = saved
    loaded = load_tokenizer(tokenizer) if isinstance(tokenizer, (str, Path)) else tokenizer
    check_tokenizer_of_model(model, loaded, folder, compare_saved=tokenizer is not saved)
    return loaded


def check_tokenizer_of_model(model, tokenizer, folder: Path | None, compare_saved: bool) -> None:
    """Refuse, in one line, a tokenizer whose ids the model has no embedding for, or another
    one than the model was trained with: the one its run recorded (trainer.json's data), else,
    with ``compare_saved``, the one saved beside it in ``folder``. Either would score and write
    garbage without an error."""
    name = getattr(tokenizer, "name_or_path", None) or "the tokenizer"
    if len(tokenizer) > model.config.vocab_size:
        raise OptionError(
            f"{name}: a tokenizer of {len(tokenizer)} tokens, more than the model's vocab_size {model.config.vocab_size}"
        )
    if folder is None:
        return
    checkpoint = model_folder(folder)
    data = read_trainer_meta(checkpoint).get("data") if (checkpoint / TRAINER_META).is_file() else None
    expected = data.get("tokenizer_sha256") if isinstance(data, dict) else None
    if expected is None and compare_saved and (folder / TOKENIZER_CONFIG).is_file():
        expected = tokenizer_digest(load_tokenizer(folder))
    now = tokenizer_digest(tokenizer)
    if None not in (expected, now) and now != expected:
        raise OptionError(
            f"{name}: another tokenizer (sha256 {now[:12]}) than the one {folder} was trained with "
            f"(sha256 {expected[:12]}): its ids are other tokens"
        )


def mark_end_of_text(model, eos_token_id: int) -> None:
    """The shards' eos id in the model's config and generation config, so that a trained
    checkpoint's ``generate()`` stops at the end of a text and pads finished rows with it
    (the shards have no padding token of their own)."""
    for config in (model.config, model.generation_config):
        config.eos_token_id = eos_token_id
        config.pad_token_id = eos_token_id
