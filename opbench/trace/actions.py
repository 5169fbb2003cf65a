"""What ``opbench trace`` does with a parsed log: console summary, CSVs, nccl-tests commands, replay, FSDP check.

Kept apart from analyze.py so the parser API stays import-light (no pandas/tabulate/torch on the hot path).
"""

from __future__ import annotations

import argparse
import math
import os
import shlex
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from opbench.core import cli
from opbench.core.cli import MAX_WORLD, positive_int, world_size
from opbench.core.collectives import COLLECTIVES, nccl_tests_command
from opbench.core.errors import UsageError
from opbench.core.redact import redact_text
from opbench.core.results import CsvReport, environment, summary_table
from opbench.core.schema import Schema
from opbench.core.units import counted, human_bytes, one_line

from .parse import _FULL, MAX_COUNT, MAX_ENUM, MAX_RANKS, LineStats, LogParser, bounded, bounded_lines, open_log
from .schema import TRACE, TRACE_FSDP, TRACE_PER_COMM, TRACE_PER_RANK
from .summary import TraceSummary

# nccl-tests / rccl-tests -o values; PreMulSum (what FSDP's gradient pre-divide logs as op >= 5) is 'mulsum'.
_TESTS_REDOP = {"sum": "sum", "prod": "prod", "max": "max", "min": "min", "avg": "avg", "premulsum": "mulsum"}


def add_action_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("nccl-tests / rccl-tests commands")
    g.add_argument("--commands", action="store_true", help="print one benchmark command per distinct size")
    g.add_argument(
        "--flavour",
        choices=["auto", "nccl", "rccl"],
        default="auto",
        help="auto: rccl-tests when the log has RCCL fields (task/globalrank/acc) or torch is ROCm",
    )
    g.add_argument(
        "--launcher",
        choices=["auto", "single", "mpi"],
        default="auto",
        help="single: one process, -g nranks; mpi: mpirun -np nranks … -g 1; "
        "auto: single when nranks fits one node (--gpus-per-node)",
    )
    g.add_argument("--gpus-per-node", type=positive_int, default=8, help="GPUs per node for -g / mpirun hosts")
    r = p.add_argument_group("replay with the torchrun comm benchmark")
    r.add_argument(
        "--replay", action="store_true", help="run torchrun … -m opbench.comm --sizes-from-trace LOG on this machine"
    )
    r.add_argument(
        "--nproc-per-node",
        type=world_size,
        default=None,
        help="ranks for --replay on this node (default: the log's largest nranks, at most --gpus-per-node; "
        "a log's nranks never launches more)",
    )
    r.add_argument(
        "--replay-arg",
        action="append",
        default=[],
        metavar="ARG",
        help="extra argument for opbench.comm (repeatable), e.g. --replay-arg=--quick",
    )
    cli.add_dry_run_arg(r, "with --replay, print the replay command instead of running it")
    f = p.add_argument_group("compare with the FSDP model")
    f.add_argument(
        "--compare-fsdp", metavar="CFG", help="model config (Primus JSON / HF config.json) or a built-in model name"
    )
    f.add_argument("--model", default=None, help="model name inside CFG when it holds several")
    f.add_argument(
        "--world-size", type=world_size, default=None, help="FSDP world size (default: nranks of the log's AllGathers)"
    )
    f.add_argument("--param-dtype", default=None, help="all-gather dtype (default: the log's AllGather dtype)")
    f.add_argument("--reduce-dtype", default=None, help="reduce-scatter dtype (default: the log's ReduceScatter dtype)")


def printable(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Rows for the console: texts read from a log (hosts, comm handles) with control characters replaced, so a
    log cannot move the cursor or start a new line on the user's terminal."""
    return [{k: one_line(v) if isinstance(v, str) else v for k, v in r.items()} for r in rows]


def side_csv(csv_path: str | None, suffix: str) -> str | None:
    """'sizes.csv' + '_per_rank' → 'sizes_per_rank.csv' (breakdowns live beside the summary)."""
    if not csv_path:
        return None
    p = Path(csv_path)
    return str(p.with_name(f"{p.stem}_{suffix}{p.suffix or '.csv'}"))


def csv_paths(args: argparse.Namespace) -> list[str]:
    """Every CSV this run writes: the summary and the breakdowns asked for beside it."""
    if not args.csv:
        return []
    wanted = {"per_rank": args.per_rank, "per_comm": args.per_comm, "fsdp": args.compare_fsdp}
    return [args.csv, *(side_csv(args.csv, suffix) or "" for suffix, on in wanted.items() if on)]


def write_csv(
    path: str | None, schema: Schema, rows: list[dict[str, Any]], meta: dict[str, Any], earlier: str | None = None
) -> None:
    """Write ``rows``; an earlier CSV at ``path`` is kept aside, replaced or appended to (``earlier``: core.outputs)."""
    if not path:
        return
    with CsvReport(path, schema, meta=meta, earlier=earlier) as report:
        report.extend(rows)
    print(f"wrote {one_line(path)} ({counted(len(rows), 'row')})")


def run(args: argparse.Namespace, summary: TraceSummary, parser: LogParser) -> int:
    st = parser.stats
    files = len(st.files)
    print(
        f"parsed {files} file{'s' if files != 1 else ''} ({human_bytes(st.bytes)}): {st.lines:,} lines, "
        f"{st.calls:,} calls, {st.skipped:,} skipped lines ({st.fragments:,} torn/incomplete call fragments)"
    )
    for err in st.read_errors:
        print(
            f"warning: stopped reading early: {err}; the calls above were read before the damage (a corrupt .gz "
            "can garble lines before its checksum fails: treat them with care)",
            file=sys.stderr,
        )
    if summary.unknown_ops:
        # most seen first, ties by name: the two readers meet the names in different orders
        ranked = sorted(summary.unknown_ops.items(), key=lambda kv: (-kv[1], kv[0]))
        names = ", ".join(f"{op!r} ({n})" for op, n in ranked[:5])
        print(
            f"warning: {sum(summary.unknown_ops.values()):,} call line(s) with no NCCL/RCCL op name skipped "
            f"(torn or damaged lines): {names}",
            file=sys.stderr,
        )
    rows = summary.summary_rows()
    if not rows and summary.out_of_range:
        where, name = first_out_of_range(args.logs)
        raise UsageError(
            "out of range (every call in the log has a number beyond the bounds)", source=where, field=name
        )
    if summary.out_of_range:
        fields = ", ".join(f"{name} ({n:,})" for name, n in summary.out_of_range.most_common())
        print(
            f"warning: {sum(summary.out_of_range.values()):,} call(s) skipped: a number beyond the command line's "
            f"bounds (count <= 2**50, nranks <= {MAX_WORLD:,}): {fields}",
            file=sys.stderr,
        )
    if not rows:
        print(
            f"opbench trace: {one_line(', '.join(args.logs))}: no NCCL calls found (was the job run with NCCL_DEBUG=INFO "
            "NCCL_DEBUG_SUBSYS=COLL?)",
            file=sys.stderr,
        )
        return 1
    meta = environment(
        None,
        {
            "logs": list(args.logs),
            **st.as_dict(),
            "read_errors": st.read_errors,
            "unknown_ops": dict(sorted(summary.unknown_ops.items())),
            "out_of_range": dict(summary.out_of_range),
            "reader": summary.reader,  # native or python (docs/trace.md, "Native reader")
        },
    )
    print_top(rows, args.top)
    write_csv(args.csv, TRACE, rows, meta, cli.earlier_policy(args))
    if args.per_rank:
        rank_rows = summary.per_rank_rows(parser.inits)
        print("\nper rank:")
        print(
            summary_table(
                printable(rank_rows),
                [c for c in TRACE_PER_RANK.columns if c != "globalrank" or summary.rccl_fields],
                max_rows=_at_least(args.top, 64),
            )
        )
        for note in summary.rank_mismatch():
            print(f"warning: ranks disagree: {one_line(note)}")
        write_csv(side_csv(args.csv, "per_rank"), TRACE_PER_RANK, rank_rows, meta, cli.earlier_policy(args))
    if args.per_comm:
        comm_rows = summary.per_comm_rows(parser.inits)
        print("\nper communicator:")
        shown = printable([{**r, "bytes": human_bytes(r["bytes"])} for r in comm_rows])
        print(
            summary_table(shown, [c for c in TRACE_PER_COMM.columns if c != "commid"], max_rows=_at_least(args.top, 32))
        )
        write_csv(side_csv(args.csv, "per_comm"), TRACE_PER_COMM, comm_rows, meta, cli.earlier_policy(args))
    if args.commands:
        print()
        commands = benchmark_commands(rows, flavour(args.flavour, summary), args.launcher, args.gpus_per_node)
        print(redact_text("\n".join(commands)))
    mismatch = False
    if args.compare_fsdp:
        units = compare_fsdp(args, rows, meta)
        unmatched = sum(not r["matched"] for r in units)
        if unmatched:  # a check: a script can tell "the log is not this FSDP model" from its exit code
            print(f"FSDP check: {unmatched} of {len(units)} predicted units do not match the log (exit 1)")
            mismatch = True
    if args.replay:
        return replay(args.logs, rows, args.nproc_per_node, args.gpus_per_node, args.replay_arg, args.dry_run)
    return 1 if st.read_errors or mismatch else 0  # what was read is written, but the log was not read to its end


def first_out_of_range(paths: Sequence[str]) -> tuple[str, str]:
    """("file:line", field) of the first call line whose count, nranks, datatype or op is beyond the bounds
    (only run when every call was: the error names one place to look)."""
    limits = {"count": (0, MAX_COUNT), "nranks": (1, MAX_RANKS), "datatype": (0, MAX_ENUM), "redop": (0, MAX_ENUM)}
    for path in paths:
        if path == "-":
            continue
        with open_log(path) as fh:
            for number, line in enumerate(bounded_lines(fh, LineStats()), 1):
                for m in _FULL.finditer(line):
                    for name, (low, high) in limits.items():
                        if bounded(m.group(name), low, high) < low:
                            return f"{one_line(path)}:{number}", name
    return one_line(", ".join(paths)), "count"


def _at_least(top: int | None, rows: int) -> int | None:
    """Rows of a breakdown table: --top, but at least ``rows`` (one line per rank and op needs more than the
    summary's 15); None (--top 0) shows all."""
    return None if top is None else max(top, rows)


def print_top(rows: list[dict[str, Any]], top: int | None) -> None:
    total = sum(r["total_bytes"] or 0 for r in rows)
    shown = []
    for r in rows[:top]:
        share = (r["total_bytes"] or 0) / total * 100 if total else 0.0
        shown.append(
            {
                **r,
                "size": human_bytes(r["bytes"]),
                "-b": human_bytes(r["nccl_tests_bytes"]),
                "total": human_bytes(r["total_bytes"]),
                "%": f"{share:.1f}",
            }
        )
    print(f"\ntop operations by total bytes ({len(rows)} distinct sizes, {human_bytes(total)} in all):")
    cols = ["op", "count", "dtype", "redop", "nranks", "calls", "size", "-b", "total", "%"]
    if any(r["note"] for r in rows[:top]):
        cols.append("note")
    print(summary_table(shown, cols))
    if top is not None and len(rows) > top:
        print(f"… {len(rows) - top} more sizes (see --csv)")


def flavour(choice: str, summary: TraceSummary) -> str:
    """rccl when asked, when the log has RCCL-only fields, or when this machine has ROCm (found without importing
    torch: a loaded torch's build, else a ROCm install)."""
    if choice != "auto":
        return choice
    if summary.rccl_fields:
        return "rccl"
    torch = sys.modules.get("torch")
    if torch is not None:
        return "rccl" if getattr(torch.version, "hip", None) else "nccl"
    return "rccl" if os.environ.get("ROCM_PATH") or os.path.isdir("/opt/rocm") else "nccl"


def benchmark_commands(rows: list[dict[str, Any]], flav: str, launcher: str, gpus_per_node: int) -> list[str]:
    """One nccl-tests/rccl-tests line per distinct (collective, -b, dtype, redop, nranks), biggest total first.

    ``-b`` follows nccl-tests semantics (core.collectives.Collective.size_bytes): AllGather/ReduceScatter/AlltoAll
    use count·nranks·elt, not the per-rank shard. Ops nccl-tests cannot run are listed as comments."""
    lines = [f"# {flav}-tests commands for the logged sizes (-b = -e = the nccl-tests size of each call)"]
    seen: set[str] = set()
    for r in rows:
        coll = r["collective"]
        if coll not in COLLECTIVES or r["nccl_tests_bytes"] is None:
            lines.append(
                one_line(f"# {r['op']} count {r['count']} {r['dtype']} x{r['calls']}: no nccl-tests equivalent")
            )
            continue
        n = r["nranks"]
        mode = launcher if launcher != "auto" else ("single" if n <= gpus_per_node else "mpi")
        nnodes = 1 if mode == "single" else max(1, math.ceil(n / gpus_per_node))
        if mode == "single" and n > gpus_per_node:
            mode, nnodes = "mpi", math.ceil(n / gpus_per_node)
        redop = _TESTS_REDOP.get(r["redop"] or "") if COLLECTIVES[coll].has_redop else None
        cmd = nccl_tests_command(
            coll, r["nccl_tests_bytes"], n, r["datatype"], flavour=flav, launcher=mode, redop=redop, nnodes=nnodes
        )
        if cmd in seen:
            continue
        seen.add(cmd)
        note = f" ({r['note']})" if r["note"] else ""
        lines.append(
            one_line(f"# {r['op']} count {r['count']} {r['dtype']} nranks {n}: {r['calls']} log line(s){note}")
        )
        lines.append(cmd)
    return lines


# -- replay -------------------------------------------------------------------------------------------------
def replay_command(logs: Sequence[str], nproc: int, extra: Sequence[str]) -> list[str]:
    """torchrun line that times the log's sizes with the comm benchmark (opbench.comm --sizes-from-trace), the
    flag once per log: a file name may hold a comma, which a comma-separated list would split."""
    flags = [arg for log in logs for arg in ("--sizes-from-trace", log)]
    return ["torchrun", "--standalone", f"--nproc-per-node={nproc}", "-m", "opbench.comm", *flags, *extra]


def replay_ranks(rows: list[dict[str, Any]], nproc: int | None, gpus_per_node: int) -> tuple[int, str | None]:
    """Ranks to launch: the user's --nproc-per-node, else the log's largest nranks capped at --gpus-per-node
    (both flags are bounded by the command line); the log's nranks only informs, so a log claiming 99999999
    ranks never launches them. Returns (ranks, a note to print when the log says otherwise)."""
    logged = max((r["nranks"] for r in rows if r["collective"] in COLLECTIVES), default=0)
    n = nproc or max(1, min(logged, gpus_per_node))
    if logged and logged != n:
        return n, f"note: the log's largest communicator has {logged:,} ranks; replaying with {n} on this node"
    return n, None


def replay(
    logs: Sequence[str],
    rows: list[dict[str, Any]],
    nproc: int | None,
    gpus_per_node: int,
    extra: Sequence[str],
    dry_run: bool,
) -> int:
    if "-" in logs:
        raise UsageError("cannot replay a log read from stdin; pass the file path", field="--replay")
    n, note = replay_ranks(rows, nproc, gpus_per_node)
    if note:
        print("\n" + note + " (set --nproc-per-node)")
    cmd = replay_command([os.path.abspath(p) for p in logs], n, extra)
    print("\nreplay: " + redact_text(shlex.join(cmd)))
    if dry_run:
        return 0
    try:
        return subprocess.call(cmd)
    except FileNotFoundError:
        raise UsageError(
            "torchrun not found on PATH (install torch or activate its environment)", field="--replay"
        ) from None


# -- FSDP comparison ----------------------------------------------------------------------------------------
def _dominant(rows: list[dict[str, Any]], op: str, key: str) -> Any:
    tally: dict[Any, int] = {}
    for r in rows:
        if r["op"] == op:
            tally[r[key]] = tally.get(r[key], 0) + r["calls"]
    return max(tally, key=tally.get) if tally else None  # type: ignore[arg-type]


def fsdp_config(args: argparse.Namespace) -> Any:
    """The model --compare-fsdp names (a config file, or a built-in model's name); checked before the log is read,
    so a typo costs no parse and names the flag the user typed."""
    from opbench.models import load_model_configs, select_models

    cfg_arg = args.compare_fsdp
    if os.path.exists(cfg_arg):
        configs = load_model_configs(cfg_arg)
        configs = select_models(configs, args.model) if args.model else configs
    else:  # a built-in model name
        try:
            configs = select_models(load_model_configs(), cfg_arg)
        except UsageError as exc:
            message = str(exc).split(": ", 1)[-1] if str(exc).startswith("field ") else str(exc)
            raise UsageError(f"neither a file nor a built-in model: {message}", field="--compare-fsdp") from None
    if len(configs) != 1:
        raise UsageError(f"holds {len(configs)} models; pick one with --model", source=cfg_arg, field="--model")
    return configs[0]


def compare_fsdp(args: argparse.Namespace, rows: list[dict[str, Any]], meta: dict[str, Any]) -> list[dict[str, Any]]:
    """Match the log's AllGather/ReduceScatter against fsdp_collectives() for the same world size: counts, then
    dtype and reduction. The all-gather dtype is the log's unless --param-dtype says otherwise (it is a choice of
    the job); the reduce-scatter dtype is FSDP2's default, the param dtype, unless --reduce-dtype says otherwise,
    so a job that reduces in fp32 (torchtitan) shows up as a dtype mismatch with a hint."""
    from opbench.core.dtypes import BY_ENUM, FLOAT_DTYPES
    from opbench.fsdp_model.model import fsdp_collectives

    cfg = getattr(args, "fsdp_config", None) or fsdp_config(args)
    world = args.world_size or _dominant(rows, "AllGather", "nranks") or _dominant(rows, "ReduceScatter", "nranks")
    if not world:
        raise UsageError("the log has no AllGather/ReduceScatter and --world-size is not set", field="--world-size")

    def opbench_dtype(enum: int | None, fallback: str) -> str:
        """The FSDP model's dtype name for the log's NCCL datatype (9 → 'bf16'); fallback if none fits."""
        found = BY_ENUM.get(enum) if enum is not None else None
        return found.name if found is not None and found.name in FLOAT_DTYPES else fallback

    param = args.param_dtype or opbench_dtype(_dominant(rows, "AllGather", "datatype"), "bf16")
    reduce = args.reduce_dtype or param
    predicted = fsdp_collectives(
        cfg, world, version=2, param_dtype=param, reduce_dtype=reduce, reshard_after_forward=True, replicate=1
    )
    log_by_key: dict[tuple[str, int], dict[str, Any]] = {}
    for r in rows:
        if r["op"] in ("AllGather", "ReduceScatter") and r["nranks"] == world:
            entry = log_by_key.setdefault((r["op"], r["count"]), {"calls": 0, "dtypes": set(), "redops": set()})
            entry["calls"] += r["calls"]
            entry["dtypes"].add(r["dtype"])
            if r["redop"]:
                entry["redops"].add(r["redop"])
    # Units with the same count cannot be told apart in the log: each (collective, count) group is checked as a
    # whole, its calls per step (summed over its units) × the steps the log covers against the lines logged.
    group_per_step: dict[tuple[str, int], int] = {}
    for c in predicted:
        if c.nccl_op in ("AllGather", "ReduceScatter"):
            group_per_step[(c.nccl_op, c.count)] = group_per_step.get((c.nccl_op, c.count), 0) + c.calls_per_step
    steps, seen = _steps_covered(group_per_step, log_by_key, world)
    out: list[dict[str, Any]] = []
    matched_keys = set()
    for c in predicted:
        if c.nccl_op not in ("AllGather", "ReduceScatter"):
            continue
        key = (c.nccl_op, c.count)
        hit = log_by_key.get(key)
        if hit:
            matched_keys.add(key)
        expected = group_per_step[key] * world * steps
        same = (
            hit is not None
            and hit["calls"] == expected
            and hit["dtypes"] == {c.dtype}
            and (c.redop is None or hit["redops"] == {c.redop})
        )
        out.append(
            {
                "unit": c.unit,
                "collective": c.collective,
                "count": c.count,
                "dtype": c.dtype,
                "redop": c.redop,
                "nranks": c.nranks,
                "calls_per_step": c.calls_per_step,
                "nccl_tests_bytes": c.nccl_tests_bytes,
                "expected_log_calls": expected,
                "log_calls": hit["calls"] if hit else 0,
                "log_dtype": ",".join(sorted(hit["dtypes"])) if hit else None,
                "log_redop": ",".join(sorted(hit["redops"])) if hit else None,
                "matched": same,
                "steps_in_log": round(hit["calls"] / (group_per_step[key] * world), 2) if hit else None,
            }
        )
    n_units = len(out)
    n_hit = sum(bool(r["matched"]) for r in out)
    n_found = sum(bool(r["log_calls"]) for r in out)
    print(
        f"\nFSDP2 model ({one_line(cfg.name)}, world {world}, param {param}, reduce {reduce}): the log covers "
        f"{f'{steps} step(s)' if seen >= 0.5 else f'{seen:.2g} of a step'}; "
        f"{n_hit} of {n_units} predicted AllGather/ReduceScatter units matched (calls per step × steps × ranks, "
        f"dtype and reduction), {n_found - n_hit} logged but not matching, {n_units - n_found} not in the log"
    )
    print(
        summary_table(
            _group_units(out),
            [
                "units",
                "collective",
                "count",
                "dtype",
                "redop",
                "calls_per_step",
                "expected_log_calls",
                "log_calls",
                "log_dtype",
                "log_redop",
                "matched",
            ],
            max_rows=40,
        )
    )
    for r in out:
        if r["log_calls"] and r["log_calls"] != r["expected_log_calls"]:
            print(
                f"calls differ: {r['collective']} count {r['count']}: {r['expected_log_calls']} log lines expected "
                f"for {steps} step(s) × {world} ranks, {r['log_calls']} logged (a partial step, or units the model "
                "does not know)"
            )
            break
    for r in out:
        differs = r["log_dtype"] != r["dtype"] or (r["redop"] is not None and r["log_redop"] != r["redop"])
        if r["log_calls"] and differs:
            hint = ""
            if r["collective"] == "reduce_scatter" and r["log_dtype"] != r["dtype"] and not args.reduce_dtype:
                hint = f" (a job that sets MixedPrecisionPolicy.reduce_dtype, as torchtitan: --reduce-dtype {r['log_dtype']})"
            print(
                f"dtype/reduction differ: {r['collective']} count {r['count']}: model {r['dtype']}"
                f"{'/' + r['redop'] if r['redop'] else ''}, log {r['log_dtype']}"
                f"{'/' + r['log_redop'] if r['log_redop'] else ''}{hint}"
            )
            break
    extra = sorted(k for k in log_by_key if k not in matched_keys)
    if extra:
        shown = ", ".join(f"{op} {count} (x{log_by_key[(op, count)]['calls']})" for op, count in extra[:10])
        print(f"log sizes the model does not predict ({len(extra)}): {shown}")
    write_csv(
        side_csv(args.csv, "fsdp"),
        TRACE_FSDP,
        out,
        {**meta, "model": cfg.name, "world_size": world},
        cli.earlier_policy(args),
    )
    return out


def _steps_covered(group_per_step: dict[tuple[str, int], int], log_by_key: dict, world: int) -> tuple[int, float]:
    """Training steps the log covers, from the group with the most calls per step (the decoder layers'
    all-gathers): its log lines / (calls per step × ranks), as a whole number (at least 1 when any of its calls
    is there) and as the fraction seen."""
    if not group_per_step:
        return 0, 0.0
    key = max(group_per_step, key=lambda k: (k[0] == "AllGather", group_per_step[k]))
    hit = log_by_key.get(key)
    if not hit:
        return 0, 0.0
    seen = hit["calls"] / (group_per_step[key] * world)
    return max(1, round(seen)), seen


def _group_units(out: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Console view: identical decoder layers collapse into one line ('layers.0-79')."""
    grouped: dict[tuple, dict[str, Any]] = {}
    for r in out:
        key = (r["collective"], r["count"], r["dtype"], r["calls_per_step"], r["log_calls"], r["matched"])
        g = grouped.setdefault(key, {**r, "units": []})
        g["units"].append(r["unit"])
    rows = []
    for g in grouped.values():
        units = g["units"]
        g["units"] = units[0] if len(units) == 1 else f"{units[0]} … {units[-1]} ({len(units)})"
        rows.append(g)
    return rows
