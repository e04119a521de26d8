"""The passes of the backbone stack that a forward of ``ImplicitCausalLM`` makes in each mode:
an explicit model's one pass; an implicit model's fixed point over the whole sequence at once
(in training with phantom gradients, in evaluation optionally in chunks, retrying the rows
that missed the tolerance in shorter chunks, ``retry_depth`` times at most) or token by
token, as an RNN; each solve one call of the model's solver with the call's ``Budget``: to a
tolerance, or exactly K passes (in an evaluation, per solve in either mode; in training, the
unroll)."""

from __future__ import annotations

import copy
import math

import torch

from ..core.errors import OptionError
from ..deq import Budget, FixedPointOptions, FixedPointSolver, KeptState, chain_chunks, solve_sequence, with_retried_rows
from .learned_solver import LearnedSolver

# Why an explicit model takes no budget of passes.
EXPLICIT_PASSES = "an explicit model makes one pass of its stack, there is nothing to iterate"


def checked_options(config, options: FixedPointOptions) -> FixedPointOptions:
    """``options`` for a model of ``config``: a budget of passes refused on an explicit model,
    which has none to spend."""
    if options.passes and not config.implicit:
        raise OptionError(f"passes={options.passes}: {EXPLICIT_PASSES}", arguments=("passes",))
    return options


class StackPasses:
    """A model's passes (``ImplicitCausalLM.stack_passes``): held by the model, not a module of
    it, so its weights and their names are the model's alone.

    It holds what it reads and nothing else: the ``stack`` it runs, the model's ``config``, the
    ``learned_solver`` its inference solves start from and the ``solver``, which the model hands
    it anew whenever it replaces its own (``ImplicitCausalLM.solver`` is this one). The training
    flag is the stack's: ``train()`` / ``eval()`` of the model set it on every submodule. No
    reference back to the model: none keeps a dropped model alive, and a deep copy of a model
    copies its passes onto the copy's stack. A caller that swaps a model's stack swaps it here too."""

    def __init__(self, stack, config, learned_solver: LearnedSolver, solver: FixedPointSolver) -> None:
        self.stack, self.config, self.learned_solver, self.solver = stack, config, learned_solver, solver
        # The solver of the last call's own options, and the model's solver it was built beside:
        # a generation hands every token's forward the same options, built into a solver once.
        self._call_solver: tuple[FixedPointOptions, FixedPointSolver, FixedPointSolver] | None = None

    @property
    def training(self) -> bool:
        return self.stack.training

    def with_options(self, fixed_point: FixedPointOptions | dict | None) -> StackPasses:
        """These passes with the fixed-point options of one call: ``fixed_point`` whole, or the
        model's changed by those fields (None or empty: these passes themselves). The model's own
        options, the default of every other call, are left as they are."""
        if not fixed_point:
            return self
        options = fixed_point if isinstance(fixed_point, FixedPointOptions) else self.solver.options.replace(**fixed_point)
        cached = self._call_solver
        if cached is None or cached[0] != options or cached[1] is not self.solver:
            # Built again when the model's own solver was replaced: its learned mixing may have changed.
            cached = self._call_solver = (options, self.solver,
                                          self.learned_solver.solver(checked_options(self.config, options)))
        call = copy.copy(self)
        call.solver = cached[2]
        return call

    def call_budget(self, mode: str, max_iter=None, tol=None, passes=None, probe: bool = False) -> Budget:
        """The ``Budget`` of a call in ``mode`` given its ``max_iter``, ``tol`` and ``passes`` (None:
        the options' own), each held to the rule ``set_fixed_point_options`` holds the option it
        stands in for to. In training, ``passes`` K is an unroll of K passes from z = 0 without
        the phase's Jacobian penalty (the few-pass stage's forward); else the phase's own solve.
        A ``passes`` asked of an explicit model, which has nothing to iterate, is refused.
        ``probe``: a call that probes the memory or time a batch takes: each solve stops at its
        first pass (a solve without gradients holds as much whatever its passes), to an infinite
        tolerance, so that it counts as converged and no convergence check fails a probe; an
        unroll keeps its passes, its graph holding every one."""
        FixedPointOptions.check_call_budget(max_iter, tol, training=self.training, passes=passes)
        if passes and not self.config.implicit:
            raise OptionError(f"passes={passes}: {EXPLICIT_PASSES}")
        if self.training:
            budget = Budget.unrolled(passes, self.solver.options.train_tol) if passes else self.solver.budget(
                "training", max_iter, tol)
        else:
            budget = self.solver.budget(mode, max_iter, tol, passes)
        if probe and budget.kind != "unrolled":
            return Budget.to_tolerance(math.inf, 1, budget.jacobian_penalty)
        return budget

    def chunk_length(self, chunk_length: int | None) -> int:
        """The chunk length of this call's simultaneous solve; 0: the whole sequence. Only an
        implicit model's evaluation chunks: training differentiates through one solve."""
        if chunk_length is None:
            chunk_length = self.solver.options.chunk_length
        elif isinstance(chunk_length, bool) or not isinstance(chunk_length, int) or chunk_length < 0:
            raise OptionError(f"chunk_length must be a non-negative integer (0: the whole sequence); got {chunk_length!r}")
        return chunk_length if self.config.implicit and not self.training else 0

    def simultaneous(self, embedded: torch.Tensor, injection, state, padding, use_cache: bool, budget: Budget,
                     chunk_length: int):
        """(z, the solve's stats, the state after the tokens) of the tokens ``embedded`` (an
        implicit model's injection ``injection``) from ``state``, all at once: the stack's one pass
        (explicit) or its fixed point within ``budget``, in chunks of ``chunk_length`` (0: the
        whole sequence), each chunk's solve with the whole budget; a budget of passes is never
        checked nor retried. The state (with ``use_cache``, else None) carries the last fixed
        point where a learned guess starts the next call (``LearnedSolver``)."""
        if not self.config.implicit:
            z, state = self.stack(embedded, None, state, padding)
            return z, None, state
        z, stats, state = self._simultaneous(embedded, injection, state, padding, use_cache, budget, chunk_length)
        return z, stats, self.learned_solver.with_last_fixed_point(self.solver.options, state, z)

    def _simultaneous(self, embedded: torch.Tensor, injection, state, padding, use_cache: bool, budget: Budget,
                      chunk_length: int, depth: int = 0):
        """An implicit model's ``simultaneous``. ``depth``: 0, or how many halvings of the chunk
        length down this solve is, a retry inside a chunked solve whose convergence the outer
        solve checks once all its retries are done (``nonconvergence="error"``)."""
        # A learned guess reads the fixed point before each chunk's first token, where it is known:
        # the previous chunk's last one, or the one a state this model returned carries.
        previous = getattr(state, "last_fixed_point", None)
        if not chunk_length:
            return self._solve(embedded, injection, state, padding, use_cache, budget, check=True, previous=previous)
        # The fixed point is causal: a chunk's tokens are settled by what precedes them, which
        # the state read off the previous chunk's fixed point carries. Chunks are counted
        # back from the end (the first one is the partial one): under left padding, every
        # row's real tokens then fall into the same chunks as they would alone, whatever the
        # padding, so a row's answer does not depend on its batch.
        length = embedded.shape[1]
        bounds = [0, *range(length % chunk_length or chunk_length, length + 1, chunk_length)]
        pieces, chunk_stats = [], []
        for start, end in zip(bounds, bounds[1:]):
            part = slice(start, end)
            chunk = (embedded[:, part], injection[:, part], None if padding is None else padding[:, part])
            keep_state = use_cache or end < length
            solved = self._solve(*chunk[:2], state, chunk[2], keep_state, budget, check=False, previous=previous)
            if not budget.fixed and depth < self.solver.options.retry_depth:
                solved = self._retry_missed(chunk, state, solved, keep_state, budget, depth + 1)
            z, stats, state = solved
            pieces.append(z)
            previous = z[:, -1]
            chunk_stats.append(stats)
        stats = chain_chunks(chunk_stats)
        if not (depth or budget.fixed):
            self.solver.require_convergence(stats, budget.passes, "samples")
        return torch.cat(pieces, dim=1), stats, state

    def _retry_missed(self, chunk, state, solved, keep_state: bool, budget: Budget, depth: int):
        """The rows of a chunk that missed the tolerance, solved again from the same state in
        chunks of half its length (the retry at ``depth``), those that miss again at half that
        while ``retry_depth`` allows, down to single tokens at most (where a simultaneous solve
        is the sequential mode's token solve): tokens iterated together may cycle where they
        settle one after another. Only those rows run again; each keeps whichever of its two
        solves ended nearer its fixed point (lower residual)."""
        z, stats, next_state = solved
        embedded, injection, padding = chunk
        missed = (~stats.converged).nonzero().flatten()
        length = embedded.shape[1]
        if length == 1 or len(missed) == 0:
            return solved
        rows = [None if t is None else t.index_select(0, missed) for t in (embedded, injection, padding)]
        z_rows, retry, state_rows = self._simultaneous(
            rows[0], rows[1], None if state is None else self.stack.select_state(state, missed), rows[2],
            keep_state, budget, chunk_length=length // 2, depth=depth,
        )
        better = retry.residual < stats.residual.index_select(0, missed)
        improved = missed[better]
        if keep_state:
            kept = self.stack.select_state(state_rows, better.nonzero().flatten())
            next_state = self.stack.replace_state_rows(next_state, improved, kept)
        return z.index_copy(0, improved, z_rows[better]), with_retried_rows(stats, missed, retry, better), next_state

    def _solve(self, embedded: torch.Tensor, injection, state, padding, use_cache: bool, budget: Budget, check: bool,
               previous: torch.Tensor | None = None):
        """One simultaneous solve over the given tokens, from ``state``, within ``budget``.
        ``check=False``: an evaluation solve whose convergence its caller checks (a chunk, which
        may be retried). ``previous``: the fixed point before the first token, where it is known
        (a learned guess reads it). With ``use_cache``, the state the tokens leave behind: an
        evaluation keeps it from the pass that gave each sample's answer, as sequential mode does
        per token; training reads it off the fixed point in one more pass, after the
        phantom-gradient steps."""
        z0 = torch.zeros_like(embedded) if self.training else self.learned_solver.first_iterate(
            self.solver.options, self.stack, embedded, previous, state)
        kept = KeptState(self._stack_state_map(injection, state, padding), self.stack.select_state,
                         self.stack.replace_state_rows)
        if self.training:
            z, stats = self.solver(kept.f, z0, budget, phase="training", restrict=kept.restrict)
            if use_cache:
                state = self.stack(z, injection, state, padding)[1]
            return z, stats, state if use_cache else None
        z, stats = self.solver(kept.f, z0, budget, phase="simultaneous", restrict=kept.restrict,
                               on_improved=kept.improved if use_cache else None)
        if check and not budget.fixed:
            self.solver.require_convergence(stats, budget.passes, "samples")
        return z, stats, kept.state if use_cache else None

    def _stack_state_map(self, injection: torch.Tensor, state, padding):
        """rows (None: all) -> z -> (f(z, u), the state after the pass), on those rows."""
        def on_rows(rows: torch.Tensor | None):
            if rows is None:
                return self.stack_map(injection, state, padding)
            return self.stack_map(
                injection.index_select(0, rows),
                None if state is None else self.stack.select_state(state, rows),
                None if padding is None else padding.index_select(0, rows),
            )

        return on_rows

    def stack_map(self, injection: torch.Tensor, state, padding):
        """z -> (f(z, u), the state after the pass): one pass of the stack over the sequence."""
        keep = None if padding is None else padding.unsqueeze(-1).to(injection.dtype)

        def f(z: torch.Tensor):
            z, states = self.stack(z, injection, state, padding)
            # Padding positions held at 0: exactly fixed, so they neither count in a
            # sample's residual nor delay its convergence.
            return (z if keep is None else z * keep), states

        return f

    def sequential(self, embedded: torch.Tensor, injection, state, budget: Budget):
        """``simultaneous``'s (z, stats, state after the tokens), token by token, as an RNN: each
        token's own solve within ``budget`` from the state the previous one left."""
        batch, length, _ = embedded.shape
        # A state this model returned carries its last token's fixed point, which a learned
        # guess reads for the first token here (a decoding step's one token).
        previous = getattr(state, "last_fixed_point", None)
        if state is None:
            state = self.stack.initial_state(batch, embedded.device, embedded.dtype)
        if not self.config.implicit:
            outputs = []
            for t in range(length):
                z_t, state = self.stack.step(embedded[:, t], None, state)
                outputs.append(z_t)
            return torch.stack(outputs, dim=1), None, state
        token_guess = self.learned_solver.token_guess(self.solver.options, self.stack, embedded, previous)
        z, state, stats = solve_sequence(
            self.stack.step, injection, state, self.solver, self.config.hidden_size, budget,
            select_rows=self.stack.select_state, replace_rows=self.stack.replace_state_rows, initial_guess=token_guess,
        )
        return z, stats, self.learned_solver.with_last_fixed_point(self.solver.options, state, z)

    def hidden_states(self, embedded, injection, z, state, padding) -> tuple[torch.Tensor, ...]:
        """Every block's input and the stack's output, from one more pass of the stack: at
        the fixed point z* for an implicit model (its output f(z*) is replaced by z*
        itself, what the head reads); over the embeddings for an explicit one. A pass over
        the whole sequence from the state the call began with equals the token-by-token
        steps, so sequential mode gets the same from it."""
        collected: list[torch.Tensor] = []
        if self.config.implicit:
            self.stack(z, injection, state, padding, hidden_states=collected)
            collected[-1] = z
        else:
            self.stack(embedded, None, state, padding, hidden_states=collected)
        return tuple(collected)
