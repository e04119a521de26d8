"""Causal LM around a backbone stack, explicit (one pass) or implicit (fixed point over depth).

The stack (a ``BlockStack`` of the family's ``block_class``) provides ``forward(z, u,
states)``, ``step(z_t, u_t, states)``, ``initial_state(batch, ...)``, ``select_state(states,
rows)``, ``replace_state_rows(states, rows, new)`` and a ``gradient_checkpointing`` flag;
this module adds embedding, injection, the two inference modes (the stack's passes in each:
``stack_passes``), the head and the loss, and generation through transformers'
``GenerationMixin``; it knows nothing else about the stack.

Implicit: u = Linear(RMSNorm(embed(x))); z* = f(z*, u) from z = 0 with f the stack.
Explicit: z = f(embed(x), None), once.
"""

from __future__ import annotations

import contextlib
import functools
import os
from typing import Callable, Iterator

import torch
import torch.nn.functional as F
from torch import nn
from transformers import GenerationMixin, PreTrainedModel

from ..core.atomic_io import following_umask, writing
from ..core.errors import OptionError
from ..core.file_digests import write_model_digests
from ..core.log_lines import without_log_lines, without_progress_bar
from ..core.run_folder import refuse_model_target
from ..deq import ConvergenceTally, FixedPointOptions, FixedPointSolver, warn_not_converged
from ..layers import RMSNorm
from .argument_checks import (
    MODES, check_forward_inputs, check_generation_arguments, check_position_ids, check_token_ids, kept_positions,
    left_aligned, pads_after_real_tokens, transformers_options,
)
from .learned_solver import InitialGuess, LearnedMixing, LearnedSolver
from .loss import token_cross_entropy
from .output import ImplicitLMOutput
from .stack import BlockStack
from .stack_passes import StackPasses, checked_options
from .token_graphs import TokenGraphs
from .weight_cache import weights_once


# transformers' warning that a right-padded batch generates wrong text: here it does not, the
# prefill reading each row with its padding moved to the left (prepare_inputs_for_generation).
RIGHT_PADDING_WARNING = "A decoder-only architecture is being used, but right-padding was detected"


class ImplicitCausalLM(PreTrainedModel, GenerationMixin):
    base_model_prefix = "model"
    # A recurrent state cannot be rolled back to an earlier token, so transformers refuses
    # the generation modes that would need it (assisted decoding).
    _is_stateful = True
    supports_gradient_checkpointing = True

    # Each family's block: built from the config, with an ``injection_size`` (the width of u).
    block_class: type[nn.Module]
    # loading.load_pretrained, given by models/__init__.py: it reads the families' table, built on this class.
    pretrained_loader: Callable[..., PreTrainedModel]

    def __init__(self, config) -> None:
        # The stack draws its random initialisation first, the embeddings after: the order
        # a seed has always given, so a seed gives the same model as before.
        stack = BlockStack(self.block_class, config)
        super().__init__(config)
        self.embeddings = nn.Embedding(config.padded_vocab_size, config.hidden_size)
        self.stack = stack
        if config.implicit:
            self.injection_norm = RMSNorm(config.hidden_size, eps=config.layer_norm_epsilon)
            self.injection = nn.Linear(config.hidden_size, self.stack.layers[0].injection_size, bias=False)
        if not config.tie_word_embeddings:
            self.lm_head = nn.Linear(config.hidden_size, config.padded_vocab_size, bias=False)
        # A plain object, not a module: the guess and mixing it holds stay out of the weights (learned_solver.py).
        self.learned_solver = LearnedSolver()
        # The stack's passes in each mode, a plain object too: it adds no weights (stack_passes.py).
        self.stack_passes = StackPasses(stack, config, self.learned_solver, self.learned_solver.solver(config.fixed_point_options))
        self._tallies: list[ConvergenceTally] = []
        # The token steps of the ``decoding_graphs`` block the model is in (None: none).
        self._token_graphs: TokenGraphs | None = None
        # What the last ``generate()`` call's fixed points did (ConvergenceTally.as_dict).
        self.generation_convergence: dict[str, float] | None = None
        self.post_init()

    @classmethod
    def _supports_default_dynamic_cache(cls) -> bool:
        # The recurrent state travels as the stack's own per-layer objects (``state``),
        # not as a transformers Cache.
        return False

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path: str | os.PathLike, *model_args, **kwargs):
        """transformers' ``from_pretrained``, with the checks of ``loading.load_pretrained``: a
        directory's config, weights' digest, weight names, shapes and values and its
        generation config; a run folder loads its latest checkpoint. Called on this class,
        the family the config names is loaded."""
        return cls.pretrained_loader(cls, pretrained_model_name_or_path, model_args, kwargs)

    def save_pretrained(self, save_directory: str | os.PathLike, is_main_process: bool = True, **kwargs) -> None:
        """transformers' ``save_pretrained``, and the SHA-256 of the weights, the config and a
        tokenizer beside them, which ``load_model`` checks: whoever saves a model (a checkpoint,
        an import, a user) writes them. A file where the folder should be, or a folder that
        links elsewhere (a training run's), is refused (``run_folder.refuse_model_target``).
        Without transformers' "Writing model shards" bar: a save takes a moment, and a caller
        that turned progress off (``progress=False``, ``--no-progress``) gets no bar from it."""
        refuse_model_target(save_directory)
        with writing(save_directory, "the model"), following_umask(save_directory), without_progress_bar():
            super().save_pretrained(save_directory, is_main_process=is_main_process, **kwargs)
        if is_main_process:
            write_model_digests(save_directory)
            self.learned_solver.save(save_directory)

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

    @property
    def solver(self) -> FixedPointSolver:
        """The solver of every solve: the passes' (one home, replaced whole by the methods below)."""
        return self.stack_passes.solver

    def fixed_point_options(self, fixed_point: FixedPointOptions | dict | None = None) -> FixedPointOptions:
        """The options a call given ``fixed_point`` (``forward``'s argument) solves with, checked."""
        return self.stack_passes.with_options(fixed_point).solver.options

    def set_fixed_point_options(self, **changes) -> None:
        """Change the model's fixed-point options, the default of every call (a curriculum phase's,
        a checkpoint's as shipped); one call's own are its ``fixed_point`` argument. A budget of
        passes is refused on an explicit model, which has none to spend."""
        options = checked_options(self.config, self.solver.options.replace(**changes))
        self.config.fixed_point = options.to_dict()
        self.stack_passes.solver = self.learned_solver.solver(options)

    @torch.no_grad()
    def solve_fixed_point(self, input_ids: torch.Tensor, max_iter: int | None = None, tol: float | None = None):
        """An implicit model's input embeddings, fixed point z* (before the head) and the solve's
        stats for ``input_ids``, by an inference solve in simultaneous mode with this budget, to
        the tolerance whatever ``passes`` says: what a learned solver is fitted to."""
        self._require_fixed_point(input_ids)
        stack_passes = self.stack_passes
        budget = stack_passes.call_budget("simultaneous", max_iter, tol, passes=0)
        with weights_once(self):
            embedded = self.embeddings(input_ids)
            z, stats, _ = stack_passes.simultaneous(embedded, self._injected(embedded), None, None, False, budget,
                                                    stack_passes.chunk_length(None))
        return embedded, z, stats

    @contextlib.contextmanager
    def fixed_point_map(self, input_ids: torch.Tensor) -> Iterator[tuple[torch.Tensor, Callable]]:
        """(input embeddings, f) for ``input_ids``: f(z) is one pass of the stack over the whole
        sequence from no state, the map whose fixed point ``solve_fixed_point`` finds (a
        learned mixing is fitted on a solver's iterates of it). Valid inside the block. f records
        a graph where autograd is on (a gradient in z: the weights are the caller's to freeze)."""
        self._require_fixed_point(input_ids)
        with weights_once(self):
            with torch.no_grad():
                embedded = self.embeddings(input_ids)
                stack_map = self.stack_passes.stack_map(self._injected(embedded), None, None)
            yield embedded, lambda z: stack_map(z)[0]

    @contextlib.contextmanager
    def token_maps(self, input_ids: torch.Tensor, fixed_point: torch.Tensor, positions: list[int]):
        """Per position t of ``positions``: (token t's embedding, f_t, read_t) with f_t(z) the
        stack's step for token t from the state its fixed points ``fixed_point`` (of
        ``input_ids``) left before it: the map of sequential mode's solve for token t; and
        read_t that state's ``BlockStack.read_state``, as a learned guess reads it. Valid
        inside the block; as ``fixed_point_map``'s, the maps record a graph where autograd is on."""
        self._require_fixed_point(input_ids)
        with weights_once(self):
            with torch.no_grad():
                embedded = self.embeddings(input_ids)
                injection = self._injected(embedded)
                # The state before token t: one parallel pass over the fixed points of tokens < t.
                before = {t: self.stack(fixed_point[:, :t], injection[:, :t], None, None)[1] if t > 0 else
                          self.stack.initial_state(input_ids.shape[0], embedded.device, embedded.dtype)
                          for t in positions}

            def token_map(t: int):
                return lambda z: self.stack.step(z, injection[:, t], before[t])[0]

            yield [(embedded[:, t], token_map(t), functools.partial(self.stack.read_state, before[t]))
                   for t in positions]

    @torch.no_grad()
    def state_reader(self, embedded: torch.Tensor, fixed_point: torch.Tensor):
        """Per-block queries (b, l, width) -> per-block readouts of the state before every token
        that the fixed points ``fixed_point`` of these input embeddings leave
        (``BlockStack.state_reader``): what a learned guess that reads the state is fitted on.
        The readouts carry gradients to the queries."""
        return self.stack.state_reader(fixed_point, self._injected(embedded))

    def _require_fixed_point(self, input_ids: torch.Tensor) -> None:
        if not self.config.implicit:
            raise OptionError("an explicit model has no fixed point")
        check_token_ids(input_ids, self.config.vocab_size)

    def _injected(self, embedded: torch.Tensor) -> torch.Tensor | None:
        """The injection u of an implicit model (None for an explicit one)."""
        return self.injection(self.injection_norm(embedded)) if self.config.implicit else None

    def _apply(self, fn, *args, **kwargs):
        # Every move of the model (``to``, ``cuda``, ...) takes its learned guess and mixing along.
        super()._apply(fn, *args, **kwargs)
        self.learned_solver.to(self.device)
        return self

    @property
    def learned_guess(self) -> InitialGuess | None:
        """The learned initial guess the model holds (``learned_solver``; None: none)."""
        return self.learned_solver.guess

    @property
    def learned_mixing(self) -> LearnedMixing | None:
        """The learned mixing the model holds (``learned_solver``; None: none)."""
        return self.learned_solver.mixing

    def attach_learned_guess(self, guess: InitialGuess | None, use: bool | None = True) -> None:
        """Keep ``guess`` with the model (saved beside its weights; None: none) and, with ``use``,
        start every inference solve from it; None: as the options say (``LearnedSolver.attach_guess``)."""
        self.learned_solver.attach_guess(self, guess, use)

    def attach_learned_mixing(self, mixing: LearnedMixing | None) -> None:
        """Keep ``mixing`` with the model (saved beside its weights; None: none), the mixing of
        every solve by a solver that mixes by one, such as "learned_anderson"."""
        self.learned_solver.attach_mixing(self, mixing)

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

    @contextlib.contextmanager
    def decoding_graphs(self, capture: bool | None = None) -> Iterator[None]:
        """Inside the block, a forward of one token in sequential mode from a state, without
        gradients, whose passes are fixed (an explicit model, or ``passes`` K), runs as one
        captured CUDA graph (``token_graphs.py``): what decoding a token costs at batch 1 is
        then the GPU's work, not its kernels' launches. Its ``state`` is the graph's buffers, and
        its ``fixed_point`` stats, until the next such forward. ``capture``: record graphs
        (default: on a CUDA model); False runs the same buffers eagerly. The weights are
        computed once for the whole block: the graphs read them where they are."""
        capture = self.device.type == "cuda" if capture is None else capture
        if capture and self.device.type != "cuda":
            raise OptionError(f"CUDA graphs need a model on a CUDA device; this one is on {self.device.type}")
        outer = self._token_graphs
        with weights_once(self):
            self._token_graphs = TokenGraphs(capture)
            try:
                yield
            finally:
                self._token_graphs = outer

    def generate(self, *args, cuda_graphs: bool | None = None, **kwargs):
        """transformers' ``generate``; for an implicit model, the convergence of the prefill
        and of every decoded token is kept in ``generation_convergence`` and a share that
        stopped above the tolerance is warned about in one line (unless a caller tracking
        convergence around this call reports it itself). ``cuda_graphs``: decode each token
        from a captured graph where its passes are fixed (``decoding_graphs``; default: on a
        CUDA model; True on a CPU runs the graphs' buffers eagerly). A batch of prompts padded
        on either side gives each prompt's text alone (``prepare_inputs_for_generation``).
        ``fixed_point``: the options of every forward of this generation, as ``forward`` takes
        them; the model's own are left as they are."""
        check_generation_arguments(self.generation_config, args, kwargs)
        if isinstance(kwargs.get("fixed_point"), dict):
            kwargs["fixed_point"] = self.fixed_point_options(kwargs["fixed_point"])  # checked once, not per token
        caller_tracks = bool(self._tallies)
        graphs = self.device.type == "cuda" if cuda_graphs is None else cuda_graphs
        # The weight-normalised weights once per generation, not once per token: a token's
        # step is small enough that computing them again was a twentieth of its time.
        decoding = self.decoding_graphs(capture=self.device.type == "cuda") if graphs else weights_once(self)
        with self.track_convergence() as tally, decoding, without_log_lines("transformers.generation.utils", RIGHT_PADDING_WARNING):
            output = super().generate(*args, **kwargs)
        if self.config.implicit:
            self.generation_convergence = tally.as_dict()
            if not caller_tracks:
                warn_not_converged(tally, "generate")
        return output

    @property
    def accepts_loss_kwargs(self) -> bool:
        # transformers' Trainer then passes ``num_items_in_batch``, counted over
        # labels[..., 1:] for a causal LM: right for shifted labels only, so word-problem
        # models (aligned labels) keep the per-micro-batch mean.
        return self.config.label_alignment == "shifted"

    def forward(
        self,
        input_ids: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        mode: str = "simultaneous",
        max_iter: int | None = None,
        tol: float | None = None,
        state: list | None = None,
        use_cache: bool = False,
        return_dict: bool | None = None,
        inputs_embeds: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        output_hidden_states: bool | None = None,
        logits_to_keep: int | torch.Tensor = 0,
        chunk_length: int | None = None,
        passes: int | None = None,
        fixed_point: FixedPointOptions | dict | None = None,
        probe: bool = False,
        **kwargs,
    ) -> ImplicitLMOutput | tuple:
        """``mode``: "simultaneous" (parallel over the sequence) or "sequential" (token by
        token, as an RNN). ``max_iter`` / ``tol`` override the solver budget of this call;
        ``passes``: exactly that many passes per solve instead (0: to ``tol``; default the
        solver options' ``passes``; ``deq/passes.py``); in training, an unroll of that many
        passes from z = 0 in place of the phase's solve (the few-pass stage's forward).
        ``state``: the recurrent state to continue from (a previous output's ``state``);
        ``use_cache``: return the state after the last token (sequential mode always does).
        ``return_dict=False``: a tuple instead, as transformers' convention has it.
        ``inputs_embeds``: (b, l, hidden_size) in place of ``input_ids``.
        ``position_ids``: accepted where they are the positions the model uses anyway (see
        ``check_position_ids``). ``output_hidden_states``: also return every block's input
        and the stack's output (one more pass of the stack). ``logits_to_keep``: logits of
        the last N positions only (0: all), or of the positions a 1-d tensor lists, as
        transformers' models take it; ``generate`` asks for the last one.
        ``chunk_length``: in an evaluation in simultaneous mode, solve in chunks of this
        many tokens, carrying the state (0: the whole sequence; default the solver options'
        ``chunk_length``); the output's ``fixed_point`` then describes each sample's chunks together.
        ``fixed_point``: this call's fixed-point options, whole or as changes to the model's
        (``FixedPointOptions`` fields: ``solver``, ``initial_guess``, ``retry_depth`` ...); the
        model's own are left as they are. ``probe``: a memory or time probe, each solve stopped at
        its first pass (``StackPasses.call_budget``).
        ``kwargs``: transformers' per-call options (``TransformersKwargs``); the loss honours
        ``num_items_in_batch``, and options this model cannot honour are refused."""
        num_items_in_batch = transformers_options(kwargs)
        check_forward_inputs(self, input_ids, inputs_embeds, attention_mask, state, labels)
        stack_passes = self.stack_passes.with_options(fixed_point)
        padding = None if attention_mask is None or bool(attention_mask.all()) else attention_mask.bool()
        if mode not in MODES:
            raise OptionError(f"mode must be one of {MODES}, got {mode!r}")
        budget = stack_passes.call_budget(mode, max_iter, tol, passes, probe)
        if mode == "sequential" and self.training and torch.is_grad_enabled():
            raise OptionError("sequential mode is for inference; training runs in simultaneous mode")
        if mode == "sequential" and padding is not None:
            # Refused rather than ignored: a recurrent state silently fed padding is wrong.
            raise OptionError("padded batches run in simultaneous mode (prefill); sequential mode takes real tokens only")
        if use_cache and padding is not None and pads_after_real_tokens(padding):
            raise OptionError("the state returned (use_cache=True) would hold the padding after a row's real tokens: "
                              "pad on the left (a tokenizer's padding_side='left'); generate() moves it there itself")
        if position_ids is not None:
            check_position_ids(position_ids, padding, continues=state is not None)
        if output_hidden_states is None:
            output_hidden_states = self.config.output_hidden_states
        graphed = None
        if self._token_graphs is not None and mode == "sequential" and not (output_hidden_states or labels is not None
                                                                              or inputs_embeds is not None):
            graphed = self._token_graphs.token(self, stack_passes, input_ids, state, budget)
        if graphed is not None:
            (logits, stats, new_state), hidden_states = graphed, None
        else:
            with weights_once(self):
                embedded = self.embeddings(input_ids) if inputs_embeds is None else inputs_embeds
                injection = self._injected(embedded)
                if mode == "sequential":
                    z, stats, new_state = stack_passes.sequential(embedded, injection, state, budget)
                else:
                    z, stats, new_state = stack_passes.simultaneous(
                        embedded, injection, state, padding, use_cache, budget, stack_passes.chunk_length(chunk_length))
                hidden_states = stack_passes.hidden_states(embedded, injection, z, state, padding) if output_hidden_states else None
                logits = self._logits(z[:, kept_positions(logits_to_keep, labels)])
        if stats is not None:
            for tally in self._tallies:
                tally.add(stats)
        loss = None
        if labels is not None:
            loss = token_cross_entropy(logits, labels, self.config.label_alignment, num_items_in_batch)
        output = ImplicitLMOutput(
            loss=loss, logits=logits, fixed_point=stats, state=new_state,
            hidden_states=hidden_states
        )
        return output.to_tuple() if return_dict is False else output

    def _logits(self, z: torch.Tensor) -> torch.Tensor:
        head = self.embeddings.weight if self.config.tie_word_embeddings else self.lm_head.weight
        return F.linear(z, head)[..., : self.config.vocab_size]

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
        inputs_embeds: torch.Tensor | None = None,
        output_hidden_states: bool = False,
        logits_to_keep: int | torch.Tensor = 0,
        chunk_length: int | None = None,
        passes: int | None = None,
        fixed_point: FixedPointOptions | dict | None = None,
        probe: bool = False,
        **unused,
    ) -> dict:
        """What ``generate()`` feeds each forward: the prompt whole, in ``mode`` (parallel prefill by
        default); then each new token alone, in sequential mode (its own fixed point, as an RNN) from
        the state the previous call returned, which holds what the attention mask said about the
        prompt, so decoding takes no mask. A ``state`` given to ``generate()`` continues an earlier
        run: the tokens given are the ones after it, fed in sequential mode. A prompt padded on the
        right (or with gaps) is read with its padding moved to the left (``left_aligned``), as each
        row alone; the sequences returned keep it where it was given. ``max_iter`` / ``tol`` /
        ``passes`` / ``fixed_point`` / ``probe``: every forward's, ``chunk_length`` the prefill's, as
        ``forward`` takes them; ``use_cache=False`` re-reads the whole sequence at every token
        instead. ``inputs_embeds`` stand for the prompt in the first forward (transformers'
        convention), ``input_ids`` for it afterwards."""
        budget = dict(max_iter=max_iter, tol=tol, passes=passes, fixed_point=fixed_point, probe=probe, use_cache=use_cache,
                      output_hidden_states=output_hidden_states, logits_to_keep=logits_to_keep)
        if state is None:
            name, prompt = ("input_ids", input_ids) if inputs_embeds is None or not is_first_iteration else ("inputs_embeds", inputs_embeds)
            attention_mask, prompt = left_aligned(attention_mask, prompt)
            return {"attention_mask": attention_mask, "mode": mode, "chunk_length": chunk_length, name: prompt, **budget}
        new_tokens = input_ids if is_first_iteration else input_ids[:, -1:]
        return dict(input_ids=new_tokens, state=state, mode="sequential", **budget)

    def _update_model_kwargs_for_generation(self, outputs, model_kwargs: dict, *args, **kwargs) -> dict:
        """Carry the recurrent state from each forward to the next. transformers carries its
        own ``Cache`` objects under one name (``cache`` since 5.24; a list of older names,
        ``state`` among them, before); a state under a name of the model's own is the model's
        to carry, as transformers' RWKV does it."""
        if outputs.get("state") is not None:
            model_kwargs["state"] = outputs["state"]
        return super()._update_model_kwargs_for_generation(outputs, model_kwargs, *args, **kwargs)

    def _reorder_cache(self, state: list, beam_index: torch.Tensor) -> list:
        """The state of the beams kept (beam search)."""
        return self.stack.select_state(state, beam_index)
