"""Text from a CSV cell or a sidecar, made inert before it goes into report.md.

A results folder can come from anyone (a shared cluster folder, an older opbench, a hand-edited CSV), so nothing
read from it may become markdown structure or HTML in the report (docs/report.md, "What the report trusts"):

- ``text`` is for prose and table cells: credentials masked (docs/conventions.md "Secrets"), control characters
  shown as ``\\n``/``\\xNN`` so a value is always one line, ``& < >`` as HTML entities (no raw HTML, no
  autolink), and every other character that can start markdown (``\\ ` * [ ] # | ! ~``, ``_`` outside a word)
  backslash-escaped, so no link, image, heading, emphasis or table cell can be made from a value;
- ``code`` is for a name in a code span: the backtick fence is longer than any backtick run inside;
- ``code_block`` is for recorded commands: a fenced block whose fence is longer than any backtick run inside.
"""

from __future__ import annotations

import re

from opbench.core.redact import redact_text

# C0/C1 controls, DEL and the Unicode line/paragraph separators: each would end a line or move the cursor.
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]")
_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}
# Markdown punctuation that can open a construct anywhere in a line (CommonMark backslash escapes apply to all).
_MARKUP = re.compile(r"[\\`*\[\]#|!~]|(?<![A-Za-z0-9])_|_(?![A-Za-z0-9])")
# What would open a list, a setext underline or a numbered item if the value ever began a line.
_BLOCK_START = re.compile(r"^(\s*\d{0,9})([-+](?=\s|$)|=+\s*$|(?<=\d)[.)](?=\s|$))")
_ENTITIES = {"&": "&amp;", "<": "&lt;", ">": "&gt;"}
_BACKTICKS = re.compile(r"`+")


def one_line(value: object) -> str:
    """The value's text with credentials masked and every control character written out (``\\n``, ``\\x1b``)."""
    masked = redact_text(str(value))
    return _CONTROL.sub(lambda m: _NAMED.get(m.group(0), f"\\x{ord(m.group(0)):02x}"), masked)


def text(value: object) -> str:
    """Plain markdown text that renders as exactly the characters of the value (masked, on one line)."""
    escaped = _MARKUP.sub(lambda m: "\\" + m.group(0), one_line(value))
    escaped = _BLOCK_START.sub(lambda m: m.group(1) + "\\" + m.group(2), escaped)
    return re.sub(r"[&<>]", lambda m: _ENTITIES[m.group(0)], escaped)


def _fence(body: str, least: int) -> str:
    longest = max((len(run) for run in _BACKTICKS.findall(body)), default=0)
    return "`" * max(least, longest + 1)


def code(value: object) -> str:
    """An inline code span holding the value (masked, one line); nothing inside it is markup."""
    body = one_line(value)
    fence = _fence(body, 1)
    if not body:
        return "` `"  # a code span cannot be empty; one space is the closest
    # CommonMark strips one space from each end when both ends have one: pad against that and against a backtick
    # at an end joining the fence
    edges = body[0] == "`" or body[-1] == "`" or (body[0] == body[-1] == " " and body.strip(" "))
    pad = " " if edges else ""
    return f"{fence}{pad}{body}{pad}{fence}"


def code_block(lines: list[str], info: str = "") -> list[str]:
    """A fenced code block of these lines (each masked and made one line); the fence cannot be closed from inside."""
    body = [one_line(line) for line in lines]
    fence = _fence("\n".join(body), 3)
    return [fence + info, *body, fence]
