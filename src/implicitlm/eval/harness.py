"""lm-evaluation-harness adapter: an implicitlm checkpoint as the lm-eval model "implicitlm".

Importing this module registers the model with lm-eval (``import implicitlm`` alone does
not import lm-eval, which is heavy). ``implicitlm-lm-eval ARGS`` (or ``python -m
implicitlm.eval.lm_eval_command ARGS``) is lm-eval's own command line with the model registered
and the shipped local tasks included (``eval.lm_eval_command``)::

    implicitlm-lm-eval --model implicitlm \
        --model_args pretrained=CHECKPOINT,max_iter=96,mode=simultaneous --tasks hellaswag

Model arguments: ``pretrained`` (checkpoint folder, or a loaded model), ``tokenizer``
(folder or hub name; default: the one saved in the checkpoint folder), ``mode``
("simultaneous": the whole text as one fixed point; "sequential": token by token, as an
RNN), ``max_iter`` / ``tol`` (the fixed-point budget; default: the model's evaluation
budget), ``passes`` (exactly that many passes per solve instead, 0: solve to ``tol``; default:
the model's ``passes``), ``batch_size`` (a number, or "auto": the largest whose forward over the longest
texts fits in memory, probed from ``max_batch_size`` (default 64) down as lm-eval does),
``max_length`` (context window, default 2048: texts are cut from
the left), ``max_gen_toks``, ``device``, ``dtype``, ``share_contexts`` (default true: a context
that several loglikelihood requests continue, the choices of an item, is solved once and each
continuation goes on from its state; the scores equal solving each text whole, to the solver
tolerance).

Simultaneous batches are left-padded under an attention mask; sequential mode takes no
padding, so its batches hold texts of one length. Generation is ``model.generate``: the
prompt in ``mode`` (a parallel prefill by default), then one sequential step per token.
"""

from __future__ import annotations

import contextlib
import importlib
import logging
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

import torch
import torch.nn.functional as F
from lm_eval.api.model import TemplateLM
from lm_eval.api.registry import model_registry
from accelerate.utils import find_executable_batch_size
from lm_eval.utils import get_rolling_token_windows, make_disjoint_window, simple_parse_args_string
from tqdm.auto import tqdm

from ..core.devices import usable_device
from ..core.errors import OptionError, quoted
from ..deq import ConvergenceTally, FixedPointOptions, warn_not_converged
from ..models import ImplicitCausalLM, load_model
from ..models.loading import torch_dtype
from ..models.implicit_lm import MODES
from ..tasks.lm import model_tokenizer
from .harness_arguments import (
    AUTO_BATCH, batch_size_argument, boolean_argument, model_arguments, positive_int_argument,
)

MODEL_NAME = "implicitlm"
DEFAULT_MAX_LENGTH = 2048  # the paper's training context
DEFAULT_MAX_BATCH_SIZE = 64  # lm-eval's, for its own Hugging Face model


class ImplicitLMHarness(TemplateLM):
    """lm-eval's three request types on an implicit (or explicit) implicitlm model.

    ``loglikelihood``: (context, continuation) -> (sum of the continuation's token
    log-probabilities, whether greedy decoding would produce it); ``loglikelihood_rolling``:
    a whole text's log-probability in disjoint windows of ``max_length`` tokens;
    ``generate_until``: greedy (or sampled) text up to a stop string.
    """

    def __init__(
        self,
        pretrained: str | Path | ImplicitCausalLM,
        tokenizer: Any = None,
        mode: str = "simultaneous",
        max_iter: int | None = None,
        tol: float | None = None,
        passes: int | None = None,
        batch_size: int | str = 1,
        max_length: int | None = None,
        max_gen_toks: int = 256,
        device: str | None = "cpu",
        dtype: str | None = None,
        progress: bool = True,
        max_batch_size: int | None = None,
        share_contexts: bool = True,
        fixed_point: dict[str, Any] | None = None,
    ) -> None:
        """``batch_size="auto"`` (or lm-eval's "auto:N"): found once per request type by
        probing; the batches run longest first, so the size that fits the first fits all.
        ``share_contexts``: a context that several loglikelihood requests continue (the
        choices of an item) is solved once; False solves every context + continuation whole.
        ``fixed_point``: ``FixedPointOptions`` fields every forward changes the model's own by
        (``forward``'s argument; in Python only); the model's own are left as they are."""
        super().__init__()
        if mode not in MODES:
            raise OptionError(f"mode must be one of {', '.join(MODES)}; got {mode!r}")
        # Before the model loads, and so before any request runs or a result records them.
        FixedPointOptions.check_call_budget(max_iter, tol, training=False, passes=passes)
        device = _device(device)  # before the model loads: a device this machine lacks costs nothing
        # A checkpoint loads in ``dtype`` as every loader gives it (weights the family keeps in
        # float32 stay so); a model passed in is cast.
        if isinstance(pretrained, (str, Path)):
            self.model = load_model(pretrained, dtype)
        else:
            self.model = pretrained.to(dtype=torch_dtype(dtype))
        self.model.to(device=device).eval()
        if fixed_point is not None and not isinstance(fixed_point, dict):
            raise OptionError(f"fixed_point: a dict of FixedPointOptions fields, got {type(fixed_point).__name__}")
        self.fixed_point = self.model.fixed_point_options(fixed_point)  # checked before any request runs
        self.tokenizer = model_tokenizer(self.model, tokenizer, "tokenizer=")
        self.mode, self.max_iter, self.tol, self.passes = mode, max_iter, tol, passes
        self.batch_size = batch_size_argument(batch_size)
        # None, not 0, takes the default: a 0 given is refused.
        self.max_batch_size = positive_int_argument(
            "max_batch_size", DEFAULT_MAX_BATCH_SIZE if max_batch_size is None else max_batch_size
        )
        self.max_length = positive_int_argument("max_length", DEFAULT_MAX_LENGTH if max_length is None else max_length)
        self.max_gen_toks = positive_int_argument("max_gen_toks", max_gen_toks)
        self.progress = progress
        self.share_contexts = boolean_argument("share_contexts", share_contexts)
        self._device = self.model.device
        # Every request's fixed points, reported in the results' "config" (get_model_info).
        self.convergence = ConvergenceTally()

    @classmethod
    def create_from_arg_obj(cls, arg_dict: dict[str, Any], additional_config: dict | None = None):
        """lm-eval's ``--model_args`` and the flags it adds, checked (``harness_arguments``)."""
        return cls(**model_arguments(cls.__init__, arg_dict, additional_config))

    @classmethod
    def create_from_arg_string(cls, arg_string: str, additional_config: dict | None = None):
        return cls.create_from_arg_obj(simple_parse_args_string(arg_string), additional_config)

    def get_model_info(self) -> dict[str, Any]:
        """The settings lm-eval records in its results' "config" (the budget as used)."""
        options = self.fixed_point
        max_iter, tol = options.budget(self.max_iter, self.tol, self.mode)
        return {
            "model_name": self.model.name_or_path, "implicit": bool(self.model.config.implicit), "mode": self.mode,
            "max_iter": max_iter, "tol": tol, "passes": options.passes if self.passes is None else self.passes,
            "max_length": self.max_length,
            **(self.convergence.as_dict() if self.model.config.implicit else {}),
        }

    @property
    def _budget(self) -> dict[str, Any]:
        """The fixed-point budget every forward and generation of a request is given."""
        return dict(max_iter=self.max_iter, tol=self.tol, passes=self.passes, fixed_point=self.fixed_point)

    @property
    def eot_token_id(self) -> int:
        return self.tokenizer.eos_token_id

    @property
    def tokenizer_name(self) -> str:
        return self.tokenizer.name_or_path.replace("/", "__")

    def tok_encode(self, string: str, add_special_tokens: bool | None = None, **kwargs) -> list[int]:
        return self.tokenizer.encode(string, add_special_tokens=bool(add_special_tokens))

    def tok_decode(self, tokens: Sequence[int]) -> str:
        return self.tokenizer.decode(tokens, skip_special_tokens=True)

    def loglikelihood(self, requests, disable_tqdm: bool = False) -> list[tuple[float, bool]]:
        return super().loglikelihood(requests, disable_tqdm=disable_tqdm or not self.progress)

    def _loglikelihood_tokens(self, requests, disable_tqdm: bool = False, **kwargs) -> list[tuple[float, bool]]:
        """``requests``: (cache key, context tokens, continuation tokens). The model reads the
        last ``max_length`` tokens before the continuation's end and scores the continuation."""
        rows = []
        for _, context, continuation in requests:
            if len(continuation) > self.max_length:
                raise OptionError(f"a continuation of {len(continuation)} tokens exceeds max_length {self.max_length}")
            rows.append(((context + continuation)[-(self.max_length + 1):-1], continuation))
        shared = self._shared_contexts(requests)
        alone = sorted(set(range(len(rows))) - {i for members in shared.values() for i in members})
        results: list[tuple[float, bool] | None] = [None] * len(rows)
        batch_size = self._fitting_batch_size(max((len(inputs) for inputs, _ in rows), default=1))
        with self._tracked("loglikelihood"), \
                tqdm(total=len(rows), desc="loglikelihood", disable=disable_tqdm or not self.progress) as bar:
            for batch in self._batches(alone, batch_size, lambda i: len(rows[i][0])):
                batch = [alone[j] for j in batch]
                for i, result in zip(batch, self._score([rows[i] for i in batch])):
                    results[i] = result
                bar.update(len(batch))
            contexts = list(shared)
            for batch in self._batches(contexts, batch_size, len):
                members = [[(i, requests[i][2]) for i in shared[contexts[j]]] for j in batch]
                for i, result in self._score_after_contexts([list(contexts[j]) for j in batch], members, batch_size):
                    results[i] = result
                bar.update(sum(map(len, members)))
        for request, result in zip(requests, results):
            if request[0] is not None:
                self.cache_hook.add_partial("loglikelihood", request[0], result)
        return results

    def _shared_contexts(self, requests) -> dict[tuple[int, ...], list[int]]:
        """Context -> the requests that continue it, for contexts that two or more requests
        share (the choices of a multiple-choice item) and that fit the window whole with each
        of their continuations: those contexts are solved once, and every continuation goes on
        from the state the context's fixed point left."""
        groups: dict[tuple[int, ...], list[int]] = {}
        if not self.share_contexts:
            return groups
        for i, (_, context, continuation) in enumerate(requests):
            if context and continuation and len(context) + len(continuation) <= self.max_length + 1:
                groups.setdefault(tuple(context), []).append(i)
        return {context: members for context, members in groups.items() if len(members) > 1}

    @torch.no_grad()
    def _score_after_contexts(
        self, contexts: list[list[int]], members: list[list[tuple[int, list[int]]]], batch_size: int
    ) -> Iterator[tuple[int, tuple[float, bool]]]:
        """(request index, result) for every continuation of ``contexts``: a context's last
        position predicts a continuation's first token; the rest of it is read from the
        state the context left, which every continuation of that context starts from."""
        input_ids, attention_mask = self._left_padded(contexts)
        solved = self.model(
            input_ids, attention_mask=attention_mask, mode=self.mode, **self._budget,
            use_cache=True, logits_to_keep=1,
        )
        first = _log_probs(solved.logits[:, -1])
        rows = [(owner, i, continuation) for owner, group in enumerate(members) for i, continuation in group]
        for batch in self._batches(rows, batch_size, lambda row: len(row[2]) - 1):
            batch_rows = [rows[j] for j in batch]
            rest = self._continue_from(solved.state, [(owner, continuation) for owner, _, continuation in batch_rows])
            for (owner, i, continuation), (logprob, greedy) in zip(batch_rows, rest):
                head = first[owner, continuation[0]]
                yield i, (float(head) + logprob, bool(first[owner].argmax() == continuation[0]) and greedy)

    def _continue_from(self, state, rows: list[tuple[int, list[int]]]) -> list[tuple[float, bool]]:
        """Each continuation's tokens after its first, scored from state row ``owner``."""
        tails = [j for j, (_, continuation) in enumerate(rows) if len(continuation) > 1]
        scored = [(0.0, True)] * len(rows)  # a one-token continuation has nothing after its first
        if tails:
            input_ids, attention_mask = self._left_padded([rows[j][1][:-1] for j in tails])
            owners = torch.tensor([rows[j][0] for j in tails], device=input_ids.device)
            output = self.model(
                input_ids, attention_mask=attention_mask, state=self.model.stack.select_state(state, owners),
                mode=self.mode, **self._budget,
            )
            logprobs = _log_probs(output.logits)
            for row, j in enumerate(tails):
                scored[j] = _continuation_score(logprobs[row], rows[j][1][1:])
        return scored

    @contextlib.contextmanager
    def _tracked(self, requests: str):
        """Count the fixed points of the block into the run's total, and warn in one line
        if any of this block's stopped above the tolerance."""
        with self.model.track_convergence(self.convergence), self.model.track_convergence() as tally:
            yield
        if self.model.config.implicit:
            warn_not_converged(tally, f"lm-eval {requests} requests ({self.mode} mode)")

    @torch.no_grad()
    def _score(self, rows: list[tuple[list[int], list[int]]]) -> list[tuple[float, bool]]:
        input_ids, attention_mask = self._left_padded([inputs for inputs, _ in rows])
        # Only the continuations are scored: the head and the softmax over the rest of the
        # text would cost as much as a small model's blocks.
        scored_positions = max(1, max(len(continuation) for _, continuation in rows))
        output = self.model(
            input_ids, attention_mask=attention_mask, mode=self.mode, **self._budget,
            logits_to_keep=scored_positions,
        )
        logprobs = _log_probs(output.logits)
        return [_continuation_score(logprobs[row], continuation) for row, (_, continuation) in enumerate(rows)]

    def loglikelihood_rolling(self, requests, disable_tqdm: bool = False) -> list[float]:
        """Each text's log-probability after the eos token, every token predicted once."""
        windows, owners = [], []
        for owner, (text,) in enumerate(request.args for request in requests):
            rolling = get_rolling_token_windows(
                token_list=self.tok_encode(text), prefix_token=self.prefix_token_id,
                max_seq_len=self.max_length, context_len=1,
            )
            for context, continuation in map(make_disjoint_window, rolling):
                windows.append((None, context, continuation))
                owners.append(owner)
        totals = [0.0] * len(requests)
        for owner, (logprob, _) in zip(owners, self._loglikelihood_tokens(windows, disable_tqdm)):
            totals[owner] += logprob
        for request, total in zip(requests, totals):
            self.cache_hook.add_partial("loglikelihood_rolling", request.args, total)
        return totals

    def generate_until(self, requests, disable_tqdm: bool = False) -> list[str]:
        """Batches share their generation settings; the text is cut at the first stop string."""
        prompts = []
        for context, settings in (request.args for request in requests):
            settings = dict(settings)
            max_new = positive_int_argument("max_gen_toks", settings.pop("max_gen_toks", self.max_gen_toks))
            until = _stop_strings(settings.pop("until", None))
            if not settings.get("do_sample", False) or settings.get("temperature") == 0.0:
                # lm-eval's temperature 0 means greedy; transformers would reject it.
                settings = {k: v for k, v in settings.items() if k not in ("do_sample", "temperature")}
            keep = max(1, self.max_length - max_new)
            tokens = (self.tok_encode(context) or [self.prefix_token_id])[-keep:]
            prompts.append((tokens, max_new, until, settings))
        outputs: list[str | None] = [None] * len(prompts)
        batch_size = self._fitting_batch_size(max((len(tokens) + max_new for tokens, max_new, *_ in prompts), default=1))
        with self._tracked("generate_until"), \
                tqdm(total=len(prompts), desc="generate_until", disable=disable_tqdm or not self.progress) as bar:
            for batch in self._batches(prompts, batch_size, lambda p: len(p[0]), key=lambda p: repr(p[1:])):
                for i, text in zip(batch, self._generate([prompts[i] for i in batch])):
                    outputs[i] = text
                    self.cache_hook.add_partial("generate_until", requests[i].args, text)
                bar.update(len(batch))
        return outputs

    @torch.no_grad()
    def _generate(self, prompts: list[tuple[list[int], int, list[str], dict]]) -> list[str]:
        _, max_new, until, settings = prompts[0]
        input_ids, attention_mask = self._left_padded([tokens for tokens, *_ in prompts])
        generated = self.model.generate(
            input_ids, attention_mask=attention_mask, max_new_tokens=max_new, mode=self.mode,
            **self._budget, eos_token_id=self.eot_token_id, pad_token_id=self.eot_token_id,
            stop_strings=until or None, tokenizer=self.tokenizer if until else None, **settings,
        )
        texts = []
        for row in generated[:, input_ids.shape[1]:].tolist():
            if self.eot_token_id in row:
                row = row[: row.index(self.eot_token_id)]
            texts.append(_cut_at_first(self.tok_decode(row), until))
        return texts

    def _left_padded(self, rows: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
        """(ids, attention mask) with the rows right-aligned. The mask is given even when it
        is all ones: ``generate`` would otherwise guess one from the pad token, which is the
        eos token, and mask every eos inside a text."""
        width = max(map(len, rows))
        ids = torch.full((len(rows), width), self.eot_token_id, dtype=torch.long)
        mask = torch.zeros((len(rows), width), dtype=torch.long)
        for i, row in enumerate(rows):
            ids[i, width - len(row):] = torch.tensor(row, dtype=torch.long)
            mask[i, width - len(row):] = 1
        return ids.to(self.device), mask.to(self.device)

    def _fitting_batch_size(self, longest: int) -> int:
        """``batch_size``; for "auto", the first from ``max_batch_size`` down (accelerate's
        ``find_executable_batch_size``, as lm-eval's own model uses) whose simultaneous forward over ``longest`` tokens runs out of no memory
        (accelerate's probe). Simultaneous mode holds the most at once, and the solve
        without gradients holds the same whatever its iterations, so one iteration probes
        (``probe``: a convergence check must not fail a probe)."""
        if self.batch_size != AUTO_BATCH:
            return self.batch_size

        @find_executable_batch_size(starting_batch_size=self.max_batch_size)
        def probe(batch_size: int) -> int:
            ids = torch.full((batch_size, longest), self.eot_token_id, dtype=torch.long, device=self.device)
            with torch.no_grad():
                self.model(ids, mode="simultaneous", fixed_point=self.fixed_point, probe=True)
            return batch_size

        size = probe()
        logging.getLogger(__name__).info("batch_size auto: %d for texts of up to %d tokens", size, longest)
        return size

    def _batches(
        self, items: list, batch_size: int, length: Callable[[Any], int], key: Callable[[Any], str] = lambda item: ""
    ) -> Iterator[list[int]]:
        """Indices of ``items`` in batches of ``batch_size``, longest first (a batch too large
        for memory fails at once, not at the end); a batch shares ``key``, and in sequential
        mode also its length, since that mode takes no padding."""
        order = sorted(range(len(items)), key=lambda i: (key(items[i]), -length(items[i])))
        batch: list[int] = []
        for i in order:
            first = items[batch[0]] if batch else None
            if batch and (
                len(batch) == batch_size
                or key(items[i]) != key(first)
                or (self.mode == "sequential" and length(items[i]) != length(first))
            ):
                yield batch
                batch = []
            batch.append(i)
        if batch:
            yield batch


def _log_probs(logits: torch.Tensor) -> torch.Tensor:
    # At least float32: half-precision log-probabilities summed over a text drift.
    return F.log_softmax(logits.to(torch.promote_types(logits.dtype, torch.float32)), dim=-1)


def _continuation_score(logprobs: torch.Tensor, continuation: list[int]) -> tuple[float, bool]:
    """(sum of the log-probabilities of ``continuation``, whether greedy decoding gives it),
    read off one row's last ``len(continuation)`` positions: left padding puts every row's
    last real token at the end."""
    if not continuation:
        return 0.0, True  # nothing to predict: probability one
    predicted = logprobs[-len(continuation):]
    target = torch.tensor(continuation, device=predicted.device)
    logprob = predicted.gather(-1, target[:, None]).sum()
    return float(logprob), bool((predicted.argmax(-1) == target).all())


def _stop_strings(until: Any) -> list[str]:
    """A request's ``until``: a stop string or a list of them (None: none). An empty one
    would stop every text before its first character, so it is refused."""
    stops = [] if until is None else [until] if isinstance(until, str) else list(until)
    if not all(isinstance(stop, str) and stop for stop in stops):
        raise OptionError(f"until must list non-empty stop strings; got {quoted(until)}")
    return stops


def _cut_at_first(text: str, stops: list[str]) -> str:
    for stop in stops:
        text = text.split(stop, 1)[0]
    return text


def _device(name: str | None) -> torch.device:
    """``name``; the CPU for a CUDA device where there is none, since lm-eval's command line
    asks for cuda:0 unless told otherwise (as its own Hugging Face model does)."""
    device = usable_device(name, cuda_fallback=True)
    if device.type == "cpu" and name not in (None, "cpu"):
        logging.getLogger(__name__).warning("device %s: no CUDA device here, running on the CPU", name)
    return device


def _register() -> None:
    # lm-eval imports its built-in models only into an empty registry: imported after ours,
    # they would be missing.
    importlib.import_module("lm_eval.models")
    # By import path, as lm-eval registers its own models: resolved when a run asks for it.
    if MODEL_NAME not in model_registry:
        model_registry.register(MODEL_NAME, target=f"implicitlm.eval.harness:{ImplicitLMHarness.__name__}")


_register()
