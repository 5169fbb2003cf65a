"""report.md is inert: nothing read from a CSV cell, a sidecar or a file name becomes markdown structure, HTML or a
credential in the report (issue 25 item 7; docs/report.md "What the report trusts").

The hostile folder is written by hand, as an attacker or an older opbench would leave it (raw CSV text, a sidecar
holding a secret), and the real ``opbench report`` CLI reads it. The report is then parsed back: no raw ``<``, every
fence longer than any backtick run inside it, no heading but the report's own; where markdown-it (a dev dependency,
through transformers → typer → rich) is installed, the rendered HTML holds no tag or link from the data.
"""

from __future__ import annotations

import csv
import html
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from opbench.gemm.schema import SCHEMA as GEMM
from opbench.report import inert

ROOT = Path(__file__).resolve().parent.parent
SECRET = "SECRETVALUE123"
PASSWORD = "PASSWORD99"
IMG = "<img src=x onerror=alert(1)>"
LINK = "[x](javascript:alert(1))"
SCRIPT = "<script>alert(1)</script>"
COMMAND = (
    "python -m opbench gemm --model `x`\n# Injected from the command\n````\n"
    f"{SCRIPT} --secret-key {SECRET} --storage s3://u:{PASSWORD}@host/b"
)


def gemm_row(**cells: object) -> list[str]:
    row = {c: "" for c in GEMM.columns}
    row.update(model=LINK, mbs=1, m=128, n=256, k=512, dtype="fp32", time_s=0.01, tflops=0.5, status="ok")
    row.update({k: str(v) for k, v in cells.items()})
    return [str(row[c]) for c in GEMM.columns]


@pytest.fixture(scope="module")
def hostile(tmp_path_factory) -> Path:
    res = tmp_path_factory.mktemp("hostile")
    sub = res / "a`b ``` #c"  # a folder name with backtick runs: it reaches the report in code spans
    sub.mkdir()
    with open(sub / "benchmark_gemm_evil.csv", "w", newline="", encoding="utf-8") as fh:
        out = csv.writer(fh)
        out.writerow(GEMM.columns)
        out.writerow(gemm_row(layer=IMG, backend="torch|x", note="noisy: IQR 50% of the median", **{"pass": "fwd"}))
        out.writerow(gemm_row(layer="# Injected layer", backend="torch", **{"pass": "`dgrad`\n## Injected pass"}))
        out.writerow(
            gemm_row(
                layer="qkv",
                backend="fp8",
                status="error",
                error=f"{SCRIPT}\n# Injected heading\ntoken={SECRET} Authorization: Bearer {SECRET}",
                **{"pass": "fwd"},
            )
        )
    meta = {
        "benchmark": "gemm",
        "schema_version": GEMM.version,
        "command": COMMAND,
        "device_name": "<img src=y onerror=alert(3)>",
        "host": "# evil host\n===",
        "torch": "[t](javascript:alert(4))",
        "storage_options": {"key": "AKIA", "secret": SECRET},
    }
    (sub / "benchmark_gemm_evil.meta.json").write_text(json.dumps(meta), encoding="utf-8")
    (res / "[y](javascript:alert(5)) <b>.csv").write_text("a,b\n1,2\n", encoding="utf-8")  # skipped, named
    return res


@pytest.fixture(scope="module")
def report(hostile, tmp_path_factory) -> tuple[subprocess.CompletedProcess, str]:
    out = tmp_path_factory.mktemp("out")
    proc = subprocess.run(
        [sys.executable, "-m", "opbench", "report", str(hostile), "--report-dir-path", str(out)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stderr
    return proc, (out / "report.md").read_text(encoding="utf-8")


def fenced_blocks(text: str) -> tuple[list[tuple[str, list[str]]], list[str]]:
    """CommonMark fenced code blocks as (fence, lines inside) and the lines outside any block."""
    blocks, outside, open_fence, body = [], [], "", []
    for line in text.splitlines():
        if open_fence:
            if re.fullmatch(rf"`{{{len(open_fence)},}}\s*", line):
                blocks.append((open_fence, body))
                open_fence, body = "", []
            else:
                body.append(line)
        elif match := re.match(r"(`{3,})[^`]*$", line):
            open_fence = match.group(1)
        else:
            outside.append(line)
    assert not open_fence, "a fenced block is never closed"
    return blocks, outside


def outside_code(text: str) -> str:
    """The text with fenced blocks and inline code spans taken out (inside them '<' is shown, never parsed)."""
    _, outside = fenced_blocks(text)
    return re.sub(r"(?<!`)(`+)(?!`).*?(?<!`)\1(?!`)", "", "\n".join(outside))


def test_no_raw_html_and_no_secret(report):
    proc, text = report
    prose = outside_code(text)
    assert "<" not in prose and ">" not in prose
    assert "&lt;img src=x onerror=alert(1)&gt;" in prose  # the value is shown, as text
    for secret in (SECRET, PASSWORD, "AKIA"):
        assert secret not in text and secret not in proc.stdout + proc.stderr
    assert "--secret-key ***" in text and "u:***@host" in text  # in the command's code block
    assert "token=\\*\\*\\*" in text and "Bearer \\*\\*\\*" in text  # in the error cell, escaped
    assert "&lt;script&gt;" in text  # the error is still shown, as text


def test_commands_sit_in_a_fence_longer_than_any_backtick_run(report):
    _, text = report
    blocks, _ = fenced_blocks(text)
    assert blocks, "no fenced block for the recorded command"
    for fence, body in blocks:
        runs = [len(r) for line in body for r in re.findall(r"`+", line)]
        assert len(fence) > max(runs, default=0), (fence, body)
    (fence, body) = next(b for b in blocks if any("opbench gemm" in line for line in b[1]))
    assert len(fence) == 5  # the command holds a run of 4
    command = next(line for line in body if "opbench gemm" in line)  # one line: the newlines written out
    assert command.startswith("python -m opbench gemm --model `x`\\n# Injected from the command\\n````\\n")


def test_no_heading_but_the_reports_own(report):
    _, text = report
    _, outside = fenced_blocks(text)
    headings = [line for line in outside if re.match(r"\s{0,3}#", line)]
    assert headings == [
        "# opbench report",
        "## Environment",
        "## GEMM",
        "### Noisy rows",
        "### Rows not measured (1: error: 1)",
        "## Skipped files",
    ]
    setext = [line for line in outside if re.fullmatch(r"\s{0,3}(=+|-+)\s*", line)]
    assert not setext  # a value's "===" must not turn the line above it into a heading
    # every table row has its header's cell count: no '|' from a value split a cell
    for block in re.findall(r"(?:^\|.*\n)+", text, re.M):
        counts = {len(re.split(r"(?<!\\)\|", row.strip())) for row in block.splitlines()}
        assert len(counts) == 1, block


def test_rendered_html_has_no_tag_or_link_from_the_data(report):
    markdown_it = pytest.importorskip("markdown_it")
    _, text = report
    rendered = markdown_it.MarkdownIt("commonmark").enable(["table", "strikethrough"]).render(text)
    tags = set(re.findall(r"<([a-z0-9]+)", rendered))
    assert tags <= {
        "h1",
        "h2",
        "h3",
        "p",
        "table",
        "thead",
        "tbody",
        "tr",
        "th",
        "td",
        "code",
        "pre",
        "ul",
        "li",
        "img",
    }
    assert "href=" not in rendered and not re.search(r"(href|src)=\"\s*javascript:", rendered, re.I)
    assert re.findall(r'<img src="([^"]*)"', rendered) == ["gemm_tflops_x_javascript_alert_1.png"]
    # the values are all there, as the characters they are
    shown = html.unescape(rendered)
    assert IMG in shown and LINK in shown and "# evil host\\n===" in shown and "torch|x" in shown


# ---- the escaping itself, on any text --------------------------------------------------------------------------

ANY_TEXT = st.text(st.sampled_from(list("ab _*`[]()<>&#|!~\\-+=.:1 \n\t\x1b\"'/{}$")), max_size=24)


@settings(max_examples=300, deadline=None)
@given(ANY_TEXT)
def test_any_value_renders_as_its_characters_and_stays_in_its_cell(value):
    markdown_it = pytest.importorskip("markdown_it")
    md = markdown_it.MarkdownIt("commonmark").enable(["table", "strikethrough"])
    para = md.render("x " + inert.text(value)).strip()
    assert para.startswith("<p>") and para.endswith("</p>")
    assert html.unescape(para[3:-4]) == ("x " + inert.one_line(value)).strip()
    table = md.render(f"| a | b |\n|---|---|\n| {inert.text(value)} | z |\n")
    assert table.count("<td") == 2
    if value:
        span = md.render("x " + inert.code(value)).strip()
        match = re.fullmatch(r"<p>x <code>(.*)</code></p>", span, re.S)
        assert match and html.unescape(match.group(1)) == inert.one_line(value)
    block = md.render("\n".join(inert.code_block([value, "# " + value], "sh"))).strip()
    match = re.fullmatch(r'<pre><code class="language-sh">(.*)</code></pre>', block, re.S)
    assert match and html.unescape(match.group(1)) == f"{inert.one_line(value)}\n# {inert.one_line(value)}\n"


def test_a_dollar_in_a_name_draws_as_text_not_math(tmp_path):
    """matplotlib reads text between two '$' as math: a model named 'a$\\nope{$b' once cost the GEMM plot
    ('could not draw: ValueError'). The plot is drawn, with the name as written."""
    res = tmp_path / "res"
    res.mkdir()
    with open(res / "benchmark_gemm_m.csv", "w", newline="", encoding="utf-8") as fh:
        out = csv.writer(fh)
        out.writerow(GEMM.columns)
        for layer in ("qkv", "o$\\bad{$"):
            out.writerow(gemm_row(model="a$\\nope{$b", layer=layer, **{"pass": "fwd"}))
    proc = subprocess.run(
        [sys.executable, "-m", "opbench", "report", str(res), "--report-dir-path", str(tmp_path / "out")],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stderr
    text = (tmp_path / "out" / "report.md").read_text(encoding="utf-8")
    assert "could not draw" not in text and "Plot not made" not in text
    (png,) = (tmp_path / "out").glob("*gemm*.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def report_text(res: Path, out: Path) -> str:
    """report.md from the real CLI (no plots), which must exit 0."""
    proc = subprocess.run(
        [sys.executable, "-m", "opbench", "report", str(res), "--report-dir-path", str(out), "--no-plots"],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stderr
    return (out / "report.md").read_text(encoding="utf-8")


@pytest.mark.parametrize("status", [f"{IMG} {LINK.replace('x', 'click')} password=hunter2", SCRIPT])
def test_a_hostile_status_is_escaped_and_masked_in_the_rows_not_measured_heading(tmp_path, status):
    """The status counts in '### Rows not measured (1: <status>: 1)' were written raw."""
    res = tmp_path / "res"
    res.mkdir()
    with open(res / "benchmark_gemm_s.csv", "w", newline="", encoding="utf-8") as fh:
        out = csv.writer(fh)
        out.writerow(GEMM.columns)
        out.writerow(gemm_row(layer="qkv", **{"pass": "fwd"}))
        out.writerow(gemm_row(layer="o", status=status, **{"pass": "fwd"}))
    text = report_text(res, tmp_path / "out")
    (heading,) = [line for line in text.splitlines() if line.startswith("### Rows not measured")]
    assert heading == f"### Rows not measured (1: {inert.text(status)}: 1)"
    assert "<" not in outside_code(text) and "hunter2" not in text


def test_a_command_given_as_nested_argument_lists_is_masked(tmp_path):
    """A sidecar's command as a JSON list (lists inside it too): every credential after its flag is masked."""
    res = tmp_path / "res"
    res.mkdir()
    with open(res / "benchmark_gemm_c.csv", "w", newline="", encoding="utf-8") as fh:
        csv.writer(fh).writerows([GEMM.columns, gemm_row(layer="qkv", **{"pass": "fwd"})])
    command = ["python", "-m", "opbench", "project", "--password", "hunter2", "--api-key", "AKIAXYZ",
               ["--secret", SECRET, ["--token", PASSWORD]]]  # fmt: skip
    meta = {"benchmark": "gemm", "schema_version": GEMM.version, "command": command}
    (res / "benchmark_gemm_c.meta.json").write_text(json.dumps(meta), encoding="utf-8")
    text = report_text(res, tmp_path / "out")
    blocks, _ = fenced_blocks(text)
    (body,) = [lines for fence, lines in blocks if any("opbench" in line for line in lines)]
    assert "'--password', '***'" in body[1] and "'--api-key', '***'" in body[1] and "'--token', '***'" in body[1]
    for secret in ("hunter2", "AKIAXYZ", SECRET, PASSWORD):
        assert secret not in text
