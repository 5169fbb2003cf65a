"""CSV schemas, declared once per benchmark next to its code (``opbench/<tool>/schema.py``).

A schema names the columns in order, the key columns that identify a row across runs, the headline metrics
(compared between runs) and the units of every measured column. The CSV writer takes its header from it and writes ``benchmark`` and ``schema_version``
into every sidecar; ``opbench report`` reads the sidecar first, falls back to the header, and builds its
tables from the same schemas. No torch import.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from .plausible import KINDS, Kind, kind_of


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
    # column -> its kind of quantity (core.plausible.KINDS) where the unit does not say it: a spread in seconds that
    # may be 0 (time_part), a ratio without a unit; every other column with a unit takes the unit's kind
    kinds: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        known = set(self.columns)
        for group, names in (
            ("keys", self.keys),
            ("metrics", tuple(self.metrics)),
            ("signature", self.signature),
            ("units", tuple(self.units)),
            ("aliases", tuple(self.aliases.values())),
            ("kinds", tuple(self.kinds)),
        ):
            missing = [n for n in names if n not in known]
            if missing:
                raise ValueError(f"schema {self.benchmark}: {group} {missing} are not columns")
        if len(known) != len(self.columns):
            raise ValueError(f"schema {self.benchmark}: duplicate columns")
        unknown = sorted(set(self.kinds.values()) - set(KINDS))
        if unknown:
            raise ValueError(f"schema {self.benchmark}: kinds {unknown} are not in core.plausible.KINDS")
        for column in self.kinds:
            self.plausible(column)  # a kind whose base unit is not the column's unit raises

    @property
    def identifying(self) -> frozenset[str]:
        """The columns a header must contain to be read as this kind."""
        return frozenset(self.signature or (*self.keys, *self.metrics))

    def unit(self, column: str) -> str:
        return self.metrics.get(column) or self.units.get(column, "")

    def plausible(self, column: str) -> tuple[Kind, float] | None:
        """The column's kind of quantity and the factor from its unit to the kind's base unit (docs/conventions.md,
        "Plausible numbers"); None for a column no kind is declared for (text, flags, keys)."""
        return kind_of(self.unit(column), self.kinds.get(column))

    def sidecar(self) -> dict[str, object]:
        return {"benchmark": self.benchmark, "schema_version": self.version}
