"""opbench selftest on CPU: every backend's verdict, a deliberately broken backend reported as wrong (exit 1),
and the 2-rank collectives and checkpoint round trip read back from their tools' CSVs."""

import csv
import json

import torch

from opbench.gemm import backends as gemm_backends
from opbench.selftest.__main__ import main


def _rows(path):
    with open(path, newline="") as fh:
        return {(r["area"], r["backend"]): r for r in csv.DictReader(fh)}


def test_gemm_and_attention_backends_on_cpu(tmp_path, capsys):
    out = tmp_path / "st.csv"
    assert main(["--areas", "gemm,attention", "--report-csv-path", str(out)]) == 0
    rows = _rows(out)
    keys = (("gemm", "torch"), ("gemm", "torch_grouped"), ("attention", "math"), ("attention", "sdpa_math"))
    for key in (*keys, ("attention", "kda_torch"), ("attention", "v4_torch"), ("attention", "hc_torch")):
        r = rows[key]
        assert (r["available"], r["correct"], r["status"]) == ("True", "True", "ok"), r
        assert float(r["max_error"]) <= float(r["tolerance"]) and float(r["tflops"]) > 0
    fp8 = rows[("gemm", "fp8")]  # no GPU here: not available, with the reason, and not counted as wrong
    assert (fp8["available"], fp8["correct"], fp8["status"]) == ("False", "", "unsupported") and "GPU" in fp8["error"]
    kda_fla = rows[("attention", "kda_fla")]
    assert (kda_fla["available"], kda_fla["status"]) == ("False", "unsupported") and "GPU" in kda_fla["error"]
    assert json.loads(out.with_suffix(".meta.json").read_text())["benchmark"] == "selftest"
    assert "all correct" in capsys.readouterr().out


def test_a_wrong_backend_is_reported_and_fails_the_run(tmp_path, capsys, monkeypatch):
    def off_by_a_little(a, b, dtype):  # transposes B: right shapes, wrong numbers
        c = torch.empty(a.shape[0], b.shape[1], dtype=a.dtype)
        return (lambda: torch.mm(a, b.t(), out=c)), "torch.mm with B transposed (deliberately wrong)"

    monkeypatch.setitem(gemm_backends.BACKENDS, "broken", gemm_backends.Backend("broken", off_by_a_little))
    out = tmp_path / "st.csv"
    assert main(["--areas", "gemm", "--report-csv-path", str(out)]) == 1
    broken = _rows(out)[("gemm", "broken")]
    assert (broken["available"], broken["correct"], broken["status"]) == ("True", "False", "error")
    assert float(broken["max_error"]) > float(broken["tolerance"]) and "wrong result" in broken["error"]
    assert _rows(out)[("gemm", "torch")]["status"] == "ok"  # the others still pass
    text = capsys.readouterr().out
    assert "gemm      broken                 WRONG" in text and "1 WRONG: gemm broken" in text


def test_collectives_on_two_ranks_and_checkpoint_round_trip(tmp_path):
    out = tmp_path / "st.csv"
    assert main(["--areas", "comm,ckpt", "--report-csv-path", str(out)]) == 0
    rows = _rows(out)
    comm = {k[1]: r for k, r in rows.items() if k[0] == "comm"}
    for coll in ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast", "send_recv"):
        mine = [r for name, r in comm.items() if name.startswith("gloo ") and coll in name]
        assert mine and all(r["correct"] == "True" and r["max_error"] == "0" for r in mine), (coll, mine)
        assert all(float(r["gbs"]) > 0 for r in mine)
    for method in ("torch_save", "dcp", "dcp_async"):
        r = rows[("ckpt", method)]
        assert (r["correct"], r["status"]) == ("True", "ok") and float(r["gbs"]) > 0


def test_a_kernel_refusing_the_case_when_called_is_unavailable_not_wrong(tmp_path, monkeypatch):
    """As torch SDPA's efficient kernel does on an H100 for some head layouts: build succeeds, the call says no."""
    from opbench.attention import backends as attn
    from opbench.core.sweep import Unsupported

    def refuses(q, k, v):
        raise Unsupported("this kernel cannot run this case")

    fake = attn.Backend("refusing", attn.BHSD, lambda shape, device, dtype: attn.Prepared(refuses), "test")
    monkeypatch.setattr(attn, "BACKENDS", {"math": attn.BACKENDS["math"], "refusing": fake})
    monkeypatch.setattr("opbench.attention.runner.BACKENDS", attn.BACKENDS)
    out = tmp_path / "st.csv"
    assert main(["--areas", "attention", "--report-csv-path", str(out)]) == 0
    r = _rows(out)[("attention", "refusing")]
    assert (r["available"], r["status"], r["error"]) == ("False", "unsupported", "this kernel cannot run this case")


def test_the_first_cpu_measurement_of_a_process_warms_up_by_time(monkeypatch):
    """A fresh process's first CPU calls can run 80× slow for a fraction of a second (docs/conventions.md,
    "Timing": 16 ms a call instead of 0.2 ms for a 256³ matmul on two shared cores); one warm-up call, as
    selftest's quick timing makes, timed that. The first measurement warms up for FIRST_CPU_WARMUP_S at least;
    the next ones keep their own warm-up. Only lower bounds of time are asserted."""
    import time

    from opbench.core import timing

    monkeypatch.setattr(timing, "_cpu_warmed", False)  # as in a fresh process
    monkeypatch.delenv("OPBENCH_FIRST_CPU_WARMUP_S", raising=False)  # the user's default, not the suite's
    calls: list[float] = []

    def call() -> None:  # a call of a millisecond or so, as a small GEMM's on a CPU
        calls.append(time.perf_counter())
        time.sleep(0.001)

    cpu, quick = torch.device("cpu"), timing.TimingConfig.quick()
    first = timing.measure(call, cpu, quick)
    warm_up = calls[: len(calls) - first.iters]  # the calls before the timed ones
    assert warm_up[-1] - warm_up[0] >= timing.FIRST_CPU_WARMUP_S * 0.99 and len(warm_up) > quick.warmup_iters
    calls.clear()
    second = timing.measure(call, cpu, quick)
    assert len(calls) - second.iters == quick.warmup_iters  # one warm-up call: the process is warm
