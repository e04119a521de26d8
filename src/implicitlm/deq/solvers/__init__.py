"""The one table of fixed-point solvers: every name a config's ``fixed_point``, ``--solver``
or a Python call may give, and the iterate generator behind it.

torchdeq's own pattern (``torchdeq.solver``: one ``_solvers`` table, ``register_solver``,
``get_solver``), with our solvers one module each: plain iteration (``plain_iteration``),
safeguarded Anderson (``anderson``) and learned Anderson (``learned_anderson``), beside
torchdeq's Anderson and Broyden. The options' ``SOLVERS`` are this table's names.

A solver is called as ``solver(f, x0=..., max_iter=..., tol=..., stop_mode=...,
learned_mixing=...)`` and ignores the keywords it has no use for, as torchdeq's do: only
learned Anderson reads the checkpoint's mixing.
"""

from __future__ import annotations

import functools
from typing import Callable

from torchdeq import solver as torchdeq_solvers

from ...core.errors import OptionError
from ..learned_mixing import LearnedMixing
from .anderson import safeguarded_anderson
from .learned_anderson import learned_anderson
from .plain_iteration import plain_iteration

_solvers: dict[str, Callable] = {}


def register_solver(name: str, solver: Callable) -> None:
    """Add ``solver`` to the table as ``name``. The options take the names registered when
    ``deq.options`` is first imported, which imports this module: the ones below."""
    _solvers[name] = solver


def get_solver(name: str, mixing: LearnedMixing | None = None) -> Callable:
    """The iterate generator registered as ``name``, given the learned mixing (None: the model
    has none, which only "learned_anderson" refuses, at its first solve)."""
    if name not in _solvers:
        raise OptionError(f"unknown solver {name!r}; known: {', '.join(_solvers)}")
    return functools.partial(_solvers[name], learned_mixing=mixing)


def solver_names() -> tuple[str, ...]:
    """The registered names, in the order they were registered."""
    return tuple(_solvers)


register_solver("fixed_point_iter", plain_iteration)
register_solver("anderson", torchdeq_solvers.get_solver("anderson"))
register_solver("broyden", torchdeq_solvers.get_solver("broyden"))
register_solver("safeguarded_anderson", safeguarded_anderson)
register_solver("learned_anderson", learned_anderson)
