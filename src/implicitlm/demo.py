"""The state-tracking demo: implicit vs explicit Mamba2, accuracy by sequence length.

Both models have the same size and see the same training words; they are tested on
fresh words of 1x, 2x and 4x the training length.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import torch

from .data.groups import get_group
from .deq.options import check_known_keys
from .eval.plots import plot_accuracy_by_length
from .eval.words import accuracy_by_length
from .models import config_from_options
from .models.mamba2_lm import ImplicitMamba2ForCausalLM
from .train.word_trainer import WordTrainConfig, train_words

PRESET_SECTIONS = ("model", "train", "implicit_train", "explicit_train", "eval")


def run_demo(preset: dict[str, Any], out_dir: str | Path, progress: bool = True) -> dict[str, Any]:
    check_known_keys(preset, PRESET_SECTIONS, "preset section")
    out_dir = Path(out_dir)
    train_base = preset.get("train", {})
    evaluation = preset.get("eval", {})
    group = train_base.get("group", "S3")
    train_length = train_base.get("train_length", 16)
    lengths = [train_length * m for m in evaluation.get("length_multiples", [1, 2, 4])]
    results: dict[str, Any] = {"group": group, "train_length": train_length, "models": {}}
    for kind in ("implicit", "explicit"):
        train_config = WordTrainConfig.from_dict({**train_base, **preset.get(f"{kind}_train", {})})
        torch.manual_seed(train_config.seed)
        model = ImplicitMamba2ForCausalLM(
            config_from_options(
                {
                    **preset.get("model", {}),
                    "implicit": kind == "implicit",
                    "vocab_size": get_group(group).order,
                    "label_alignment": "aligned",
                }
            )
        )
        train_words(model, train_config, out_dir / kind, progress=progress, description=f"train {kind}")
        rows = accuracy_by_length(
            model,
            group,
            lengths,
            count=evaluation.get("count", 512),
            seed=train_config.seed,
            max_iter=evaluation.get("max_iter"),
            tol=evaluation.get("tol"),
            progress=progress,
        )
        results["models"][kind] = {
            "parameters": sum(p.numel() for p in model.parameters()),
            "by_length": rows,
        }
    write_json(out_dir / "results.json", results)
    plot_accuracy_by_length(
        {k: v["by_length"] for k, v in results["models"].items()},
        out_dir / "accuracy_by_length.png",
        title=f"{group} word problem, trained at length {train_length}",
        train_length=train_length,
    )
    return results


def format_table(results: dict[str, Any]) -> str:
    models = results["models"]
    names = list(models)
    header = f"{'test length':>12}" + "".join(f"{name + ' acc':>16}{'last10':>9}" for name in names)
    lines = [header]
    for i, row in enumerate(models[names[0]]["by_length"]):
        multiple = row["length"] // results["train_length"]
        cells = "".join(
            f"{models[n]['by_length'][i]['accuracy']:>16.1%}{models[n]['by_length'][i]['accuracy_last10']:>9.1%}"
            for n in names
        )
        lines.append(f"{row['length']:>7} ({multiple}x)" + cells)
    params = ", ".join(f"{n}: {models[n]['parameters']:,} parameters" for n in names)
    return "\n".join([f"{results['group']} word problem, trained at length {results['train_length']} ({params})", *lines])


def write_json(path: Path, value: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.tmp")
    temporary.write_text(json.dumps(value, indent=2))
    os.replace(temporary, path)
