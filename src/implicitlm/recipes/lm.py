"""The CPU language-model demo: explicit vs implicit Mamba2 on Python's own source code.

The corpus is the standard library's ``.py`` files, which every machine with Python has.
A byte-level BPE tokenizer is trained on it, the files are tokenized into shards with a
held-out split, and an explicit and an implicit model of about the same size are trained
on the same tokens; both are scored by held-out perplexity.
"""

from __future__ import annotations

import sysconfig
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from ..core.atomic_io import write_json
from ..data.corpus import read_documents
from ..data.shard_writer import write_shards
from ..data.shards import TokenShards
from ..data.token_windows import evaluation_windows
from ..data.tokenizer import train_tokenizer
from ..tasks.lm import perplexity
from ..eval.plots import plot_learning_curves
from ..models import build_model, config_from_options
from ..presets import merged_options
from ..core.errors import DataError
from ..core.options import Options
from ..core.schema import at_least, between, check_known_keys
from ..core.targets import staged_folder
from . import DEMO_FOLDER, clock, seconds_since
from ..train.config import TrainConfig
from ..train.held_out import held_out_curve
from ..train.trainer import train


@dataclass(frozen=True)
class DemoCorpus(Options):
    """How much of the standard library to read, and the tokenizer trained on it."""

    max_bytes: int = 3_000_000
    vocab_size: int = 2048
    test_fraction: float = 0.02

    WHAT = "lm demo corpus option"
    FIELD_RULES = {"max_bytes": at_least(1), "vocab_size": at_least(1), "test_fraction": between(0, 1)}


PRESET_SECTIONS = ("corpus", "model", "implicit_model", "explicit_model", "train", "implicit_train", "explicit_train")
KINDS = ("explicit", "implicit")  # in the order the demo trains them


def stdlib_sources(max_bytes: int) -> list[Path]:
    """The standard library's ``.py`` files in sorted order, up to ``max_bytes`` in all."""
    root = Path(sysconfig.get_paths()["stdlib"])
    chosen, total = [], 0
    for path in sorted(root.rglob("*.py")):
        if "site-packages" in path.parts or not path.is_file():
            continue
        size = path.stat().st_size
        if total + size > max_bytes:
            break
        chosen.append(path)
        total += size
    if not chosen:
        raise DataError(f"no Python source files found under {root}")
    return chosen


def prepare_corpus(corpus: DemoCorpus, staging: Path, final_dir: Path, progress: bool) -> Path:
    """Tokenizer and shards under ``staging``, which becomes ``final_dir`` once complete;
    returns the shard directory."""
    sources = stdlib_sources(corpus.max_bytes)
    tokenizer = train_tokenizer(read_documents(sources), corpus.vocab_size, staging / "tokenizer")
    # The shard index records where the tokenizer is: where it will be, not where it is built.
    tokenizer.name_or_path = str(final_dir / "tokenizer")
    data_dir = staging / "data"
    write_shards(
        read_documents(sources), tokenizer, data_dir, test_fraction=corpus.test_fraction, seed=0,
        progress=progress, overwrite=True,
    )
    return data_dir


def run_lm_demo(
    preset: dict[str, Any], out_dir: str | Path, progress: bool = True, overwrite: bool = False,
    device: str | None = None,
) -> dict[str, Any]:
    """The corpus, both kinds' runs and their held-out perplexities, into the folder
    ``out_dir``: built aside and renamed into place once complete; a folder already there is
    refused, before any of it, unless ``overwrite`` and it holds a demo's results (whose files
    it replaces, keeping any other). ``device``: where the models train and are scored
    (``trainer.train``); ``results`` records the run's wall and CPU seconds."""
    began = clock()
    check_known_keys(preset, PRESET_SECTIONS, "preset section")
    corpus = DemoCorpus.from_dict(preset.get("corpus", {}))
    # Every section is checked before the corpus is built and the first model trains.
    configs = {
        kind: TrainConfig.for_task("lm", **merged_options(preset, "train", kind, {})) for kind in KINDS
    }
    for kind in KINDS:
        config_from_options(_model_options(preset, kind, corpus.vocab_size))
    out_dir = Path(out_dir)
    with staged_folder(out_dir, overwrite, DEMO_FOLDER) as staging:
        data_dir = prepare_corpus(corpus, staging, out_dir, progress)
        train_shards, test_shards = TokenShards(data_dir, "train"), TokenShards(data_dir, "test")
        results: dict[str, Any] = {
            "corpus": {"train_tokens": len(train_shards), "test_tokens": len(test_shards), **asdict(corpus)},
            "models": {},
        }
        curves = {}
        for kind in KINDS:
            # The trained tokenizer may hold fewer tokens than asked for.
            model = build_model(config_from_options(_model_options(preset, kind, train_shards.vocab_size)))
            results["models"][kind] = _train_and_score(model, configs[kind], data_dir, staging / kind, progress, device)
            curves[kind] = held_out_curve(staging / kind, configs[kind].batch_tokens)
        results.update(seconds_since(began))
        write_json(staging / "results.json", results)
        plot_learning_curves(
            curves, staging / "perplexity.png", title="Python stdlib, held-out perplexity",
            xlabel="training tokens", ylabel="held-out perplexity",
        )
    return results


def _train_and_score(
    model, config: TrainConfig, data_dir: Path, run_dir: Path, progress: bool, device: str | None,
) -> dict[str, Any]:
    """Train ``model`` into ``run_dir`` on ``device``; its size and held-out perplexity."""
    train(model, config, run_dir, data=data_dir, progress=progress, device=device)
    test_shards = TokenShards(data_dir, "test")
    held_out = perplexity(model, evaluation_windows(test_shards, config.sequence_length, config.batch_size))
    return {
        "parameters": model.num_parameters(),
        "train_tokens": config.total_steps * config.batch_tokens,
        "test_perplexity": held_out["perplexity"],
        "test_loss": held_out["loss"],
        # The convergence behind the figure: fixed points that stopped above the tolerance.
        **{key: value for key, value in held_out.items() if key.startswith("fp_")},
    }


def _model_options(preset: dict[str, Any], kind: str, vocab_size: int) -> dict[str, Any]:
    return {**merged_options(preset, "model", kind, {}), "implicit": kind == "implicit", "vocab_size": vocab_size}


def format_lm_table(results: dict[str, Any]) -> str:
    corpus = results["corpus"]
    lines = [
        f"corpus: Python stdlib, {corpus['train_tokens']:,} training / {corpus['test_tokens']:,} held-out tokens",
        f"{'model':<10}{'parameters':>12}{'train tokens':>14}{'held-out ppl':>14}",
    ]
    for name, entry in results["models"].items():
        lines.append(
            f"{name:<10}{entry['parameters']:>12,}{entry['train_tokens']:>14,}{entry['test_perplexity']:>14.2f}"
        )
    return "\n".join(lines)
