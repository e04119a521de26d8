"""Word-problem data: the authors' S5 training set on disk, and labels derived by the loader.

The authors train on 512 x 16384 = 8,388,608 S5 words of 256 tokens (2.15G tokens); the
targets are to generate that set in under 10 minutes and store it in at most 2.2 GB.
Stored targets (the baseline) double the bytes; derived targets keep only the inputs,
and the loader then computes each batch's prefix products, which must stay far ahead of
what a training step consumes. Both variants are measured in the same run.
"""

from __future__ import annotations

import shutil
import tempfile
import time
from pathlib import Path

import torch

from common import Table, median_seconds, ratio, synchronize, verdict
from implicitlm.presets import load_preset
from implicitlm.data.groups import get_group
from implicitlm.data.word_storage import load_words, sidecar_path, write_generated_words
from implicitlm.tasks.words import WordBatches
from implicitlm.train.runs import word_model, word_train_config

GROUP, LENGTH, BATCH = "S5", 256, 128
AUTHORS_WORDS = 512 * 16384
AUTHORS_TOKENS = AUTHORS_WORDS * LENGTH
TARGET_SECONDS, TARGET_BYTES = 600.0, 2.2e9
FREE_BYTES_NEEDED = 6e9  # the stored set (4.3 GB) plus room; the variants are written one at a time
LOADER_MARGIN = 10.0  # loader tokens/s over training tokens/s that counts as "keeps training fed"
STORAGES = ("stored", "derived")


def run(quick: bool, device: str = "cpu") -> Table:
    words = 32768 if quick else 262144
    table = Table(
        "Word-problem data generation (S5, length 256)",
        ["quantity", "stored targets (baseline)", "derived targets", "derived / stored", "target"],
    )
    with tempfile.TemporaryDirectory(prefix="implicitlm-bench-") as directory:
        directory = Path(directory)
        rates, sizes = {}, {}
        for storage in STORAGES:
            rates[storage], sizes[storage] = _generation(directory / f"{storage}.npy", words, storage, 3 if quick else 5)
        loader = {s: _loader_tokens_per_s(directory / f"{s}.npy", device, 30 if quick else 200) for s in STORAGES}
        full = _authors_set_actual(directory, quick, table.notes)
    table.add(f"generation tokens/s ({words:,} words to disk)", _si(rates["stored"]), _si(rates["derived"]),
              ratio(rates["derived"], rates["stored"]), "-")
    table.add("bytes on disk per token", f"{sizes['stored']:.3f}", f"{sizes['derived']:.3f}",
              ratio(sizes["derived"], sizes["stored"]), "-")
    seconds = {s: full[s][0] for s in STORAGES} if full else {s: AUTHORS_TOKENS / rates[s] for s in STORAGES}
    size = {s: full[s][1] for s in STORAGES} if full else {s: AUTHORS_TOKENS * sizes[s] for s in STORAGES}
    how = "actual" if full else "projected"
    table.add(f"authors' set time ({how})", _duration(seconds["stored"]), _duration(seconds["derived"]),
              ratio(seconds["derived"], seconds["stored"]), _verdicts(seconds, TARGET_SECONDS, "<= 10 min"))
    table.add("authors' set size", f"{size['stored'] / 1e9:.2f} GB", f"{size['derived'] / 1e9:.2f} GB",
              ratio(size["derived"], size["stored"]), _verdicts(size, TARGET_BYTES, "<= 2.2 GB"))
    table.add(f"loader tokens/s ({BATCH} x {LENGTH} sorted random rows -> int64 on {device})", _si(loader["stored"]),
              _si(loader["derived"]), ratio(loader["derived"], loader["stored"]), "-")
    training, batch = _training_tokens_per_s(quick, device)
    table.add(f"loader / training tokens/s (training {_si(training)})", f"{loader['stored'] / training:,.0f}x",
              f"{loader['derived'] / training:,.0f}x", "-",
              f">= {LOADER_MARGIN:.0f}x: {verdict(loader['derived'] / training >= LOADER_MARGIN)}")
    table.notes += [
        f"Time and size are projected linearly from the {words:,}-word files" if not full else
        "Time and size of the authors' set are from generating all of it (then deleted)",
        "generation time includes the fsync of the file; the loader reads files still in the page cache",
        f"training: one step of the implicit Mamba2 of preset words_s5 (bounded phase 4+1, forward + backward "
        f"+ AdamW{', bf16 autocast' if device == 'cuda' else ''}) on {batch} x {LENGTH} tokens, {device}"
        + (f"; quick mode times batch {batch} and takes its tokens/s for batch {BATCH}" if batch != BATCH else ""),
    ]
    return table


def _generation(path: Path, words: int, storage: str, repeats: int) -> tuple[float, float]:
    """(tokens/s, bytes on disk per token) of writing ``words`` words with ``storage`` targets."""
    seconds = median_seconds(
        lambda: write_generated_words(path, GROUP, LENGTH, words, seed=0, targets=storage, overwrite=True), repeats
    )
    return words * LENGTH / seconds, _file_bytes(path) / (words * LENGTH)


def _loader_tokens_per_s(path: Path, device: str, repeats: int) -> float:
    """Tokens/s of the trainer's own file batches (copies to ``device`` included)."""
    words = load_words(path)
    batches = WordBatches(words.group, LENGTH, BATCH, data=words)

    def next_batch() -> None:
        for tensor in next(batches):
            tensor.to(device)
        synchronize(device)

    return BATCH * LENGTH / median_seconds(next_batch, repeats, warmup=3)


def _authors_set_actual(directory: Path, quick: bool, notes: list[str]) -> dict[str, tuple[float, int]] | None:
    """(seconds, bytes) of the whole set with each storage, or None where it is projected."""
    if quick:
        return None
    free = shutil.disk_usage(directory).free
    if free < FREE_BYTES_NEEDED:
        notes.append(f"only {free / 1e9:.1f} GB free in {directory.parent}: the authors' set is projected")
        return None
    measured = {}
    for storage in STORAGES:
        path = directory / f"authors-{storage}.npy"
        start = time.perf_counter()
        write_generated_words(path, GROUP, LENGTH, AUTHORS_WORDS, seed=0, targets=storage)
        measured[storage] = time.perf_counter() - start, _file_bytes(path)
        path.unlink()
        sidecar_path(path).unlink()
    return measured


def _training_tokens_per_s(quick: bool, device: str) -> tuple[float, int]:
    """Tokens/s of one training step of the words_s5 implicit model, and the batch timed;
    on CUDA in bf16 autocast, as the trainer's default precision runs it there."""
    preset = load_preset("words_s5")
    train = word_train_config(preset, "implicit")
    model = word_model(preset, "implicit", train).to(device)
    bounded = next(phase for phase in train.curriculum(True).phases if phase.name == "bounded")
    optimizer = torch.optim.AdamW(model.parameters(), lr=train.lr)
    batch = 32 if quick and device == "cpu" else BATCH
    vocab = get_group(train.group).order
    input_ids, labels = (torch.randint(0, vocab, (batch, LENGTH), device=device) for _ in range(2))
    model.train()

    def step() -> None:
        with torch.autocast(device_type=device, dtype=torch.bfloat16, enabled=device == "cuda"):
            loss = model(input_ids, labels=labels, fixed_point=bounded.fixed_point).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        synchronize(device)

    return batch * LENGTH / median_seconds(step, 2 if quick else 3), batch


def _file_bytes(path: Path) -> int:
    return path.stat().st_size + sidecar_path(path).stat().st_size


def _verdicts(values: dict[str, float], limit: float, target: str) -> str:
    return f"{target}: derived {verdict(values['derived'] <= limit)}, stored {verdict(values['stored'] <= limit)}"


def _si(tokens_per_s: float) -> str:
    for scale, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if tokens_per_s >= scale:
            return f"{tokens_per_s / scale:.1f}{suffix}"
    return f"{tokens_per_s:.0f}"


def _duration(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.1f} min"
