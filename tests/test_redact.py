"""core.redact: what counts as a credential (docs/conventions.md "Secrets"), and that the writers use it."""

from __future__ import annotations

import json

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
    assert got == {"opts": {"key": MASK, "secret": MASK, "anon": False}, "cmd": ["--password", "p4ss"]}
    # a list of words is not a command line: only a joined string shows the flag/value pair
    assert redact("--password p4ss") == f"--password {MASK}"


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
