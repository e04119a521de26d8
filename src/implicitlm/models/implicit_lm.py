"""Causal LM around a backbone stack, explicit (one pass) or implicit (fixed point over depth).

A stack provides ``forward(z, u, states)``, ``step(z_t, u_t, states)``,
``initial_state(batch, ...)``, ``select_state(states, rows)`` and a
``gradient_checkpointing`` flag; this module adds embedding, injection, the two inference
modes, the head and the loss, and generation through transformers' ``GenerationMixin``;
it knows nothing else about the stack.

Implicit: u = Linear(RMSNorm(embed(x))); z* = f(z*, u) from z = 0 with f the stack.
Explicit: z = f(embed(x), None), once.
"""

from __future__ import annotations

import contextlib
from typing import Iterator

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.utils import parametrize
from transformers import GenerationMixin, PreTrainedModel

from ..deq import ConvergenceTally, FixedPointSolver, solve_sequence, warn_not_converged
from ..layers import RMSNorm
from .loss import token_cross_entropy
from .output import ImplicitLMOutput

MODES = ("simultaneous", "sequential")


class ImplicitCausalLM(PreTrainedModel, GenerationMixin):
    base_model_prefix = "model"
    # A recurrent state cannot be rolled back to an earlier token, so transformers refuses
    # the generation modes that would need it (assisted decoding).
    _is_stateful = True
    supports_gradient_checkpointing = True

    def __init__(self, config, stack: nn.Module, injection_size: int) -> None:
        super().__init__(config)
        self.embeddings = nn.Embedding(config.padded_vocab_size, config.hidden_size)
        self.stack = stack
        if config.implicit:
            self.injection_norm = RMSNorm(config.hidden_size, eps=config.layer_norm_epsilon)
            self.injection = nn.Linear(config.hidden_size, injection_size, bias=False)
        if not config.tie_word_embeddings:
            self.lm_head = nn.Linear(config.hidden_size, config.padded_vocab_size, bias=False)
        self.solver = FixedPointSolver(config.fixed_point_options)
        self._tallies: list[ConvergenceTally] = []
        # What the last ``generate()`` call's fixed points did (ConvergenceTally.as_dict).
        self.generation_convergence: dict[str, float] | None = None
        self.post_init()

    @classmethod
    def _supports_default_dynamic_cache(cls) -> bool:
        # The recurrent state travels as the stack's own per-layer objects (``state``),
        # not as a transformers Cache.
        return False

    def _init_weights(self, module: nn.Module) -> None:
        if isinstance(module, nn.Embedding) or module is getattr(self, "lm_head", None):
            nn.init.normal_(module.weight, mean=0.0, std=self.config.initializer_range)

    def get_input_embeddings(self) -> nn.Embedding:
        return self.embeddings

    def set_input_embeddings(self, value: nn.Embedding) -> None:
        self.embeddings = value

    def get_output_embeddings(self) -> nn.Linear | None:
        # Tied: the head is the embedding matrix itself (by construction, not by copy), so
        # there is no separate module for transformers to tie.
        return None if self.config.tie_word_embeddings else self.lm_head

    def set_fixed_point_options(self, **changes) -> None:
        """Change solver options in place (curriculum phases, evaluation budgets)."""
        options = self.solver.options.replace(**changes)
        self.config.fixed_point = options.to_dict()
        self.solver = FixedPointSolver(options)

    @contextlib.contextmanager
    def track_convergence(self, tally: ConvergenceTally | None = None) -> Iterator[ConvergenceTally]:
        """Count, over every forward inside the block, the fixed points that stopped above
        the tolerance (none for explicit models): evaluations report it beside their scores.
        ``tally``: one to add to (e.g. a total over several blocks); a fresh one by default."""
        tally = ConvergenceTally() if tally is None else tally
        self._tallies.append(tally)
        try:
            yield tally
        finally:
            self._tallies.remove(tally)

    def generate(self, *args, **kwargs):
        """transformers' ``generate``; for an implicit model, the convergence of the prefill
        and of every decoded token is kept in ``generation_convergence`` and a share that
        stopped above the tolerance is warned about in one line (unless a caller tracking
        convergence around this call reports it itself)."""
        caller_tracks = bool(self._tallies)
        with self.track_convergence() as tally:
            output = super().generate(*args, **kwargs)
        if self.config.implicit:
            self.generation_convergence = tally.as_dict()
            if not caller_tracks:
                warn_not_converged(tally, "generate")
        return output

    def forward(
        self,
        input_ids: torch.Tensor,
        labels: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        mode: str = "simultaneous",
        max_iter: int | None = None,
        tol: float | None = None,
        state: list | None = None,
        use_cache: bool = False,
        return_dict: bool | None = None,
    ) -> ImplicitLMOutput | tuple:
        """``mode``: "simultaneous" (parallel over the sequence) or "sequential" (token by
        token, as an RNN). ``max_iter`` / ``tol`` override the solver budget of this call.
        ``state``: the recurrent state to continue from (a previous output's ``state``);
        ``use_cache``: return the state after the last token (sequential mode always does).
        ``return_dict=False``: a tuple instead, as transformers' convention has it."""
        padding = None if attention_mask is None or bool(attention_mask.all()) else attention_mask.bool()
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
        if mode == "sequential" and self.training and torch.is_grad_enabled():
            raise ValueError("sequential mode is for inference; training runs in simultaneous mode")
        if mode == "sequential" and padding is not None:
            # Refused rather than ignored: a recurrent state silently fed padding is wrong.
            raise ValueError("padded batches run in simultaneous mode (prefill); sequential mode takes real tokens only")
        with self._weights_once_per_forward():
            embedded = self.embeddings(input_ids)
            if mode == "sequential":
                z, stats, state = self._sequential(embedded, state, max_iter, tol)
            else:
                z, stats, state = self._simultaneous(embedded, state, padding, use_cache, max_iter, tol)
            head = self.embeddings.weight if self.config.tie_word_embeddings else self.lm_head.weight
            logits = F.linear(z, head)[..., : self.config.vocab_size]
        if stats is not None:
            for tally in self._tallies:
                tally.add(stats)
        loss = None
        if labels is not None:
            loss = token_cross_entropy(logits, labels, self.config.label_alignment)
        output = ImplicitLMOutput(loss=loss, logits=logits, fixed_point=stats, state=state)
        return output.to_tuple() if return_dict is False else output

    @contextlib.contextmanager
    def _weights_once_per_forward(self):
        """The weight-normalised weights computed once per forward, not once per iteration.

        Not under activation checkpointing: its recomputation in the backward pass runs
        outside this forward, where the cache is gone, so it would compute the weights
        itself and no longer replay the forward it stands for.
        """
        if self.stack.gradient_checkpointing:
            yield
            return
        with parametrize.cached():
            _fill_parametrization_cache(self)
            yield

    def _simultaneous(self, embedded: torch.Tensor, state, padding, use_cache: bool, max_iter, tol):
        if not self.config.implicit:
            z, state = self.stack(embedded, None, state, padding)
            return z, None, state
        injection = self.injection(self.injection_norm(embedded))
        z, stats = self.solver(
            self._stack_map(injection, state, padding),
            torch.zeros_like(embedded),
            training=self.training,
            max_iter=max_iter,
            tol=tol,
            # Samples already converged are left out of the remaining iterations.
            restrict=lambda rows: self._stack_map(
                injection.index_select(0, rows),
                None if state is None else self.stack.select_state(state, rows),
                None if padding is None else padding.index_select(0, rows),
            ),
        )
        if use_cache:
            # The state the sequence leaves behind is the one read off its fixed point: one
            # more pass at z*, as the sequential mode commits each token's state.
            state = self.stack(z, injection, state, padding)[1]
        return z, stats, state if use_cache else None

    def _stack_map(self, injection: torch.Tensor, state, padding):
        """z -> f(z, u): one pass of the stack over the sequence."""
        keep = None if padding is None else padding.unsqueeze(-1).to(injection.dtype)

        def f(z: torch.Tensor) -> torch.Tensor:
            z = self.stack(z, injection, state, padding)[0]
            # Padding positions held at 0: exactly fixed, so they neither count in a
            # sample's residual nor delay its convergence.
            return z if keep is None else z * keep

        return f

    def _sequential(self, embedded: torch.Tensor, state, max_iter: int | None, tol: float | None):
        batch, length, _ = embedded.shape
        if state is None:
            state = self.stack.initial_state(batch, embedded.device, embedded.dtype)
        if not self.config.implicit:
            outputs = []
            for t in range(length):
                z_t, state = self.stack.step(embedded[:, t], None, state)
                outputs.append(z_t)
            return torch.stack(outputs, dim=1), None, state
        options = self.solver.options
        injection = self.injection(self.injection_norm(embedded))
        z, state, stats = solve_sequence(
            self.stack.step,
            injection,
            state,
            self.solver,
            self.config.hidden_size,
            max_iter=options.eval_f_max_iter if max_iter is None else max_iter,
            tol=options.eval_f_tol if tol is None else tol,
            select_rows=self.stack.select_state,
        )
        return z, stats, state

    def prepare_inputs_for_generation(
        self,
        input_ids: torch.Tensor,
        state: list | None = None,
        attention_mask: torch.Tensor | None = None,
        mode: str = "simultaneous",
        max_iter: int | None = None,
        tol: float | None = None,
        use_cache: bool = True,
        is_first_iteration: bool = False,
        **unused,
    ) -> dict:
        """What ``generate()`` feeds each forward: the prompt whole, in ``mode`` (parallel
        prefill by default); then each new token alone, in sequential mode (its own fixed
        point, as an RNN) from the state the previous call returned. That state already
        holds what the attention mask said about the prompt, so decoding takes no mask.
        A ``state`` given to ``generate()`` continues an earlier run: the tokens given are
        the ones after it, fed in sequential mode. ``max_iter`` / ``tol`` set the solver
        budget (the evaluation budget by default); ``use_cache=False`` re-reads the whole
        sequence at every token instead."""
        budget = dict(max_iter=max_iter, tol=tol, use_cache=use_cache)
        if state is None:
            return dict(input_ids=input_ids, attention_mask=attention_mask, mode=mode, **budget)
        new_tokens = input_ids if is_first_iteration else input_ids[:, -1:]
        return dict(input_ids=new_tokens, state=state, mode="sequential", **budget)

    def _reorder_cache(self, state: list, beam_index: torch.Tensor) -> list:
        """The state of the beams kept (beam search)."""
        return self.stack.select_state(state, beam_index)


def _fill_parametrization_cache(model: nn.Module) -> None:
    """Compute every parametrised weight now, while autograd records (if it is on at all).

    The cache fills on first access; if that first access were inside the no-grad
    fixed-point solve, the phantom-gradient steps would reuse weights without history and
    the backbone would never receive a gradient.
    """
    for module in model.modules():
        if parametrize.is_parametrized(module):
            for name in module.parametrizations:
                getattr(module, name)
