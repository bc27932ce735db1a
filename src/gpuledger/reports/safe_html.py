"""What every HTML page gpuledger writes carries so a name in it cannot run: the Content-Security-
Policy that names the page's own inline code by its sha256 and allows nothing else, and JSON that
can sit inside a ``<script>`` element.

The JSON escapes ``<``, ``>`` and ``&`` (so no ``</script>`` or ``<!--`` can end or bend the element)
and U+2028 / U+2029 (line ends to an old JavaScript parser) as ``\\u003c``...; a JSON reader gets
the same values back.
"""

from __future__ import annotations

import base64
import hashlib
import html
import json
from collections.abc import Sequence
from typing import Any

__all__ = ["csp_meta", "json_block", "policy", "script_safe", "source_hash"]

_SCRIPT_SAFE = str.maketrans({"<": "\\u003c", ">": "\\u003e", "&": "\\u0026", "\u2028": "\\u2028", "\u2029": "\\u2029"})


def script_safe(text: str) -> str:
    """JSON text made safe to inline in ``<script type="application/json">``."""
    return text.translate(_SCRIPT_SAFE)


def json_block(element_id: str, data: Any) -> str:
    """``data`` as JSON in a ``<script type="application/json">`` element with that id."""
    text = script_safe(json.dumps(data, default=str))
    return f'<script type="application/json" id="{html.escape(element_id)}">{text}</script>'


def source_hash(text: str) -> str:
    """The CSP source that allows exactly this inline script or style sheet."""
    return "'sha256-" + base64.b64encode(hashlib.sha256(text.encode("utf-8")).digest()).decode() + "'"


def policy(styles: Sequence[str], scripts: Sequence[str] = ()) -> str:
    """Nothing fetched, no form, no base: only these inline style sheets and scripts (their text)."""
    script_src = " ".join(source_hash(s) for s in scripts) or "'none'"
    style_src = " ".join(source_hash(s) for s in styles) or "'none'"
    return (
        f"default-src 'none'; script-src {script_src}; style-src {style_src}; img-src data:; "
        "base-uri 'none'; form-action 'none'"
    )


def csp_meta(styles: Sequence[str], scripts: Sequence[str] = ()) -> str:
    """The ``<meta>`` to put first in ``<head>``, before anything it governs."""
    return f'<meta http-equiv="Content-Security-Policy" content="{html.escape(policy(styles, scripts))}">'
