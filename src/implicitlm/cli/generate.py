"""``implicitlm generate``: text from a language-model checkpoint, printed as it is decoded."""

from __future__ import annotations

import sys
from pathlib import Path

from .arguments import add_overwrite_option, positive_float, positive_int, seed, tokenizer_name
from .shared import (
    add_budget_options, add_device_option, add_dtype_option, add_solver_flags, check_model_paths, device_in_use,
    fixed_point_settings, print_device,
)

DESCRIPTION = (
    "Continue a prompt with a language model (a checkpoint, or a run folder's latest). The prompt is solved "
    "in --mode (one fixed point over the whole prompt by default), then each new token is one sequential "
    "step, as an RNN. The prompt is printed, then its continuation as it is decoded. Tokens are sampled (temperature 1, top-k 50, top-p 1) unless --greedy; --seed makes "
    "sampling repeatable."
)


def add_generate(commands) -> None:
    p = commands.add_parser("generate", help="continue a prompt with a language model, printing tokens as they come",
                            description=DESCRIPTION)
    p.add_argument("checkpoint", type=Path, help="checkpoint folder, or a run folder (its latest checkpoint)")
    prompt = p.add_mutually_exclusive_group(required=True)
    prompt.add_argument("--prompt", default=None, metavar="TEXT", help="the text to continue")
    prompt.add_argument("--prompt-file", default=None, metavar="FILE",
                        help="read the text to continue from FILE (UTF-8; its last line break is dropped); - for stdin")
    p.add_argument("--max-new-tokens", type=positive_int, default=None, help="tokens to generate at most (default: 100)")
    p.add_argument("--greedy", action="store_true", help="take the most likely token each step instead of sampling")
    p.add_argument("--temperature", type=positive_float, default=None, help="sampling temperature (default: 1)")
    p.add_argument("--top-k", type=positive_int, default=None, help="sample among the k most likely tokens (default: 50)")
    p.add_argument("--top-p", type=positive_float, default=None,
                   help="sample among the most likely tokens whose probabilities add up to p, in (0, 1] (default: 1)")
    p.add_argument("--seed", type=seed, default=None, help="seed of the sampling (default: a fresh one each run)")
    p.add_argument("--num-return-sequences", type=positive_int, default=1,
                   help="texts to sample for the prompt, separated by a line '---' (default: 1); more than a day "
                        "decodes here, timed on one, are refused before the first")
    p.add_argument("--mode", choices=["simultaneous", "sequential"], default="simultaneous",
                   help="how the prompt is solved: one fixed point over it, or token by token (default: simultaneous)")
    add_budget_options(p)
    add_solver_flags(p)
    p.add_argument("--tokenizer", type=tokenizer_name, default=None, help="tokenizer folder or hub name (default: the checkpoint's)")
    add_device_option(p)
    add_dtype_option(p)
    p.add_argument("--eager", action="store_true",
                   help="on a CUDA device, launch each token's kernels one by one instead of replaying the graph "
                        "captured of its passes (the default where they are fixed: an explicit model, or --passes K)")
    p.add_argument("--out", type=Path, default=None, help="also write the text to this file")
    add_overwrite_option(p, "a file already at --out")
    p.set_defaults(run=_run_generate, check=check_model_paths)


def _run_generate(args) -> None:
    from ..deq import ConvergenceTally, warn_not_converged
    from ..tasks.base import convergence_line
    from ..tasks.generation import DEFAULT_MAX_NEW_TOKENS, Decoding, generate_text, read_prompt

    prompt = args.prompt if args.prompt is not None else read_prompt(args.prompt_file)
    decoding = Decoding(
        max_new_tokens=args.max_new_tokens or DEFAULT_MAX_NEW_TOKENS, greedy=args.greedy, temperature=args.temperature,
        top_k=args.top_k, top_p=args.top_p, seed=args.seed, num_return_sequences=args.num_return_sequences,
    )
    device = device_in_use(args)

    def show(text: str) -> None:
        sys.stdout.write(text)
        sys.stdout.flush()

    convergence = ConvergenceTally()
    generate_text(args.checkpoint, prompt, decoding, tokenizer=args.tokenizer, mode=args.mode,
                  fixed_point=fixed_point_settings(args), dtype=args.dtype, device=device, on_text=show,
                  out=args.out, overwrite=args.overwrite, echo_prompt=True, cuda_graphs=False if args.eager else None,
                  convergence=convergence)
    # Once all is written: a refusal on the way, the --out file's included, stays one line.
    print_device(device, file=sys.stderr)
    # As an evaluation reports them: a warning where fixed points missed, and what they all came to.
    warn_not_converged(convergence, "generate")
    line = convergence_line(convergence.as_dict())
    if line is not None:
        print(line, file=sys.stderr)
