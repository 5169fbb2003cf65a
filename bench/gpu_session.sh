#!/usr/bin/env bash
# The GPU acceptance check: run it on a new GPU node (and whenever a GPU is lent to a developer) before anything
# else. Each step has its own time limit, so one hang does not cost the rest; logs and results go to $OUT
# (default out/gpu_session). It ends with one table, one rule per check (bench/gpu_acceptance.py says them):
#   selftest   every available backend correct
#   harness    opbench's GEMM rate >= 0.95 x a CUDA graph's at every size >= 2048^3
#   attention  opbench's fwd and fwd+bwd within +-5 % of triton's do_bench on the same SDPA call
#   moe        opbench's grouped-GEMM times within +-5 % of do_bench on the same torch._grouped_mm call
#   ckpt       every checkpoint method ok (torch_save, dcp, dcp_async)
#   comm       collectives correct, only with >= 2 GPUs (one GPU has no link to measure)
# and exits non-zero when any rule fails. Steps that are measured but not judged (validate, eager, gemm, grouped,
# moe_block, bwd_split, comm_hold, faults) leave their logs for a person to read.
# The judged steps run first. DEADLINE_S=N ends every step by N seconds after the start (a step that would get
# under 20 s is not run, and its check fails saying so), so the table is printed inside one call's time limit.
#   bash bench/gpu_session.sh                         # all steps
#   STEPS="selftest harness attention_ref" bash bench/gpu_session.sh   # some steps (only their checks are judged)
#   DEADLINE_S=540 bash bench/gpu_session.sh          # everything that fits in 9 minutes, the table included
set -uo pipefail
OUT=${OUT:-out/gpu_session}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
PY=${PYTHON:-python3}
STEPS=${STEPS:-"env selftest harness attention_ref moe_ref ckpt comm validate eager gemm grouped moe_block attention bwd_split comm_hold faults"}
DEADLINE_S=${DEADLINE_S:-0}  # 0: no deadline
TABLE_S=15                   # kept back from the deadline for the verdict
GPUS=$($PY -c "import torch; print(torch.cuda.device_count() if torch.cuda.is_available() else 0)" 2>/dev/null || echo 0)
if [ "$GPUS" -lt 1 ]; then
    echo "gpu_session.sh: no GPU visible to torch ($PY); this is the GPU acceptance check" >&2
    exit 2
fi
NPROC=$(( GPUS < 8 ? GPUS : 8 ))
step() {  # step NAME LIMIT_S CMD...
    local name=$1 limit=$2; shift 2
    case " $STEPS " in *" $name "*) ;; *) return 0;; esac
    if [ "$DEADLINE_S" -gt 0 ]; then
        local left=$(( DEADLINE_S - SECONDS - TABLE_S ))
        if [ "$left" -lt 20 ]; then
            echo "not run: DEADLINE_S=$DEADLINE_S left $left s" | tee "$OUT/$name.log" | sed "s/^/=== $name: /"
            return 0
        fi
        [ "$left" -lt "$limit" ] && limit=$left
    fi
    echo "=== $name: $*"
    local t0=$SECONDS
    timeout -k 10 "$limit" "$@" >"$OUT/$name.log" 2>&1
    local rc=$?
    case $rc in 124|137) echo "timed out after $limit s" >>"$OUT/$name.log";; esac
    echo "=== $name rc=$rc in $((SECONDS - t0)) s"
    tail -n 40 "$OUT/$name.log"
}
multi_gpu_step() {  # step NAME LIMIT_S CMD..., only with >= 2 GPUs (one GPU has no link to measure)
    if [ "$GPUS" -ge 2 ]; then step "$@"; else
        case " $STEPS " in *" $1 "*) echo "=== $1: skipped ($GPUS GPU: no link to measure)";; esac
    fi
}
step env 60 bash -c "nvidia-smi || rocm-smi; $PY -c 'import torch, triton; print(torch.__version__, torch.version.cuda, torch.version.hip, triton.__version__, torch.cuda.get_device_name(0))'"
step selftest 150 $PY -m opbench selftest --report-dir-path "$OUT/selftest"
step harness 150 $PY bench/gemm_harness_overhead.py --size 1024 2048 4096 8192 --rounds 3 --seconds 1.0 --json "$OUT/harness.json"
step attention_ref 180 $PY bench/attention_vs_dobench.py --seqlen 4096 --rounds 3 --json "$OUT/attention_vs_dobench.json"
# issue 43: the experts' grouped GEMM (Qwen3-30B-A3B at EP 8, gpt-oss-20b), balanced and Zipf-skewed, against do_bench
step moe_ref 180 $PY bench/moe_grouped_vs_dobench.py --rounds 3 --json "$OUT/moe_vs_dobench.json"
step ckpt 150 $PY -m opbench ckpt --size-mb 1024 --nproc-per-node 1 --methods torch_save,dcp,dcp_async \
    --iterations 2 --report-dir-path "$OUT/ckpt" --storage /tmp/opbench_ckpt
multi_gpu_step comm 120 $PY -m opbench comm --nproc-per-node "$NPROC" -b 64 -e 1G -f 8 -n 20 -w 5 --check --report-dir-path "$OUT/comm"
# the projection against a real bf16 training step here (max_memory_allocated, step time): its log has the ratios.
# Qwen3-0.6B at 8,192 tokens a micro-batch: its kernels outlast their launches (a tiny model's step is the host's)
step validate 180 $PY -m opbench project --model Qwen3_0.6B --world-size 1 --seqlen 4096 \
    --mbs 2 --microbatches 2 --validate --steps 3 --report-dir-path "$OUT/validate"
# PyTorch eager's memory-bound kernels against what --memory-ops eager projects for them (EAGER_MEMORY_EFFICIENCY)
step eager 90 $PY bench/eager_kernel_classes.py --model Qwen3_0.6B --seqlen 4096 --mbs 2
step gemm 200 $PY -m opbench gemm --model Llama3.1_8B --seqlen 4096 --tp 8 --dtype bf16 \
    --backends torch,torch_grouped,triton,fp8 --budget 0.3 --report-dir-path "$OUT/gemm"
step grouped 150 $PY -m opbench gemm --model DeepSeek_V2_Lite --seqlen 4096 --ep 8 --dtype bf16 \
    --layers router,expert_gate_up,expert_down --backends torch,torch_grouped,triton --budget 0.3 --report-dir-path "$OUT/gemm_grouped"
# issue 43: the whole MoE block, forward and backward by phase, balanced vs skewed (Qwen3-30B-A3B; gpt-oss-20b from
# examples/configs): one step, so its limit and the deadline hold for both runs
step moe_block 200 bash -c "$PY -m opbench moe --model-config-path builtin --model Qwen3_30B_A3B --seqlen 4096 \
    --routing balanced,zipf:1.2 --backends grouped_mm,te_grouped,torch_loop --budget 0.3 --report-dir-path $OUT/moe \
    && $PY -m opbench moe --model-config-path examples/configs/gpt-oss-20b/config.json --seqlen 4096 \
    --routing balanced,zipf:1.2 --backends grouped_mm,te_grouped --budget 0.3 --report-dir-path $OUT/moe"
step attention 150 $PY -m opbench attention --model-config-path builtin --model Llama3.1_8B,DeepSeek_V2_Lite --seqlen 4096 --dtype bf16 \
    --budget 0.3 --report-csv-path "$OUT/attention/attention_benchmark.csv"
step bwd_split 90 $PY bench/attention_bwd_split.py --device cuda --backends sdpa,triton --seqlen 4096 --budget 0.5
# opbench holds the stream while it queues a loop; a bare loop does not: at small sizes opbench should be faster
multi_gpu_step comm_hold 120 $PY bench/comm_allreduce_overhead.py --nproc-per-node "$NPROC" --sizes 8,4K,64K,1M --rounds 10
multi_gpu_step faults 120 bash -c "$PY -m opbench comm --nproc-per-node $NPROC -b 256M --collectives all_reduce -n 10 --report-dir-path $OUT/faults/none && OPBENCH_FAULTS=slow:0:3 $PY -m opbench comm --nproc-per-node $NPROC -b 256M --collectives all_reduce -n 10 --report-dir-path $OUT/faults/slow"
tar czf "$OUT/results.tgz" -C "$OUT" --exclude results.tgz . 2>/dev/null

# Judge the checks whose steps ran.
CHECKS=""
for pair in selftest:selftest harness:harness attention_ref:attention moe_ref:moe ckpt:ckpt comm:comm; do
    case " $STEPS " in *" ${pair%%:*} "*) CHECKS+="${pair#*:},";; esac
done
[ -n "$CHECKS" ] || { echo "no judged step in STEPS='$STEPS'"; exit 0; }
echo
$PY bench/gpu_acceptance.py "$OUT" --gpus "$GPUS" --checks "${CHECKS%,}" | tee "$OUT/acceptance.md"
exit "${PIPESTATUS[0]}"
