"""``implicitlm solver train``: fitting a model's learned solver (``models/learned_solver.py``:
a learned initial guess and a learned mixing of the safeguarded-Anderson steps) to a trained
implicit checkpoint. ``fit`` runs it: the frozen model's tight solves, the guess fitted in
``guess_fit``, the mixing in ``mixing_fit``, where each mode starts and which solver mixes
its steps chosen on a held-out batch in ``comparison``, an interrupted fit kept in
``progress``, and the save."""

from .fit import RECORD, train_learned_solver

__all__ = ["RECORD", "train_learned_solver"]
