#!/usr/bin/env bash
# Training at a mirror with MLPerf Storage's DLIO benchmark (dlio_benchmark 2.0.0): the
# accelerator utilisation (AU) and samples/s of resnet50_h100 and unet3d_h100 (one simulated
# accelerator), the bytes that crossed the link and the CPU each process spent, in four states:
#   a  at region A (the primary's region), for reference;
#   b  at region B, lazy mirror: nothing copied, every first read of a block crosses the link;
#   c  at region B while the eager copy runs: training starts as soon as the files, generated
#      at A, are visible at B with their full length (the pending blocks then are reported;
#      see EAGER_PAUSE);
#   d  at region B after the eager copy (pending blocks 0; `strait warmup` confirms it).
# Run as root, after `cargo build` (not in CI: timing; it needs ~10 GB of disk at full size):
#
#   ./bench/scripts/dlio.sh                                  # full size, 2 epochs
#   RESNET_FILES=4 UNET_FILES=4 UNET_ARGS="++workload.reader.batch_size=2" EPOCHS=1 \
#       ./bench/scripts/dlio.sh                              # a quick run
#
# Each workload runs in two fresh `strait dev up --store garage` (a Garage per region; the
# mirror reaches A's only through the link, CAP MB/s and DELAY_MS one way): `--sync lazy` for
# states a and b, `--sync eager` for c and d. In each, DLIO generates the data set at A's mount
# (dev up's), then every training run reads through a mount of its own, made for it and
# unmounted after it (`strait mount -d` of the region's daemon, as dev up mounts, with
# MOUNT_ARGS, default `--cache-size 0`: no disk cache), after `sync; echo 3 >
# /proc/sys/vm/drop_caches`: every run starts cold, its own memory cache empty.
#
# Environment:
#   CAP, DELAY_MS     the link: MB/s per proxy (default 200) and one-way delay (default 15)
#   EPOCHS            training epochs (default 2)
#   WORKLOADS         default "resnet50 unet3d"
#   STATES            default "a b c d" (a subset runs only the dev ups it needs)
#   RESNET_FILES      resnet50_h100 files (default 32, 4.6 GB; 1251 samples of ~112 KiB each)
#   UNET_FILES        unet3d_h100 files (default 28, ~4 GB; one sample of ~140 MB each)
#   RESNET_ARGS, UNET_ARGS   more DLIO overrides (`++workload.X=Y ...`), for generation and
#                     training alike; unet3d's batch is 7 samples, so fewer than 7 files need
#                     UNET_ARGS="++workload.reader.batch_size=2"
#   MOUNT_ARGS        options of the training mounts (default "--cache-size 0")
#   DLIO_VENV         DLIO's virtual environment (default ~/.cache/strait-dlio-venv; made once)
#   DLIO_PYTHON       the Python that makes it (default python3; tried with 3.11)
#   DLIO_TIMEOUT      seconds one DLIO run may take (default 3600)
#   EAGER_PAUSE       1 (default): for state c, `strait mirror pause` holds the mirror's applier
#                     while DLIO writes at A and `resume` lifts it once the data set is written,
#                     so that training starts with the whole copy ahead of it. 0: no pause; DLIO
#                     writes at A (~40 MB/s here) slower than the link copies, so the copy is
#                     then over (pending 0) when the files are visible at B, and c is d.
#   BENCH_DIR         scratch directory (default a new one under /tmp; removed at the end)
#   KEEP_RESULTS      directory to copy the results (tables, DLIO outputs, logs) into
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$HOME/.cache/strait-target}
STRAIT=${STRAIT:-$CARGO_TARGET_DIR/debug/strait}
CAP=${CAP:-200}
DELAY_MS=${DELAY_MS:-15}
EPOCHS=${EPOCHS:-2}
WORKLOADS=${WORKLOADS:-"resnet50 unet3d"}
STATES=${STATES:-"a b c d"}
RESNET_FILES=${RESNET_FILES:-32}
UNET_FILES=${UNET_FILES:-28}
RESNET_ARGS=${RESNET_ARGS:-}
UNET_ARGS=${UNET_ARGS:-}
MOUNT_ARGS=${MOUNT_ARGS:-"--cache-size 0"}
DLIO_VENV=${DLIO_VENV:-$HOME/.cache/strait-dlio-venv}
DLIO_PYTHON=${DLIO_PYTHON:-python3}
DLIO_TIMEOUT=${DLIO_TIMEOUT:-3600}
EAGER_PAUSE=${EAGER_PAUSE:-1}
read -r -a MOUNT_ARGV <<<"$MOUNT_ARGS"

if [[ $EUID -ne 0 ]]; then
    echo "bench-dlio.sh: run as root (FUSE mounts, drop_caches, mpirun)" >&2
    exit 1
fi
# shellcheck source=scripts/lib/prereqs.sh
source "$ROOT/scripts/lib/prereqs.sh"   # apt_ensure; PATH with ~/.cargo/bin (garage)
[[ -x "$STRAIT" ]] || { echo "no strait binary at $STRAIT: cargo build first" >&2; exit 1; }
command -v garage >/dev/null || { echo "no garage on PATH (scripts/test.sh installs it)" >&2; exit 1; }

# ---- DLIO: MPI, a virtual environment outside the checkout, DALI's tfrecord2idx stand-in ----
command -v mpirun >/dev/null || apt_ensure openmpi-bin libopenmpi-dev
# dlio_benchmark 2.0.0 declares torch, torchvision, torchaudio, tensorflow (GPU) and DALI for
# CUDA 11: it is installed without them, and with what these two workloads import (versions
# that were installed and run together): hydra-core/omegaconf (its configuration), numpy,
# pandas, psutil, mpi4py (imported at start), pydftracer 1.0.2 (its profiler decorators:
# without it the fallback class fails at import), tensorflow-cpu (resnet50: TFRecord
# generation, the tensorflow reader and framework; brings h5py) and torch (unet3d: the
# pytorch data loader and framework; PyPI's Linux wheel brings the CUDA libraries, ~5 GB,
# which it loads at import even without a GPU). Pillow, torchvision, torchaudio and DALI are
# not imported by these workloads.
DLIO_DEPS=(hydra-core==1.3.8 omegaconf==2.3.1 numpy==2.4.6 pandas==3.1.1 psutil==7.2.2
    PyYAML==6.0.4 mpi4py==4.1.2 pydftracer==1.0.2 tensorflow-cpu==2.21.0 torch==2.15.0)
STAMP="dlio_benchmark==2.0.0 ${DLIO_DEPS[*]}"
if [[ ! -f "$DLIO_VENV/.strait-dlio" || "$(cat "$DLIO_VENV/.strait-dlio")" != "$STAMP" ]]; then
    t0=$(date +%s)
    echo "==> installing DLIO into $DLIO_VENV (once; ~7 GB, a few minutes)"
    if ! "$DLIO_PYTHON" -m venv "$DLIO_VENV"; then
        apt_ensure python3-venv
        "$DLIO_PYTHON" -m venv "$DLIO_VENV"
    fi
    pip_log=$(mktemp /tmp/strait-dlio-pip.XXXXXX)
    if ! { "$DLIO_VENV/bin/pip" install --no-deps dlio_benchmark==2.0.0 &&
        "$DLIO_VENV/bin/pip" install "${DLIO_DEPS[@]}" &&
        TF_CPP_MIN_LOG_LEVEL=2 "$DLIO_VENV/bin/python" -c \
            'import dlio_benchmark.main, tensorflow, torch, mpi4py.MPI, dftracer.logger, h5py'; } >"$pip_log" 2>&1; then
        echo "installing DLIO failed; the end of its log ($pip_log):" >&2
        tail -30 "$pip_log" >&2
        exit 1
    fi
    rm -f "$pip_log"
    echo "$STAMP" >"$DLIO_VENV/.strait-dlio"
    echo "DLIO installed in $(($(date +%s) - t0)) s: $(du -sh "$DLIO_VENV" | cut -f1)"
fi
# DLIO's TFRecord generator runs DALI's `tfrecord2idx` after each file
if ! cmp -s <(tail -n +2 "$ROOT/scripts/lib/tfrecord2idx.py") <(tail -n +2 "$DLIO_VENV/bin/tfrecord2idx" 2>/dev/null); then
    { echo "#!$DLIO_VENV/bin/python"; tail -n +2 "$ROOT/scripts/lib/tfrecord2idx.py"; } >"$DLIO_VENV/bin/tfrecord2idx"
    chmod 755 "$DLIO_VENV/bin/tfrecord2idx"
fi
PY=$DLIO_VENV/bin/python
export PATH=$DLIO_VENV/bin:$PATH
export TF_CPP_MIN_LOG_LEVEL=${TF_CPP_MIN_LOG_LEVEL:-2}

# ---- scratch, cleanup ----
WORK=${BENCH_DIR:-$(mktemp -d /tmp/strait-bench-dlio.XXXXXX)}
mkdir -p "$WORK/out" "$WORK/logs"
RESULTS=$WORK/results.jsonl
: >"$RESULTS"
D=
DEVPID=
TMNT=
SAMPLER=
stop_devup() {
    if [[ -n "$SAMPLER" ]]; then
        kill "$SAMPLER" 2>/dev/null || true
        wait "$SAMPLER" 2>/dev/null || true
        SAMPLER=
    fi
    if [[ -n "$TMNT" ]] && grep -q " $TMNT " /proc/mounts; then
        "$STRAIT" umount "$TMNT" >/dev/null 2>&1 || umount -l "$TMNT" 2>/dev/null || true
    fi
    TMNT=
    if [[ -n "$DEVPID" ]]; then
        kill -INT "$DEVPID" 2>/dev/null || true
        wait "$DEVPID" 2>/dev/null || true
        DEVPID=
    fi
    # anything dev up could not unmount
    local m
    for m in $(awk -v w="$WORK/" 'index($2, w) == 1 {print $2}' /proc/mounts | sort -r); do
        umount -l "$m" 2>/dev/null || true
    done
    [[ -n "$D" ]] && rm -rf "$D"
    D=
}
cleanup() {
    local rc=$?
    trap - EXIT INT TERM
    stop_devup
    if [[ -n "${KEEP_RESULTS:-}" ]]; then
        mkdir -p "$KEEP_RESULTS"
        cp -r "$WORK/out" "$WORK/logs" "$WORK"/results.* "$KEEP_RESULTS/" 2>/dev/null || true
    fi
    rm -rf "$WORK"
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# ---- helpers ----
log() { echo "[$(date +%H:%M:%S)] $*"; }
devup() { # SYNC: a fresh `dev up` in $WORK/dev
    D=$WORK/dev
    "$STRAIT" dev up --dir "$D" --store garage --sync "$1" --link-mb-s "$CAP" --delay-ms "$DELAY_MS" \
        >"$WORK/logs/devup-$W-$1.log" 2>&1 &
    DEVPID=$!
    for _ in $(seq 1 180); do
        grep -q "strait dev: ready" "$WORK/logs/devup-$W-$1.log" && break
        kill -0 "$DEVPID" 2>/dev/null || break
        sleep 1
    done
    grep -q "strait dev: ready" "$WORK/logs/devup-$W-$1.log" || {
        echo "dev up did not come up:" >&2
        tail -20 "$WORK/logs/devup-$W-$1.log" >&2
        exit 1
    }
    MIRROR=$(sed -n 's/^  "mirror": "\(.*\)",$/\1/p' "$D/dev.json")
    MA=$D/region-a/mnt
    MB=$D/region-b/mnt
}
pid_of() { pgrep -f "$1" | head -1 || true; }
ticks() { if [[ -n "$1" && -r /proc/$1/stat ]]; then awk '{print $14 + $15}' "/proc/$1/stat"; else echo 0; fi; }
mstatus() { "$STRAIT" mirror status --addr "$MIRROR" --token-file "$D/tokens/admin.token" --json; }
blocks() { # the mirror's block counters, as "pending copied fallback_bytes"
    mstatus | "$PY" -c 'import json, sys
b = json.load(sys.stdin)["mirrors"][0]["blocks"]
print(b["pending_blocks"], b["copied_bytes"], b["cross_region_read_bytes"])'
}
listing() { (cd "$1" && find . -type f -printf '%p %s\n' | sort); }
wait_visible_at_b() { # the data set's files at B, with A's lengths
    local want
    want=$(listing "$MA/dlio/$W")
    for _ in $(seq 1 600); do
        [[ "$(listing "$MB/dlio/$W" 2>/dev/null)" == "$want" ]] && return 0
        sleep 0.2
    done
    echo "the data set did not appear at B in 120 s" >&2
    exit 1
}
dlio() { # LOG ARGS...: DLIO in the foreground; its CPU ticks (with its workers) to LOG.cpu
    local log=$1
    shift
    local t0 rc=0
    t0=$(date +%s.%N)
    # bash waits for DLIO, so its cutime+cstime is DLIO's CPU with every worker it waited for.
    # TMPDIR: PyTorch's data loader workers leave /tmp/pymp-* directories behind.
    mkdir -p "$WORK/tmp"
    TMPDIR=$WORK/tmp timeout "$DLIO_TIMEOUT" mpirun --allow-run-as-root --bind-to none -np 1 \
        bash -c 'dlio_benchmark "${@:2}"; rc=$?; awk "{print \$16 + \$17}" /proc/$$/stat >"$1"; exit $rc' \
        bash "$log.cpu" "workload=${WL[$W]}" "hydra.run.dir=$WORK/out/hydra" "$@" >"$log" 2>&1 || rc=$?
    echo "$(date +%s.%N) - $t0" | bc >"$log.wall"
    if ((rc != 0)); then
        echo "DLIO failed ($rc); the end of $log:" >&2
        grep -v '^I0000\|^WARNING: All log' "$log" | tail -30 >&2
        exit 1
    fi
}
generate() {
    log "$W: generating ${NFILES[$W]} files at A ($(basename "$D")/region-a/mnt/dlio/$W)"
    local t0
    t0=$(date +%s)
    dlio "$WORK/logs/gen-$W-$1.log" ++workload.workflow.generate_data=True ++workload.workflow.train=False \
        "++workload.dataset.num_files_train=${NFILES[$W]}" "++workload.dataset.data_folder=$MA/dlio/$W" \
        "++workload.output.folder=$WORK/out/gen-$W-$1" "${XARGS[@]}"
    sync -f "$MA/dlio/$W"
    local bytes
    bytes=$(du -sb "$MA/dlio/$W/train" | cut -f1)
    log "$W: generated $(numfmt --to=iec "$bytes") in $(($(date +%s) - t0)) s"
    echo "$W ${NFILES[$W]} $bytes" >>"$WORK/results.datasets"
}
mount_region() { # REGION (a|b) STATE: a fresh mount of its daemon at $TMNT, as dev up's but
    # with MOUNT_ARGS
    local r=$1 url
    url=$(sed -n 's/^STRAIT_URL=//p' "$D/region-$r/etc/mount-data.env")
    TMNT=$WORK/train-mnt
    mkdir -p "$TMNT" "$WORK/train-cache"
    rm -rf "${WORK:?}/train-cache"/*
    (
        set -a
        # shellcheck source=/dev/null
        [[ -f "$D/region-$r/etc/s3.env" ]] && source "$D/region-$r/etc/s3.env"
        set +a
        "$STRAIT" mount -d "$url" "$TMNT" --token-file "$D/tokens/mount.token" \
            --cache-dir "$WORK/train-cache" --log-file "$WORK/logs/mount-$W-$2.log" "${MOUNT_ARGV[@]}" \
            >/dev/null
    )
}
pending_sampler() { # "seconds pending_blocks" each second, until killed
    local n
    while :; do
        n=$(mstatus 2>/dev/null | sed -n 's/^ *"pending_blocks": \([0-9]*\),*$/\1/p' | head -1)
        echo "$(date +%s.%N) ${n:-?}"
        sleep 1
    done
}
train() { # STATE REGION: one training run, cold, through a fresh mount of REGION (made here
    # unless mount_region made it already)
    STATE=$1
    local r=$2 log=$WORK/logs/train-$W-$1.log
    [[ -n "$TMNT" ]] || mount_region "$r" "$STATE"
    local -A pid before
    pid[mirror]=$(pid_of "strait mirror --config $D")
    pid[primary]=$(pid_of "strait primary --config $D")
    pid[mount]=$(pid_of "strait mount [^ ]* $TMNT ")
    pid[mountA]=$(pid_of "strait mount .* $D/region-a/mnt")
    pid[mountB]=$(pid_of "strait mount .* $D/region-b/mnt")
    pid[garageA]=$(pid_of "garage .*$D/region-a")
    pid[garageB]=$(pid_of "garage .*$D/region-b")
    pid[devup]=$DEVPID
    sync
    echo 3 >/proc/sys/vm/drop_caches
    local k
    for k in "${!pid[@]}"; do before[$k]=$(ticks "${pid[$k]}"); done
    local b0 t0
    b0=$(blocks)
    t0=$(date +%s.%N)
    log "$W: state $STATE: training at $r (pending blocks ${b0%% *})"
    if [[ "${b0%% *}" != 0 ]]; then
        pending_sampler >"$log.pending" &
        SAMPLER=$!
    fi
    dlio "$log" ++workload.workflow.generate_data=False ++workload.workflow.train=True \
        ++workload.workflow.checkpoint=False "++workload.train.epochs=$EPOCHS" \
        "++workload.dataset.num_files_train=${NFILES[$W]}" "++workload.dataset.data_folder=$TMNT/dlio/$W" \
        "++workload.output.folder=$WORK/out/train-$W-$STATE" "${XARGS[@]}"
    if [[ -n "$SAMPLER" ]]; then
        kill "$SAMPLER" 2>/dev/null || true
        wait "$SAMPLER" 2>/dev/null || true
        SAMPLER=
    fi
    local b1 cpu=""
    b1=$(blocks)
    for k in "${!pid[@]}"; do cpu="$cpu \"$k\": $(($(ticks "${pid[$k]}") - ${before[$k]})),"; done
    cpu="$cpu \"dlio\": $(cat "$log.cpu")"
    grep -q "Training Accelerator Utilization" "$log" || log "(no AU in $log)"
    "$STRAIT" umount "$TMNT" >/dev/null
    TMNT=
    read -r p0 c0 f0 <<<"$b0"
    read -r p1 c1 f1 <<<"$b1"
    echo "{\"workload\": \"$W\", \"state\": \"$STATE\", \"out\": \"$WORK/out/train-$W-$STATE\"," \
        "\"t0\": $t0, \"wall\": $(cat "$log.wall"), \"pending0\": $p0, \"pending1\": $p1," \
        "\"copied\": $((c1 - c0)), \"fallback\": $((f1 - f0)), \"ticks\": {$cpu}," \
        "\"hz\": $(getconf CLK_TCK), \"samples\": \"$log.pending\"}" >>"$RESULTS"
}
wants() { local s; for s in "$@"; do [[ " $STATES " == *" $s "* ]] && return 0; done; return 1; }

declare -A WL=([resnet50]=resnet50_h100 [unet3d]=unet3d_h100)
declare -A NFILES=([resnet50]=$RESNET_FILES [unet3d]=$UNET_FILES)
declare -A XARGV=([resnet50]=$RESNET_ARGS [unet3d]=$UNET_ARGS)

log "link $CAP MB/s, $DELAY_MS ms one way; $EPOCHS epochs; states: $STATES; work in $WORK"
for W in $WORKLOADS; do
    [[ -n "${WL[$W]:-}" ]] || { echo "unknown workload $W (resnet50, unet3d)" >&2; exit 1; }
    read -r -a XARGS <<<"${XARGV[$W]}"
    if wants a b; then
        devup lazy
        generate lazy
        wait_visible_at_b
        if wants a; then train a a; fi
        if wants b; then train b b; fi
        stop_devup
    fi
    if wants c d; then
        devup eager
        admin=(--addr "$MIRROR" --token-file "$D/tokens/admin.token")
        if wants c && [[ "$EAGER_PAUSE" == 1 ]]; then
            # hold the mirror's applier while A writes, so that the copy starts as the files
            # appear at B (else it keeps up with DLIO's writing and is done before training)
            "$STRAIT" mirror pause "${admin[@]}" --seconds 3600 >/dev/null
        fi
        generate eager
        if wants c; then
            mount_region b c
            if [[ "$EAGER_PAUSE" == 1 ]]; then "$STRAIT" mirror resume "${admin[@]}" >/dev/null; fi
        fi
        wait_visible_at_b
        if wants c; then train c b; fi
        if wants d; then
            t0=$(date +%s)
            while :; do
                p=$(blocks)
                [[ "${p%% *}" == 0 ]] && break
                if (($(date +%s) - t0 > 1800)); then
                    echo "the eager copy did not finish in 30 min: $(blocks)" >&2
                    exit 1
                fi
                sleep 1
            done
            log "$W: eager copy done (waited $(($(date +%s) - t0)) s for it); strait warmup:"
            "$STRAIT" warmup "${admin[@]}" "/dlio/$W" 2>/dev/null |
                sed 's/^/    /'
            train d b
        fi
        stop_devup
    fi
done

# ---- the tables ----
"$PY" - "$RESULTS" "$WORK/results.datasets" "$CAP" "$DELAY_MS" "$MOUNT_ARGS" <<'EOF' | tee "$WORK/results.txt"
import json, sys
from datetime import datetime

rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
data = {w: (f, int(b)) for w, f, b in (l.split() for l in open(sys.argv[2]))}
what = {"a": "A (primary)", "b": "B lazy", "c": "B eager, copying", "d": "B after copy"}
mb = lambda n: f"{n / 1e6:.0f}"



def pending(r):
    """Pending blocks at DLIO's start, at epoch 1's start, and when the copy was done (s)."""
    at0, at1, done = str(r["pending0"]), "", ""
    try:
        samples = [(float(t), int(n)) for t, n in (l.split() for l in open(r["samples"])) if n.isdigit()]
    except OSError:
        return at0, at1, done
    e1 = json.load(open(r["out"] + "/per_epoch_stats.json"))["1"]["start"]
    e1 = datetime.strptime(e1, "%Y-%m-%dT%H:%M:%S.%f").timestamp()
    before = [n for t, n in samples if t <= e1]
    at1 = str(before[-1]) if before else ""
    zero = [t for t, n in samples if n == 0]
    done = f"{zero[0] - r['t0']:.0f}" if zero else ">end"
    return at0, at1, done


print()
print("AU: DLIO's train_au_percentage (it leaves each epoch's first step out); AU*: the compute")
print("time over all steps' time, first included. samples/s: DLIO's per epoch. link MB: bytes the")
print("mirror copied + read across the link during the run. pending: blocks queued for the copy")
print("at DLIO's start / at its first epoch's start (DLIO imports TensorFlow or PyTorch first);")
print("copy done: seconds after DLIO's start when none was pending.")
print(f"Link {sys.argv[3]} MB/s, {sys.argv[4]} ms one way; training mounts: {sys.argv[5]}.")
for w in dict.fromkeys(r["workload"] for r in rows):
    print(f"\n{w}: {data[w][0]} files, {data[w][1] / 1e9:.2f} GB")
    hdr = f"{'state':<18} {'AU % per epoch':<16} {'AU %':>6} {'AU* %':>6} {'samples/s per epoch':<21} {'mean':>8} {'wall s':>7} {'link MB':>8} {'(copy+read)':<13} {'pending':>15} {'copy done s':>11}"
    print(hdr)
    print("-" * len(hdr))
    for r in (r for r in rows if r["workload"] == w):
        s = json.load(open(r["out"] + "/summary.json"))["metric"]
        o = json.load(open(r["out"] + "/0_output.json"))
        comp = proc = 0.0
        for e in range(1, 100):
            ep = o.get(str(e))
            if not ep:
                break
            for k, v in ep["compute"].items():
                comp += sum(v)
                proc += sum(ep["proc"][k])
        au = " ".join(f"{x:.1f}" for x in s["train_au_percentage"])
        tp = " ".join(f"{x:.1f}" for x in s["train_throughput_samples_per_second"])
        link = r["copied"] + r["fallback"]
        p = pending(r)
        print(f"{what[r['state']]:<18} {au:<16} {s['train_au_mean_percentage']:>6.1f} "
              f"{100 * comp / proc if proc else 0:>6.1f} {tp:<21} "
              f"{s['train_throughput_mean_samples_per_second']:>8.1f} {r['wall']:>7.1f} "
              f"{mb(link):>8} {mb(r['copied']) + '+' + mb(r['fallback']):<13} "
              f"{' / '.join(x for x in p[:2] if x):>15} {p[2]:>11}")
    names = ["dlio", "mount", "mirror", "primary", "mountA", "mountB", "garageA", "garageB", "devup"]
    print(f"\n{w}: CPU seconds over the run (mount: the run's own mount; mountA/mountB: dev up's;"
          " devup: its link proxies)")
    hdr = f"{'state':<18} " + " ".join(f"{n:>8}" for n in names)
    print(hdr)
    print("-" * len(hdr))
    for r in (r for r in rows if r["workload"] == w):
        print(f"{what[r['state']]:<18} " + " ".join(f"{r['ticks'].get(n, 0) / r['hz']:>8.1f}" for n in names))
EOF
