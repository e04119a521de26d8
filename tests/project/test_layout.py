"""The layout's rules that hold today: one exception base (and no built-in exception raised
as it is), the bottom layers importing only downward (``core`` nothing of implicitlm; ``deq``
and ``layers`` only ``core``), no package's modules importing each other in a circle, the
command line importing the library only inside the command that runs; and the tests' folders
mirroring the source's packages."""

from __future__ import annotations

import ast
import builtins
import importlib
import inspect
import pkgutil
import sys
from pathlib import Path

import implicitlm
from implicitlm.core import ImplicitLMError

SOURCE = Path(implicitlm.__file__).parent
LAYOUT = Path(__file__).resolve().parents[2] / "docs" / "development" / "layout.md"


def allowed_imports(layout: Path) -> dict[str, set[str]]:
    """Folder or top-level module -> the implicitlm folders and modules it may import besides
    itself, read from the table of ``docs/development/layout.md`` (the picture is the rule)."""
    rules = {}
    for line in layout.read_text().splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if len(cells) == 2 and cells[0].startswith("`"):
            rules[cells[0].strip("`")] = {name.strip().strip("`") for name in cells[1].split(",") if name.strip()}
    return rules


MAY_IMPORT = allowed_imports(LAYOUT)
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


def owner(path: Path) -> str:
    """The folder of a module under ``src/implicitlm``, or the module's own name at the top."""
    parts = path.relative_to(SOURCE).parts
    return parts[0] if len(parts) > 1 else path.stem


def test_imports_run_the_way_the_layout_says():
    modules = sorted(SOURCE.rglob("*.py"))
    assert {owner(path) for path in modules} <= set(MAY_IMPORT), "a folder or module without a row in docs/development/layout.md"
    for path in modules:
        wrong = implicitlm_imports(path) - MAY_IMPORT[owner(path)] - {owner(path)}
        assert not wrong, f"{path.relative_to(SOURCE)} imports {sorted(wrong)}, which docs/development/layout.md does not allow"


def test_the_layout_table_is_read_and_the_import_check_can_fail():
    assert MAY_IMPORT["core"] == set() and MAY_IMPORT["deq"] == {"core"} and MAY_IMPORT["layers"] == {"core"}
    assert len(MAY_IMPORT) >= 12
    module = SOURCE / "deq" / "solve.py"
    assert "core" in implicitlm_imports(module)
    # The models import deq and layers, which neither of those may import back.
    assert implicitlm_imports(SOURCE / "models" / "implicit_lm.py") >= {"deq", "layers"}
    assert "models" not in MAY_IMPORT["deq"] | MAY_IMPORT["layers"]


def module_names(source: Path) -> dict[tuple[str, ...], Path]:
    """Each module and package under ``source`` by its name's parts (a package: its folder's)."""
    names = {}
    for path in source.rglob("*.py"):
        parts = path.relative_to(source).with_suffix("").parts
        names[parts[:-1] if parts[-1] == "__init__" else parts] = path
    return names


def package_import_graph(source: Path, package: str) -> dict[str, set[str]]:
    """Module of folder ``package`` under ``source`` (its subpackages included) -> the modules of
    that folder it imports, wherever the import stands (inside a function as at the top: a
    lazy import only moves where the circle closes). An import runs the packages on the way
    to its module, besides those the importer is already inside."""
    names = module_names(source)
    graph = {}
    for parts, path in names.items():
        if parts[:1] != (package,):
            continue
        own = parts if path.name == "__init__.py" else parts[:-1]
        graph[".".join(parts)] = {
            ".".join(prefix) for target in imported_modules(path, own, names)
            for prefix in (target[:i] for i in range(1, len(target) + 1))
            if prefix[0] == package and prefix in names and prefix != parts
            and (prefix == target or prefix != own[: len(prefix)])
        }
    return graph


def imported_modules(path: Path, own: tuple[str, ...], names: dict) -> list[tuple[str, ...]]:
    """The modules (or packages) of implicitlm a module's imports name, by their parts under
    ``src/implicitlm``; ``own``: the package the module is in, for relative imports."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found += [tuple(alias.name.split(".")[1:]) for alias in node.names if alias.name.startswith("implicitlm.")]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = (*own[: len(own) - node.level + 1], *(node.module.split(".") if node.module else ()))
            elif node.module and node.module.startswith("implicitlm."):
                base = tuple(node.module.split(".")[1:])
            else:
                continue
            # from package import name: the module of that name where it is one, else the package.
            found += [(*base, alias.name) if (*base, alias.name) in names else base for alias in node.names]
    return found


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Each circle of imports a depth-first walk of ``graph`` meets, as its modules in order
    with the first repeated at the end."""
    cycles, done, path = [], set(), []

    def visit(module: str) -> None:
        path.append(module)
        for imported in sorted(graph[module]):
            if imported in path:
                cycles.append([*path[path.index(imported):], imported])
            elif imported not in done:
                visit(imported)
        path.pop()
        done.add(module)

    for module in sorted(graph):
        if module not in done:
            visit(module)
    return cycles


def test_no_package_imports_itself_in_a_circle():
    """Within each package the imports point one way (before: models/ went families -> the
    family packages -> implicit_lm -> loading -> families, closed by an import inside
    ``from_pretrained``)."""
    packages = sorted(path.parent.name for path in SOURCE.glob("*/__init__.py"))
    assert {"models", "eval", "deq", "cli"} <= set(packages)
    cycles = [" -> ".join(cycle) for package in packages for cycle in import_cycles(package_import_graph(SOURCE, package))]
    assert not cycles, "imports in a circle: " + "; ".join(cycles)


def test_the_circle_check_can_fail(tmp_path):
    files = {
        "__init__.py": "from .shelf import Shelf\n",
        "shelf.py": "from .table import ROWS\nimport os\n",
        "table.py": "from .rows import ROWS\nfrom implicitlm.core import errors\n",
        "rows.py": "def load():\n    from implicitlm.pkg.shelf import Shelf\n",
        "leaf.py": "from . import rows\n",
        "inner/__init__.py": "from .deep import X\n",
        "inner/deep.py": "from .. import leaf\nfrom ...core import errors\n",
    }
    for name, text in files.items():
        (tmp_path / "pkg" / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "pkg" / name).write_text(text)
    graph = package_import_graph(tmp_path, "pkg")
    assert graph["pkg.inner.deep"] == {"pkg.leaf"} and graph["pkg.leaf"] == {"pkg.rows"}
    assert import_cycles(graph) == [["pkg.shelf", "pkg.table", "pkg.rows", "pkg.shelf"]]
    (tmp_path / "pkg" / "rows.py").write_text("ROWS = 3\n")
    assert import_cycles(package_import_graph(tmp_path, "pkg")) == []


def module_level_imports(path: Path) -> list[str]:
    """What a module imports when it is imported (not inside its functions): module names,
    relative ones with their leading dots."""
    found = []
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.ImportFrom):
            found.append("." * node.level + (node.module or ""))
        elif isinstance(node, ast.Import):
            found += [alias.name for alias in node.names]
    return found


def test_command_modules_import_the_library_only_inside_their_commands():
    """A command group's module imports the standard library and its sibling command modules
    at module level, nothing else: building the parser (``--help``) then loads no model,
    data or training code, only the command that runs does."""
    for path in sorted((SOURCE / "cli").glob("*.py")):
        outside = [name for name in module_level_imports(path)
                   if not (name.split(".")[0] in sys.stdlib_module_names or (name.startswith(".") and not name.startswith("..")))]
        assert not outside, f"cli/{path.name} imports {outside} at module level"


HELP_IMPORTS = """
import argparse, json, sys
from implicitlm.cli import build_parser, main

def commands(parser, path=()):
    yield path
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from commands(sub, (*path, name))

for command in commands(build_parser()):
    try:
        main([*command, "--help"])
    except SystemExit:
        pass
    heavy = [name for name in ("torch", "numpy", "transformers") if name in sys.modules]
    if heavy:
        print(json.dumps({"command": " ".join(command), "imported": heavy}))
        break
else:
    print(json.dumps({"commands": sum(1 for _ in commands(build_parser()))}))
"""


def test_help_of_every_command_imports_no_torch():
    """``--help`` answers from the parser alone: the root's and every subcommand's, each in
    turn in one fresh interpreter, import neither torch, numpy nor transformers."""
    import json
    import subprocess

    ran = subprocess.run([sys.executable, "-c", HELP_IMPORTS], capture_output=True, text=True, check=True)
    result = json.loads(ran.stdout.strip().splitlines()[-1])
    assert "imported" not in result, f"implicitlm {result['command']} --help imports {result['imported']}"
    assert result["commands"] >= 25


def test_the_module_level_import_check_can_fail():
    assert "..deq" in module_level_imports(SOURCE / "models" / "implicit_lm.py")
    assert "torch" in module_level_imports(SOURCE / "deq" / "solve.py")


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


# Python's own errors. KeyboardInterrupt and SystemExit are left out: they stop a run rather
# than report an error, and ``except Exception`` (so ``except ImplicitLMError``) must not catch them.
BUILTIN_ERRORS = {name for name, value in vars(builtins).items() if inspect.isclass(value) and issubclass(value, Exception)}


def builtin_raises(source: str) -> list[tuple[int, str]]:
    """(line, class) of each ``raise`` of a built-in error in ``source``. A bare ``raise`` and
    ``raise error`` of a caught exception name no class: the error passes on unchanged."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Raise) and node.exc is not None:
            raised = node.exc.func if isinstance(node.exc, ast.Call) else node.exc
            if isinstance(raised, ast.Name) and raised.id in BUILTIN_ERRORS:
                found.append((node.lineno, raised.id))
    return sorted(found)


def test_no_module_raises_a_built_in_error():
    """Every error the package raises is an ImplicitLMError, so ``except ImplicitLMError``
    catches them all: a built-in class raised as it is would slip past (before: 115 sites)."""
    found = [f"{path.relative_to(SOURCE)}:{line} {name}"
             for path in sorted(SOURCE.rglob("*.py")) for line, name in builtin_raises(path.read_text())]
    assert not found, f"raise a class of core/errors.py (OptionError, DataError, ...) instead: {', '.join(found)}"


def test_the_built_in_raise_check_can_fail():
    source = """
try:
    run()
except OSError as error:
    raise
raise ValueError("bad")
raise KeyError
raise error
raise KeyboardInterrupt
raise OptionError("bad")
"""
    assert builtin_raises(source) == [(6, "ValueError"), (7, "KeyError")]
    assert {"ValueError", "FileNotFoundError", "NotImplementedError", "IndexError"} <= BUILTIN_ERRORS


def task_name_comparisons(source: str) -> list[int]:
    """Lines comparing a task's name (``x.task``, a variable ``task``, ``task.name``) with a string
    literal or a tuple, list or set of them: a branch that belongs in the task."""

    def is_task(node) -> bool:
        if isinstance(node, ast.Attribute) and node.attr == "name":
            node = node.value
        return (isinstance(node, ast.Name) and node.id == "task") or (isinstance(node, ast.Attribute) and node.attr == "task")

    def is_literal(node) -> bool:
        items = node.elts if isinstance(node, (ast.Tuple, ast.List, ast.Set)) else [node]
        return all(isinstance(item, ast.Constant) and isinstance(item.value, str) for item in items)

    return sorted(
        node.lineno for node in ast.walk(ast.parse(source)) if isinstance(node, ast.Compare)
        and any(map(is_task, [node.left, *node.comparators])) and any(map(is_literal, [node.left, *node.comparators]))
    )


def test_only_the_tasks_branch_on_a_task_name():
    """The trainer and eval/ call the task's methods (before: trainer.py and eval/length.py
    compared ``config.task`` and ``task.name`` with "lm", "words", "catbabi"). cli/ is exempt:
    it builds each task's subcommand from its name without importing the tasks (--help loads no
    torch), so which options a task's parser takes is the parser's, not the task's behaviour."""
    found = [f"{path.relative_to(SOURCE)}:{line}" for path in sorted(SOURCE.rglob("*.py"))
             if path.relative_to(SOURCE).parts[0] not in ("tasks", "cli")
             for line in task_name_comparisons(path.read_text())]
    assert not found, f"move these branches on a task's name into the task: {', '.join(found)}"
    source = 'if config.task == "lm": pass\nif task in ("lm", "words"): pass\nif task.name != "catbabi": pass\nif task == other: pass'
    assert task_name_comparisons(source) == [1, 2, 3]


def solver_name_comparisons(source: str, names: set[str]) -> list[int]:
    """Lines comparing anything with one of the solver names ``names`` (a string literal, or a
    tuple, list or set holding one): a branch on a solver's name."""

    def names_a_solver(node) -> bool:
        items = node.elts if isinstance(node, (ast.Tuple, ast.List, ast.Set)) else [node]
        return any(isinstance(item, ast.Constant) and isinstance(item.value, str) and item.value in names
                   for item in items)

    return sorted(node.lineno for node in ast.walk(ast.parse(source))
                  if isinstance(node, ast.Compare) and any(map(names_a_solver, [node.left, *node.comparators])))


def test_nothing_branches_on_a_solver_name():
    """Which solvers mix their steps by a learned mixing, and what solves in their place without
    one, is the solver table's record (``deq.solvers.register_solver``), read by the loader, a
    warm start and ``solver train`` alike (before: the fallback from "learned_anderson" to
    "safeguarded_anderson" was a branch on the name in three modules)."""
    from implicitlm.deq.solvers import solver_names

    names = set(solver_names())
    found = [f"{path.relative_to(SOURCE)}:{line}" for path in sorted(SOURCE.rglob("*.py"))
             for line in solver_name_comparisons(path.read_text(), names)]
    assert not found, f"ask the solver table instead: {', '.join(found)}"
    source = ('if options.solver_for(mode) == "learned_anderson": pass\n'
              'x = "a" if name in ("broyden", "newton") else "b"\nif solver == other: pass\nif mode != "sequential": pass')
    assert solver_name_comparisons(source, names) == [1, 2]


def option_setter_calls(source: str) -> list[int]:
    """Lines that call a model's ``set_fixed_point_options``."""
    return sorted({node.lineno for node in ast.walk(ast.parse(source)) if isinstance(node, ast.Call)
                   and isinstance(node.func, ast.Attribute) and node.func.attr == "set_fixed_point_options"})


def test_no_evaluation_generation_or_command_sets_the_options_of_the_model_it_runs():
    """An evaluation, a generation and a command hand their fixed-point settings to each forward
    (``fixed_point=``); a model's own options are set only where they become its defaults: by the
    model itself (``models/``, a learned solver attached) and by the training that decides what
    the checkpoint it saves ships with (``train/``). Before: six modules of tasks/, eval/,
    recipes/ and cli/ set them on the model they had loaded."""
    setters = ("models", "train")
    found = [f"{path.relative_to(SOURCE)}:{line}" for path in sorted(SOURCE.rglob("*.py"))
             if path.relative_to(SOURCE).parts[0] not in setters for line in option_setter_calls(path.read_text())]
    assert not found, f"give the forwards fixed_point= instead: {', '.join(found)}"
    assert option_setter_calls("model.set_fixed_point_options(tol=1e-3)\nmodel(ids, fixed_point={'tol': 1e-3})") == [1]


def task_class_uses(source: str, classes: set[str]) -> list[int]:
    """Lines naming one of the task classes ``classes`` (an import, an ``isinstance``, a table
    keyed by them) or walking a class's ``__mro__``: a branch on a task's class."""
    names = classes | {"__mro__"}
    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Name) and node.id in names or isinstance(node, ast.Attribute) and node.attr in names:
            found.add(node.lineno)
        elif isinstance(node, ast.ImportFrom) and any(alias.name in names for alias in node.names):
            found.add(node.lineno)
    return sorted(found)


def test_eval_and_train_name_no_task_class():
    """They call the methods of ``Task`` (the base they may name): each task's record comes from
    the task (``Task.length_record``), not from a writer eval/ keeps per task class (before:
    ``LENGTH_RECORDS`` in eval/length.py, keyed by WordsTask, LMTask and CatbabiTask)."""
    from implicitlm import tasks
    from implicitlm.tasks.base import Task

    modules = [importlib.import_module(f"implicitlm.tasks.{info.name}") for info in pkgutil.iter_modules(tasks.__path__)]
    classes = {value.__name__ for module in modules for value in vars(module).values()
               if inspect.isclass(value) and issubclass(value, Task) and value is not Task}
    assert {"WordsTask", "LMTask", "CatbabiTask", "FolderTask"} <= classes
    found = [f"{path.relative_to(SOURCE)}:{line}" for folder in ("eval", "train")
             for path in sorted((SOURCE / folder).rglob("*.py")) for line in task_class_uses(path.read_text(), classes)]
    assert not found, f"call a method of the task instead: {', '.join(found)}"
    source = ("from ..tasks.words import WordsTask\nRECORDS = {LMTask: 1}\nif isinstance(task, tasks.CatbabiTask): pass\n"
              "kinds = type(task).__mro__\ndef run(task: Task): pass")
    assert task_class_uses(source, classes) == [1, 2, 3, 4]


# ---------------------------------------------------------------- the tests mirror the source

TESTS = Path(__file__).resolve().parents[1]
# Folders of tests/ that name no package: the repository as a whole, and what the tests share.
NOT_PACKAGES = {"project", "support"}


def stray_test_folders(tests: Path, source: Path) -> list[str]:
    """The folders of ``tests`` that name no package of ``source`` (and are not one of
    ``NOT_PACKAGES``), and those without an ``__init__.py``, which their tests need to be
    ``tests.<folder>.<module>`` (so that a file's name may repeat in another folder)."""
    packages = {path.parent.name for path in source.glob("*/__init__.py")}
    folders = [path for path in sorted(tests.iterdir()) if path.is_dir() and not path.name.startswith((".", "_"))]
    unnamed = [f"{path.name}/ names no package of src/implicitlm/" for path in folders
               if path.name not in packages | NOT_PACKAGES]
    return unnamed + [f"{path.name}/ has no __init__.py" for path in folders if not (path / "__init__.py").is_file()]


def test_every_test_folder_names_a_package_of_the_source():
    assert not stray_test_folders(TESTS, SOURCE), stray_test_folders(TESTS, SOURCE)
    assert {"core", "deq", "layers", "models", "train", "cli"} <= {path.name for path in TESTS.iterdir()}


def test_the_test_folder_check_can_fail(tmp_path):
    for name in ("core", "project", "misc", "layer"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "__init__.py").touch()
    (tmp_path / "deq").mkdir()  # a package, but its tests could not share a file name with another folder's
    assert stray_test_folders(tmp_path, SOURCE) == [
        "layer/ names no package of src/implicitlm/", "misc/ names no package of src/implicitlm/",
        "deq/ has no __init__.py",
    ]
