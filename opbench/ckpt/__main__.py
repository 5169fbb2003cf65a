"""Checkpoint save/load benchmark CLI.

    torchrun --nproc-per-node 8 -m opbench.ckpt --model Llama3.1_8B --methods torch_save,dcp,dcp_async \\
        --storage /nvme/ckpt,s3://bucket/ckpt --thread-count 1,4 --report-dir-path out/ckpt
    srun --ntasks-per-node 8 python -m opbench.ckpt ...     # one world; the job script exports MASTER_ADDR
    opbench ckpt --nproc-per-node 2 --size-mb 256          # starts torchrun itself on this machine
    python -m opbench.ckpt --size-mb 64                     # one process (world size 1)

Writes DIR/ckpt_benchmark.csv (one row per state × storage × method × thread count, as each finishes) and
DIR/ckpt_benchmark.meta.json (environment, every per-iteration and per-rank time).
"""

from __future__ import annotations

import argparse
import itertools
import os
import sys
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from opbench.core import cli, dist
from opbench.core.cli import csv_list, positive_int, size_mib
from opbench.core.dtypes import FLOAT_DTYPES
from opbench.core.errors import UsageError, run_cli
from opbench.core.faults import Faults
from opbench.core.progress import STATUS, Field, column, figure, time_text
from opbench.core.redact import redact_text
from opbench.core.units import wrapped

from .schema import METHOD_NAMES, SCHEMA
from .spec import OPTIMIZERS, StateSpec, model_state_spec, synthetic_state_spec, with_num_layers
from .storage import Storage, parse_storage_options, preflight, remove_tree

if TYPE_CHECKING:
    from .runner import Case, RunOptions

CSV_NAME = "ckpt_benchmark.csv"
DEFAULT_SIZE_MB = 256.0
SUMMARY = [
    "model",
    "method",
    "storage",
    "thread_count",
    "save_block_time",
    "save_total_time",
    "load_time",
    "iter_folder_size",
    "save_bandwidth_mib_per_s",
    "load_bandwidth_mib_per_s",
    "pct_of_raw_save",
    "pct_of_raw_load",
    "accurate",
    "verified",
    "status",
]


# One line per finished case in a batch log (core.progress): which method on which storage, and how fast.
LINE_FIELDS = [
    column("method", 10, left=True),
    column("thread_count", 7, title="threads"),
    Field("save block", 10, lambda r: time_text(r.get("save_block_time"))),
    Field("save total", 10, lambda r: time_text(r.get("save_total_time"))),
    Field("load", 9, lambda r: time_text(r.get("load_time"))),
    Field("save MiB/s", 10, lambda r: figure(r.get("save_bandwidth_mib_per_s"))),
    Field("load MiB/s", 10, lambda r: figure(r.get("load_bandwidth_mib_per_s"))),
    STATUS,
]


def build_parser() -> argparse.ArgumentParser:
    p = cli.parser("opbench ckpt", __doc__)
    g = p.add_argument_group("state (what is saved)")
    cli.add_model_args(g, with_name=False)
    g.add_argument(
        "--num-layers",
        type=cli.layer_count,
        default=None,
        help="override the model's decoder layer count (to fit a big model on a small machine)",
    )
    g.add_argument(
        "--optimizer",
        choices=OPTIMIZERS,
        default="adam",
        help="adam: exp_avg + exp_avg_sq per parameter; sgd: momentum_buffer (all fp32)",
    )
    g.add_argument("--param-dtype", choices=FLOAT_DTYPES, default="bf16", help="parameter dtype")
    g.add_argument(
        "--master-weights",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="fp32 master copy of the parameters (default: on unless --param-dtype fp32)",
    )
    g.add_argument(
        "--size-mb",
        type=csv_list(size_mib),
        default=None,
        help=f"instead of a model: total MiB across all ranks, in --param-dtype tensors of realistic "
        f"sizes; comma-separated to sweep (default: {DEFAULT_SIZE_MB:g} when no model is given)",
    )
    g = p.add_argument_group("methods and storage (every combination is one CSV row)")
    g.add_argument(
        "--methods",
        type=csv_list(str),
        default=["torch_save", "dcp", "dcp_async"],
        help=f"comma-separated from {','.join(m for m in METHOD_NAMES if m != 'raw')}",
    )
    g.add_argument(
        "--raw",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="first, per storage: the same bytes as plain sequential files (write + fsync, read back), the "
        "storage's own speed; every other row gets pct_of_raw_save / pct_of_raw_load",
    )
    g.add_argument(
        "--storage",
        type=csv_list(str),
        default=None,
        help="directories and/or fsspec URLs (s3://bucket/prefix, gs://…, file://…, memory://), "
        "comma-separated (default: REPORT_DIR/ckpt_data)",
    )
    g.add_argument(
        "--storage-options",
        default=None,
        help='JSON for the fsspec file system, e.g. \'{"endpoint_url": "http://127.0.0.1:9000"}\'',
    )
    g.add_argument(
        "--thread-count",
        type=csv_list(thread_count),
        default=[1],
        help="DCP writer threads per rank, comma-separated to sweep",
    )
    g.add_argument(
        "--single-file-per-rank",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="DCP: one file per rank instead of one per tensor",
    )
    g.add_argument(
        "--sync-files",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="fsync every file before a save counts as done",
    )
    g = p.add_argument_group("measurement")
    g.add_argument(
        "--iterations", type=positive_int, default=3, help="saves per case, each to a new directory, then as many loads"
    )
    g.add_argument(
        "--save-interval",
        type=cli.finite_float,
        default=0.0,
        help="async methods: seconds of simulated training after each async save returns; a save "
        "still running then makes accurate=false (default: 0, wait for it at once)",
    )
    g.add_argument(
        "--drop-cache",
        action="store_true",
        help="evict the saved files from the page cache before each load (local storage)",
    )
    cli.add_timeout_arg(g, 1800.0)
    g.add_argument("--keep", action="store_true", help="keep the checkpoints instead of deleting each case's")
    g.add_argument(
        "--device", type=cli.device_spec, default="auto", help="where the state lives: auto (GPU if present), cpu, cuda"
    )
    cli.add_output_args(g, dir_default=cli.tool_dir("ckpt"), dir_help=f"where {CSV_NAME} goes")
    cli.add_earlier_args(p)
    g.add_argument(
        "--nproc-per-node",
        type=positive_int,
        default=None,
        help="not under torchrun/srun: start torchrun with this many ranks on this machine",
    )
    cli.add_dry_run_arg(g, "print the states and the cases, save nothing")
    return p


MAX_THREADS = 1024  # DCP writer threads per rank; more is a typo, and each is a real thread with its own file


def thread_count(text: str) -> int:
    value = positive_int(text)
    if value > MAX_THREADS:
        raise argparse.ArgumentTypeError(f"{value} writer threads per rank is more than {MAX_THREADS}; is that a typo?")
    return value


def state_specs(args: argparse.Namespace) -> list[StateSpec]:
    """The states to sweep: each selected model (with --num-layers), or each --size-mb."""
    if args.save_interval < 0:
        raise UsageError(f"must not be negative, got {args.save_interval}", field="--save-interval")
    if args.timeout <= 0:
        raise UsageError(f"must be positive, got {args.timeout:g}", field="--timeout")
    if args.size_mb is not None and (args.model or args.model_config_path):
        raise UsageError(
            "give either --size-mb or a model (--model / --model-config-path), not both", field="--size-mb"
        )
    if args.model is None and args.model_config_path is None:
        sizes = args.size_mb or [DEFAULT_SIZE_MB]
        if any(s <= 0 for s in sizes):
            raise UsageError(f"must be positive, got {','.join(f'{s:g}' for s in sizes)}", field="--size-mb")
        return [synthetic_state_spec(int(s * 2**20), args.param_dtype) for s in sizes]
    from opbench.models import load_model_configs, select_models

    configs = load_model_configs(args.model_config_path, None)
    chosen = select_models(configs, args.model) if args.model else configs
    return [
        model_state_spec(with_num_layers(cfg, args.num_layers), args.optimizer, args.param_dtype, args.master_weights)
        for cfg in chosen
    ]


def cases_for(state_index: int, storages: list[Storage], methods: list[str], threads: list[int]) -> list[Case]:
    """storage × method × thread count; methods without a thread knob get one case, thread_count empty."""
    from .methods import get_method
    from .runner import Case

    cases: list[Case] = []
    for storage, name in itertools.product(storages, methods):
        method = get_method(name)
        for tc in threads if method.uses_threads else [None]:
            cases.append(Case(state_index, storage, method, tc))
    return cases


def check_memory(specs: list[StateSpec], world: int, device: Any) -> None:
    """Refuse a state this machine cannot hold: on a CPU the state and one copy (a torch.load result or async
    staging) in host memory; on a GPU the state and a loaded copy in the GPU's memory, and (the staging copy)
    the state once more in host memory."""
    local = int(os.environ.get("LOCAL_WORLD_SIZE", world))
    field = "--model" if any(s.optimizer for s in specs) else "--size-mb"
    advice = "use --num-layers or a smaller --size-mb"
    if device.type == "cuda":
        import torch

        gpu_bytes = torch.cuda.get_device_properties(device).total_memory
        for spec in specs:
            need = spec.local_bytes(0, world) * 2
            if need > 0.9 * gpu_bytes:
                raise UsageError(
                    f"state '{spec.label}' needs about {need / 2**30:.1f} GiB on each GPU ({spec.local_bytes(0, world) / 2**30:.2f} "
                    f"GiB per rank, twice for a loaded copy) but the GPU has {gpu_bytes / 2**30:.1f} GiB; {advice}",
                    field=field,
                )
    try:
        with open("/proc/meminfo") as fh:
            avail = next(int(line.split()[1]) * 1024 for line in fh if line.startswith("MemAvailable:"))
    except (OSError, StopIteration):
        return
    copies = 2 if device.type == "cpu" else 1
    for spec in specs:
        need = spec.local_bytes(0, world) * local * copies
        if need > avail:
            what = (
                "twice for load/staging copies" if copies == 2 else "once for staging and loading through host memory"
            )
            raise UsageError(
                f"state '{spec.label}' needs about {need / 2**30:.1f} GiB of memory on this node "
                f"({local} ranks × {spec.local_bytes(0, world) / 2**30:.2f} GiB, {what}) but "
                f"{avail / 2**30:.1f} GiB is available; {advice}",
                field=field,
            )


def parse(argv: Sequence[str] | None) -> tuple[argparse.Namespace, list[StateSpec], list[Storage], RunOptions]:
    args = build_parser().parse_args(argv)
    specs = state_specs(args)
    unknown = [m for m in args.methods if m not in METHOD_NAMES]
    if unknown:
        raise UsageError(f"unknown method '{unknown[0]}' (choose from {', '.join(METHOD_NAMES)})", field="--methods")
    if args.raw and "raw" not in args.methods:
        args.methods = ["raw", *args.methods]
    args.methods = sorted(dict.fromkeys(args.methods), key=lambda m: m != "raw")  # raw first: the others' yardstick
    options = parse_storage_options(args.storage_options)
    storages = [Storage(s, options) for s in (args.storage or [os.path.join(args.report_dir_path, "ckpt_data")])]
    for storage in storages:
        storage.check_protocol()
    from .runner import RunOptions  # torch: after every argument is known to be good

    run = RunOptions(
        args.iterations,
        args.save_interval,
        args.drop_cache,
        args.keep,
        args.single_file_per_rank,
        args.sync_files,
        Faults.from_env(),
        args.timeout,
    )
    return args, specs, storages, run


def dry_run(args, specs: list[StateSpec], storages: list[Storage], world: int) -> int:
    from opbench.core.results import summary_table

    Faults.validate(world)  # as a real run would: a fault for a rank this world lacks is refused here too
    rows = [
        dict(
            state=s.label,
            tensors=len(s.tensors),
            total_GiB=s.total_bytes / 2**30,
            per_rank_GiB=s.local_bytes(0, world) / 2**30,
            optimizer=s.optimizer,
            param_dtype=s.param_dtype,
            master_weights=s.master_weights,
            num_layers=s.num_layers,
        )
        for s in specs
    ]
    print(summary_table(rows, list(rows[0])))
    cases = cases_for(0, storages, args.methods, args.thread_count)
    print(f"\n{len(cases)} cases per state, {args.iterations} saves and loads each, world size {world}:")
    print(
        summary_table(
            [dict(method=c.method.name, storage=c.storage.spec, thread_count=c.thread_count) for c in cases],
            ["method", "storage", "thread_count"],
        )
    )
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args, specs, storages, run = parse(argv)
    dist_env = dist.detect()
    if dist_env is not None:
        world = dist_env.world_size
        per_node = os.environ.get("LOCAL_WORLD_SIZE")
        if args.nproc_per_node and per_node and args.nproc_per_node != int(per_node):
            raise UsageError(
                f"the launcher started {per_node} ranks per node, not {args.nproc_per_node}", field="--nproc-per-node"
            )
    else:
        world = args.nproc_per_node or 1
    if args.dry_run:
        return dry_run(args, specs, storages, world) if dist_env is None or dist_env.is_main else 0
    from opbench.core.device import resolve_device

    check_memory(specs, world, resolve_device(args.device))
    if dist_env is None and world > 1:
        # Check the storage here so a typo fails once, cleanly, before any rank starts.
        for storage in storages:
            remove_tree(storage, preflight(storage, world, needed_bytes(specs, run)))
        return dist.relaunch(
            dist.torchrun_command(
                dist.without_flag(argv, "--nproc-per-node"), world, "opbench.ckpt", timeout_s=args.timeout
            ),
            "opbench ckpt",
        )
    return _run_ranks(args, specs, storages, run, dist_env or dist.single())


def _run_ranks(args, specs: list[StateSpec], storages: list[Storage], run: RunOptions, dist_env: dist.DistEnv) -> int:
    ranks = dist.Ranks.join(dist_env, args.device, args.timeout, cpu_group=True)
    try:
        ranks.same_arguments(args)
        run.faults.for_world(ranks.world_size)
        return _benchmark(args, specs, storages, run, ranks)
    except UsageError:
        if ranks.is_main:
            raise
        return 2
    finally:
        from .methods import stop_async_daemon

        stop_async_daemon()
        ranks.stop()


def _benchmark(args, specs: list[StateSpec], storages: list[Storage], run: RunOptions, ranks: dist.Ranks) -> int:
    from opbench.core.results import environment, summary_table

    from .runner import warm_up_state

    run_dirs = _preflight_all(ranks, storages, specs, run)
    meta: dict[str, Any] = {}
    if ranks.is_main:
        meta = environment(
            ranks.device,
            dict(
                world_size=ranks.world_size,
                launcher=ranks.env.launcher,
                nnodes=ranks.env.nnodes,
                # the options as parsed (a mapping, masked key by key), not as typed: escapes cannot hide a name
                args={**vars(args), "storage_options": parse_storage_options(args.storage_options) or None},
                run_dirs=run_dirs,
                states=[],
                cases=[],
            ),
        )
    report = ranks.open_report(
        os.path.join(args.report_dir_path, CSV_NAME), SCHEMA, meta, earlier=cli.earlier_policy(args)
    )
    rows: list[dict[str, Any]] = []
    tiny = warm_up_state(ranks)
    failures = FailureLog(os.path.join(args.report_dir_path, ERRORS_LOG_NAME), ranks)
    try:
        for index, spec in enumerate(specs):
            rows += _sweep_state(args, index, spec, storages, run_dirs, run, ranks, tiny, report, meta, failures)
    finally:
        if ranks.is_main and not run.keep:
            for storage, run_dir in zip(storages, run_dirs):
                if storage.spec in failures.down:
                    continue  # nothing there can be reached; every attempt would wait out the retries
                try:
                    remove_tree(storage, run_dir)
                except Exception:  # noqa: BLE001 - leftovers are harmless, the report is what matters
                    pass
        report.close()
    if not ranks.is_main:
        return 0 if all(r.get("status") == "ok" for r in rows) else 1
    print(summary_table(rows, SUMMARY, schema=SCHEMA))
    for text in (async_note(rows, ranks.device.type), raw_note(rows)):
        if text:
            print("\n" + wrapped(text))
    print(f"\nwrote {report.path}")
    bad = [r for r in rows if r.get("status") != "ok" or r.get("verified") is False]
    for where, reason in failures.down.items():
        print(
            f"opbench ckpt: {redact_text(where)}: {redact_text(reason)}; its remaining cases were not run",
            file=sys.stderr,
        )
    if bad:
        where = f"; tracebacks in {failures.path}" if failures.written else ""
        print(
            f"opbench ckpt: {len(bad)} of {len(rows)} cases failed or did not verify (see status/error{where})",
            file=sys.stderr,
        )
        return 1
    return 0


ERRORS_LOG_NAME = "ckpt_benchmark.errors.log"


class FailureLog:
    """The failed cases' full tracebacks (every rank's, gathered to rank 0) in a log beside the CSV, so the CSV's
    error cell stays one line; and the storages found down, whose remaining cases are not run. Every rank keeps
    the same ``down``: it comes from the failure every rank was told (core.dist.Ranks.agree)."""

    def __init__(self, path: str, ranks: dist.Ranks):
        self.path, self.ranks = path, ranks
        self.down: dict[str, str] = {}  # storage spec -> the one-line reason
        self.written = False

    def record(self, case: Case, exc: BaseException, tracebacks: list[str]) -> None:
        """After a case failed on every rank: remember a storage that is down, log the tracebacks (rank 0)."""
        from opbench.core.results import launch_command

        from .failures import STORAGE_DOWN

        if getattr(exc, "status", None) == STORAGE_DOWN:
            self.down.setdefault(case.storage.spec, str(exc))
        everyone = self.ranks.gather("".join(tracebacks))
        if not self.ranks.is_main:
            return
        text = "".join(
            f"--- {case.tag} on {case.storage.spec}, rank {rank}\n{tb}" for rank, tb in enumerate(everyone) if tb
        )
        if not self.written:  # appended: an earlier run's tracebacks stay, each run under its own heading
            text = f"=== opbench ckpt, {time.strftime('%Y-%m-%d %H:%M:%S %Z')}: {launch_command()}\n{text}"
        try:
            with open(self.path, "a", encoding="utf-8") as fh:
                fh.write(redact_text(text))
            self.written = True
        except OSError as e:  # the CSV row still says what failed
            print(f"opbench ckpt: warning: cannot write {self.path}: {e}", file=sys.stderr)


def _sweep_state(
    args,
    index: int,
    spec: StateSpec,
    storages: list[Storage],
    run_dirs: list[str],
    run: RunOptions,
    ranks: dist.Ranks,
    tiny: Any,
    report: Any,
    meta: dict[str, Any],
    failures: FailureLog,
) -> list[dict[str, Any]]:
    """Every case of one state; the state is built here and freed when this returns."""
    from opbench.core.dist import RankFailure
    from opbench.core.sweep import run_sweep

    from .failures import STORAGE_DOWN
    from .runner import base_row, case_row, run_case, sidecar_entry
    from .state import ShardedState

    cases = cases_for(index, storages, args.methods, args.thread_count)
    start = time.perf_counter()
    state = ShardedState.build(spec, ranks.rank, ranks.world_size, ranks.device)
    state.dcp_state_dict()  # DTensor views made once, outside every timing
    if ranks.is_main:
        meta["states"].append(
            dict(
                label=spec.label,
                tensors=len(spec.tensors),
                total_bytes=spec.total_bytes,
                rank0_bytes=state.local_bytes,
                build_s=time.perf_counter() - start,
            )
        )
    primed_s = prime_storages(ranks, state, storages, run_dirs, run)
    if ranks.is_main:
        meta["states"][-1]["prime_s"] = primed_s

    raw_rows: dict[str, dict[str, Any]] = {}  # per storage: this state's raw row, measured first

    def measure(case: Case) -> dict[str, Any]:
        case_dir = f"{run_dirs[storages.index(case.storage)]}/{case.tag}"
        if case.storage.spec in failures.down:
            raise StorageDown(failures.down[case.storage.spec])  # a row at once, with the first case's reason
        tracebacks: list[str] = []
        try:
            result = run_case(ranks, state, case, case_dir, run, tiny, tracebacks)
        except Exception as exc:
            if getattr(exc, "status", None) == STORAGE_DOWN or not dist.job_broken(exc):
                failures.record(case, exc, tracebacks)
                raise  # the case's own failure: a row, and the sweep goes on
            # A peer exited or hung: every later case would wait out --timeout too. Leave now, with one line.
            if ranks.is_main and not run.keep:
                for storage, run_dir in zip(storages, run_dirs):
                    try:
                        remove_tree(storage, run_dir)
                    except Exception:  # noqa: BLE001 - best effort on the way out
                        pass
            dist.fail_job(
                "opbench ckpt",
                f"rank {ranks.rank}/{ranks.world_size}: {case.tag} failed (--timeout {args.timeout:g} s): "
                f"{redact_text(' '.join(str(exc).split()))[:300]} (a peer rank probably exited or hung)",
            )
            raise
        if ranks.is_main:
            meta["cases"].append(sidecar_entry(case, result))
            report.write_meta(meta)
        row = case_row(case, state, ranks, run, result)
        if case.method.name == "raw":
            raw_rows[case.storage.spec] = row
        return with_raw_ratios(row, raw_rows.get(case.storage.spec))

    def failed(case: Case, status: str, message: str) -> dict[str, Any]:
        message = failures.down.get(case.storage.spec) or message.removeprefix(f"{RankFailure.__name__}: ")
        return {**base_row(case, state, ranks, run), "status": status, "error": message}

    return run_sweep(cases, measure, failed, report, desc=spec.label, fields=LINE_FIELDS)


def with_raw_ratios(row: dict[str, Any], raw: dict[str, Any] | None) -> dict[str, Any]:
    """pct_of_raw_save / pct_of_raw_load: the row's bandwidth as a percentage of the raw row's on the same storage
    and state (100 × bandwidth / raw bandwidth); empty when there is no raw row or either side is missing."""
    usable = raw is not None and raw.get("status") == "ok" and row.get("status") == "ok"
    for col, metric in (
        ("pct_of_raw_save", "save_bandwidth_mib_per_s"),
        ("pct_of_raw_load", "load_bandwidth_mib_per_s"),
    ):
        mine, ref = row.get(metric), (raw or {}).get(metric)
        row[col] = 100.0 * mine / ref if usable and mine and ref else None
    return row


def _case_key(row: dict[str, Any]) -> tuple[Any, ...]:
    """What two rows must share to be compared: the state, the storage, the writer threads."""
    return row.get("model"), row.get("storage"), row.get("thread_count")


def async_note(rows: Sequence[dict[str, Any]], device_type: str) -> str | None:
    """What an async method's save_block_time holds, said under the table, and, only where the rows show it, that
    it blocked longer than the synchronous dcp save beside it (on a CPU the staging copy is extra work; on a GPU
    it is the device-to-host copy a save makes anyway). None without an async row."""
    done = [r for r in rows if r.get("status") == "ok"]
    staging = sorted({r["async_staging"] for r in done if r.get("async_staging")})
    if not staging:
        return None
    where = " and ".join(staging)
    if device_type == "cpu":
        text = (
            f"async save_block_time = copying the state into {where} (staging); planning and writing run in the "
            "background."
        )
    else:
        text = (
            f"async save_block_time = the device-to-host copy of the state into {where} (staging); "
            "save_total_time adds planning and the write, in the background."
        )
    dcp = {_case_key(r): r["save_block_time"] for r in done if r.get("method") == "dcp"}
    longer = [
        (r, dcp[_case_key(r)])
        for r in done
        if r.get("async_staging") and _case_key(r) in dcp and r["save_block_time"] > dcp[_case_key(r)]
    ]
    if longer:
        r, sync = longer[0]
        cases = f"{len(longer)} cases; the first: " if len(longer) > 1 else ""
        text += (
            f" Here {r['method']} blocked longer than dcp's whole save ({cases}{r['save_block_time']:.3g} s against "
            f"{sync:.3g} s)"
            + (
                ": on a CPU the state already lives in host memory, so staging is extra work; on a GPU it is the "
                "device-to-host copy any save makes, and async pays off (docs/ckpt.md)."
                if device_type == "cpu"
                else ": the staging copy took longer than planning and writing together (docs/ckpt.md)."
            )
        )
    return text


def raw_note(rows: Sequence[dict[str, Any]]) -> str | None:
    """Why a row can read above 100 % of raw, said only when one does: raw runs the same bytes through the same
    file system (one file per rank, fsync with --sync-files, loads in place), measured once, first (after
    ``prime_storages``); what is left above 100 % is the storage's speed moving between cases, beside raw's own
    spread (docs/ckpt.md, "Measurement")."""
    done = [r for r in rows if r.get("status") == "ok"]
    raw = {(r.get("model"), r.get("storage")): r for r in done if r.get("method") == "raw"}
    over = []
    for r in done:
        ref = raw.get((r.get("model"), r.get("storage")))
        for what, col, spread in (("save", "save", "save_total_time"), ("load", "load", "load_time")):
            pct = r.get(f"pct_of_raw_{col}")
            if ref is not None and pct is not None and pct > 100 and r is not ref:
                lo, hi = ref.get(f"{spread}_min"), ref.get(f"{spread}_max")
                own = f", raw's own {what}s {lo:.3g}-{hi:.3g} s" if lo is not None and hi is not None else ""
                over.append(f"{r['method']} {what} {pct:.0f} % ({r[spread]:.3g} s{own})")
    if not over:
        return None
    return (
        f"above 100 % of raw: {'; '.join(over[:3])}{'; …' if len(over) > 3 else ''}. raw writes and reads the "
        "same bytes, one plain file per rank (fsync with --sync-files, as torch_save; loaded in place, as dcp), "
        "measured once before the other cases: a row above it ran while the storage was faster (page cache, "
        "writeback, other jobs on the disk), not with less work. bench/ckpt_dcp_vs_raw.py interleaves them "
        "(docs/ckpt.md)."
    )


def needed_bytes(specs: list[StateSpec], run: RunOptions) -> int:
    """Storage one case needs at its peak: every iteration of the biggest state is kept until the loads."""
    return max(s.total_bytes for s in specs) * run.iterations


def _preflight_all(ranks: dist.Ranks, storages: list[Storage], specs: list[StateSpec], run: RunOptions) -> list[str]:
    """Rank 0 checks every storage (exists, writable, room for the biggest state's iterations) and leaves a marker
    in each run directory; every rank then looks for it, so a --storage that is not shared (a node-local path on
    several nodes, a relative path from different working directories) stops every rank with one message."""
    outcome: Any = None
    if ranks.is_main:
        try:
            outcome = [preflight(s, ranks.world_size, needed_bytes(specs, run)) for s in storages]
            for storage, run_dir in zip(storages, outcome):
                storage.filesystem()[0].pipe_file(f"{run_dir}/{SHARED_MARKER}", b"opbench: written by rank 0")
        except UsageError as exc:
            outcome = exc
    outcome = ranks.broadcast(outcome)
    if isinstance(outcome, UsageError):
        raise outcome
    unseen = [s.spec for s, d in zip(storages, outcome) if not _sees(s, f"{d}/{SHARED_MARKER}")]
    everyone = ranks.gather((ranks.rank, ranks.env.host, unseen))
    blind = ranks.broadcast([(r, h, u) for r, h, u in everyone if u] if ranks.is_main else None)
    if blind:
        rank, host, storage_specs = blind[0]
        if ranks.is_main:
            for storage, run_dir in zip(storages, outcome):
                remove_tree(storage, run_dir)
        raise UsageError(
            f"rank {rank} on {host} cannot see what rank 0 wrote there ({len(blind)} rank(s) in all): every rank "
            "must reach the same storage; on several nodes use a shared file system or object storage, and give "
            "an absolute path",
            source=storage_specs[0],
            field="--storage",
        )
    return outcome


PRIME_DIR = "prime"


def prime_storages(
    ranks: dist.Ranks, state: Any, storages: list[Storage], run_dirs: list[str], run: RunOptions
) -> float:
    """Untimed, before a state's first case: write its bytes to each local storage as ``raw`` does, --iterations
    times, and remove them. The first case of a run wrote 1.5-3× slower than the same case after another one
    (raw 0.53-0.88 s per 256 MiB save first, 0.16-0.34 s after torch_save; torch_save first 1.41-1.49 s, after
    raw 0.35-0.39 s, one process, ext4), so raw, measured first as every other row's yardstick, read as slow
    as the case after it was fast: torch_save at 147-250 % of raw. Each case now follows a write and removal of
    the same size (docs/ckpt.md, "Measurement"). Object storage is not primed (uploads cost). Returns seconds."""
    from .methods import Raw, SaveOptions

    start = time.perf_counter()
    raw, opts = Raw(), SaveOptions(sync_files=run.sync_files)
    for storage, run_dir in zip(storages, run_dirs):
        if storage.local_root is None:
            continue
        try:
            for i in range(run.iterations):
                raw.save(state, storage, f"{run_dir}/{PRIME_DIR}/iter_{i + 1:07d}", opts).wait()
        except Exception:  # noqa: BLE001 - a storage that fails here fails its cases too, each with its row
            pass
        ranks.barrier()
        if ranks.is_main:
            try:
                remove_tree(storage, f"{run_dir}/{PRIME_DIR}")
            except Exception:  # noqa: BLE001 - leftovers go with the run directory
                pass
        ranks.barrier()
    return time.perf_counter() - start


class StorageDown(Exception):
    """A case not run because an earlier case found its storage unusable (FailureLog.down)."""


SHARED_MARKER = ".opbench_rank0"  # written by rank 0 into each run directory, looked for by every rank


def _sees(storage: Storage, path: str) -> bool:
    try:
        return bool(storage.filesystem()[0].exists(path))
    except Exception:  # noqa: BLE001 - an unreadable storage is an unseen one
        return False


if __name__ == "__main__":
    sys.exit(run_cli(main, prog="python -m opbench.ckpt"))
