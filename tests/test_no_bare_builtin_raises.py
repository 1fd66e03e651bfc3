"""Library code raises persia.errors classes, not bare TypeError/ValueError/RuntimeError/
AttributeError (issue 26): a user catches PersiaError for anything Pyrsia raised on purpose,
and the builtin still where PERSIA users catch it (InvalidInputError is a ValueError,
InvalidTypeError a TypeError, MisuseError a RuntimeError, UnknownOptionError an
AttributeError). This test scans persia/ and pyrsia/ with ast and fails on a new bare raise.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BUILTINS = {"TypeError", "ValueError", "RuntimeError", "AttributeError"}

# Python's attribute protocol requires AttributeError itself: getattr(obj, name, default),
# hasattr and copy/pickle probes catch exactly that, and a read-only attribute refuses a
# write with it (as a frozen dataclass does).
PROTOCOL = {
    "__getattr__": {"AttributeError"},
    "__getattribute__": {"AttributeError"},
    "__setattr__": {"AttributeError"},
    "__delattr__": {"AttributeError"},
}

NOT_YET: tuple[str, ...] = ()  # files still to convert; none left


def _raised_name(node: ast.Raise) -> str | None:
    exc = node.exc.func if isinstance(node.exc, ast.Call) else node.exc
    return exc.id if isinstance(exc, ast.Name) else None


def bare_raises(path: Path, root: Path = ROOT) -> list[str]:
    """``path:line Name in function`` for each bare builtin raise the rules do not allow."""
    found = []

    def visit(node: ast.AST, function: str) -> None:
        for child in ast.iter_child_nodes(node):
            name = function
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                name = child.name
            elif isinstance(child, ast.Raise) and child.exc is not None:
                raised = _raised_name(child)
                if raised in BUILTINS and raised not in PROTOCOL.get(function, ()):
                    found.append(f"{path.relative_to(root)}:{child.lineno} {raised} in {function}")
            visit(child, name)

    visit(ast.parse(path.read_text()), "<module>")
    return found


def library_files() -> list[Path]:
    files = []
    for package in ("persia", "pyrsia"):
        for path in sorted((ROOT / package).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            if not rel.startswith(NOT_YET):
                files.append(path)
    return files


def test_library_code_raises_its_own_classes():
    found = [hit for path in library_files() for hit in bare_raises(path)]
    assert found == [], (
        "bare builtin raises in library code: raise the persia.errors class for the case "
        "(InvalidInputError, InvalidTypeError, MisuseError, ...)\n" + "\n".join(found)
    )


def test_the_scan_finds_a_bare_raise_and_allows_the_protocol(tmp_path):
    sample = tmp_path / "sample.py"
    sample.write_text(
        "def f(x):\n    raise ValueError('no')\n\n"
        "class A:\n    def __getattr__(self, name):\n        raise AttributeError(name)\n"
        "    def g(self):\n        raise AttributeError('not here')\n"
    )
    assert bare_raises(sample, tmp_path) == [
        "sample.py:2 ValueError in f",
        "sample.py:8 AttributeError in g",
    ]
