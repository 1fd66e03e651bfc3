"""A griffe extension for the API reference: reStructuredText roles become cross-references.

The docstrings name other objects the Sphinx way (``:class:`~pyrsia.shared.errors.PersiaError```,
``:func:`get_ctx```, ``:data:`KEYS```), which mkdocstrings would show as raw text. Each role
is rewritten, before the docstring is rendered, as an autorefs reference marked optional:
a link where the site documents the object, its name in code font where it does not (a
private module), and never a broken link or a build warning. ``~`` keeps only the last
part of the name as the text, as in Sphinx; a name without dots is looked up in the
docstring's own module first. mkdocs.yml loads it (mkdocstrings' ``extensions``).
"""

from __future__ import annotations

import re
from html import escape

import griffe

ROLE = re.compile(r":(?:py:)?(?:class|func|meth|mod|data|attr|exc|obj|const):`(~?)([\w.]+)(\(\))?`")


def _module_of(obj: griffe.Object) -> str:
    while obj.parent is not None and not obj.is_module:
        obj = obj.parent
    return obj.path


def rewrite(text: str, module: str) -> str:
    """``text`` with each role an ``<autoref ... optional>`` tag (autorefs resolves it)."""

    def one(match: re.Match) -> str:
        tilde, name, call = match.groups()
        target = name if "." in name else f"{module}.{name}"
        shown = (name.rsplit(".", 1)[-1] if tilde else name) + (call or "")
        return f'<autoref identifier="{escape(target)}" optional><code>{escape(shown)}</code></autoref>'

    return ROLE.sub(one, text)


class RstRoles(griffe.Extension):
    """Rewrites the roles of every docstring once the object tree is built."""

    def on_object(self, *, obj: griffe.Object, **kwargs: object) -> None:
        if obj.is_alias or obj.docstring is None or ":" not in obj.docstring.value:
            return
        obj.docstring.value = rewrite(obj.docstring.value, _module_of(obj))
