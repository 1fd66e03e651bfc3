"""The package dependency rule of DESIGN.md: ``persia -> pyrsia.services.* -> pyrsia.shared``.

``persia`` is PERSIA's API, the facade users import; ``pyrsia.services`` holds each
process's machinery; ``pyrsia.shared`` is the code every service speaks. The test reads every ``import`` statement (top level and
function level) with ``ast``, so a lazy import inside a function counts too.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
ALLOWED = {
    "persia": {"persia", "services", "shared"},
    "services": {"services", "shared"},
    "shared": {"shared"},
}
PROJECT_PACKAGES = set(ALLOWED)
FOLDERS = {"persia": "persia", "services": "pyrsia/services", "shared": "pyrsia/shared"}


def _layer(module: str) -> str:
    """The layer a dotted module name belongs to (``pyrsia.shared.codec`` -> ``shared``)."""
    parts = module.split(".")
    if parts[0] == "pyrsia" and len(parts) > 1:
        return parts[1]
    return parts[0]


def imported_top_packages(path: Path) -> set[tuple[int, str]]:
    """(line, top-level package) of every absolute import in the file."""
    tree = ast.parse(path.read_text(), filename=str(path))
    found: set[tuple[int, str]] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update((node.lineno, _layer(alias.name)) for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add((node.lineno, _layer(node.module)))
    return found


def _modules(package: str) -> list[Path]:
    return sorted((ROOT / FOLDERS[package]).rglob("*.py"))


@pytest.mark.parametrize("package", sorted(ALLOWED))
def test_package_imports_only_what_the_layering_allows(package: str) -> None:
    offenders = []
    for path in _modules(package):
        for line, top in imported_top_packages(path):
            if top in PROJECT_PACKAGES and top not in ALLOWED[package]:
                offenders.append(f"{path.relative_to(ROOT)}:{line} imports {top}")
    assert not offenders, "layering broken:\n" + "\n".join(offenders)


def test_the_rule_reads_function_level_imports(tmp_path: Path) -> None:
    sample = tmp_path / "m.py"
    sample.write_text(
        "def f():\n    from pyrsia.services.embedding_ps import main\n    import pyrsia.shared.codec\n"
    )
    assert imported_top_packages(sample) == {(2, "services"), (3, "shared")}
