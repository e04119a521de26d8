"""``implicitlm-lm-eval``: lm-eval's own command line, every flag as ``lm_eval`` takes it, with
the model ``implicitlm`` registered and the shipped local tasks (``eval.lm_eval_tasks``)
included beside any ``--include_path``::

    implicitlm-lm-eval --model implicitlm --model_args pretrained=RUN,max_iter=32 \
        --tasks piqa_local,hellaswag_local --metadata data_dir=/data/downstream --batch_size 8

lm-eval releases have no hook for a model defined outside them, so this command is how a
user runs lm-eval on an implicitlm checkpoint; an error of this package's (a bad model
argument, a missing data file) is one line and exit code 2, as in ``implicitlm``.
"""

from __future__ import annotations

import contextlib
import sys
from typing import Iterator, Sequence

from ..core.devices import check_device_name
from ..core.errors import ImplicitLMError
from .downstream import quiet_lm_eval_notes

PROG = "implicitlm-lm-eval"


def main() -> int:
    """``implicitlm-lm-eval``: lm-eval's command line on ``sys.argv``."""
    return run_command()


def run_command(argv: Sequence[str] | None = None) -> int:
    """lm-eval's command line on ``argv`` (default: ``sys.argv[1:]``); the exit code."""
    from lm_eval._cli.harness import HarnessCLI
    from lm_eval.utils import setup_logging

    from . import harness  # noqa: F401  (registers the model "implicitlm")

    setup_logging()
    cli = HarnessCLI()
    with _arguments(argv):
        args = cli.parse_args()  # lm-eval's parser reads sys.argv (and inserts "run" where none is named)
    if hasattr(args, "include_path"):
        args.include_path = _with_local_tasks(args)
    try:
        _check_devices(args)
        with quiet_lm_eval_notes():
            cli.execute(args)
    except ImplicitLMError as error:
        print(f"{PROG}: error: {str(error).splitlines()[0] if str(error) else type(error).__name__}", file=sys.stderr)
        return 2
    return 0


def _check_devices(args) -> None:
    """The devices ``--device`` and ``--model_args`` name for this package's model, by name,
    before lm-eval reads its tasks and loads the model (a minute): a name that nothing runs on
    is refused now, not met then as a traceback."""
    from .harness import MODEL_NAME

    if getattr(args, "model", None) != MODEL_NAME:
        return
    model_args = getattr(args, "model_args", None)
    given = model_args.get("device") if isinstance(model_args, dict) else None
    for name in (getattr(args, "device", None), given):
        if name is not None:
            check_device_name(name)


@contextlib.contextmanager
def _arguments(argv: Sequence[str] | None) -> Iterator[None]:
    saved = sys.argv
    sys.argv = [PROG, *(sys.argv[1:] if argv is None else argv)]
    try:
        yield
    finally:
        sys.argv = saved


def _with_local_tasks(args) -> list[str]:
    """The shipped task folder, then the folder ``--include_path`` (or a ``--config`` file) gives."""
    from .lm_eval_tasks import LOCAL_TASKS_DIR

    given = args.include_path
    if given is None and getattr(args, "config", None):
        from lm_eval.config.evaluate_config import EvaluatorConfig

        given = EvaluatorConfig.load_yaml_config(args.config).get("include_path")
    return [str(LOCAL_TASKS_DIR), *([] if given is None else [given] if isinstance(given, str) else given)]


if __name__ == "__main__":
    sys.exit(main())
