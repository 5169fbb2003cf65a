"""Numbers on the command line are ASCII digits (issue 25 item 5): int() and float() also read other scripts'
digits ('٨' is 8, '８' is 8) and underscores ('1_6' is 16), so before this a flag took them. Every number flag
goes through core.cli's parsers; each refuses them in one line naming the flag."""

import argparse
import importlib

import pytest

from opbench.core import cli
from opbench.core.errors import UsageError


@pytest.mark.parametrize("text", ["٨", "８", "1_6", "٢٤", "１K"])
@pytest.mark.parametrize(
    "parse",
    [
        cli.integer,
        cli.positive_int,
        cli.non_negative_int,
        cli.world_size,
        cli.finite_float,
        cli.size_mib,
        cli.positive_seconds,
        cli.port_number,
        cli.parse_bytes,
    ],  # fmt: skip
)
def test_parsers_take_ascii_digits_only(parse, text):
    with pytest.raises(argparse.ArgumentTypeError):
        parse(text)


def test_parsers_still_take_what_people_type():
    assert cli.positive_int(" 8 ") == 8 and cli.integer("-3") == -3 and cli.world_size("16") == 16
    assert cli.finite_float("2.5e3") == 2500.0 and cli.parse_bytes("64M") == 64 << 20 and cli.size_mib("0.5") == 0.5


@pytest.mark.parametrize(
    "module,argv",
    [
        ("opbench.fsdp_model.__main__", ["--world-size", "٨"]),
        ("opbench.project.__main__", ["--model", "Qwen3_0.6B", "--world-size", "８"]),
        ("opbench.comm.__main__", ["-b", "١K"]),
        ("opbench.comm.__main__", ["--root", "٣"]),
        ("opbench.trace.__main__", ["x.log", "--jobs", "٢"]),
        ("opbench.attention.__main__", ["--max-seqlen", "1_0"]),
        ("opbench.gemm.__main__", ["--warmup", "٣"]),
    ],
)
def test_every_tool_refuses_them_in_one_line_naming_the_flag(module, argv):
    with pytest.raises(UsageError, match=r"field '--?[\w-]+': '.+' is not"):
        importlib.import_module(module).build_parser().parse_args(argv)


def test_layer_count_has_the_configs_bound():
    """--num-layers and a config's num_hidden_layers meet one bound (models.config uses cli.MAX_LAYERS)."""
    assert cli.layer_count("4096") == 4096
    with pytest.raises(argparse.ArgumentTypeError, match="4097 layers is more than 4,096"):
        cli.layer_count("4097")
