#!/usr/bin/env bash
# What the trash costs, beside JuiceFS (issue 44): `rm -rf` of one flat directory of FILES empty
# files, through one `strait primary` and one mount (the path users take), with the trash on
# (trash_days 1, the default) and off (0); then JuiceFS 1.4 (Redis + a local directory) with its
# trash on (trash-days 1, its default) and off, in the same run. The files are made by a
# Python loop (not timed). Prints, for each, the seconds, files/s, and the CPU time per file of
# each process (rm, the mount, the daemon or Redis).
#
#   sudo scripts/bench-trash.sh
#
# Environment:
#   FILES      files in the directory (default 100000)
#   STRAIT     strait binary (default: $CARGO_TARGET_DIR/debug/strait, as the tests use)
#   DIR        working directory, emptied first (default /tmp/strait-trash-bench)
set -euo pipefail

FILES=${FILES:-100000}
DIR=${DIR:-/tmp/strait-trash-bench}
STRAIT=${STRAIT:-${CARGO_TARGET_DIR:-$HOME/.cache/strait-target}/debug/strait}

BENCH=bench-trash.sh
# shellcheck source=scripts/lib/bench.sh
source "$(dirname "$0")/lib/bench.sh"
bench_setup

make_files() {
    python3 - "$1" "$FILES" <<'EOF'
import os, sys
d, n = sys.argv[1], int(sys.argv[2])
os.mkdir(d)
for i in range(n):
    os.close(os.open(os.path.join(d, "f%07d" % i), os.O_CREAT | os.O_WRONLY, 0o644))
EOF
}

# rm -rf DIR, timed; LABEL, then name=pid pairs for the CPU per file
time_rm() {
    local dir=$1 label=$2
    shift 2
    local before=() p
    for kv in "$@"; do before+=("$(cpu_of "${kv#*=}")"); done
    local t0 t1 rm_cpu
    t0=$(date +%s.%N)
    rm_cpu=$( { /usr/bin/time -f "%U %S" rm -rf "$dir" ; } 2>&1 | awk '{print $1 + $2}')
    t1=$(date +%s.%N)
    local line
    line=$(awk -v a="$t0" -v b="$t1" -v n="$FILES" -v l="$label" -v c="$rm_cpu" \
        'BEGIN {printf "%-28s %7.2f s %9.0f files/s   CPU/file: rm %5.1f us", l, b - a, n / (b - a), c * 1e6 / n}')
    local i=0
    for kv in "$@"; do
        p=${kv#*=}
        line+=$(awk -v a="${before[$i]}" -v b="$(cpu_of "$p")" -v n="$FILES" -v k="${kv%%=*}" \
            'BEGIN {printf ", %s %5.1f us", k, (b - a) * 1e6 / n}')
        i=$((i + 1))
    done
    echo "$line"
}

echo "== rm -rf of a flat directory of $FILES empty files"

# strait: one primary, one mount
start_strait trash
for days in 1 0; do
    "$STRAIT" trash days "$DIR/mnt" "$days" >/dev/null
    make_files "$DIR/mnt/flat-$days"
    time_rm "$DIR/mnt/flat-$days" "strait, trash_days $days" "mount=$pid_m" "primary=$pid_d"
done
echo "   strait's trash after the rounds: $("$STRAIT" trash list "$DIR/mnt" | tail -1)"

# JuiceFS: Redis + a local directory
start_juicefs_meta --trash-days 1
for days in 1 0; do
    # a mount reads the setting when it starts
    juicefs config "$JFS_META" --trash-days "$days" --yes >/dev/null 2>&1 ||
        die "juicefs config --trash-days $days"
    mount_juicefs
    make_files "$DIR/jmnt/flat-$days"
    time_rm "$DIR/jmnt/flat-$days" "juicefs, trash-days $days" "mount=$pid_j" "redis=$pid_r"
    umount_juicefs
done
