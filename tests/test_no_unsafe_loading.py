"""No pickle anywhere in the source tree, and every ``torch.load`` passes ``weights_only=True``.

The scan parses every tracked Python file (ast, not grep, so comments and strings that
mention pickle do not count and aliases such as ``import pickle as p`` do): imports of
pickle-like modules, ``pickle.*`` / ``read_pickle`` / ``to_pickle`` uses, ``allow_pickle=True``,
and ``torch.load`` without a literal ``weights_only=True`` are findings.
"""

from __future__ import annotations

import ast
import io
import subprocess
import tokenize
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PICKLE_MODULES = frozenset(
    {
        "pickle",
        "cPickle",
        "_pickle",
        "dill",
        "cloudpickle",
        "shelve",
        "marshal",
        "joblib",
        "copyreg",
    }
)
PICKLE_ATTRS = frozenset({"read_pickle", "to_pickle", "loads", "load"})


def _python_files() -> list[Path]:
    out = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "*.py"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    return [REPO / p for p in out if (REPO / p).is_file()]


def _is_torch_load(func: ast.expr) -> bool:
    return (
        isinstance(func, ast.Attribute)
        and func.attr == "load"
        and (
            (isinstance(func.value, ast.Name) and func.value.id == "torch")
            or (isinstance(func.value, ast.Attribute) and func.value.attr == "serialization")
        )
    )


def findings(source: str, where: str) -> list[str]:
    """Every unsafe-loading construct in ``source`` (``where`` prefixes each finding)."""
    tree = ast.parse(source)
    found: list[str] = []
    pickle_names: set[str] = set()
    for node in ast.walk(tree):
        line = f"{where}:{getattr(node, 'lineno', 0)}"
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] in PICKLE_MODULES:
                    found.append(f"{line}: import {alias.name}")
                    pickle_names.add(alias.asname or alias.name.split(".")[0])
        elif isinstance(node, ast.ImportFrom) and node.module:
            if node.module.split(".")[0] in PICKLE_MODULES:
                found.append(f"{line}: from {node.module} import ...")
            if node.module.split(".")[0] == "torch" and any(a.name == "load" for a in node.names):
                found.append(f"{line}: torch's load imported by name (unchecked calls)")
        elif isinstance(node, ast.Attribute) and node.attr in ("read_pickle", "to_pickle"):
            found.append(f"{line}: .{node.attr}")
        elif isinstance(node, ast.Call):
            for kw in node.keywords:
                if kw.arg == "allow_pickle" and not (
                    isinstance(kw.value, ast.Constant) and kw.value.value is False
                ):
                    found.append(f"{line}: allow_pickle is not False")
            if _is_torch_load(node.func):
                ok = any(
                    kw.arg == "weights_only"
                    and isinstance(kw.value, ast.Constant)
                    and kw.value.value is True
                    for kw in node.keywords
                )
                if not ok:
                    found.append(f"{line}: torch.load without weights_only=True")
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id in pickle_names
        ):
            found.append(f"{where}:{node.lineno}: {node.value.id}.{node.attr}")
    return found


def test_the_scanner_catches_what_it_looks_for():
    bad = (
        "import pickle\nimport dill as d\nfrom cloudpickle import dumps\nimport torch\n"
        "x = pickle.loads(b'')\ntorch.load('f')\ntorch.load('f', weights_only=False)\n"
        "import numpy as np\nnp.load('f', allow_pickle=True)\ndf.to_pickle('p')\n"
        "from torch import load\n"
    )
    got = findings(bad, "bad.py")
    for expected in (
        "import pickle",
        "import dill",
        "from cloudpickle",
        "pickle.loads",
        "bad.py:6: torch.load",
        "bad.py:7: torch.load",
        "allow_pickle",
        "to_pickle",
        "bad.py:11: torch's load",
    ):
        assert any(expected in f for f in got), (expected, got)
    ok = "import torch\ntorch.load('f', map_location='cpu', weights_only=True)\n# import pickle\n"
    assert findings(ok, "ok.py") == []


def test_no_pickle_and_torch_load_is_weights_only_everywhere():
    files = _python_files()
    assert len(files) > 50  # the whole tree was scanned, not an empty list
    problems = [
        f for path in files for f in findings(path.read_text(), str(path.relative_to(REPO)))
    ]
    assert not problems, "\n".join(problems)


def _code_torch_loads(text: str) -> int:
    """``torch.load(`` occurrences in the code (tokens; comments and strings excluded)."""
    toks = [
        t.string
        for t in tokenize.generate_tokens(io.StringIO(text).readline)
        if t.type in (tokenize.NAME, tokenize.OP)
    ]
    return sum(1 for i in range(len(toks) - 3) if toks[i : i + 4] == ["torch", ".", "load", "("])


def test_every_torch_load_call_was_seen():
    """The token view agrees with the ast view: each ``torch.load(`` in code is a checked call."""
    calls = 0
    for path in _python_files():
        text = path.read_text()
        textual = _code_torch_loads(text)
        parsed = sum(
            1
            for node in ast.walk(ast.parse(text))
            if isinstance(node, ast.Call) and _is_torch_load(node.func)
        )
        assert textual == parsed, f"{path}: {textual} 'torch.load(' in the text, {parsed} calls"
        calls += parsed
    assert calls >= 1  # pyrsia/services/nn_worker/dense_state.py loads dense checkpoints
