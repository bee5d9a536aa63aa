#!/usr/bin/env bash
# What a clone costs, beside JuiceFS (issue 44): a tree of FILES files of SIZE bytes in DIRS
# directories, copied through one `strait primary` and one mount (the path users take) with
# `strait clone` and with `cp -r`; then the same on JuiceFS 1.4 (Redis + a local directory) with
# `juicefs clone` and `cp -r`, in the same run. The tree is made by a Python loop (not timed).
# Prints, for each copy, the seconds, files/s, the CPU time per file of each process (the
# command, the mount, the daemon or Redis) and how much the object store grew.
#
#   sudo scripts/bench-clone.sh
#
# Environment:
#   FILES      files in the tree (default 100000)
#   DIRS       directories they are spread over (default 100)
#   SIZE       bytes per file (default 1024)
#   ROUNDS     clones of each (default 3), strait and JuiceFS in turn
#   CP=0       no cp -r (it takes about ten minutes on each here)
#   STRAIT     strait binary (default: $CARGO_TARGET_DIR/debug/strait, as the tests use)
#   DIR        working directory, emptied first (default /tmp/strait-clone-bench)
set -euo pipefail

FILES=${FILES:-100000}
DIRS=${DIRS:-100}
SIZE=${SIZE:-1024}
ROUNDS=${ROUNDS:-3}
CP=${CP:-1}
DIR=${DIR:-/tmp/strait-clone-bench}
STRAIT=${STRAIT:-${CARGO_TARGET_DIR:-$HOME/.cache/strait-target}/debug/strait}

BENCH=bench-clone.sh
# shellcheck source=scripts/lib/bench.sh
source "$(dirname "$0")/lib/bench.sh"
bench_setup

make_tree() {
    python3 - "$1" "$FILES" "$DIRS" "$SIZE" <<'PY'
import os, sys
d, n, dirs, size = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
os.mkdir(d)
for j in range(dirs):
    os.mkdir(os.path.join(d, "d%04d" % j))
for i in range(n):
    p = os.path.join(d, "d%04d" % (i % dirs), "f%07d" % i)
    with open(p, "wb") as f:
        f.write((b"%07d" % i) * (size // 7) + b"x" * (size % 7))
PY
}

# bytes under a directory
bytes_of() {
    du -sb "$1" 2>/dev/null | awk '{print $1}'
}

# LABEL ROW SYSTEM STORE_DIR name=pid... -- COMMAND...: run COMMAND, timed, with the CPU per
# file of each process and what the store grew by
time_copy() {
    local label=$1 row=$2 system=$3 store=$4
    shift 4
    local procs=()
    while [[ $1 != -- ]]; do
        procs+=("$1")
        shift
    done
    shift
    local before=() p kv
    for kv in "${procs[@]}"; do before+=("$(cpu_of "${kv#*=}")"); done
    local s0 t0 t1 cmd_cpu s1
    s0=$(bytes_of "$store")
    t0=$(date +%s.%N)
    /usr/bin/time -o "$DIR/copy.time" -f "%U %S" "$@" >/dev/null 2>"$DIR/copy.err" ||
        die "$label failed: $(tail -3 "$DIR/copy.err")"
    cmd_cpu=$(awk '{print $1 + $2}' "$DIR/copy.time")
    t1=$(date +%s.%N)
    sync
    s1=$(bytes_of "$store")
    local line
    line=$(awk -v a="$t0" -v b="$t1" -v n="$FILES" -v l="$label" -v c="$cmd_cpu" \
        'BEGIN {printf "%-18s %8.2f s %8.0f files/s   CPU/file: command %6.1f us", l, b - a, n / (b - a), c * 1e6 / n}')
    local i=0
    for kv in "${procs[@]}"; do
        p=${kv#*=}
        line+=$(awk -v a="${before[$i]}" -v b="$(cpu_of "$p")" -v n="$FILES" -v k="${kv%%=*}" \
            'BEGIN {printf ", %s %6.1f us", k, (b - a) * 1e6 / n}')
        i=$((i + 1))
    done
    line+=$(awk -v a="$s0" -v b="$s1" 'BEGIN {printf "   store +%.1f MiB", (b - a) / 1048576}')
    echo "$line"
    result "$row" "$system" "$(rate "$FILES" "$t0" "$t1")" files/s
}

echo "== a tree of $FILES files of $SIZE bytes in $DIRS directories: clone ($ROUNDS rounds) against cp -r"

# strait (one primary, one mount) and JuiceFS (Redis + a local directory), both up; the clones
# in turn, ROUNDS times, so that a burst of noise on a shared machine falls on both alike (the
# summary takes each one's median); then one cp -r on each
start_strait clone
start_juicefs_meta
mount_juicefs
make_tree "$DIR/mnt/tree"
make_tree "$DIR/jmnt/tree"
sync
for r in $(seq 1 "$ROUNDS"); do
    time_copy "strait clone" "clone of $FILES files" strait "$DIR/data" "mount=$pid_m" "primary=$pid_d" -- \
        "$STRAIT" clone "$DIR/mnt/tree" "$DIR/mnt/tree-clone-$r"
    time_copy "juicefs clone" "clone of $FILES files" juicefs "$DIR/jfs-data" "mount=$pid_j" "redis=$pid_r" -- \
        juicefs clone "$DIR/jmnt/tree" "$DIR/jmnt/tree-clone-$r"
done
n=$(find "$DIR/mnt/tree-clone-1" -type f | wc -l)
[[ $n -eq $FILES ]] || die "the strait clone has $n files, not $FILES"
cmp -s "$DIR/mnt/tree/d0000/f0000000" "$DIR/mnt/tree-clone-1/d0000/f0000000" ||
    die "the strait clone's bytes differ from its source's"
n=$(find "$DIR/jmnt/tree-clone-1" -type f | wc -l)
[[ $n -eq $FILES ]] || die "the JuiceFS clone has $n files, not $FILES"
if [[ $CP != 0 ]]; then
    time_copy "strait, cp -r" "cp -r of $FILES files" strait "$DIR/data" "mount=$pid_m" "primary=$pid_d" -- \
        cp -r "$DIR/mnt/tree" "$DIR/mnt/tree-cp"
    time_copy "juicefs, cp -r" "cp -r of $FILES files" juicefs "$DIR/jfs-data" "mount=$pid_j" "redis=$pid_r" -- \
        cp -r "$DIR/jmnt/tree" "$DIR/jmnt/tree-cp"
fi
umount_juicefs
