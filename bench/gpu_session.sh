#!/usr/bin/env bash
# Everything a GPU session should run first (DEVELOPERS: "run the bench/ scripts on it before anything else"),
# in one command so a lent machine is started once. Logs go to $OUT (or ./out/gpu_session). Each step has its
# own time limit, so one hang does not cost the rest.
#   bash bench/gpu_session.sh            # all steps
#   STEPS="gemm attention" bash bench/gpu_session.sh
set -uo pipefail
OUT=${OUT:-out/gpu_session}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
PY=${PYTHON:-python3}
STEPS=${STEPS:-"env selftest gemm grouped attention harness bwd_split comm comm_hold faults ckpt"}
step() {  # step NAME LIMIT_S CMD...
    local name=$1 limit=$2; shift 2
    case " $STEPS " in *" $name "*) ;; *) return 0;; esac
    echo "=== $name: $*"
    local t0=$SECONDS
    timeout -k 10 "$limit" "$@" >"$OUT/$name.log" 2>&1
    local rc=$?
    echo "=== $name rc=$rc in $((SECONDS - t0)) s"
    tail -n 40 "$OUT/$name.log"
}
step env 60 bash -c "nvidia-smi; $PY -c 'import torch, triton; print(torch.__version__, torch.version.cuda, torch.version.hip, triton.__version__, torch.cuda.get_device_name(0))'"
step selftest 150 $PY -m opbench selftest --report-dir-path "$OUT/selftest"
step gemm 200 $PY -m opbench gemm --model Llama3.1_8B --seqlen 4096 --tp 8 --dtype bf16 \
    --backends torch,torch_grouped,triton,fp8 --budget 0.3 --report-dir-path "$OUT/gemm"
step grouped 150 $PY -m opbench gemm --model DeepSeek_V2_Lite --seqlen 4096 --ep 8 --dtype bf16 \
    --layers router,expert_gate_up,expert_down --backends torch,torch_grouped,triton --budget 0.3 --report-dir-path "$OUT/gemm"
step attention 150 $PY -m opbench attention --model-config-path builtin --model Llama3.1_8B,DeepSeek_V2_Lite --seqlen 4096 --dtype bf16 \
    --budget 0.3 --report-csv-path "$OUT/attention/attention_benchmark.csv"
step harness 120 $PY bench/gemm_harness_overhead.py --size 1024 2048 4096 8192 --rounds 3 --seconds 1.0
step bwd_split 90 $PY bench/attention_bwd_split.py --device cuda --backends sdpa,triton --seqlen 4096 --budget 0.5
step comm 90 $PY -m opbench comm --nproc-per-node 1 -b 8 -e 1G -f 8 -n 20 -w 5 --check --report-dir-path "$OUT/comm"
# opbench holds the stream while it queues a loop; a bare loop does not: at small sizes opbench should be faster
step comm_hold 120 $PY bench/comm_allreduce_overhead.py --nproc-per-node 1 --sizes 8,4K,64K,1M --rounds 10
step faults 120 bash -c "$PY -m opbench comm --nproc-per-node 1 -b 256M --collectives all_reduce -n 10 --report-dir-path $OUT/faults/none && OPBENCH_FAULTS=slow:0:3 $PY -m opbench comm --nproc-per-node 1 -b 256M --collectives all_reduce -n 10 --report-dir-path $OUT/faults/slow"
step ckpt 120 $PY -m opbench ckpt --size-mb 1024 --nproc-per-node 1 --methods torch_save,dcp,dcp_async \
    --iterations 2 --report-dir-path "$OUT/ckpt" --storage /tmp/opbench_ckpt
tar czf "$OUT/results.tgz" -C "$OUT" --exclude results.tgz . 2>/dev/null
