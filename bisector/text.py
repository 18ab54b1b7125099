"""Escaping per sink: names come from the model (any Unicode, control characters included) and must reach every
output as data, never as markup or terminal commands.

- `terminal`: control characters (C0 but tab/newline, DEL, C1: ESC sequences, bells, NULs), lone surrogates (a
  non-UTF-8 file name) and Unicode bidi overrides become visible escapes (`\\x1b`).
- `markdown_code` / `markdown_text`: inside a report.md table cell (pipes, backticks, HTML tags, newlines).
- `xml_text`: XML 1.0 cannot carry most control characters at all: they become visible escapes.
- rich: print through `Console(markup=False)` or `rich.text.Text`; `rich_escape` for markup strings.
"""

from __future__ import annotations

import re

_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069\ud800-\udfff]")
_XML_ILLEGAL = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f\ud800-\udfff\ufffe\uffff]")


def _escape(m: re.Match) -> str:
    c = ord(m.group(0))
    return f"\\x{c:02x}" if c < 0x100 else f"\\u{c:04x}"


def terminal(text: object) -> str:
    """`text` safe for a terminal line: no escape sequences, no bells, no undecodable surrogates."""
    return _CONTROL.sub(_escape, str(text))


def one_line(text: object) -> str:
    """`terminal`, and newlines/tabs too (a name inside a one-line message)."""
    return terminal(text).replace("\n", "\\n").replace("\r", "\\r").replace("\t", "\\t")


def xml_text(text: object) -> str:
    """Characters XML 1.0 forbids (and surrogates) as visible escapes; ElementTree escapes <, >, & itself."""
    return _XML_ILLEGAL.sub(_escape, str(text))


def markdown_text(text: object) -> str:
    """Plain text inside a markdown table cell: no HTML, no table-breaking pipes or newlines, no emphasis."""
    s = one_line(text)
    s = s.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    return re.sub(r"([\\`*_\[\]|#])", r"\\\1", s)


def markdown_code(text: object, table: bool = True) -> str:
    """`text` as a markdown code span: a fence longer than any backtick run inside (HTML inside a code span is
    shown, never interpreted); in a table cell `|` is escaped, since GFM splits cells at `|` even in code."""
    s = one_line(text)
    if table:
        s = s.replace("|", "\\|")
    longest = max((len(r) for r in re.findall(r"`+", s)), default=0)
    fence = "`" * (longest + 1)
    pad = " " if s.startswith("`") or s.endswith("`") or not s else ""
    return f"{fence}{pad}{s}{pad}{fence}"


def rich_escape(text: object) -> str:
    """For a string that rich parses as markup."""
    from rich.markup import escape

    return escape(terminal(text))


def utf8(text: object) -> str:
    """A string that encodes as UTF-8: undecodable bytes of a file name (surrogate escapes) become `\\xe9`."""
    s = str(text)
    try:
        s.encode("utf-8")
        return s
    except UnicodeEncodeError:
        return s.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace").encode(
            "utf-8", "backslashreplace").decode("utf-8")


def utf8_tree(value):
    """`utf8` on every string of a JSON-like value."""
    if isinstance(value, str):
        return utf8(value)
    if isinstance(value, dict):
        return {utf8_tree(k): utf8_tree(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(utf8_tree(v) for v in value)
    return value
