"""Causal LM around a backbone stack, explicit (one pass) or implicit (fixed point over depth).

A stack provides ``forward(z, u, states)``, ``step(z_t, u_t, states)`` and
``initial_state(batch, ...)``; this module adds embedding, injection, the two inference
modes, the tied head and the loss, and knows nothing else about the stack.

Implicit: u = Linear(RMSNorm(embed(x))); z* = f(z*, u) from z = 0 with f the stack.
Explicit: z = f(embed(x), None), once.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.utils import parametrize
from transformers import PreTrainedModel

from ..deq import FixedPointSolver, solve_sequence
from ..layers import RMSNorm
from .loss import token_cross_entropy
from .output import ImplicitLMOutput

MODES = ("simultaneous", "sequential")


class ImplicitCausalLM(PreTrainedModel):
    base_model_prefix = "model"

    def __init__(self, config, stack: nn.Module, injection_size: int) -> None:
        super().__init__(config)
        self.embeddings = nn.Embedding(config.padded_vocab_size, config.hidden_size)
        self.stack = stack
        if config.implicit:
            self.injection_norm = RMSNorm(config.hidden_size, eps=config.layer_norm_epsilon)
            self.injection = nn.Linear(config.hidden_size, injection_size, bias=False)
        self.solver = FixedPointSolver(config.fixed_point_options)
        self.post_init()

    def _init_weights(self, module: nn.Module) -> None:
        if isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, mean=0.0, std=self.config.initializer_range)

    def get_input_embeddings(self) -> nn.Embedding:
        return self.embeddings

    def set_input_embeddings(self, value: nn.Embedding) -> None:
        self.embeddings = value

    def get_output_embeddings(self) -> None:
        # The head is the embedding matrix itself (tied by construction, not by copy).
        return None

    def set_fixed_point_options(self, **changes) -> None:
        """Change solver options in place (curriculum phases, evaluation budgets)."""
        options = self.solver.options.replace(**changes)
        self.config.fixed_point = options.to_dict()
        self.solver = FixedPointSolver(options)

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
    ) -> ImplicitLMOutput:
        """``mode``: "simultaneous" (parallel over the sequence) or "sequential" (token by
        token, as an RNN). ``max_iter`` / ``tol`` override the solver budget of this call.
        ``state``: the recurrent state to continue from (a previous output's ``state``);
        ``use_cache``: return the state after the last token (sequential mode always does)."""
        padding = None if attention_mask is None or bool(attention_mask.all()) else attention_mask.bool()
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
        if mode == "sequential" and self.training and torch.is_grad_enabled():
            raise ValueError("sequential mode is for inference; training runs in simultaneous mode")
        if mode == "sequential" and padding is not None:
            # Refused rather than ignored: a recurrent state silently fed padding is wrong.
            raise ValueError("padded batches run in simultaneous mode (prefill); sequential mode takes real tokens only")
        # The weight-normalised weights are computed once per forward, not once per iteration.
        with parametrize.cached():
            _fill_parametrization_cache(self)
            embedded = self.embeddings(input_ids)
            if mode == "sequential":
                z, stats, state = self._sequential(embedded, state, max_iter, tol)
            else:
                z, stats, state = self._simultaneous(embedded, state, padding, use_cache, max_iter, tol)
            logits = F.linear(z, self.embeddings.weight)[..., : self.config.vocab_size]
        loss = None
        if labels is not None:
            loss = token_cross_entropy(logits, labels, self.config.label_alignment)
        return ImplicitLMOutput(loss=loss, logits=logits, fixed_point=stats, state=state)

    def _simultaneous(self, embedded: torch.Tensor, state, padding, use_cache: bool, max_iter, tol):
        if not self.config.implicit:
            z, state = self.stack(embedded, None, state, padding)
            return z, None, state
        injection = self.injection(self.injection_norm(embedded))
        keep = None if padding is None else padding.unsqueeze(-1).to(embedded.dtype)

        def f(z: torch.Tensor) -> torch.Tensor:
            z = self.stack(z, injection, state, padding)[0]
            # Padding positions held at 0: exactly fixed, so they neither count in a
            # sample's residual nor delay its convergence.
            return z if keep is None else z * keep

        z, stats = self.solver(
            f,
            torch.zeros_like(embedded),
            training=self.training,
            max_iter=max_iter,
            tol=tol,
        )
        if use_cache:
            # The state the sequence leaves behind is the one read off its fixed point: one
            # more pass at z*, as the sequential mode commits each token's state.
            state = self.stack(z, injection, state, padding)[1]
        return z, stats, state if use_cache else None

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
        )
        return z, stats, state


    @torch.no_grad()
    def generate(
        self,
        input_ids: torch.Tensor,
        max_new_tokens: int = 20,
        attention_mask: torch.Tensor | None = None,
        do_sample: bool = False,
        temperature: float = 1.0,
        top_k: int | None = None,
        eos_token_id: int | None = None,
        max_iter: int | None = None,
        tol: float | None = None,
        generator: torch.Generator | None = None,
    ) -> torch.Tensor:
        """Prompt + up to ``max_new_tokens`` tokens, shape (B, L + new).

        The prompt is prefilled in simultaneous mode (parallel over the prompt); each new
        token is then decoded in sequential mode, as an RNN: its own fixed point, reading
        and then committing the recurrent state. Explicit models take one pass per token.
        Sequences that emit ``eos_token_id`` are padded with it while the others go on.
        Prompts of different lengths are left-padded, with ``attention_mask`` 0 on padding.
        Runs with the evaluation budget (``max_iter`` / ``tol`` override it).
        """
        if max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
        was_training = self.training
        self.eval()
        try:
            out = self(
                input_ids, attention_mask=attention_mask, mode="simultaneous", use_cache=True, max_iter=max_iter, tol=tol
            )
            finished = torch.zeros(input_ids.shape[0], dtype=torch.bool, device=input_ids.device)
            tokens = [input_ids]
            for position in range(max_new_tokens):
                next_token = _choose(out.logits[:, -1], do_sample, temperature, top_k, generator)
                if eos_token_id is not None:
                    next_token = torch.where(finished, eos_token_id, next_token)
                    finished |= next_token == eos_token_id
                tokens.append(next_token[:, None])
                if position == max_new_tokens - 1 or bool(finished.all()):
                    break
                out = self(next_token[:, None], mode="sequential", state=out.state, max_iter=max_iter, tol=tol)
        finally:
            self.train(was_training)
        return torch.cat(tokens, dim=1)


def _choose(
    logits: torch.Tensor, do_sample: bool, temperature: float, top_k: int | None, generator: torch.Generator | None
) -> torch.Tensor:
    """Greedy argmax, or a sample from softmax(logits / temperature) over the top k."""
    if not do_sample:
        return logits.argmax(-1)
    if temperature <= 0:
        raise ValueError(f"temperature must be positive, got {temperature}")
    logits = logits.float() / temperature
    if top_k is not None:
        threshold = torch.topk(logits, min(top_k, logits.shape[-1]), dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < threshold, float("-inf"))
    return torch.multinomial(torch.softmax(logits, dim=-1), 1, generator=generator)[:, 0]


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
