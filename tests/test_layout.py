"""The layout's rules that hold today: one exception base, and the bottom layers importing
only downward (``core`` nothing of implicitlm; ``deq`` and ``layers`` only ``core``)."""

from __future__ import annotations

import ast
import importlib
import inspect
import pkgutil
from pathlib import Path

import pytest

import implicitlm
from implicitlm.core import ImplicitLMError

SOURCE = Path(implicitlm.__file__).parent
# Package -> the implicitlm packages it may import besides itself.
MAY_IMPORT = {"core": set(), "deq": {"core"}, "layers": {"core"}}
# Not errors a user meets: the solver's way to end its own loop.
INTERNAL = {"_SolveDone"}


def implicitlm_imports(path: Path) -> set[str]:
    """The top-level implicitlm packages a module imports, relative imports resolved."""
    package = path.relative_to(SOURCE).parts[:-1]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - node.level + 1]
                target = [*base, *(node.module.split(".") if node.module else [])]
            elif node.module and node.module.split(".")[0] == "implicitlm":
                target = node.module.split(".")[1:]
            else:
                continue
            if node.module is None and node.level:  # from . import x: x are modules of base
                target = [*base, *(alias.name for alias in node.names[:1])]
            if target:
                found.add(target[0])
        elif isinstance(node, ast.Import):
            found |= {alias.name.split(".")[1] for alias in node.names if alias.name.startswith("implicitlm.")}
    return found


@pytest.mark.parametrize("package", sorted(MAY_IMPORT))
def test_the_bottom_layers_import_only_downward(package):
    for path in sorted((SOURCE / package).rglob("*.py")):
        wrong = implicitlm_imports(path) - MAY_IMPORT[package] - {package}
        assert not wrong, f"{path.relative_to(SOURCE)} imports {sorted(wrong)}"


def test_the_import_check_can_fail(tmp_path):
    module = SOURCE / "deq" / "solver.py"
    assert "core" in implicitlm_imports(module)
    assert implicitlm_imports(SOURCE / "models" / "implicit_lm.py") >= {"deq", "layers"}


def test_every_error_derives_from_one_base():
    errors = []
    for info in pkgutil.walk_packages(implicitlm.__path__, "implicitlm."):
        if info.name.endswith("__main__"):  # runs the command line when imported
            continue
        module = importlib.import_module(info.name)
        for name, value in vars(module).items():
            if inspect.isclass(value) and issubclass(value, BaseException) and value.__module__ == info.name:
                errors.append(value)
    assert len(errors) >= 8
    outside = [f"{e.__module__}.{e.__name__}" for e in errors if not issubclass(e, ImplicitLMError) and e.__name__ not in INTERNAL]
    assert not outside, outside
