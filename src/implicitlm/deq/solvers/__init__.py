"""The one table of fixed-point solvers: every name a config's ``fixed_point``, ``--solver``
or a Python call may give, and the iterate generator behind it.

torchdeq's own pattern (``torchdeq.solver``: one ``_solvers`` table, ``register_solver``,
``get_solver``), with our solvers one module each: plain iteration (``plain_iteration``),
safeguarded Anderson (``anderson``) and learned Anderson (``learned_anderson``), beside
torchdeq's Anderson and Broyden. The options' ``SOLVERS`` are this table's names.

A solver is called as ``solver(f, x0=..., max_iter=..., tol=..., stop_mode=...,
learned_mixing=...)`` and ignores the keywords it has no use for, as torchdeq's do. The table
also records which solvers mix their steps by a model's learned mixing, and the solver that
runs in each one's place where there is none (``without_mixing``): what a model, run or
loader asks of a solver's name, never the name itself.
"""

from __future__ import annotations

import functools
from typing import Callable

from torchdeq import solver as torchdeq_solvers

from ...core.errors import OptionError
from .anderson import Mixing, safeguarded_anderson
from .learned_anderson import learned_anderson
from .plain_iteration import plain_iteration

_solvers: dict[str, Callable] = {}
# A solver that mixes its steps by the learned mixing -> the solver run in its place without one.
_without_mixing: dict[str, str] = {}


def register_solver(name: str, solver: Callable, without_mixing: str | None = None) -> None:
    """Add ``solver`` to the table as ``name``. The options take the names registered when
    ``deq.options`` is first imported, which imports this module: the ones below.
    ``without_mixing``: for a solver that mixes its steps by the model's learned mixing, the
    registered solver that solves in its place where the model has none (a run from weights
    the mixing was not fitted to, or while one is fitted); None: it uses no mixing."""
    _solvers[name] = solver
    if without_mixing is not None:
        _without_mixing[name] = without_mixing


def get_solver(name: str, mixing: Mixing | None = None) -> Callable:
    """The iterate generator registered as ``name``, given the learned mixing (None: the model
    has none, which a solver that needs one refuses at its first solve, not here: a model is
    built before its mixing is loaded)."""
    _require_known(name)
    if mixing is None and needs_mixing(name):
        return functools.partial(_refuse_without_mixing, name)
    return functools.partial(_solvers[name], learned_mixing=mixing)


def needs_mixing(name: str) -> bool:
    """Whether the solver ``name`` mixes its steps by the model's learned mixing."""
    _require_known(name)
    return name in _without_mixing


def without_mixing(name: str) -> str:
    """The solver that solves in ``name``'s place where the model has no learned mixing:
    ``name`` itself where it needs none."""
    _require_known(name)
    return _without_mixing.get(name, name)


def solver_names() -> tuple[str, ...]:
    """The registered names, in the order they were registered."""
    return tuple(_solvers)


def _require_known(name: str) -> None:
    if name not in _solvers:
        raise OptionError(f"unknown solver {name!r}; known: {', '.join(_solvers)}")


def _refuse_without_mixing(name: str, *args, **options) -> None:
    raise OptionError(f"solver {name!r}, but this model has no learned mixing (implicitlm solver train makes one)",
                      arguments=("solver",))


register_solver("fixed_point_iter", plain_iteration)
register_solver("anderson", torchdeq_solvers.get_solver("anderson"))
register_solver("broyden", torchdeq_solvers.get_solver("broyden"))
register_solver("safeguarded_anderson", safeguarded_anderson)
register_solver("learned_anderson", learned_anderson, without_mixing="safeguarded_anderson")
