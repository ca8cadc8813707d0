"""Text in a Markdown table cell: the report's and the autotune's tables share these, so
neither imports the other's renderer."""

from __future__ import annotations

MIB = 2**20


def code(text: str) -> str:
    """``text`` as inline code in a Markdown table cell."""
    return f"`{escape(text)}`"


def escape(text) -> str:
    """``text`` safe in a Markdown table cell: no column breaks, one line."""
    return str(text).replace("|", "\\|").replace("\n", " ")
