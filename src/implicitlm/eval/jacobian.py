"""The state-to-state Jacobian of the paper's Theorem 1: diagonal explicit, dense implicit.

For one token t and one layer l with SSM state h, J = dh_t / dh_{t-1}, every other part of
the recurrent state (the other layers, the conv buffers) held fixed. An explicit Mamba layer
updates h_t = exp(dt A) h_{t-1} + dt x B, where dt, x and B depend on the token and on the
layers below, never on h itself: J is diagonal. It is so per layer only: across layers
h^{l+1}_t depends on h^l_{t-1} through layer l's output, so the claim and this analysis are
per layer. In an implicit model the token's output z*_t = g(z*_t, h_{t-1}) feeds back into
dt, x and B, so every coordinate of h_t depends on every coordinate of h_{t-1}.

A layer's state holds heads x headdim x d_state numbers (Mamba1: d_inner x d_state); the
analysis takes k of them, as indices into the flattened state of one sample. Methods:

- "ift": the implicit-function theorem at the token's fixed point z*, exactly:
  J = dS/dh + dS/dz (I - dg/dz)^{-1} dg/dh, with g(z, h) the token map and S(z, h) the
  state it commits; all four blocks dense, by ``torch.func.jacrev`` (dg/dz is D x D).
- "unroll": autograd through the iteration itself, z <- g(z, h) from z = 0 for as many
  steps as the model's own solve took. Equal to "ift" once the iteration has converged.

Explicit models have no fixed point: both methods give dS/dh.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import torch
from torch.func import jacrev
from torch.nn.utils import parametrize
from tqdm.auto import tqdm

from ..data.groups import resolve_group
from ..data.words import generate_words
from ..core.devices import usable_device
from ..core.duration import require_time, seconds_of
from ..core.errors import OptionError
from ..core.memory import FLOAT_BYTES, activation_bytes, require
from ..models import build_model, config_from_options, load_model
from ..presets import model_options_from
from ..presets.options import PRESET_PREFIX
from ..tasks.base import forward_seconds
from .plots import plot_heatmaps
from .records import claimed_outputs, make_record, record_files, write_record

METHODS = ("ift", "unroll")
EXPERIMENT = "jacobian"


def off_diagonal_share(jacobian: torch.Tensor) -> float:
    """||J - diag(J)||_F / ||J||_F: 0 for a diagonal matrix, near 1 for a dense one."""
    off_diagonal = jacobian - torch.diag_embed(jacobian.diagonal())
    return (off_diagonal.norm() / jacobian.norm()).item()


def select_coordinates(model, layer: int = 0, coordinates: int | Sequence[int] = 64, seed: int = 0) -> torch.Tensor:
    """Indices into the layer's flattened per-sample SSM state: ``coordinates`` of them at
    random (seeded, sorted so that heatmaps follow the state's layout; all of them if the
    state is smaller), or the indices given."""
    size = _ssm_state(model, layer).numel()
    if not isinstance(coordinates, (int, np.integer)):
        chosen = torch.as_tensor(list(coordinates), dtype=torch.long)
        if len(chosen) == 0 or chosen.min() < 0 or chosen.max() >= size:
            raise OptionError(f"state coordinates must be indices in [0, {size}) of layer {layer}'s SSM state")
        return chosen
    if coordinates < 1:
        raise OptionError(f"the number of state coordinates must be positive, got {coordinates}")
    generator = torch.Generator().manual_seed(seed)
    return torch.randperm(size, generator=generator)[: min(coordinates, size)].sort().values


def state_jacobian(
    model, input_ids: torch.Tensor, position: int, layer: int = 0, coordinates: int | Sequence[int] = 64,
    method: str = "ift", max_iter: int | None = None, tol: float | None = None, seed: int = 0,
    fixed_point: dict[str, Any] | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(J, coordinates): the k x k Jacobian of token ``position`` of the sequence
    ``input_ids`` (1-D), at the state its prefix leaves in sequential mode; every solve within
    ``max_iter`` / ``tol`` (None: the options'), by the model's options changed by ``fixed_point``."""
    _check_method(method)
    chosen = select_coordinates(model, layer, coordinates, seed).to(model.device)
    ids = torch.as_tensor(input_ids, device=model.device).long().reshape(1, -1)
    _check_positions([position], ids.shape[1])
    solve = _solve_settings(model, max_iter, tol, fixed_point)
    state = _advance(model, ids[:, :position], None, solve)
    jacobian, _ = _token_jacobian(model, state, ids[:, position], layer, chosen, method, solve)
    return jacobian, chosen


def _solve_settings(model, max_iter: int | None, tol: float | None, fixed_point: dict[str, Any] | None) -> dict[str, Any]:
    """What every solve of an analysis is given: its budget, and its options checked once."""
    return {"max_iter": max_iter, "tol": tol, "fixed_point": model.fixed_point_options(fixed_point)}


def jacobian_analysis(
    model, input_ids: torch.Tensor, positions: Sequence[int], layer: int = 0, coordinates: int | Sequence[int] = 64,
    method: str = "ift", max_iter: int | None = None, tol: float | None = None, seed: int = 0, progress: bool = False,
    fixed_point: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """J at every position of every sequence of ``input_ids`` (count x length), summarised;
    solved as ``state_jacobian`` solves.

    Returns ``metrics`` (off-diagonal share mean / median / min / max, diagonal statistics,
    and for implicit models the worst relative residual of the fixed points), ``rows`` (one
    per sequence and position), ``coordinates``, and a ``representative`` row, the one of
    median share, with its Jacobian.
    """
    _check_method(method)
    chosen = select_coordinates(model, layer, coordinates, seed).to(model.device)
    ids = torch.as_tensor(input_ids, device=model.device).long()
    positions = sorted(set(positions))
    _check_positions(positions, ids.shape[1])
    solve = _solve_settings(model, max_iter, tol, fixed_point)
    _require_time(model, ids, positions, layer, chosen, method, solve)
    rows, jacobians = [], []
    with tqdm(total=len(ids) * len(positions), desc="jacobian", disable=not progress) as bar:
        for sample, sequence in enumerate(ids):
            state, done = None, 0
            for position in positions:
                # Each sequence is run once: the state advances from one position to the next.
                state, done = _advance(model, sequence[None, done:position], state, solve), position
                jacobian, residual = _token_jacobian(model, state, sequence[None, position], layer, chosen, method, solve)
                rows.append(_row(sample, position, jacobian, residual))
                jacobians.append(jacobian)
                bar.update()
    shares = np.array([row["off_diagonal_share"] for row in rows])
    representative = int(np.abs(shares - np.median(shares)).argmin())
    return {
        "metrics": _metrics(rows, torch.stack([j.diagonal() for j in jacobians])),
        "rows": rows,
        "coordinates": chosen.tolist(),
        "representative": {**rows[representative], "jacobian": jacobians[representative]},
    }


def _require_time(model, ids: torch.Tensor, positions: list[int], layer: int, chosen: torch.Tensor, method: str,
                  solve: dict[str, Any]) -> None:
    """Refuse, before the first, Jacobians past the time limit (``core.duration``): one, timed
    at the first token, for every sequence and position, and the sequential steps that reach
    them, at one pass each."""
    state = _advance(model, ids[:1, :0], None, solve)
    one = seconds_of(lambda: _token_jacobian(model, state, ids[:1, 0], layer, chosen, method, solve))
    steps = forward_seconds(model, "sequential", 1, positions[-1], len(ids) if positions[-1] else 0, solve["fixed_point"])
    require_time(f"{len(ids) * len(positions):,} Jacobians ({len(ids):,} sequence(s), {len(positions):,} position(s) each)",
                 one * len(ids) * len(positions) + steps, arguments=("count", "positions"),
                 hint="; give a smaller count or fewer positions")


def _row(sample: int, position: int, jacobian: torch.Tensor, residual: float | None) -> dict[str, Any]:
    diagonal = jacobian.diagonal()
    row = {
        "sample": sample,
        "position": position,
        "off_diagonal_share": off_diagonal_share(jacobian),
        "diagonal_min": diagonal.min().item(),
        "diagonal_max": diagonal.max().item(),
    }
    if residual is not None:
        row["fp_rel_residual"] = residual
    return row


def _metrics(rows: list[dict[str, Any]], diagonals: torch.Tensor) -> dict[str, float]:
    shares = np.array([row["off_diagonal_share"] for row in rows])
    metrics = {
        "off_diagonal_share_mean": shares.mean(),
        "off_diagonal_share_median": np.median(shares),
        "off_diagonal_share_min": shares.min(),
        "off_diagonal_share_max": shares.max(),
        "diagonal_abs_mean": diagonals.abs().mean().item(),
        "diagonal_min": diagonals.min().item(),
        "diagonal_max": diagonals.max().item(),
    }
    if "fp_rel_residual" in rows[0]:
        metrics["fp_rel_residual_max"] = max(row["fp_rel_residual"] for row in rows)
    return {name: float(value) for name, value in metrics.items()}


def _ssm_state(model, layer: int) -> torch.Tensor:
    """The layer's SSM state of one sample, zeros; a clear error for layers without one."""
    layers = model.stack.layers
    if not 0 <= layer < len(layers):
        raise OptionError(f"layer must be in [0, {len(layers)}), got {layer}")
    state = layers[layer].initial_state(1, model.device, model.dtype)
    if not hasattr(state, "ssm"):
        raise OptionError(
            f"{model.config.model_type} layers keep a {type(state).__name__} that grows with the sequence, "
            "not a fixed-size state: the state Jacobian is defined for Mamba2 and Mamba1 models"
        )
    return state.ssm


def _check_method(method: str) -> None:
    if method not in METHODS:
        raise OptionError(f"method must be one of {', '.join(METHODS)}, got {method!r}")


def _check_positions(positions: Sequence[int], length: int) -> None:
    if not positions or min(positions) < 0 or max(positions) >= length:
        raise OptionError(f"positions must lie in [0, {length}) (the sequence length), got {list(positions)}")


@torch.no_grad()
def _advance(model, ids: torch.Tensor, state: list | None, solve: dict[str, Any]) -> list:
    """The state after feeding ``ids`` (1, n) from ``state`` (zeros when None), in sequential mode,
    each token solved to the tolerance (``solve``: ``_solve_settings``): the Jacobians are taken
    at fixed points."""
    if state is None:
        state = model.stack.initial_state(1, model.device, model.dtype)
    if ids.shape[1] == 0:
        return state
    return model(ids, mode="sequential", state=state, passes=0, **solve).state


@torch.no_grad()  # torch.func differentiates all the same; no graph to the weights is kept
def _token_jacobian(
    model, state: list, token: torch.Tensor, layer: int, chosen: torch.Tensor, method: str, solve: dict[str, Any]
) -> tuple[torch.Tensor, float | None]:
    """(J, relative residual of the token's fixed point, None for explicit models)."""
    # The weight-normalised weights computed once for the solve and all of jacrev's
    # evaluations, not at every step, as the model's own forward does.
    with parametrize.cached():
        embedded = model.get_input_embeddings()(token)
        h = state[layer].ssm.reshape(-1)[chosen]
        if not model.config.implicit:
            step = _token_step(model.stack, state, None, layer, chosen)
            return jacrev(lambda h: step(embedded[0], h)[1])(h), None
        injection = model.injection(model.injection_norm(embedded))
        step = _token_step(model.stack, state, injection, layer, chosen)
        z_star, stats = _solve_token(model, state, injection, solve)
        if method == "unroll":
            jacobian = jacrev(_unrolled(step, torch.zeros_like(z_star[0]), int(stats.passes[0])))(h)
        else:
            jacobian = _implicit_function_jacobian(step, z_star[0], h)
        return jacobian, stats.rel_residual[0].item()


def _solve_token(model, state: list, injection: torch.Tensor, solve: dict[str, Any]):
    """The token's fixed point as sequential mode finds it, by the solver of the analysis's
    options within its budget (``solve``)."""
    solver = model.stack_passes.with_options(solve["fixed_point"]).solver
    return solver(
        lambda z: model.stack.step(z, injection, state)[0],
        injection.new_zeros(injection.shape[0], model.config.hidden_size),
        solver.budget("sequential", solve["max_iter"], solve["tol"], passes=0),
        phase="sequential",
    )


def _implicit_function_jacobian(step, z_star: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
    """dS/dh + dS/dz (I - dg/dz)^{-1} dg/dh at the fixed point z* = g(z*, h)."""
    (g_z, g_h), (s_z, s_h) = jacrev(step, argnums=(0, 1))(z_star, h)
    identity = torch.eye(len(g_z), dtype=g_z.dtype, device=g_z.device)
    return s_h + s_z @ torch.linalg.solve(identity - g_z, g_h)


def _token_step(stack, state: list, injection: torch.Tensor | None, layer: int, chosen: torch.Tensor):
    """(z, h) -> (next z, the chosen coordinates of the committed state), for one sample:
    ``h`` replaces the chosen coordinates of the layer's SSM state, the rest stays fixed."""
    ssm = state[layer].ssm

    def step(z: torch.Tensor, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        replaced = dataclasses.replace(state[layer], ssm=ssm.reshape(-1).index_put((chosen,), h).reshape(ssm.shape))
        z_next, states = stack.step(z[None], injection, [*state[:layer], replaced, *state[layer + 1 :]])
        return z_next[0], states[layer].ssm.reshape(-1)[chosen]

    return step


def _unrolled(step, z0: torch.Tensor, steps: int):
    def committed_state(h: torch.Tensor) -> torch.Tensor:
        z = z0
        for _ in range(steps):
            z = step(z, h)[0]
        return step(z, h)[1]

    return committed_state


# The experiment: models from the command line, tokens, records and the figure.


def analysis_model(spec: str, seed: int = 0):
    """A model in float64 and eval mode from a checkpoint folder, ``preset:NAME`` or a JSON
    file of model options (its "model" section if it has one); the last two randomly
    initialised from ``seed``. Float64, so that the linear solve of "ift" and the small
    off-diagonal entries of an implicit model's J are not rounding."""
    if not (spec.startswith(PRESET_PREFIX) or spec.endswith(".json")):
        return load_model(spec).double().eval()
    torch.manual_seed(seed)
    return build_model(config_from_options(model_options_from(spec))).double().eval()


def analysis_tokens(model, length: int, count: int, seed: int = 0, words: str | None = None) -> torch.Tensor:
    """(count, length) token ids: uniform over the vocabulary, or word-problem words over the
    group ``words`` (its elements are the first token ids)."""
    if length < 1 or count < 1:
        raise OptionError(f"length and count must be positive, got {length} and {count}")
    vocab_size = model.config.vocab_size
    if words is None:
        return torch.randint(0, vocab_size, (count, length), generator=torch.Generator().manual_seed(seed))
    order = resolve_group(words).order
    if order > vocab_size:
        raise OptionError(f"{words} has {order} elements, more than the model's {vocab_size} tokens")
    inputs, _ = generate_words(words, length, count, seed)
    return torch.from_numpy(inputs.astype(np.int64))


def _require_sequences(model, count: int, length: int) -> None:
    """The sequential run up to the last position keeps a float per token and channel of
    every block, and the logits of every token (the vocabulary wide), in the model's dtype."""
    config, item = model.config, model.dtype.itemsize
    blocks = activation_bytes(count, length, config.hidden_size, config.num_hidden_layers) // FLOAT_BYTES
    require(f"{count} sequence(s) of length {length:,}", item * (blocks + length * config.vocab_size))


def default_positions(length: int) -> list[int]:
    """Four positions spread over the sequence, the last included."""
    return sorted({length // 4, length // 2, 3 * length // 4, length - 1})


def jacobian_record(checkpoint: str, model, analysis: dict[str, Any], label: str,
                    fixed_point: dict[str, Any] | None = None, **settings: Any) -> dict[str, Any]:
    """The record of one model (its solves given ``fixed_point``): metrics, rows, the mean share
    by position as a curve, and the representative Jacobian as a nested list."""
    by_position: dict[int, list[float]] = {}
    for row in analysis["rows"]:
        by_position.setdefault(row["position"], []).append(row["off_diagonal_share"])
    curve = {"label": label, "x": list(by_position), "y": [float(np.mean(s)) for s in by_position.values()]}
    representative = {**analysis["representative"], "jacobian": analysis["representative"]["jacobian"].tolist()}
    return make_record(
        EXPERIMENT, checkpoint, model, analysis["metrics"], [curve],
        {"x": "token position", "y": "off-diagonal share of ||J||_F"}, fixed_point,
        label=label, rows=analysis["rows"], coordinates=analysis["coordinates"], representative=representative,
        **settings,
    )


def plot_jacobians(records: list[dict[str, Any]], path: str | Path) -> Path:
    """log10 |J| of each record's representative Jacobian, side by side on one colour scale
    whose bottom is the smallest non-zero entry: exact zeros (an explicit model's
    off-diagonal) take the bottom colour."""
    panels = {}
    for record in records:
        kind = "implicit" if record["model"]["implicit"] else "explicit"
        share = record["representative"]["off_diagonal_share"]
        magnitude = np.abs(np.array(record["representative"]["jacobian"]))
        panels[f"{record['label']} ({kind})\noff-diagonal share {share:.2g}"] = magnitude
    nonzero = np.concatenate([m[m > 0] for m in panels.values()])
    low, high = (np.log10(nonzero.min()), np.log10(nonzero.max())) if nonzero.size else (-1.0, 0.0)
    logs = {name: np.log10(np.maximum(m, 10.0**low)) for name, m in panels.items()}
    first = records[0]
    title = f"|dh_t / dh_(t-1)|: layer {first['layer']}, {len(first['coordinates'])} SSM state coordinates"
    labels = {"x": "coordinate of h_(t-1)", "y": "coordinate of h_t", "colorbar": "log10 |entry|"}
    return plot_heatmaps(logs, path, title, labels, vmin=low, vmax=high)


def run_jacobian(
    specs: Sequence[str], out_dir: str | Path, layer: int = 0, coordinates: int = 64,
    positions: Sequence[int] | None = None, length: int = 32, count: int = 4, words: str | None = None,
    method: str = "ift", fixed_point: dict[str, Any] | None = None, seed: int = 0, progress: bool = False,
    overwrite: bool = False, device: str | None = None,
) -> list[dict[str, Any]]:
    """Analyse each model (``analysis_model`` specs) on the same tokens, solved as its own
    fixed-point options say or as ``fixed_point`` sets them (``FixedPointOptions`` fields:
    ``max_iter``, ``tol`` ...), on ``device`` (``usable_device``'s names; None: the CPU);
    returns the records.

    One model: ``<out>/jacobian.json`` and ``<out>/jacobian.png``. Several:
    ``<out>/<label>/jacobian.json`` and ``.png`` per model, and every heatmap side by side
    in ``<out>/jacobian.png``. Any of them already there is refused, before the analysis,
    unless ``overwrite``.
    """
    out_dir = Path(out_dir)
    device = usable_device(device)
    positions = list(positions) if positions else default_positions(length)
    settings = dict(layer=layer, method=method)
    details = dict(positions=positions, length=length, count=count, tokens=f"words:{words}" if words else "random", seed=seed)
    folders = {label: out_dir if len(specs) == 1 else out_dir / label for label in _labels(specs)}
    outputs = [file for folder in folders.values() for file in record_files(folder, EXPERIMENT)]
    records = []
    with claimed_outputs([*outputs, record_files(out_dir, EXPERIMENT)[1]], overwrite):
        for spec, (label, folder) in zip(specs, folders.items()):
            model = analysis_model(spec, seed).to(device)
            options = model.fixed_point_options(fixed_point)  # checked before the analysis starts
            _require_sequences(model, count, length)
            ids = analysis_tokens(model, length, count, seed, words)
            analysis = jacobian_analysis(model, ids, positions, coordinates=coordinates, seed=seed, progress=progress,
                                         fixed_point=options, **settings)
            budget = dict(zip(("max_iter", "tol"), options.budget(None, None)))
            record = jacobian_record(spec, model, analysis, label, fixed_point, **settings, **budget, **details)
            write_record(folder, record)
            if len(specs) > 1:
                plot_jacobians([record], record_files(folder, EXPERIMENT)[1])
            records.append(record)
        plot_jacobians(records, record_files(out_dir, EXPERIMENT)[1])
    return records


def _labels(specs: Sequence[str]) -> list[str]:
    """A folder name per model: the preset, JSON file or folder name, with as many parent
    folders as it takes to tell models apart (runs' "checkpoint" folders)."""
    names = [_name_parts(spec) for spec in specs]
    for depth in range(1, max(map(len, names)) + 1):
        labels = ["-".join(parts[-depth:]) for parts in names]
        if len(set(labels)) == len(labels):
            return labels
    return [f"{label}-{i + 1}" for i, label in enumerate(labels)]  # the same model given twice


def _name_parts(spec: str) -> list[str]:
    if spec.startswith(PRESET_PREFIX):
        return [spec.removeprefix(PRESET_PREFIX)]
    path = Path(spec).with_suffix("") if spec.endswith(".json") else Path(spec)
    parts = [part for part in path.parts if part not in (path.anchor, ".", "..")]
    # "." or "..": the folder's own name, which only its absolute path holds.
    return parts or [Path(os.path.abspath(spec)).name]
