"""The documentation cannot drift: a short README, a nav without dead pages, and generated
references that cover every configuration key and environment variable.

`make docs` (run in CI) builds the site with ``mkdocs build --strict``; these checks are the
fast part of it, with no mkdocs needed.
"""

from __future__ import annotations

import dataclasses
import importlib.util
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"


@pytest.fixture(scope="module")
def gen():
    spec = importlib.util.spec_from_file_location("gen_reference", DOCS / "gen_reference.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def pages(gen):
    return gen.pages()


def _nav_paths(node) -> list[str]:
    if isinstance(node, str):
        return [node]
    if isinstance(node, list):
        return [p for item in node for p in _nav_paths(item)]
    if isinstance(node, dict):
        return [p for value in node.values() for p in _nav_paths(value)]
    return []


def _flatten(data: dict, prefix: str = "") -> list[str]:
    keys = []
    for key, value in data.items():
        path = f"{prefix}.{key}" if prefix else key
        keys += _flatten(value, path) if isinstance(value, dict) else [path]
    return keys


def test_readme_is_a_front_page():
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) < 200, f"README.md has {len(lines)} lines; move detail into docs/"
    text = "\n".join(lines)
    assert "make demo" in text and "make test" in text


def test_readme_links_resolve():
    import re

    text = (ROOT / "README.md").read_text()
    targets = re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", text)
    local = [t for t in targets if "://" not in t]
    assert local
    missing = [t for t in local if not (ROOT / t).exists()]
    assert not missing, f"README.md links to files that do not exist: {missing}"


def test_every_nav_page_exists(pages):
    nav = yaml.safe_load((ROOT / "mkdocs.yml").read_text())["nav"]
    paths = _nav_paths(nav)
    assert paths
    missing = [p for p in paths if not (DOCS / p).is_file() and p not in pages]
    assert not missing, (
        f"mkdocs.yml nav names pages that neither exist nor are generated: {missing}"
    )


def test_config_reference_lists_every_schema_key(gen, pages):
    from pyrsia.shared.config import parse_embedding_config
    from pyrsia.shared.config_schema import GlobalConfig

    page = pages["reference/config.md"]
    global_keys = _flatten(dataclasses.asdict(GlobalConfig()))  # every field, unset ones too
    schema = parse_embedding_config(
        {"slots_config": {"s": {"dim": 4}}, "feature_groups": {"g": ["s"]}}, strict=True
    ).to_dict()
    embedding_keys = [
        k.replace("slots_config.s.", "slots_config.<slot>.").replace(
            "feature_groups.g", "feature_groups.<group>"
        )
        for k in _flatten(schema)
    ]
    for filename, keys in (
        ("global_config.yml", global_keys),
        ("embedding_config.yml", embedding_keys),
    ):
        meanings = gen.MEANINGS[filename]
        for key in keys:
            assert f"| `{key}` |" in page, f"{filename}: {key} missing from the reference"
            assert meanings.get(key), f"{filename}: {key} has no meaning in gen_reference.MEANINGS"
        stale = set(meanings) - set(keys)
        assert not stale, f"{filename}: MEANINGS describes keys the schema lacks: {stale}"


def test_config_reference_lists_every_epl_key_and_hb_option(pages):
    from persia.epl.config import KEYS
    from persia.hb._options import SPECS

    page = pages["reference/config.md"]
    for key in KEYS:
        assert f"| `{key}` |" in page, key
    for name in SPECS:
        assert f"| `{name}` |" in page, name


def test_every_environment_variable_is_described(gen, pages):
    variables = gen.env_constants()
    assert any(name == "PERSIA_REDIS_URL" for name, _ in variables)
    for name, doc in variables:
        assert gen.ENV_MEANINGS.get(name) or doc, f"{name}: no docstring and no ENV_MEANINGS entry"
        assert f"| `{name}` |" in pages["reference/environment.md"], name


def test_cli_reference_covers_every_launcher_command(pages):
    from persia.launcher import SUBCOMMANDS

    page = pages["reference/cli.md"]
    for command in SUBCOMMANDS:
        assert f"## `persia-launcher {command}`" in page, command
    assert "`--checkpoint-root`" in page


def test_api_pages_turn_rst_roles_into_cross_references():
    """docs/griffe_roles.py (mkdocs.yml loads it): a role becomes an optional autorefs link
    (a link where the site documents the object, code font where not), and no public
    ``persia`` docstring keeps a raw role after it."""
    griffe = pytest.importorskip("griffe")  # the docs extra (make docs)
    spec = importlib.util.spec_from_file_location("griffe_roles", DOCS / "griffe_roles.py")
    roles = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(roles)
    assert roles.rewrite(
        "a :class:`~pyrsia.shared.errors.PersiaError` and :func:`get_ctx`", "persia.ctx"
    ) == (
        'a <autoref identifier="pyrsia.shared.errors.PersiaError" optional><code>PersiaError</code>'
        '</autoref> and <autoref identifier="persia.ctx.get_ctx" optional><code>get_ctx</code>'
        "</autoref>"
    )
    root = griffe.load(
        "persia",
        extensions=griffe.load_extensions(roles.RstRoles()),
        search_paths=[str(DOCS.parent)],
    )
    left, todo = [], [root]
    while todo:
        obj = todo.pop()
        if obj.is_alias:
            continue
        if obj.docstring is not None and roles.ROLE.search(obj.docstring.value):
            left.append(obj.path)
        todo.extend(obj.members.values())
    assert not left, f"raw reStructuredText roles left in: {left}"
