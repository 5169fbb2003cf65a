"""core.redact: what counts as a credential (docs/conventions.md "Secrets"), and that the writers use it."""

from __future__ import annotations

import json
import shlex
import sys

import pytest

from opbench.core.redact import MASK, redact, redact_text
from opbench.core.results import CsvReport
from opbench.core.schema import Schema

ENV = {"AWS_SESSION_TOKEN": "sessiontok99", "HOME": "/root", "AWS_REGION": "us"}


def test_text_forms_are_masked_and_model_fields_kept() -> None:
    line = (
        """opbench ckpt --storage-options '{"key": "AKIA1", "secret": "s3cr3t", "endpoint_url": "http://h:5000"}' """
        "--token tok1 --api-key=zzz AWS_SECRET_ACCESS_KEY=abc http://u:pw@h/x Authorization: Bearer bb sessiontok99 "
        "num_key_value_heads=8 tokens=4096 KeyError: <class 'type'> {'token': None}"
    )
    out = redact_text(line, environ=ENV)
    for secret in ("AKIA1", "s3cr3t", "tok1", "zzz", "abc", ":pw@", "Bearer bb", "sessiontok99"):
        assert secret not in out, secret
    for kept in ("http://h:5000", "num_key_value_heads=8", "tokens=4096", "KeyError: <class 'type'>", "'token': None"):
        assert kept in out, kept
    assert out.count(MASK) == 8


def test_mappings_mask_whole_values_and_recurse() -> None:
    got = redact({"opts": {"key": "a", "secret": {"x": 1}, "anon": False}, "cmd": ["--password", "p4ss"]}, ENV)
    assert got == {"opts": {"key": MASK, "secret": MASK, "anon": False}, "cmd": ["--password", MASK]}
    assert redact("--password p4ss") == f"--password {MASK}"
    # a list of words is an argument list: the word after a credential's flag is its value
    assert redact(("--token", "t0k", "--tp", "2", "--api-key", "--x")) == (
        "--token",
        MASK,
        "--tp",
        "2",
        "--api-key",
        "--x",
    )
    assert redact(["--num-key-value-heads", "8"]) == ["--num-key-value-heads", "8"]


def test_an_argument_list_printed_as_python_is_masked() -> None:
    """A CalledProcessError or a logged argv shows the list's repr: the quoted word after a credential's flag."""
    cmd = ["torchrun", "--hf-token", "hf_abc", "--tp", "2", "--password", "it's", "--keys", "3"]
    out = redact_text(f"Command '{cmd}' returned non-zero exit status 1.")
    assert "hf_abc" not in out and "it's" not in out, out
    assert f"'--hf-token', '{MASK}'" in out and "'--tp', '2'" in out and "'--keys', '3'" in out


def test_csv_cells_and_sidecar_are_redacted(tmp_path) -> None:
    schema = Schema("t", "t", 1, ("case", "error"), ("case",), {})
    path = tmp_path / "t.csv"
    with CsvReport(path, schema, meta={"command": "x --secret-key K123", "storage_options": {"token": "T9"}}) as rep:
        rep.append({"case": "a", "error": "ClientError: bad {'aws_secret_access_key': 'S3'}"})
    text = path.read_text() + path.with_suffix(".meta.json").read_text()
    assert "K123" not in text and "T9" not in text and "'S3'" not in text
    meta = json.loads(path.with_suffix(".meta.json").read_text())
    assert meta["command"] == f"x --secret-key {MASK}" and meta["storage_options"] == {"token": MASK}


def test_a_usage_error_is_one_line_with_credentials_masked(capsys) -> None:
    from opbench.core.errors import UsageError, run_cli

    def main(argv) -> int:
        raise UsageError(
            "cannot reach s3://b with {'secret': 'S3CR'}\ntouch /tmp/x", source="m\nrm -rf /", field="opts"
        )

    assert run_cli(main, []) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "S3CR" not in err and err.startswith("opbench: error: m?rm -rf /: field 'opts'")


def test_json_escapes_in_a_name_do_not_hide_it() -> None:
    r"""'{"secr\u0065t": ...}' is {"secret": ...} once parsed: the object is read as JSON and written back masked;
    text that is no whole object (cut short in an error cell) has the escapes decoded in the name."""
    typed = """opbench ckpt --storage-options '{"secr\\u0065t": "s3cr3tvalue", "endpoint_url": "http://h:5000"}'"""
    assert redact_text(typed) == (
        """opbench ckpt --storage-options '{"secret": "***", "endpoint_url": "http://h:5000"}'"""
    )
    assert redact_text('{"x": {"t\\u006fken": {"nested": "v1"}}, "n": 1}') == '{"x": {"token": "***"}, "n": 1}'
    assert redact_text("""bad JSON: '{"secr\\u0065t": "s3cr3tvalue", ...""") == (
        """bad JSON: '{"secr\\u0065t": "***", ..."""
    )
    unchanged = '{"endpoint_url": "http://h:5000", "default_block_size": 5}'  # nothing masked: left as written
    assert redact_text(f"--storage-options '{unchanged}'") == f"--storage-options '{unchanged}'"


def test_quoted_words_mask_their_whole_value() -> None:
    """shlex.join quotes a whole argument: '--hf-token X' (a --replay-arg value), '--password=a b c', a quoted
    value after a flag or '=' (shlex's '"'"' escape included) are masked whole, not up to the first space."""
    for argv, masked in (
        (["x", "--replay-arg", "--hf-token hf_abcdefghij"], "x --replay-arg '--hf-token ***'"),
        (["x", "--replay-arg=--hf-token hf_abcdefghij"], "x '--replay-arg=--hf-token ***'"),
        (["x", "--password", "a b c", "--timeout", "20"], "x --password *** --timeout 20"),
        (["x", "--password", "it's a b"], "x --password ***"),
        (["x", "--password=a b c"], "x '--password=***'"),
        (["x", "--api-key=it's x"], "x '--api-key=***'"),
    ):
        assert redact_text(shlex.join(argv)) == masked, argv
    assert redact_text("""--password='a b c' token="x y" --secret "p q" """) == (
        "--password=*** token=*** --secret *** "
    )
    assert redact_text("'--timeout 20 --hf-token hf_x' --model 'y'") == "'--timeout 20 --hf-token ***' --model 'y'"


def test_assignment_lists_spaces_colons_and_auth_schemes() -> None:
    """key=A,secret=B as one option's value; 'password = abc'; 'GITHUB_TOKEN: ghp_x' (YAML, env listings); an
    authorization scheme is kept and the credential after it masked, in every form."""
    assert redact_text("--storage-options=key=AKIA,secret=s,region=us") == (
        "--storage-options=key=***,secret=***,region=us"
    )
    assert redact_text("password = abc token=b64== x") == "password = *** token=*** x"
    assert redact_text("GITHUB_TOKEN: ghp_xxx\napiKey: zzz, password: 'a b'") == (
        "GITHUB_TOKEN: ***\napiKey: ***, password: ***"
    )
    assert redact_text("error: session: 3") == "error: session: ***"  # after a name that is none
    for text, masked in (
        ("authorization=Bearer X", "authorization=Bearer ***"),
        ("Authorization: Bearer X", "Authorization: Bearer ***"),
        ("Authorization: token ghp_x", "Authorization: token ***"),
        ("'authorization=Bearer X'", "'authorization=Bearer ***'"),
        ("--authorization Basic dXNlcg==", "--authorization Basic ***"),
    ):
        assert redact_text(text) == masked, text


def test_ordinary_benchmark_text_stays_readable() -> None:
    for text in (
        "--timeout 20 --passes fwd,dgrad --model my-sessions-7b --sessions 4 --keep --max-tokens 512",
        "token_count=3 token_count: 5 tokens/s: 3.2 max_tokens 512 keep=1 num_key_value_heads: 8 tokens=4096",
        "KeyError: 'token'",
        "ExpiredToken: The provided token has expired",  # an S3 error code, not a name: value
        "InvalidAccessKeyId: The AWS Access Key Id you provided does not exist",
        "s3://bucket/key: not found",
        "token == 3 and {'token': None} and token: None and --token --other",
        "Traceback: x; error: y",
    ):
        assert redact_text(text) == text


def test_environment_values_follow_changes_to_os_environ(monkeypatch) -> None:
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "first-secret-1")
    assert redact_text("saw first-secret-1") == f"saw {MASK}"
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "second-secret-2")
    assert redact_text("saw first-secret-1 and second-secret-2") == f"saw first-secret-1 and {MASK}"
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    assert redact_text("saw second-secret-2") == "saw second-secret-2"


def test_ckpt_records_escaped_storage_options_masked(tmp_path, monkeypatch, capsys) -> None:
    r"""opbench ckpt --storage-options '{"secr\u0065t": ...}': the sidecar's command, its args.storage_options
    (recorded parsed: a mapping) and report.md hold ***, never the value."""
    pytest.importorskip("torch")
    from opbench.ckpt.__main__ import main
    from opbench.core.errors import run_cli
    from opbench.report.__main__ import main as report_main

    options = '{"secr\\u0065t": "s3cr3tvalue", "default_block_size": 5}'
    out = tmp_path / "out"
    argv = ["--size-mb", "1", "--iterations", "1", "--device", "cpu", "--methods", "torch_save"]
    argv += ["--storage", str(tmp_path / "data"), "--storage-options", options, "--report-dir-path", str(out)]
    monkeypatch.delenv("OPBENCH_LAUNCH_COMMAND", raising=False)
    monkeypatch.setattr(sys, "orig_argv", [sys.executable, "-m", "opbench.ckpt", *argv], raising=False)
    assert run_cli(main, argv, prog="opbench ckpt") == 0
    assert report_main([str(out), "--no-plots"]) == 0
    printed = "".join(capsys.readouterr())
    files = [p for p in out.rglob("*") if p.is_file()]
    assert any(p.name == "report.md" for p in files)
    for text in [printed] + [p.read_text() for p in files]:
        assert "s3cr3tvalue" not in text
    meta = json.loads((out / "ckpt_benchmark.meta.json").read_text())
    assert meta["args"]["storage_options"] == {"secret": MASK, "default_block_size": 5}
    assert """'{"secret": "***", "default_block_size": 5}'""" in meta["command"]
