"""All-to-all-v split matrices from a routing distribution: ``s[i][j]``, the elements rank ``i`` sends rank ``j``.
No torch import (numpy, through moe/routing.py): a dry run plans them, and a bad --routing fails, before torch loads.

The MoE token dispatch as Megatron's all-to-all dispatcher runs it: each rank of the EP group has ``T`` tokens and
sends ``k`` copies of each (top-k) to the ranks owning the chosen experts; the ``E`` experts are placed on the EP
ranks contiguously (rank ``r`` owns experts ``r·E/n … (r+1)·E/n − 1``, Megatron's ``local_expert_indices``); a copy
is one token's activation, ``hidden`` elements. How many copies each expert gets is the routing distribution's
(moe/routing.py ``target_counts``: balanced, zipf:S, max-mean:R, histogram:FILE), the same on every rank: a hot
expert is hot for every rank's tokens, so one rank (the hot expert's owner) receives more than the others.

- dispatch: ``s[i][j] = hidden · Σ_{e on rank j} copies[e]`` (every row the same; the receive totals differ);
- combine: the transpose (the experts' outputs go back to the tokens' ranks: the hot rank sends the most).

Every rank builds the matrix from the same arguments (checked equal across ranks when the job starts), with no
randomness, so every rank agrees on it without an exchange. Sizes follow nccl-tests 2.19 ``alltoallv_perf``
(core/collectives.py ``alltoallv_size_elements``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from opbench.core.errors import UsageError
from opbench.moe.routing import Routing, load, parse_routing, target_counts

DIRECTIONS = ("dispatch", "combine")
EXPERTS_PER_RANK = 8  # --experts default: 8 per rank of the group (Mixtral on an EP group of one, DeepSeek-V3 on 32)
DEFAULT_TOP_K = 2
DEFAULT_HIDDEN = 4096
MAX_MATRIX_IN_SIDECAR = 64  # ranks; a larger group's sidecar keeps the per-rank totals only


@dataclass(frozen=True)
class SplitSpec:
    """One all-to-all-v traffic pattern; ``experts`` None = ``EXPERTS_PER_RANK`` per rank of the group."""

    routing: Routing  # with its histogram read (routing.load)
    tokens: int  # per rank
    top_k: int
    hidden: int
    experts: int | None = None
    direction: str = "dispatch"

    def n_experts(self, nranks: int) -> int:
        return self.experts if self.experts is not None else EXPERTS_PER_RANK * nranks

    @property
    def label(self) -> str:
        e = "" if self.experts is None else f" E={self.experts}"
        return f"a2av {self.direction} {self.routing.label}{e} k={self.top_k} h={self.hidden}"

    def _check_experts(self, nranks: int) -> int:
        experts = self.n_experts(nranks)
        if experts % nranks:
            raise UsageError(
                f"{experts} experts do not split over an EP group of {nranks} ranks (placed contiguously)",
                field="--experts",
            )
        if self.top_k > experts:
            raise UsageError(f"top-{self.top_k} of {experts} experts", field="--top-k")
        return experts

    def check(self, nranks: int) -> None:
        """What ``expert_copies`` refuses at any size, checked once before any rank starts and worded for the
        flags of a run without a model (--experts, --top-k): no token count, since a size's tokens are not the
        user's and the max-mean bound E/k holds whatever their number."""
        experts = self._check_experts(nranks)
        r = self.routing
        if r.kind == "max-mean" and r.value is not None and r.value > experts / self.top_k:
            raise UsageError(
                f"'{r.text}': max/mean is at most E/k = {experts}/{self.top_k} = {experts / self.top_k:g} "
                "(the hot expert cannot get more copies than there are tokens: a token picks an expert once)",
                field="--routing",
            )
        if r.kind == "histogram" and len(r.histogram) != experts:
            given = (
                f"--experts is {experts}"
                if self.experts is not None
                else f"the run has {experts} experts ({EXPERTS_PER_RANK} per rank × {nranks} ranks; set --experts)"
            )
            raise UsageError(f"has {len(r.histogram)} counts, {given}", source=r.path, field="--routing")

    def expert_copies(self, nranks: int) -> tuple[list[int], str]:
        """Copies per expert of one rank's ``tokens·top_k`` (routing.target_counts) and its note."""
        experts = self._check_experts(nranks)
        if self.tokens == 0:
            return [0] * experts, ""
        return target_counts(self.routing, self.tokens, self.top_k, experts)

    def matrix(self, nranks: int) -> list[list[int]]:
        """``s[i][j]``: elements rank ``i`` sends rank ``j`` (the module docstring's rule)."""
        copies, _ = self.expert_copies(nranks)
        per = len(copies) // nranks
        row = [self.hidden * sum(copies[j * per : (j + 1) * per]) for j in range(nranks)]
        dispatch = [list(row) for _ in range(nranks)]
        if self.direction == "dispatch":
            return dispatch
        return [[dispatch[j][i] for j in range(nranks)] for i in range(nranks)]

    def describe(self, nranks: int, elt_size: int) -> dict[str, Any]:
        """What the sidecar records: the parameters, the per-rank send/receive bytes and (small groups) the matrix."""
        s = self.matrix(nranks)
        copies, note = self.expert_copies(nranks)
        out: dict[str, Any] = {
            "direction": self.direction,
            "routing": self.routing.text,
            "experts": self.n_experts(nranks),
            "top_k": self.top_k,
            "hidden": self.hidden,
            "tokens_per_rank": self.tokens,
            "nranks": nranks,
            "copies_per_expert": copies,
            "send_bytes": [sum(row) * elt_size for row in s],
            "recv_bytes": [sum(s[i][j] for i in range(nranks)) * elt_size for j in range(nranks)],
            "exchange": "none: every rank builds the same matrix from the same arguments",
        }
        if nranks <= MAX_MATRIX_IN_SIDECAR:
            out["split_elements"] = s
        if note:
            out["note"] = note
        return out


def parse_routings(text: str) -> list[Routing]:
    """--routing for all_to_all_v: comma-separated moe/routing.py entries (``model`` needs a model's router, which
    comm does not run); histogram files are read here, so a bad one stops the run before any rank starts."""
    out = []
    for item in text.split(","):
        try:
            routing = parse_routing(item)
        except ValueError as exc:
            raise UsageError(str(exc), field="--routing") from None
        if routing.kind == "model":
            raise UsageError(
                "'model' needs the model's router, which opbench moe runs; comm takes balanced, "
                "zipf:S, max-mean:R or histogram:FILE",
                field="--routing",
            )
        out.append(load(routing))
    return out
