"""The verdict of ``bench/gpu_session.sh``: reads what its steps wrote under OUT and applies one rule per check.

| check     | rule                                                                                  |
|-----------|---------------------------------------------------------------------------------------|
| selftest  | every backend that is available here gives the right answer (no `error` row)         |
| harness   | opbench's GEMM rate ≥ 0.95 × a CUDA graph's at every size ≥ 2048³                     |
| attention | opbench's fwd and fwd+bwd times within ±5 % of triton's do_bench on the same SDPA call |
| moe       | opbench's grouped-GEMM times within ±5 % of do_bench on the same torch._grouped_mm call |
| ckpt      | every checkpoint method's row is `ok` (saved, loaded and verified)                   |
| comm      | with ≥ 2 GPUs: every collective row `ok` with no wrong elements; one GPU: skipped     |

A check whose output is missing fails (its step's log says why). Prints one table; exit status 1 when any check
fails, else 0. Usage: python bench/gpu_acceptance.py OUT [--gpus N]
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
from pathlib import Path

PASS, FAIL, SKIP = "PASS", "FAIL", "skip"
HARNESS_MIN = 0.95
HARNESS_FROM = 2048


def _rows(path: Path) -> list[dict[str, str]]:
    with open(path, newline="", encoding="utf-8") as fh:
        return list(csv.DictReader(fh))


def _first(out: Path, pattern: str) -> Path | None:
    found = sorted(out.glob(pattern))
    return found[0] if found else None


def _missing(out: Path, what: str, step: str) -> tuple[str, str]:
    """The verdict on a step that left no output: FAIL, naming the step log's last line (a timeout, the deadline,
    the error)."""
    try:
        lines = (out / f"{step}.log").read_text(errors="replace").strip().splitlines()
    except OSError:
        lines = []
    last = lines[-1].strip()[:160] if lines else "no log"
    return FAIL, f"no {what} ({step}.log: {last})"


def check_selftest(out: Path) -> tuple[str, str]:
    path = _first(out, "selftest/selftest.csv")
    if path is None:
        return _missing(out, "selftest.csv", "selftest")
    rows = _rows(path)
    wrong = [f"{r['area']} {r['backend']}" for r in rows if r.get("status") == "error"]
    ok = sum(r.get("status") == "ok" for r in rows)
    text = f"{ok} correct, {len(rows) - ok - len(wrong)} not available, {len(wrong)} wrong"
    return (FAIL, f"{text}: {', '.join(wrong)}") if wrong or not ok else (PASS, text)


def check_harness(out: Path) -> tuple[str, str]:
    path = out / "harness.json"
    if not path.exists():
        return _missing(out, "harness.json", "harness")
    sizes = json.loads(path.read_text())["sizes"]
    ratios = {int(n): times["graph"] / times["harness"] for n, times in sizes.items() if "graph" in times}
    judged = {n: r for n, r in ratios.items() if n >= HARNESS_FROM}
    if not judged:
        return FAIL, f"no size ≥ {HARNESS_FROM} with a CUDA-graph reference"
    text = ", ".join(f"{n}³ {r:.2f}" for n, r in sorted(ratios.items()))
    return (PASS if min(judged.values()) >= HARNESS_MIN else FAIL), f"harness/graph rate {text}"


def _check_dobench(out: Path, name: str, step: str, what: str, keys: tuple[str, ...]) -> tuple[str, str]:
    """A ``*_vs_dobench.json`` of ratios opbench / do_bench: every one inside its tolerance (``ok``)."""
    path = out / name
    if not path.exists():
        return _missing(out, name, step)
    data = json.loads(path.read_text())
    results = data["results"]
    if not results:
        return FAIL, "no shapes timed"
    ratios = [r["ratio"] for r in results]
    text = f"opbench/do_bench {min(ratios):.3f}–{max(ratios):.3f} over {len(results)} {what}"
    bad = [" ".join(str(r[k]) for k in keys) + f" {r['ratio']:.3f}" for r in results if not r["ok"]]
    return (FAIL, f"{text}; outside ±{data['tolerance']:.0%}: {', '.join(bad)}") if bad else (PASS, text)


def check_attention(out: Path) -> tuple[str, str]:
    return _check_dobench(out, "attention_vs_dobench.json", "attention_ref", "shape×pass", ("shape", "pass"))


def check_moe(out: Path) -> tuple[str, str]:
    keys = ("shape", "routing", "gemm", "pass")
    return _check_dobench(out, "moe_vs_dobench.json", "moe_ref", "shape×routing×GEMM×pass", keys)


def check_ckpt(out: Path) -> tuple[str, str]:
    path = _first(out, "ckpt/ckpt_benchmark.csv")
    if path is None:
        return _missing(out, "ckpt_benchmark.csv", "ckpt")
    rows = _rows(path)
    bad = [
        f"{r.get('method')}: {r.get('status')} {r.get('error') or ''}".strip() for r in rows if r.get("status") != "ok"
    ]
    methods = sorted({r.get("method", "") for r in rows})
    if not rows:
        return FAIL, "no rows"
    return (FAIL, "; ".join(bad)[:300]) if bad else (PASS, f"{', '.join(methods)} ok ({len(rows)} rows)")


def check_comm(out: Path, gpus: int) -> tuple[str, str]:
    if gpus < 2:
        return SKIP, f"{gpus} GPU: no link to measure"
    paths = sorted(out.glob("comm/*_benchmark.csv"))  # one CSV per collective
    if not paths:
        return _missing(out, "comm CSV", "comm")
    rows = [r for path in paths for r in _rows(path)]
    # unsupported: a size too small to split over the ranks (count 0), not a fault of the collective
    bad = [r for r in rows if r.get("status", "ok") not in ("ok", "unsupported") or (r.get("wrong") or "0") != "0"]
    ok = sum(r.get("status") == "ok" for r in rows)
    if not ok:
        return FAIL, f"no ok rows in {len(paths)} CSVs"
    text = f"{ok} rows ok over {len(paths)} collectives"
    return (FAIL, f"{len(bad)} of {len(rows)} rows not ok or wrong; {text}") if bad else (PASS, text)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("out", type=Path, help="the folder gpu_session.sh wrote (its OUT)")
    p.add_argument("--gpus", type=int, default=None, help="GPUs on this node (default: torch's count)")
    p.add_argument("--checks", default="selftest,harness,attention,moe,ckpt,comm", help="comma list of checks to judge")
    args = p.parse_args()
    gpus = args.gpus
    if gpus is None:
        import torch

        gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    checks = {
        "selftest": ("every available backend correct", lambda: check_selftest(args.out)),
        "harness": (f"GEMM harness ≥ {HARNESS_MIN} × CUDA graph at ≥ {HARNESS_FROM}³", lambda: check_harness(args.out)),
        "attention": ("attention within ±5 % of do_bench", lambda: check_attention(args.out)),
        "moe": ("grouped GEMM within ±5 % of do_bench", lambda: check_moe(args.out)),
        "ckpt": ("every checkpoint method ok", lambda: check_ckpt(args.out)),
        "comm": ("collectives ok (≥ 2 GPUs)", lambda: check_comm(args.out, gpus)),
    }
    wanted = [c for c in args.checks.split(",") if c]
    table = []
    for name in wanted:
        rule, judge = checks[name]
        try:
            verdict, measured = judge()
        except (OSError, ValueError, KeyError, ZeroDivisionError) as exc:
            verdict, measured = FAIL, f"unreadable output: {type(exc).__name__}: {exc}"
        table.append((name, rule, measured, verdict))
    widths = [max(len(str(row[i])) for row in [("check", "rule", "measured", "verdict"), *table]) for i in range(4)]
    for row in [("check", "rule", "measured", "verdict"), tuple("-" * w for w in widths), *table]:
        print("| " + " | ".join(str(c).ljust(w) for c, w in zip(row, widths)) + " |")
    failed = [name for name, _, _, verdict in table if verdict == FAIL]
    print(f"\nGPU acceptance: {'FAIL (' + ', '.join(failed) + ')' if failed else 'PASS'}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
