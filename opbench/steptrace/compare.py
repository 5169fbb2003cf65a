"""Set a measured step beside ``opbench project``'s projection of the same model and layout, line item by line item,
and write the per-class factors (``--calibrate``) that ``opbench project --calibration`` reads back.

The projection's flags are ``opbench project``'s own, parsed by its parser (``--project "--model-config-path …
--world-size 8 …"``): one meaning per flag. Its compute line items are the critical stage's GEMM, attention and
memory-bound items times the micro-batches (``opbench.project.step``); collectives are the exposed time per
parallel dimension (tp_comm, dp_comm, …), which a trace names by collective kind, so both are listed and compared in
total. Imports pandas (the rates) only when a projection is asked for; no torch.
"""

from __future__ import annotations

import json
import math
import shlex
from typing import Any

from opbench.core.errors import UsageError

from . import rules
from .attribute import IDLE

# measured line item -> the projection's, where the two mean the same thing
COMPUTE_ITEMS = (rules.GEMM, rules.ATTENTION, rules.MEMORY)
CALIBRATED = COMPUTE_ITEMS  # opbench.project.calibration.CLASSES: the classes a factor scales


def projected_items(flags: str) -> tuple[dict[str, float], dict[str, Any], Any]:
    """``_projected_items``, its errors said to come from ``--project``'s flags."""
    try:
        return _projected_items(flags)
    except UsageError as exc:
        if str(exc).startswith("field '--project'"):
            raise
        raise UsageError(str(exc), source="--project") from None


def _projected_items(flags: str) -> tuple[dict[str, float], dict[str, Any], Any]:
    """The projection's line items (seconds per step of one rank) for ``opbench project`` flags, what it was
    (model, layout, device) for the sidecar, and its rates (``opbench.project.rates.Rates``) for the kernel rows."""
    from dataclasses import replace

    from opbench.core.peaks import node_gpus_of
    from opbench.models import load_model_configs, select_models
    from opbench.project.__main__ import assumptions, base_plan, build_parser
    from opbench.project.plan import check_part
    from opbench.project.rates import Rates
    from opbench.project.step import Projector
    from opbench.project.workload import COMPUTE_KINDS

    try:
        words = shlex.split(flags)
    except ValueError as exc:
        raise UsageError(f"cannot split the flags: {exc}", field="--project") from None
    args = build_parser().parse_args(words)
    if args.model_config_path is None and args.model is None:
        raise UsageError("the projection needs a model: --model or --model-config-path", field="--project")
    configs = select_models(load_model_configs(args.model_config_path, args.model_name), args.model)
    if len(configs) != 1:
        raise UsageError(f"projects one model at a time, got {len(configs)}", field="--project")
    (cfg,) = configs
    plan = base_plan(cfg, args)
    rates = Rates(args.results, args.device, args.dtype, assumptions(args), args.gpus_per_node)
    check_part(plan, rates.device)  # as opbench project refuses it
    if args.gpus_per_node_from_part and not args.device and args.results:  # the part --results was measured on
        plan = replace(plan, gpus_per_node=node_gpus_of(rates.device))
    projector = Projector(cfg, rates, args.activation_profile, None, args.memory_reserve_gib)
    result = projector.project(plan)
    work = projector.stage_work(plan)
    busy = [sum(w.fwd_s + w.bwd_s for w in chunks) for chunks in work]
    crit = max(range(len(work)), key=lambda s: busy[s])
    out: dict[str, float] = {k: 0.0 for k in COMPUTE_KINDS}
    for w in work[crit]:
        for item in (*w.fwd, *w.bwd):
            if item.category in COMPUTE_KINDS:
                out[item.category] += item.exposed * plan.microbatches
    out[rules.OPTIMIZER] = result.optimizer_s
    offload = result.exposed_comm_s.get("offload", 0.0)  # host copies: a trace's memcpy, not a collective
    for category, seconds in result.exposed_comm_s.items():
        if category != "offload":
            out[f"comm:{category}"] = seconds
    out["comm"] = result.exposed_comm_total - offload
    if offload:
        out[rules.MEMCPY] = offload
    out["bubble"] = result.bubble_s
    out[IDLE] = result.host_wait_s  # the GPU waiting on its host (host-bound, or at synchronisations): a trace's idle
    out["step"] = result.step_s
    meta = {"model": cfg.name, "flags": flags, "device": rates.device, "world": plan.world, "sources": result.sources}
    return out, meta, rates


def kernel_rates(rows: list[dict[str, Any]], rates: Any) -> None:
    """Each GEMM row's time at the projection's rate for its shape (``--results`` rows of this cluster, else the
    peak table's estimate: the sidecar's ``sources`` say which) beside the measured one: ``projected_s`` per step
    and ``measured_over_projected`` (1 = the step's kernel ran at the rate measured for that shape)."""
    for row in rows:
        if row["class"] != rules.GEMM or not (row["m"] and row["n"] and row["k"]):
            continue
        per_call = rates.gemm_time(row["m"], row["n"], row["k"], row["groups"] or 1, row["dtype"] == "fp8").seconds
        row["projected_s"] = per_call * row["calls"]
        if row["projected_s"] > 0:
            row["measured_over_projected"] = row["time_s"] / row["projected_s"]


def side_by_side(measured: dict[str, float], projected: dict[str, float]) -> list[dict[str, Any]]:
    """One row per line item either side has: measured and projected seconds and their ratio."""
    rows = []
    names = list(measured) + [k for k in projected if k not in measured]
    for item in names:
        m, p = measured.get(item), projected.get(item)
        ratio = m / p if m is not None and p else None
        rows.append({"item": item, "measured_s": m, "projected_s": p, "measured_over_projected": ratio})
    return rows


def measured_totals(per_rank: list[dict[str, dict[str, float]]]) -> dict[str, float]:
    """Mean over ranks of each line item (``bubble`` among them: a pipeline stage's waits on its neighbours,
    docs/step.md, "The pipeline bubble"; 0 in a trace with no pipeline send or receive), plus ``comm`` (every
    collective's exposed time)."""
    out: dict[str, float] = {}
    for items in per_rank:
        for k, v in items.items():
            out[k] = out.get(k, 0.0) + v["measured_s"] / len(per_rank)
    out["comm"] = sum(v for k, v in out.items() if k.startswith("comm:"))
    return out


def factors(measured: dict[str, float], projected: dict[str, float]) -> dict[str, float]:
    """measured / projected for each compute class both sides have time for: what ``project --calibration``
    multiplies that class's times by."""
    out = {}
    for klass in CALIBRATED:
        m, p = measured.get(klass, 0.0), projected.get(klass, 0.0)
        if m > 0 and p > 0 and math.isfinite(m / p):
            out[klass] = round(m / p, 6)
    return out


def write_calibration(path: str, fac: dict[str, float], meta: dict[str, Any]) -> None:
    from opbench.core.outputs import write_file

    if not fac:
        raise UsageError("no class has time on both sides: nothing to calibrate", field="--calibrate")
    doc = {"factors": fac, **meta, "how": "measured / projected per class, mean of the traces' steps (docs/step.md)"}
    write_file(path, (json.dumps(doc, indent=2, sort_keys=True) + "\n").encode())
