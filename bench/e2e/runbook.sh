#!/usr/bin/env bash
# The engine bench on a GPU host, start to end: the image's GPU runtime (a venv with the patch series applied, and
# its GPU smoke tests), stock vLLM 0.32.0 beside it, optionally the peers' runtimes (SGLang, a newer vLLM, the newest
# SGLang), the kernel benches of the series, config tuning, and `python -m bench.e2e`. Run it in the repository root;
# every step that runs for long runs from its own copy of the tree, in the background, and writes to $RES.
# bench/README.md walks through a session.
#
#   bench/e2e/runbook.sh probe            # host facts into $OUT (nvidia-smi, pip freeze, disk, CPUs, nvcc)
#   bench/e2e/runbook.sh stage PART       # move one part of a packed wheelhouse (tools/gpu_wheelhouse.py pack:
#                                         # wheelhouse.tar.part-*, wheelhouse-<peer>.tar.part-*) into $STAGE
#   setsid bench/e2e/runbook.sh tune &    # block-FP8 fused-MoE config tuning with the host's own torch and Triton
#                                         # (the kernel harness, bench/kernels/moe, on vLLM's fused_moe.py: pristine
#                                         # in $KERNEL_SOURCES/stock/ with its configs/, patched in .../patched/);
#                                         # `all` waits for it, then serves the image with the gated files added
#   setsid bench/e2e/runbook.sh prep &    # the image's runtime, stock vLLM and the models of E2E_ARGS (while
#                                         # the peers' parts still arrive); `all` waits for it and skips those
#   setsid bench/e2e/runbook.sh all &     # the rest, in the background. Environment:
#       E2E_ARGS   the engine bench's flags (required: without --models it would make every preset model);
#       ENGINE=0   no engine bench: the kernel benches alone (E2E_ARGS and PEERS unused);
#       SMOKE=0    skip the GPU smoke tests (make gpu-venv instead of make smoke);
#       KERNELS=0  skip the benches of patches 0006 and 0007 (bench.kernels.fp8_quant, bench.kernels.router_topk);
#       GEMMS=0    no decode GEMM bench (bench.kernels.decode_gemm, after the engine bench; GEMMS=first: before
#                  it; GEMM_ARGS its flags, e.g. "--presets qwen3-235b-a22b-ep8");
#       PROFILE=0  no profiler windows (at 94 layers a one-client window is about a million GPU events);
#       PEERS="sglang vllm-latest sglang-latest"   the peers' runtimes too (the `peers` step) and the bench told
#                  their Pythons;
#       SMALL_M_CANDIDATES   (with GEMMS=first; may be empty) bench.kernels.small_m_configs' flags: small-M files
#                  from this session's decode GEMM bench for the image-candidates arm (with ENGINE=0: the files alone)
#   setsid bench/e2e/runbook.sh e2e &     # the engine bench alone again (E2E_ARGS, PEERS, PROFILE as for all), on
#                                         # the runtimes all or prep installed
#   bench/e2e/runbook.sh peers            # the peers' runtimes (PEERS, default sglang vllm-latest) from staged parts,
#                                         # each a venv beside $GPU_VENV
#   bench/e2e/runbook.sh collect          # copy what is done so far into $OUT (logs and tables, a few archives)
#   bench/e2e/runbook.sh stop             # end a running session and its engine servers
#
# The image's runtime comes from $WH: a wheelhouse folder (tools/gpu_wheelhouse.py download --dest W), or its parts
# staged in $STAGE (tools/gpu_wheelhouse.py pack --src W --parts DIR --size 45M), unpacked there first. The peers':
# download --runtime PEER (sglang, vllm-latest, sglang-latest), then pack --name wheelhouse-PEER, into $STAGE too
# (the names keep them apart). Folders: everything under $BENCH_HOME (default $HOME), each overridable.
set -uo pipefail
BENCH_HOME=${BENCH_HOME:-${HOME:-/tmp}}
STAGE=${STAGE:-$BENCH_HOME/stage}
WH=${WH:-$BENCH_HOME/wheelhouse}
RES=${RES:-$BENCH_HOME/results}
GPU_VENV=${GPU_VENV:-$BENCH_HOME/venv-gpu}
STOCK=${STOCK:-$BENCH_HOME/stock}
MODELS=${MODELS:-$BENCH_HOME/models}
PEER_ROOT=${PEER_ROOT:-$BENCH_HOME}  # wheelhouse-<peer>/ unpacked and venv-<peer>/ made here
OUT=${OUT:-$RES/out}  # what probe and collect write, to take away
KERNEL_SOURCES=${KERNEL_SOURCES:-.cache/carry}  # tune's fused_moe.py files (relative: to the repository root)
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1

# The image's runtime from $WH, its staged parts unpacked first (make gpu-venv, or make smoke unless SMOKE=0; its
# output also in smoke.log) and stock vLLM 0.32.0 beside it, from the pristine wheel
install_image() {
    step "unpack"
    if compgen -G "$STAGE/wheelhouse.tar.part-*" > /dev/null; then
        mkdir -p "$(dirname "$WH")" && cat "$STAGE"/wheelhouse.tar.part-* | tar -x -C "$(dirname "$WH")" || return 1
        rm -f "$STAGE"/wheelhouse.tar.part-*  # about 2 GB; a 16-layer model takes 15-23 GB
    elif [ ! -f "$WH/requirements.txt" ]; then
        echo "no wheelhouse: neither parts in $STAGE nor $WH/requirements.txt" >&2; return 1
    fi
    # SMOKE=0: the venv only (make gpu-venv), when the smoke test already passed on this stack
    target=smoke; [ "${SMOKE:-1}" = 0 ] && target=gpu-venv
    step "make $target (install from the wheelhouse, apply the series[, GPU smoke tests])"
    make "$target" WHEELHOUSE="$WH" GPU_VENV="$GPU_VENV" 2>&1 | tee "$RES/smoke.log"
    echo "make $target exit: ${PIPESTATUS[0]}"
    step "stock vLLM 0.32.0 beside it (pristine wheel)"
    "$GPU_VENV/bin/python" -m pip install -q --no-index --no-deps --find-links "$WH" --target "$STOCK" vllm==0.32.0
}
# A subcommand that would run bench.e2e without E2E_ARGS (every preset model, more than a host's disk holds) stops
# at once, touching nothing
need_e2e_args() {  # SUBCOMMAND WHAT_TO_GIVE
    [ -n "${E2E_ARGS:-}" ] && return
    echo "$1: E2E_ARGS is unset; give it $2" >&2
    exit 2
}
t0=$(date +%s)
step() { echo "=== $(($(date +%s) - t0)) s: $*"; }
# pgrep/pkill patterns for this script's subcommands and the benches they run, anchored at the start of a command
# line: a caller's shell whose command only mentions them (`runbook.sh stop; ... bench.e2e ...`) is not one
subcommand() { echo "^(/usr/bin/)?bash [^ ]*runbook[.]sh $1( |\$)"; }
E2E_PROC='^[^ ]*python[0-9.]* -m bench[.]e2e( |$)'
# Wait while a background subcommand runs and has not written its DONE file; true when it did
wait_for() {  # DONE_FILE SUBCOMMAND
    while [ ! -f "$1" ] && pgrep -f "$(subcommand "$2")" > /dev/null; do sleep 5; done
    [ -f "$1" ]
}
PREP_LOG=$RES/prep.log PREP_DONE=$RES/PREP_DONE
# A background subcommand runs from its own copy of the tree ($BENCH_HOME/NAME-tree), so that the checkout may change
# while it runs
tree_copy() { rm -rf "$BENCH_HOME/$1-tree" && cp -a . "$BENCH_HOME/$1-tree" && cd "$BENCH_HOME/$1-tree"; }
# The bench's flags for the installed peer runtimes of PEERS (peer_args); a peer whose runtime is missing or failed
# its check is taken out of E2E_ARGS (the bench would refuse the whole run for an arm without its runtime)
peer_args=()
set_peer_args() {
    for peer in ${PEERS:-}; do
        py="$PEER_ROOT/venv-$peer/bin/python"
        if [ -x "$py" ] && [ -f "$PEER_ROOT/venv-$peer/check-passed" ]; then
            peer_args+=("--${peer}-python" "$py")
        else
            echo "PEER $peer: runtime not installed or its check failed: its arm is taken out of E2E_ARGS for this run"
            E2E_ARGS=$(echo " ${E2E_ARGS:-} " | sed "s/ $peer / /g")
        fi
    done
}
engine_bench() {
    step "engine benchmark"
    "$GPU_VENV/bin/python" -m bench.e2e --stock-site "$STOCK" --image-python "$GPU_VENV/bin/python" \
        ${peer_args[@]+"${peer_args[@]}"} \
        --models-dir "$MODELS" --out "$RES/e2e" --ready-timeout 480 $([ "${PROFILE:-1}" = 0 ] || echo --profile) \
        ${E2E_ARGS:-}
}

case "${1:-}" in
probe)
    mkdir -p "$OUT"
    nvidia-smi > "$OUT/nvidia-smi.txt" 2>&1
    python3 -m pip freeze > "$OUT/host-freeze.txt" 2>&1
    { df -h "$BENCH_HOME" /tmp; nproc; free -g; which nvcc; python3 --version; lscpu; nvidia-smi topo -m;
      nvidia-smi -q -d CLOCK,PERFORMANCE; } > "$OUT/host.txt" 2>&1
    ;;
stage)
    mkdir -p "$STAGE" && mv "$2" "$STAGE/" && ls "$STAGE" | wc -l
    ;;
tune)
    # Per-GEMM tune of the block-FP8 shapes, candidate files, their bench against stock (its file or its default
    # heuristic), the gated files.
    K=$RES/kernels; mkdir -p "$K" && tree_copy tune || exit 1
    exec > >(tee -a "$K/tune.log") 2>&1
    S=$KERNEL_SOURCES/stock; P=$KERNEL_SOURCES/patched; MS=1,2,4,8,16,24,32,48,64,96,128,256,512
    SHAPES=${TUNE_SHAPES:-qwen3-235b-ep8,qwen3-coder-480b-ep8,deepseek-v3-ep8,qwen3-235b-tp4,qwen3-coder-480b-tp4}
    A="--fused-moe-py $S/fused_moe.py --patched-fused-moe-py $P/fused_moe.py --workers 15"
    python3 -m bench.kernels.moe $A --mode gtune --space wide --seeds 3 --budget-s "${TUNE_BUDGET_S:-420}" \
        --tune-plan "$(echo "$SHAPES" | tr ',' '\n' | sed "s/\$/:$MS/" | paste -sd';')" --out "$K" --tag gblock
    python3 -m bench.kernels.moe.make_configs --tune "$K/gtune_gblock.json" --stock-configs-dir "$S/configs" \
        --out "$K/cand"
    python3 -m bench.kernels.moe $A --configs-dir "$K/cand" --mode bench --shapes "$SHAPES" --ms $MS \
        --budget-s "${BENCH_BUDGET_S:-300}" --out "$K" --tag bblock
    python3 -m bench.kernels.moe.make_configs --tune "$K/gtune_gblock.json" --bench "$K/bench_bblock.json" \
        --stock-configs-dir "$S/configs" --out "$K/gated" --report "$K/decisions.json"
    # what the image arm serves with: the shipped files plus the gated ones
    rm -rf "$K/configs" && cp -r configs "$K/configs" && cp "$K"/gated/*.json "$K/configs/"
    touch "$K/DONE"
    ;;
prep)
    # prep makes the models E2E_ARGS names: without it, every preset model, which the host's disk does not hold
    need_e2e_args prep "the E2E_ARGS of the \`all\` that follows (the models to make)"
    # the install reads Makefile and patches/ from the copy
    mkdir -p "$RES" && rm -f "$PREP_DONE" && tree_copy prep || exit 1
    exec > >(tee -a "$PREP_LOG") 2>&1
    install_image || exit 1
    step "the models of E2E_ARGS (bench.e2e --models-only; the run reuses them)"
    "$GPU_VENV/bin/python" -m bench.e2e --models-only --stock-site "$STOCK" --models-dir "$MODELS" \
        --out "$RES/e2e" ${E2E_ARGS:-} || exit 1
    step "prep done"
    touch "$PREP_DONE"
    ;;
all)
    [ "${ENGINE:-1}" = 0 ] || need_e2e_args all "the engine bench's flags (--models ...), or ENGINE=0 for the kernel benches alone"
    mkdir -p "$RES"
    exec > >(tee -a "$RES/session.log") 2>&1
    if [ -f "$PREP_LOG" ]; then
        step "waiting for prep (the image's runtime, stock vLLM, the models: $PREP_LOG)"
        wait_for "$PREP_DONE" prep || { echo "prep failed: the session stops"; tail -n 30 "$PREP_LOG"; exit 1; }
    else
        install_image || exit 1
    fi
    # the peers serve only in the engine bench
    if [ -n "${PEERS:-}" ] && [ "${ENGINE:-1}" != 0 ]; then
        step "peer runtimes: $PEERS (beside $GPU_VENV)"
        "$0" peers
        set_peer_args
    fi
    # a kernel that fails its bench or disagrees with vLLM's op stays out of the engine run (the log says so)
    kernel_bench() {  # MODULE OUT_DIR SWITCH
        "$GPU_VENV/bin/python" -m "bench.kernels.$1" --out "$RES/$2" || {
            echo "$1 failed: the image arms run with $3=false"; export "$3=false"; }
    }
    if [ "${KERNELS:-1}" != 0 ]; then
        step "patch 0006 against vLLM's FP8 quantization op (bytes and CUDA-graph time)"
        kernel_bench fp8_quant quant OPTION_FP8_MOE_ONE_LAUNCH_QUANT
        step "patch 0007 against vLLM's topk_softmax op (ids, weights, CUDA-graph time)"
        kernel_bench router_topk router OPTION_MOE_ONE_PASS_TOPK
    fi
    decode_gemms() {  # bounded: a cuteDSL JIT compile takes its own time
        [ "${GEMMS:-1}" = 0 ] && return
        step "the decode step's GEMMs outside the MoE: router gate and block-FP8 dense kernels vLLM ships"
        timeout 300 "$GPU_VENV/bin/python" -m bench.kernels.decode_gemm --quick --out "$RES/decode" ${GEMM_ARGS:-} \
            || echo "decode GEMM bench failed or ran past 300 s"
    }
    [ "${GEMMS:-1}" = first ] && decode_gemms
    if [ -n "${SMALL_M_CANDIDATES+set}" ]; then
        # this session's small-M files, gated in the same run: SMALL_M_CANDIDATES holds small_m_configs' flags
        # (e.g. "--fused-input-quant 6144x12288"); the image-candidates arm serves them (needs GEMMS=first)
        step "small-M candidate files from the decode GEMM bench, for the image-candidates arm"
        if "$GPU_VENV/bin/python" -m bench.kernels.small_m_configs --from "$RES/decode/decode_gemm.json" \
                --out "$RES/candidates" $SMALL_M_CANDIDATES && compgen -G "$RES/candidates/*.json" > /dev/null; then
            E2E_ARGS="${E2E_ARGS:-} --candidate-configs $RES/candidates"
        else
            echo "no small-M candidate files: image-candidates is taken out of E2E_ARGS for this run"
            E2E_ARGS=$(echo " ${E2E_ARGS:-} " | sed "s/ image-candidates / /g")
        fi
    fi
    if [ -d "$RES/kernels" ]; then
        step "waiting for the config tune (its GPU timings must not share the GPU)"
        wait_for "$RES/kernels/DONE" tune && export LMI_CONFIGS_DIR="$RES/kernels/configs" || echo "tune failed: shipped configs only"
        echo "image configs: ${LMI_CONFIGS_DIR:-configs/}"
    fi
    if [ "${ENGINE:-1}" = 0 ]; then step "ENGINE=0: no engine bench"; else engine_bench; fi
    [ "${GEMMS:-1}" = first ] || decode_gemms
    step "done"
    touch "$RES/DONE"
    ;;
e2e)
    # The engine bench again (E2E_ARGS, PEERS, PROFILE as for all) on what all or prep installed, e.g. after a run
    # whose arms did not fit: its e2e/ is replaced, session.log gets its lines
    need_e2e_args e2e "the engine bench's flags (--models ...)"
    mkdir -p "$RES" && exec > >(tee -a "$RES/session.log") 2>&1
    [ -x "$GPU_VENV/bin/python" ] && [ -d "$STOCK/vllm" ] || { echo "no image runtime or stock vLLM: run all or prep"; exit 1; }
    tree_copy e2e || exit 1
    set_peer_args
    engine_bench
    step "done"
    touch "$RES/DONE"
    ;;
peers)
    # Each peer's wheelhouse from its parts ($STAGE/wheelhouse-<peer>.tar.part-*), its venv beside the image's
    # (tools/peer_runtimes.py install), its wheelhouse removed (KEEP_PEER_WHEELS=1 keeps it), and
    # a check that its Python imports its own lock's versions and not the image's vLLM (tools/peer_runtimes.py check).
    # The peers install side by side (a venv each), every line of output marked with its peer.
    install_peer() {  # PEER
        local peer=$1
        if compgen -G "$STAGE/wheelhouse-$peer.tar.part-*" > /dev/null; then
            cat "$STAGE"/wheelhouse-"$peer".tar.part-* | tar -x -C "$PEER_ROOT" && rm -f "$STAGE"/wheelhouse-"$peer".tar.part-*
        fi
        if ! python3 tools/peer_runtimes.py install "$peer" --wheelhouse "$PEER_ROOT/wheelhouse-$peer" \
                --image-venv "$GPU_VENV" --venv "$PEER_ROOT/venv-$peer"; then
            echo "$peer: runtime not installed"; rm -rf "$PEER_ROOT/venv-$peer"; return 1
        fi
        [ "${KEEP_PEER_WHEELS:-0}" = 1 ] || rm -rf "$PEER_ROOT/wheelhouse-$peer"
        # the mark `all` starts a peer's arm by: a runtime whose check fails is kept to look at, not measured
        python3 tools/peer_runtimes.py check "$peer" --python "$PEER_ROOT/venv-$peer/bin/python" \
            && touch "$PEER_ROOT/venv-$peer/check-passed"
    }
    pids=()
    for peer in ${PEERS:-sglang vllm-latest}; do
        install_peer "$peer" > >(sed "s/^/[$peer] /") 2>&1 &
        pids+=($!)
    done
    rc=0
    for pid in "${pids[@]}"; do wait "$pid" || rc=1; done
    exit $rc
    ;;
collect)
    [ -d "$RES" ] || { echo "no results yet"; exit 0; }
    # a few files: session.log, setup-logs, e2e.md, e2e.json, kernel-benches and the three tarballs of logs and
    # kernels below
    mkdir -p "$OUT"
    [ -f "$RES/session.log" ] && cp "$RES/session.log" "$OUT/"
    setup=$(cd "$RES" && ls prep.log smoke.log 2>/dev/null)
    [ -n "$setup" ] && tar -czf "$OUT/setup-logs.tar.gz" -C "$RES" $setup
    for f in e2e.md e2e.json; do [ -f "$RES/e2e/$f" ] && cp "$RES/e2e/$f" "$OUT/"; done
    # the kernel benches' and the tune's tables and data (not the tune's configs/ copy) in one file
    benches=$(cd "$RES" && ls -d quant/fp8_quant.* router/router_topk.* decode/decode_gemm.* candidates kernels \
              2>/dev/null)
    [ -n "$benches" ] && tar -czf "$OUT/kernel-benches.tar.gz" -C "$RES" --exclude kernels/configs $benches
    [ -d "$RES/e2e/logs" ] && tar -czf "$OUT/e2e-logs.tar.gz" -C "$RES/e2e" logs
    # the servers' logs while they run, and the cross-check client's report (bench/e2e/crosscheck.py)
    [ -d /tmp/e2e-work/logs ] && tar -czf "$OUT/e2e-live-logs.tar.gz" -C /tmp/e2e-work logs \
        $(cd /tmp/e2e-work && ls -d crosscheck 2>/dev/null)
    # each arm's torch.compile kernels (Inductor's Triton source) and the configs its autotuning picked
    # (*.best_config), which the profiles name (triton_red_fused_1)
    kern=$(cd /tmp/e2e-work 2>/dev/null && { grep -rl --include='*.py' -e '^def triton_' homes;
                                             find homes -name '*.best_config'; } 2>/dev/null | head -600)
    [ -n "$kern" ] && tar -czf "$OUT/inductor-kernels.tar.gz" -C /tmp/e2e-work $kern
    tail -n 25 "$RES/session.log"
    [ -f "$RES/DONE" ] && echo "SESSION DONE"
    ;;
stop)
    # SIGTERM: the engine bench stops its servers (their process groups) before it exits
    pkill -TERM -f "$(subcommand all)"; pkill -TERM -f "$(subcommand e2e)"; pkill -TERM -f "$(subcommand tune)"
    pkill -TERM -f '^[^ ]*python[0-9.]* -m bench[.]kernels[.]moe( |$)'
    pkill -TERM -f "$E2E_PROC"
    for _ in $(seq 60); do pgrep -f "$E2E_PROC" > /dev/null || break; sleep 1; done
    pgrep -fa "$E2E_PROC|^VLLM::EngineCore|^sglang::" || echo "stopped"
    nvidia-smi --query-gpu=memory.used --format=csv,noheader
    ;;
*)
    awk 'NR > 1 && !/^#/ {exit} NR > 1' "$0"; exit 2  # the header above
    ;;
esac
