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
#   ROUNDS     rounds (default 1); each runs strait and JuiceFS in turn
#   STRAIT     strait binary (default: $CARGO_TARGET_DIR/debug/strait, as the tests use)
#   DIR        working directory, emptied first (default /tmp/strait-trash-bench)
set -euo pipefail

FILES=${FILES:-100000}
ROUNDS=${ROUNDS:-1}
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

# rm -rf DIR, timed; LABEL, the row and system of its result, then name=pid pairs for the CPU
# per file
time_rm() {
    local dir=$1 label=$2 row=$3 system=$4
    shift 4
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
    result "$row" "$system" "$(rate "$FILES" "$t0" "$t1")" files/s
}

echo "== rm -rf of a flat directory of $FILES empty files, $ROUNDS round(s), strait and JuiceFS in turn"

# strait: one primary, one mount; JuiceFS: Redis + a local directory (mounted for each run: a
# mount reads the trash setting when it starts). The two run in turn, so that a burst of
# noise on a shared machine falls on both alike; the summary takes each one's median.
start_strait trash
start_juicefs_meta --trash-days 1
for r in $(seq 1 "$ROUNDS"); do
    for days in 1 0; do
        "$STRAIT" trash days "$DIR/mnt" "$days" >/dev/null
        make_files "$DIR/mnt/flat-$r-$days"
        time_rm "$DIR/mnt/flat-$r-$days" "strait, trash_days $days" "rm -rf of $FILES files, trash $days d" \
            strait "mount=$pid_m" "primary=$pid_d"
        juicefs config "$JFS_META" --trash-days "$days" --yes >/dev/null 2>&1 ||
            die "juicefs config --trash-days $days"
        mount_juicefs
        make_files "$DIR/jmnt/flat-$r-$days"
        time_rm "$DIR/jmnt/flat-$r-$days" "juicefs, trash-days $days" "rm -rf of $FILES files, trash $days d" \
            juicefs "mount=$pid_j" "redis=$pid_r"
        umount_juicefs
    done
done
echo "   strait's trash after the rounds: $("$STRAIT" trash list "$DIR/mnt" | tail -1)"
