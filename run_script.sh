#!/usr/bin/env bash
# opbench: the whole suite — GEMM, attention, collectives, the cluster check, then FSDP and checkpoint — with one
# results folder per run. Run it on every node of a job with the same MASTER_ADDR/MASTER_PORT and each node's
# NODE_RANK; single-GPU kernel benchmarks run on node 0 only, collectives and checkpointing on every node.
#
#   ./run_script.sh                                       # one machine (CPU: 1-2 minutes, small sizes)
#   NNODES=2 NODE_RANK=0 MASTER_ADDR=node0 ./run_script.sh   # on node0, and NODE_RANK=1 on node1
#   MODEL=Llama3.1_70B STAGES="comm" ./run_script.sh        # only the collectives, for one model
#
# Environment (defaults in brackets):
#   MASTER_ADDR [127.0.0.1]  MASTER_PORT [29500]  NNODES [1]  NODE_RANK [0]
#   NPROC_PER_NODE [GPUs on this node; 2 on a CPU-only machine]
#   REPORT_DIR [out/run_<UTC time>]   MODEL [Llama3.1_8B]   MODEL_CONFIG_PATH [built-in configs]
#   STAGES ["gemm attention comm cluster fsdp ckpt report"]   PYTHON [python]
#   QUICK [1 on CPU, 0 on GPU]: short timing budgets and small sizes
#   FSDP_WORLD [NNODES x NPROC_PER_NODE, or 8 when that is 1]: the world the fsdp stage models (the job you plan,
#     not the processes this script starts: one rank has no FSDP collectives); FSDP_NNODES [NNODES, or 1 when
#     FSDP_WORLD took the default of 8]: the nodes that world spans
#   GEMM_ARGS / ATTN_ARGS / COMM_ARGS / CLUSTER_ARGS / FSDP_ARGS / CKPT_ARGS: replace a stage's default size/timing flags
#   With NNODES>1 the ckpt stage needs storage every node sees: CKPT_ARGS="--storage /shared/fs/path" (or s3://…);
#   the default REPORT_DIR/ckpt/ckpt_data is usually node-local, and DCP's loads would fail on the other nodes.
#
# Collective library settings are left to you; set them before calling this script. Common ones:
#   NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=COLL      log every call (feed the log to `opbench trace`)
#   NCCL_SOCKET_IFNAME=<netdev>                 bootstrap/socket interface (e.g. the management NIC)
#   GLOO_SOCKET_IFNAME=<netdev>                 the same for gloo (CPU runs, FSDP's CPU groups)
#   NCCL_IB_HCA=<hca list>  NCCL_IB_GID_INDEX=3  RDMA devices; GID index 3 is usual for RoCE v2
#   NCCL_NET_GDR_LEVEL, NCCL_CROSS_NIC, NCCL_ALGO, NCCL_PROTO   tuning; leave unset to measure the defaults
# On ROCm, RCCL reads the same NCCL_* variables (torch's backend name is still "nccl"); AMD's MI300X tuning
# guide also discusses NCCL_MIN_NCHANNELS and HSA_NO_SCRATCH_RECLAIM. No NIC or HCA names are set here.

set -uo pipefail

PYTHON=${PYTHON:-python}
MASTER_ADDR=${MASTER_ADDR:-127.0.0.1}
MASTER_PORT=${MASTER_PORT:-29500}
NNODES=${NNODES:-1}
NODE_RANK=${NODE_RANK:-0}
MODEL=${MODEL:-Llama3.1_8B}
MODEL_CONFIG_PATH=${MODEL_CONFIG_PATH:-}
STAGES=${STAGES-"gemm attention comm cluster fsdp ckpt report"}  # set but empty: an error below, not "all"
REPORT_DIR=${REPORT_DIR:-out/run_$(date -u +%Y%m%d_%H%M%S)}

fail() { echo "run_script.sh: error: $*" >&2; exit 2; }
command -v "$PYTHON" >/dev/null || fail "PYTHON='$PYTHON' is not a command"
# Numbers used in arithmetic ($((NNODES * NPROC_PER_NODE))) must be plain integers: bash would evaluate anything else.
# Checked before anything starts (NPROC_PER_NODE again once its default is known).
for var in NNODES NODE_RANK MASTER_PORT ${NPROC_PER_NODE+NPROC_PER_NODE}; do
    [[ ${!var} =~ ^[0-9]+$ ]] || fail "$var must be a non-negative integer, got '${!var}'"
done
[ "$NNODES" -ge 1 ] || fail "NNODES must be at least 1, got $NNODES"
[ "$NODE_RANK" -lt "$NNODES" ] || fail "NODE_RANK=$NODE_RANK does not exist in a job of NNODES=$NNODES node(s)"
[ "$MASTER_PORT" -ge 1 ] && [ "$MASTER_PORT" -le 65535 ] || fail "MASTER_PORT must be 1-65535, got $MASTER_PORT"
[ -n "${STAGES// /}" ] || fail "STAGES is empty (choose from gemm attention comm cluster fsdp ckpt report)"
for stage_name in $STAGES; do
    case " gemm attention comm cluster fsdp ckpt report " in
        *" $stage_name "*) ;;
        *) fail "unknown stage '$stage_name' in STAGES (choose from gemm attention comm cluster fsdp ckpt report)";;
    esac
done

GPUS=$("$PYTHON" -c "import torch; print(torch.cuda.device_count() if torch.cuda.is_available() else 0)" 2>/dev/null || echo 0)
if [ "$GPUS" -gt 0 ]; then
    NPROC_PER_NODE=${NPROC_PER_NODE:-$GPUS}
    QUICK=${QUICK:-0}
else
    NPROC_PER_NODE=${NPROC_PER_NODE:-2}
    QUICK=${QUICK:-1}
fi
[[ $NPROC_PER_NODE =~ ^[0-9]+$ ]] && [ "$NPROC_PER_NODE" -ge 1 ] || fail "NPROC_PER_NODE must be at least 1, got '$NPROC_PER_NODE'"
WORLD=$((NNODES * NPROC_PER_NODE))
# The fsdp stage models a training job's world: this job's when it has 2 or more ranks, else one 8-GPU node.
if [ "$WORLD" -ge 2 ]; then
    FSDP_WORLD=${FSDP_WORLD:-$WORLD}
    FSDP_NNODES=${FSDP_NNODES:-$NNODES}
else
    FSDP_WORLD=${FSDP_WORLD:-8}
    FSDP_NNODES=${FSDP_NNODES:-1}
fi
for var in FSDP_WORLD FSDP_NNODES; do
    [[ ${!var} =~ ^[0-9]+$ ]] && [ "${!var}" -ge 1 ] || fail "$var must be a positive integer, got '${!var}'"
done

model_flags=(--model "$MODEL")
[ -n "$MODEL_CONFIG_PATH" ] && model_flags+=(--model-config-path "$MODEL_CONFIG_PATH")

# Stage flags: full-size on GPUs; on a CPU, short budgets and small token counts so the suite takes minutes.
if [ "$QUICK" = 1 ]; then
    GEMM_ARGS=${GEMM_ARGS:-"--quick --seqlen 128"}
    ATTN_ARGS=${ATTN_ARGS:-"--quick --max-seqlen 128 --backends math,sdpa"}
    COMM_ARGS=${COMM_ARGS:-"-b 1K -e 1M -f 32 -n 5 -w 2 --trials 3 --check --seqlen 64"}
    CLUSTER_ARGS=${CLUSTER_ARGS:-"--quick --outlier-fraction 0.3"}  # ranks sharing CPU cores differ by chance
    FSDP_ARGS=${FSDP_ARGS:-""}
    CKPT_ARGS=${CKPT_ARGS:-""}
else
    GEMM_ARGS=${GEMM_ARGS:-""}
    ATTN_ARGS=${ATTN_ARGS:-""}
    COMM_ARGS=${COMM_ARGS:-"-b 8 -e 8G -f 2 -n 20 -w 5 --check"}
    CLUSTER_ARGS=${CLUSTER_ARGS:-""}
    FSDP_ARGS=${FSDP_ARGS:-""}
    CKPT_ARGS=${CKPT_ARGS:-""}
fi

# One node: torchrun picks a free port itself; several: the static rendezvous at MASTER_ADDR:MASTER_PORT.
if [ "$NNODES" = 1 ]; then
    rdzv=(--standalone)
else
    rdzv=(--master-addr "$MASTER_ADDR" --master-port "$MASTER_PORT")
fi
torchrun_cmd=("$PYTHON" -m torch.distributed.run --nnodes "$NNODES" --node-rank "$NODE_RANK"
              --nproc-per-node "$NPROC_PER_NODE" "${rdzv[@]}")

mkdir -p "$REPORT_DIR" 2>/dev/null && [ -w "$REPORT_DIR" ] || fail "cannot create or write REPORT_DIR='$REPORT_DIR'"
declare -A result=() took=() skipped=()
order=()
has_module() { "$PYTHON" -c "import importlib.util, sys; sys.exit(importlib.util.find_spec('$1') is None)" 2>/dev/null; }
stage() {   # stage NAME COMMAND…: run, log to REPORT_DIR/NAME.log as well as the terminal, remember the status
    local name=$1; shift
    echo "=== $name: $*"
    local t0=$SECONDS
    "$@" 2>&1 | tee "$REPORT_DIR/$name.log"
    local rc=${PIPESTATUS[0]}
    result[$name]=$rc
    took[$name]=$((SECONDS - t0))
    order+=("$name")
    [ "$rc" = 0 ] || echo "=== $name failed (exit $rc); see $REPORT_DIR/$name.log"
}
wanted() { [[ " $STAGES " == *" $1 "* ]]; }

echo "opbench suite: $NNODES node(s) x $NPROC_PER_NODE ranks, node $NODE_RANK, model $MODEL, results in $REPORT_DIR" \
    "(fsdp models $FSDP_WORLD ranks on $FSDP_NNODES node(s))"

if [ "$NODE_RANK" = 0 ] && wanted gemm; then
    # shellcheck disable=SC2086
    stage gemm "$PYTHON" -m opbench.gemm "${model_flags[@]}" --report-dir-path "$REPORT_DIR/gemm" $GEMM_ARGS
fi
if [ "$NODE_RANK" = 0 ] && wanted attention; then
    # shellcheck disable=SC2086
    stage attention "$PYTHON" -m opbench.attention --model-config-path "${MODEL_CONFIG_PATH:-builtin}" \
        --model "$MODEL" --report-csv-path "$REPORT_DIR/attention/attention_benchmark.csv" $ATTN_ARGS
fi
if wanted comm && [ "$WORLD" = 1 ]; then
    echo "=== comm: skipped: a job of 1 rank has no link to measure (NPROC_PER_NODE=$NPROC_PER_NODE, NNODES=$NNODES)"
    skipped[comm]="a job of 1 rank has no link to measure"
    order+=(comm)
elif wanted comm; then
    # nccl-tests style sweep plus the model's TP/SP/EP/PP activation sizes, across every rank of the job
    # shellcheck disable=SC2086
    stage comm "${torchrun_cmd[@]}" -m opbench.comm "${model_flags[@]}" --report-dir-path "$REPORT_DIR/comm" $COMM_ARGS
fi
if wanted cluster; then  # exit 1 = the cluster failed a check or has an outlier (see cluster/cluster_summary.md)
    stage cluster "${torchrun_cmd[@]}" -m opbench.cluster --report-dir-path "$REPORT_DIR/cluster" $CLUSTER_ARGS
fi
if [ "$NODE_RANK" = 0 ] && wanted fsdp; then
    if has_module opbench.fsdp_model.__main__; then
        # shellcheck disable=SC2086
        # exact FSDP2 sizes for the modelled world (FSDP_WORLD), with the nccl-tests/rccl-tests lines that replay them
        mkdir -p "$REPORT_DIR/fsdp"
        stage fsdp "$PYTHON" -m opbench.fsdp_model "${model_flags[@]}" --world-size "$FSDP_WORLD" \
            --nnodes "$FSDP_NNODES" --csv "$REPORT_DIR/fsdp/fsdp_model.csv" --commands $FSDP_ARGS
    else
        echo "=== fsdp: opbench.fsdp_model has no command line in this install; skipped"
    fi
fi
if wanted ckpt; then
    if has_module opbench.ckpt.__main__; then
        # shellcheck disable=SC2086
        stage ckpt "${torchrun_cmd[@]}" -m opbench.ckpt --report-dir-path "$REPORT_DIR/ckpt" $CKPT_ARGS
    else
        echo "=== ckpt: opbench.ckpt is not in this install; skipped"
    fi
fi
if [ "$NODE_RANK" = 0 ] && wanted report && has_module opbench.report.__main__; then
    stage report "$PYTHON" -m opbench.report "$REPORT_DIR"
fi

failed=0
echo "=== summary ($REPORT_DIR)"
for name in "${order[@]}"; do
    if [ -n "${skipped[$name]:-}" ]; then
        echo "  $name: skipped (${skipped[$name]})"
        continue
    fi
    echo "  $name: $([ "${result[$name]}" = 0 ] && echo ok || echo "failed (exit ${result[$name]})") in ${took[$name]} s"
    [ "${result[$name]}" = 0 ] || failed=1
done
exit $failed
