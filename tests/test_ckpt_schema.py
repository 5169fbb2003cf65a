"""The checkpoint CSV's bandwidth columns say their unit (MiB/s); CSVs written under the old Primus names
(`*_bandwidth_in_mbps`, schema 3) are still read by `opbench report`."""

from __future__ import annotations

import csv

from opbench.ckpt.schema import SCHEMA
from opbench.report.discover import discover


def test_bandwidth_columns_are_named_and_declared_mib_per_s():
    for col in ("save_bandwidth_mib_per_s", "load_bandwidth_mib_per_s"):
        assert col in SCHEMA.columns and SCHEMA.unit(col) == "MiB/s"
    assert not [c for c in SCHEMA.columns if "mbps" in c]
    assert SCHEMA.version >= 4
    # every measured time column states its unit
    assert all(SCHEMA.unit(c) == "s" for c in SCHEMA.columns if c.endswith(("_time", "_time_min", "_time_max")))


def test_a_schema_3_csv_with_the_old_names_is_read_as_checkpoint_rows(tmp_path):
    """An old CSV without its sidecar: identified by its header, the old names read as the new ones."""
    old = [{v: k for k, v in SCHEMA.aliases.items()}.get(c, c) for c in SCHEMA.columns]
    assert "save_bandwidth_in_mbps" in old and "load_bandwidth_in_mbps" in old
    row = dict.fromkeys(old, "")
    row.update(model="m", method="dcp", storage="/d", world_size="2", thread_count="1", status="ok")
    row.update(save_bandwidth_in_mbps="512.5", load_bandwidth_in_mbps="1024", save_total_time="0.5")
    path = tmp_path / "ckpt_benchmark.csv"
    with open(path, "w", newline="") as fh:
        writer = csv.DictWriter(fh, old)
        writer.writeheader()
        writer.writerow(row)
    found = discover(tmp_path)
    assert [f.kind.benchmark for f in found.files] == ["ckpt"] and found.files[0].identified_by == "header"
    frame = found.frame("ckpt")
    assert frame.loc[0, "save_bandwidth_mib_per_s"] == 512.5 and frame.loc[0, "load_bandwidth_mib_per_s"] == 1024
    assert "save_bandwidth_in_mbps" not in frame.columns
