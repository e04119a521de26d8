"""A model's learned solver (Bai, Koltun and Kolter, *Neural Deep Equilibrium Solvers*, ICLR
2022): a learned initial guess, where its inference solves start, and a learned mixing of the
safeguarded-Anderson steps that take them from there. ``implicitlm solver train`` fits both to
a trained model (``train/learned_solver/``); this is what a model does with them.

The guess. A solve from z = 0 spends its first passes finding the neighbourhood of z*. A small
network reads what the solve is given, each token's input (its embedding, of which the
injection u_t is a linear function, at a fraction of u_t's width) and (in sequential mode) the
previous token's fixed point z*_{t-1}, and proposes z0 near z*_t. The stop test is the same, so
the tolerance keeps its meaning. But a map may have several fixed points, and a trained model's
answers are those of the one z = 0 leads to: a poor guess may lead elsewhere, which is why the
fit checks a held-out batch before it lets a guess be used. In simultaneous mode the previous
tokens' fixed points are unknown when the solve starts (but for a chunk's first token, whose
predecessor the chunk before settled): the network reads a zero vector in their place, and it is
trained on both kinds of input. A guess built with ``readouts`` also reads the recurrent state
before the token, through a learned query per block (``--guess-reads-state``), zeros where the
state is unknown.

The mixing. Anderson's next iterate is ``sum_i a_i (b f(x_i) + (1 - b) x_i)`` over the last few
iterates, with ``a`` the least-squares weights and ``b = 1``. A small network reads what the
solve knows at that step, scale-free (``deq.solvers.anderson.Mixing``), and proposes a
correction to the weights (summing to zero) and the damping ``b`` in (0, 2). Its last layer
starts at zero: an untrained mixing is safeguarded Anderson exactly. A sample whose learned step
fails to cut its residual by a tenth falls back for the rest of its solve to the safeguarded
step: a poor mixing costs a pass or two, never a solve that stops short. The solvers that mix
by it, and what solves in their place without one, are the solver table's
(``deq.solvers.needs_mixing``, ``without_mixing``): "learned_anderson", safeguarded Anderson.

Both are saved beside a checkpoint's weights, each in a file of its own with its SHA-256
(``initial_guess.safetensors``, ``learned_mixing.safetensors``), which a weight check does not
see, and held out of the model's module tree, on its device. Loading reads no pickle and checks
the digest and every tensor's shape.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Sequence
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file
from torch import nn

from ..core.atomic_io import atomic_write
from ..core.errors import DataError, OptionError
from ..core.weights_digest import file_sha256
from ..deq import FixedPointOptions, FixedPointSolver
from ..deq.solvers import needs_mixing, without_mixing
from ..deq.solvers.anderson import MEMORY
from .errors import ModelLoadError
from .argument_checks import MODES
from .stack import StackState

GUESS_FILE = "initial_guess.safetensors"
MIXING_FILE = "learned_mixing.safetensors"
GUESS_WIDTH = 128  # hidden units: 98k parameters beside the shipped 1-layer WikiText-2 model's 1.6M
MIXING_WIDTH = 64  # hidden units; the mixing reads a few dozen numbers per sample and step
MAX_DAMPING = 2.0  # b in (0, 2): from heavy damping to over-relaxation
# The options' fields that name a solver: training's and each inference mode's.
SOLVER_FIELDS = ("solver", "simultaneous_solver", "sequential_solver")
ReadState = Callable[[list[torch.Tensor]], list[torch.Tensor]]


class LearnedSolver:
    """A model's learned initial guess (``guess``) and learned mixing (``mixing``; None: none
    attached). Attaching, saving and loading take the model, for its options and device; where
    the solves start takes the solver options that say where each mode starts
    (``FixedPointOptions``) and, where it reads states, the model's stack (``StackPasses``,
    which runs the solves, hands them)."""

    def __init__(self) -> None:
        self.guess: InitialGuess | None = None
        self.mixing: LearnedMixing | None = None

    def attach_guess(self, model, guess: InitialGuess | None, use: bool | None) -> None:
        """Keep ``guess`` (None: none) and, with ``use``, start every inference solve of ``model``
        from it (``fixed_point.initial_guess`` "learned"; else "zero", where
        ``initial_guess="learned"`` can turn it on; the per-mode ``simultaneous_initial_guess`` /
        ``sequential_initial_guess`` are cleared). ``use=None`` leaves the options as they are
        (a loaded model: its config says)."""
        self.guess = guess
        self.to(model.device)
        if use is not None:
            model.set_fixed_point_options(initial_guess="learned" if guess is not None and use else "zero",
                                          simultaneous_initial_guess="", sequential_initial_guess="")

    def attach_mixing(self, model, mixing: LearnedMixing | None) -> None:
        """Keep ``mixing`` (None: none), the mixing of every solve of ``model`` by a solver that
        mixes its steps by one."""
        self.mixing = mixing
        self.to(model.device)
        model.set_fixed_point_options()  # the solver rebuilt, with this mixing, where the options are

    def solver(self, options: FixedPointOptions) -> FixedPointSolver:
        """A solver of ``options`` whose solvers that use a learned mixing mix by the one held here."""
        return FixedPointSolver(options, self.mixing)

    def to(self, device: torch.device) -> None:
        """The guess and mixing moved to ``device``, in place (the solver holds the mixing
        itself); never cast: each computes in its own precision."""
        for network in (self.guess, self.mixing):
            if network is not None:
                network.to(device)

    def save(self, folder: str | Path) -> None:
        """Each network attached, in its file beside the weights in ``folder``."""
        for network in (self.guess, self.mixing):
            if network is not None:
                network.save(folder)

    def load(self, model, folder: Path) -> None:
        """The guess and mixing saved in ``folder`` beside an implicit model's weights, loaded,
        checked and attached even where the options do not use them (``initial_guess="learned"``
        or a solver that mixes by the mixing may turn them on); one the options use must be there
        (an explicit model uses none). A missing, damaged or mismatched file is a ModelLoadError."""
        if not model.config.implicit:
            return
        options = model.solver.options
        try:
            if any(options.initial_guess_for(mode) == "learned" for mode in MODES) or (folder / GUESS_FILE).is_file():
                self.attach_guess(model, InitialGuess.load(folder, model.config.hidden_size,
                                                           model.stack.readout_sizes()), use=None)
            mixing_solver = next((options.solver_for(mode) for mode in (*MODES, "training")
                                  if needs_mixing(options.solver_for(mode))), None)
            if mixing_solver is not None or (folder / MIXING_FILE).is_file():
                self.attach_mixing(model, LearnedMixing.load(folder, MEMORY, mixing_solver))
        except DataError as error:
            raise ModelLoadError(str(error)) from None

    def first_iterate(self, options: FixedPointOptions, stack, embedded: torch.Tensor,
                      previous: torch.Tensor | None = None, state=None) -> torch.Tensor:
        """Where an inference solve over these tokens starts: the learned guess from each
        token's embedding and, for the first token, the fixed point before it (``previous``)
        and the state the tokens before it left (``state``), where known (the others' are not
        known until the solve ends), or z = 0."""
        guess = self._in_use(options, "simultaneous")
        if guess is None:
            return torch.zeros_like(embedded)
        known = None
        if previous is not None:
            known = torch.zeros_like(embedded)
            known[:, 0] = previous
        reads = _first_token_reads(stack, state, embedded.shape[1]) if guess.reads_state and state is not None \
            else None
        return guess(embedded, known, reads)

    def token_guess(self, options: FixedPointOptions, stack, embedded: torch.Tensor,
                    first_previous: torch.Tensor | None):
        """(t, the previous token's fixed point, the state before token t) -> token t's first
        iterate in sequential mode; None: z = 0. ``first_previous``: the fixed point before the
        first token, where it is known."""
        guess = self._in_use(options, "sequential")
        if guess is None:
            return None
        reads_state = guess.reads_state

        def start(t: int, previous: torch.Tensor | None, state) -> torch.Tensor:
            # A guess that does not read the state gets no reader: nothing is bound per token for it.
            read = functools.partial(stack.read_state, state) if reads_state else None
            return guess(embedded[:, t], first_previous if previous is None else previous, read)

        return start

    def with_last_fixed_point(self, options: FixedPointOptions, state: list | None, z: torch.Tensor) -> list | None:
        """``state`` after an implicit model's fixed points ``z``, and where a learned guess starts
        the solves, the last token's fixed point with it (``StackState``): the next call's first
        token starts from a guess that reads it."""
        if state is None or all(options.initial_guess_for(mode) != "learned" for mode in MODES):
            return state
        return StackState(state, last_fixed_point=z[:, -1].detach())

    def _in_use(self, options: FixedPointOptions, mode: str) -> InitialGuess | None:
        """The learned initial guess, on the model's device, where the options ask for it in
        ``mode``; None: the solves start from z = 0."""
        if options.initial_guess_for(mode) != "learned":
            return None
        if self.guess is None:
            raise OptionError("initial_guess='learned', but this model has no learned initial guess "
                              "(implicitlm solver train makes one)", arguments=("initial_guess",))
        return self.guess


def without_learned_solver(options: FixedPointOptions) -> dict[str, str]:
    """The changes of ``options`` by which a model solves without a learned solver: every solve
    from z = 0, and each solver that mixes by a learned mixing replaced by the one the solver
    table runs in its place. A guess and mixing are fitted to one model's weights and travel
    with its checkpoint only: a run from those weights solves so (``implicitlm solver train``
    fits new ones to its result), as the fit's own tight solves do."""
    return {"initial_guess": "zero", "simultaneous_initial_guess": "", "sequential_initial_guess": "",
            **{field: without_mixing(getattr(options, field)) for field in SOLVER_FIELDS if getattr(options, field)}}


def _first_token_reads(stack, state, length: int):
    """Per-block queries (b, length, width) -> readouts of ``state`` by the first token's,
    zeros for the others (whose states are not known yet)."""
    def read(queries: list[torch.Tensor]) -> list[torch.Tensor]:
        first = stack.read_state(state, [query[:, 0] for query in queries])
        return [torch.cat([read[:, None], read.new_zeros(read.shape[0], length - 1, read.shape[-1])], dim=1)
                for read in first]

    return read


# ---------------------------------------------------------------- the networks


class InitialGuess(nn.Module):
    """z0 = W2 gelu(W1 [rms(x_t), rms(z_prev), rms(r_1), ...]), computed in float32 whatever
    the model's dtype. With ``readouts`` (per block of the model, the (query, readout) widths
    of its ``read_state``), the guess also reads the recurrent state before the token: per
    block, a query q_l = Q_l [rms(x_t), rms(z_prev)] read against the block's state gives
    r_l (for an SSM, the state read as its C reads it; for attention, the cache attended to)."""

    def __init__(self, hidden_size: int, width: int = GUESS_WIDTH, readouts: Sequence[tuple[int, int]] = ()) -> None:
        super().__init__()
        self.hidden_size, self.width = hidden_size, width
        self.readouts = tuple((int(query), int(readout)) for query, readout in readouts)
        self.queries = nn.ModuleList(nn.Linear(2 * hidden_size, query) for query, _ in self.readouts)
        self.hidden = nn.Linear(2 * hidden_size + sum(readout for _, readout in self.readouts), width)
        self.out = nn.Linear(width, hidden_size)

    @property
    def reads_state(self) -> bool:
        return bool(self.readouts)

    def forward(self, embedded: torch.Tensor, previous: torch.Tensor | None = None,
                read_state: ReadState | None = None) -> torch.Tensor:
        """``embedded``: (..., hidden_size), the tokens' embeddings; ``previous``: the previous
        token's fixed point, or None where it is not known yet (a simultaneous solve);
        ``read_state``: per-block queries (..., query width) -> per-block readouts of the state
        before the tokens (``BlockStack.read_state``), or None where it is not known."""
        x = _rms(embedded.float())
        z = torch.zeros_like(x) if previous is None else _rms(previous.float())
        features = [x, z]
        if self.reads_state:
            features += self._read(torch.cat(features, dim=-1), read_state)
        return self.out(nn.functional.gelu(self.hidden(torch.cat(features, dim=-1)))).to(embedded.dtype)

    def _read(self, known: torch.Tensor, read_state: ReadState | None) -> list[torch.Tensor]:
        if read_state is None:
            return [known.new_zeros(*known.shape[:-1], readout) for _, readout in self.readouts]
        return [_rms(read.float()) for read in read_state([query(known) for query in self.queries])]

    def save(self, folder: str | Path) -> None:
        """``GUESS_FILE`` and its digest in ``folder``."""
        _save_network(self, folder, GUESS_FILE, {"hidden_size": str(self.hidden_size), "width": str(self.width),
                                                  "readouts": json.dumps(self.readouts)})

    @classmethod
    def load(cls, folder: str | Path, hidden_size: int, readouts: Sequence[tuple[int, int]] = ()) -> InitialGuess:
        """The guess saved in ``folder`` for a model of these sizes (``readouts``: the model's
        ``BlockStack.readout_sizes()``, for a guess that reads the state); a missing, damaged
        or mismatched file is a one-line DataError."""
        def build(tensors: dict[str, torch.Tensor]) -> InitialGuess:
            width = tensors["hidden.weight"].shape[0] if "hidden.weight" in tensors else GUESS_WIDTH
            reads_state = any(name.startswith("queries.") for name in tensors)
            return cls(hidden_size, width, readouts if reads_state else ())

        return _load_network(folder, GUESS_FILE, build, "the config's fixed_point.initial_guess is 'learned'")


class LearnedMixing(nn.Module):
    """(normalised Gram, history mask, least-squares weights, log residual fall) per sample,
    each in age order (0: the newest entry) -> (mixing weights summing to 1, damping), in
    the Gram matrix's dtype."""

    def __init__(self, memory: int, width: int = MIXING_WIDTH) -> None:
        super().__init__()
        self.memory, self.width = memory, width
        features = memory * memory + 2 * memory + 1
        self.hidden = nn.Linear(features, width)
        self.out = nn.Linear(width, memory + 1)
        nn.init.zeros_(self.out.weight)
        nn.init.zeros_(self.out.bias)

    def forward(self, gram: torch.Tensor, valid: torch.Tensor, weights: torch.Tensor,
                residual_fall: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        # In the iterate's precision (at least float32), as the least-squares weights are: a
        # float64 solve keeps its digits, and a sample's step does not depend on its batch.
        dtype = gram.dtype
        mask = valid.to(dtype)
        features = torch.cat([gram.flatten(1), mask, weights, residual_fall[:, None].to(dtype)], dim=1)
        hidden = nn.functional.linear(features, self.hidden.weight.to(dtype), self.hidden.bias.to(dtype))
        out = nn.functional.linear(nn.functional.gelu(hidden), self.out.weight.to(dtype), self.out.bias.to(dtype))
        correction = out[:, : self.memory] * mask
        correction = correction - mask * correction.sum(dim=1, keepdim=True) / mask.sum(dim=1, keepdim=True)
        # sigmoid(0) = 1/2: the untrained damping is exactly 1.
        return weights + correction, MAX_DAMPING * torch.sigmoid(out[:, self.memory])

    def save(self, folder: str | Path) -> None:
        """``MIXING_FILE`` and its digest in ``folder``."""
        _save_network(self, folder, MIXING_FILE, {"memory": str(self.memory), "width": str(self.width)})

    @classmethod
    def load(cls, folder: str | Path, memory: int, solver: str | None = None) -> LearnedMixing:
        """The mixing saved in ``folder`` for Anderson's history of ``memory`` entries;
        ``solver``: the config's solver that mixes by it, named where the file is missing. A
        missing, damaged or mismatched file is a one-line DataError."""
        def build(tensors: dict[str, torch.Tensor]) -> LearnedMixing:
            return cls(memory, tensors["hidden.weight"].shape[0] if "hidden.weight" in tensors else MIXING_WIDTH)

        return _load_network(folder, MIXING_FILE, build, f"the config's fixed_point names solver {solver!r}")


def _rms(x: torch.Tensor) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + 1e-6)


# ---------------------------------------------------------------- the networks' files


def _save_network(network: nn.Module, folder: str | Path, file: str, metadata: dict[str, str]) -> None:
    """``file`` and its digest (``file``.sha256) in ``folder``, each written whole or not at all."""
    folder = Path(folder)
    tensors = {name: tensor.detach().float().contiguous().cpu() for name, tensor in network.state_dict().items()}
    atomic_write(folder / file, lambda temporary: save_file(tensors, str(temporary), metadata=metadata))
    digest = file_sha256(folder / file)
    atomic_write(folder / f"{file}.sha256", lambda temporary: temporary.write_text(digest + "\n"))


def _load_network(folder: str | Path, file: str, build: Callable[[dict[str, torch.Tensor]], nn.Module],
                  needed_by: str) -> nn.Module:
    """The network saved as ``file`` in ``folder``, made by ``build(tensors)`` (which reads
    any size it needs off them) and filled with them, in evaluation mode and frozen.
    ``needed_by``: what asks for the file, named when it is missing."""
    path = Path(folder) / file
    if not path.is_file():
        raise DataError(f"{path}: missing, but {needed_by}")
    digest_file = Path(folder) / f"{file}.sha256"
    if not digest_file.is_file():
        raise DataError(f"{digest_file}: missing; {file} is not loaded unchecked")
    if file_sha256(path) != digest_file.read_text(encoding="utf-8", errors="replace").strip().lower():
        raise DataError(f"{path}: SHA-256 differs from {digest_file.name}: the file is damaged")
    try:
        tensors = load_file(str(path))
    except (SafetensorError, OSError, ValueError) as error:
        raise DataError(f"{path}: not a safetensors file ({str(error).splitlines()[0]})") from None
    for name, tensor in tensors.items():
        _check_tensor(path, name, tensor)
    network = build(tensors)
    expected = {name: tuple(tensor.shape) for name, tensor in network.state_dict().items()}
    found = {name: tuple(tensor.shape) for name, tensor in tensors.items()}
    if found != expected:
        raise DataError(f"{path}: tensors {json.dumps(found)}, but a model of these sizes needs {json.dumps(expected)}")
    network.load_state_dict(tensors)
    return network.eval().requires_grad_(False)


def _check_tensor(path: Path, name: str, tensor: torch.Tensor) -> None:
    """A tensor of a learned solver's file, as ``_save_network`` writes them: float32 weights of
    one or more dimensions, finite. A NaN mixing would only be caught, if at all, solve by solve."""
    if tensor.dtype != torch.float32:
        raise DataError(f"{path}: tensor {name} is {str(tensor.dtype).removeprefix('torch.')}; "
                        f"a learned solver's tensors are float32")
    if tensor.dim() == 0:
        raise DataError(f"{path}: tensor {name} is a scalar (0-d); a learned solver's tensors are weight matrices and vectors")
    if not bool(torch.isfinite(tensor).all()):
        raise DataError(f"{path}: tensor {name} holds NaN or Inf")
