"""``implicitlm models ...``, ``options``, ``report`` and ``jacobian``: model presets and options,
import and analysis."""

from __future__ import annotations

import json
from pathlib import Path

from .arguments import (
    add_overwrite_option, key_value, model_preset_name, non_negative_int, option_sections, options_epilog, position_list,
    positive_int, seed,
)
from .shared import add_budget_options, add_device_option, device_in_use, fixed_point_settings, print_device


def add_models_list(commands) -> None:
    p = commands.add_parser("list", help="every model preset with its size and parameter count")
    p.set_defaults(run=_run_models_list)


def _run_models_list(args) -> None:
    from ..presets import model_preset_names, preset_summary

    print(f"{'name':<26}{'arch':<8}{'layers':>7}{'d_model':>8}  {'variant':<14}{'eval max_iter':>14}{'params (M)':>12}")
    for row in map(preset_summary, model_preset_names()):
        eval_max_iter = "-" if row["eval_max_iter"] is None else row["eval_max_iter"]
        print(
            f"{row['name']:<26}{row['architecture']:<8}{row['layers']:>7}{row['d_model']:>8}  {row['variant']:<14}"
            f"{eval_max_iter:>14}{row['parameters'] / 1e6:>12.1f}"
        )


def add_models_show(commands) -> None:
    p = commands.add_parser("show", help="a preset's model options as JSON")
    p.add_argument("name", type=model_preset_name, help="preset name (see: implicitlm models list)")
    p.set_defaults(run=_run_models_show)


def _run_models_show(args) -> None:
    from ..presets import model_preset

    print(json.dumps(model_preset(args.name), indent=2))


def add_options(commands) -> None:
    p = commands.add_parser("options", help="every --model key (and --train key of a trainer) with its default and meaning")
    p.add_argument("--trainer", choices=("words", "lm"), default=None, help="also the --train keys of this trainer")
    p.set_defaults(run=lambda args: print(option_sections(args.trainer)))


def add_models_import(commands) -> None:
    p = commands.add_parser("import", help="convert a transformers checkpoint of a family's source model (safetensors)")
    p.add_argument("source", type=Path, help="checkpoint directory (config.json + safetensors weights)")
    p.add_argument("--out", type=Path, required=True, help="folder for the converted model")
    add_overwrite_option(p, "a model already in --out (its files; others stay)")
    p.add_argument("--implicit", action="store_true", help="an implicit model initialised from the explicit weights")
    p.add_argument("--model", type=key_value, action="append", default=[], metavar="KEY=VALUE", help="model option, repeatable")
    p.epilog = options_epilog(None)
    p.set_defaults(run=_run_models_import)


def _run_models_import(args) -> None:
    from ..core.atomic_io import staged_directory
    from ..core.targets import exclusive_target
    from ..data.tokenizer import load_tokenizer, save_tokenizer
    from ..models.convert import MODEL_FOLDER, from_hf

    with exclusive_target(args.out, args.overwrite, MODEL_FOLDER):
        model = from_hf(args.source, implicit=args.implicit, **dict(args.model))
        # The source's tokenizer goes with it, so that the folder alone serves generate() and lm-eval.
        tokenizer = load_tokenizer(args.source) if (args.source / "tokenizer_config.json").is_file() else None
        # Built aside and renamed: a killed import leaves no folder of a config without its weights.
        with staged_directory(args.out, MODEL_FOLDER.keeps) as staging:
            if tokenizer is not None:
                save_tokenizer(tokenizer, staging)
            model.save_pretrained(staging)  # with the digests of the weights, the config and the tokenizer
    kind = "implicit" if model.config.implicit else "explicit"
    print(f"saved the {kind} model ({model.num_parameters() / 1e6:.1f}M parameters) to {args.out}")
    if tokenizer is not None:
        print(f"copied the tokenizer from {args.source}")


def add_report(commands) -> None:
    p = commands.add_parser("report", help="gather the results of several runs into one Markdown table and figures")
    p.add_argument("runs", nargs="+", type=Path, help="run folders (searched for result JSON files) or result files")
    p.add_argument("--out", type=Path, default=Path("report"), help="folder for report.md and figures (default: report)")
    add_overwrite_option(p, "a report.md or figure already in --out")
    p.set_defaults(run=_run_report)


def _run_report(args) -> None:
    from ..eval.report import write_report

    report, figures = write_report(args.runs, args.out, overwrite=args.overwrite)
    print(report.read_text())
    print(f"report: {report}, figures: {', '.join(str(f) for f in figures)}")


def add_jacobian(commands) -> None:
    p = commands.add_parser(
        "jacobian",
        help="state-to-state Jacobian of an SSM layer (Theorem 1): diagonal explicit, dense implicit",
        description=(
            "dh_t/dh_(t-1) of one layer's SSM state (other state parts held fixed), at the states that token "
            "sequences reach in sequential mode; reports the off-diagonal share ||J - diag J||_F / ||J||_F. "
            "Computed in float64. One MODEL: <out>/jacobian.json and <out>/jacobian.png. Several: "
            "<out>/<label>/jacobian.json (and .png) per model, all heatmaps side by side in <out>/jacobian.png."
        ),
    )
    p.add_argument("models", nargs="+", metavar="MODEL",
                   help="checkpoint folder, preset:NAME (random weights; implicitlm models list) or JSON model options "
                        "(random weights)")
    p.add_argument("--out", type=Path, required=True, help="output folder")
    add_overwrite_option(p, "a record or figure already in --out")
    p.add_argument("--layer", type=non_negative_int, default=0, help="layer whose SSM state is analysed (default 0)")
    p.add_argument("--coordinates", type=positive_int, default=64, help="state coordinates analysed, a seeded random choice")
    p.add_argument("--positions", type=position_list, default=None, help="comma-separated token positions (default: 4 spread, the last included)")
    p.add_argument("--length", type=positive_int, default=32, help="tokens per sequence")
    p.add_argument("--count", type=positive_int, default=4, help="sequences")
    p.add_argument("--words", default=None, metavar="GROUP", help="word-problem tokens over GROUP instead of random tokens")
    p.add_argument("--method", choices=["ift", "unroll"], default="ift",
                   help="implicit-function theorem at the fixed point, or autograd through the iterations")
    p.add_argument("--seed", type=seed, default=0, help="seed of the random weights, tokens and coordinates")
    # The models are built inside run_jacobian, whose solves are its own: no flag to apply.
    add_budget_options(p, passes=False)
    add_device_option(p)
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    p.set_defaults(run=_run_jacobian, check=_check_jacobian_models)


def _check_jacobian_models(args) -> None:
    """The checkpoints among the models, by their files, before torch loads (presets and JSON
    options are the library's to read)."""
    from ..core.run_folder import check_model_location
    from ..presets.options import PRESET_PREFIX

    for model in args.models:
        if not (model.startswith(PRESET_PREFIX) or model.endswith(".json")):
            check_model_location(model)


def _run_jacobian(args) -> None:
    from ..eval.jacobian import run_jacobian

    records = run_jacobian(
        args.models, args.out, layer=args.layer, coordinates=args.coordinates,
        positions=args.positions, length=args.length, count=args.count,
        words=args.words, method=args.method, fixed_point=fixed_point_settings(args), seed=args.seed,
        progress=not args.no_progress, overwrite=args.overwrite, device=device_in_use(args),
    )
    print_device(records[0]["model"]["device"])
    print(f"{'model':<28}{'kind':<10}{'share mean':>12}{'median':>12}{'max':>12}")
    for record in records:
        kind = "implicit" if record["model"]["implicit"] else "explicit"
        metrics = record["metrics"]
        print(f"{record['label']:<28}{kind:<10}{metrics['off_diagonal_share_mean']:>12.3g}"
              f"{metrics['off_diagonal_share_median']:>12.3g}{metrics['off_diagonal_share_max']:>12.3g}")
    print(f"results: {args.out}, heatmaps: {args.out / 'jacobian.png'}")
