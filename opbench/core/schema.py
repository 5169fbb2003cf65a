"""CSV schemas, declared once per benchmark next to its code (``opbench/<tool>/schema.py``).

A schema names the columns in order, the key columns that identify a row across runs, the headline metrics
(compared between runs) and the units of every measured column. The CSV writer takes its header from it and writes ``benchmark`` and ``schema_version``
into every sidecar; ``opbench report`` reads the sidecar first, falls back to the header, and builds its
tables from the same schemas. No torch import.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Schema:
    """One CSV kind. ``version`` goes up whenever a column is renamed, removed or changes meaning."""

    benchmark: str  # the sidecar's "benchmark" and the report's kind
    title: str  # section title in the report
    version: int
    columns: tuple[str, ...]
    keys: tuple[str, ...]  # identify a row across runs (report --compare, failed-row lists)
    metrics: Mapping[str, str]  # headline metric -> unit: what `report --compare` sets side by side
    signature: tuple[str, ...] = ()  # columns that identify a header-only CSV; default keys + metrics
    file_hint: str = ""  # regex on the file name, breaks ties between header matches
    units: Mapping[str, str] = field(default_factory=dict)  # units of other columns worth stating
    # old column name -> its current name, so CSVs written before a rename are still read (opbench report)
    aliases: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        known = set(self.columns)
        for group, names in (
            ("keys", self.keys),
            ("metrics", tuple(self.metrics)),
            ("signature", self.signature),
            ("units", tuple(self.units)),
            ("aliases", tuple(self.aliases.values())),
        ):
            missing = [n for n in names if n not in known]
            if missing:
                raise ValueError(f"schema {self.benchmark}: {group} {missing} are not columns")
        if len(known) != len(self.columns):
            raise ValueError(f"schema {self.benchmark}: duplicate columns")

    @property
    def identifying(self) -> frozenset[str]:
        """The columns a header must contain to be read as this kind."""
        return frozenset(self.signature or (*self.keys, *self.metrics))

    def unit(self, column: str) -> str:
        return self.metrics.get(column) or self.units.get(column, "")

    def sidecar(self) -> dict[str, object]:
        return {"benchmark": self.benchmark, "schema_version": self.version}
