#!/usr/bin/env bash
# What a directory quota costs, beside JuiceFS (issue 44): `strait bench DIR` (its metadata rows,
# and its data rows with small files and one big file) through one `strait primary` and one
# mount, in alternating rounds in a directory without a quota (/free/r-N) and in one under two
# nested quotas (/team with a quota, /team/r-N with its own), both at the same depth, the limits
# far away; then the same benchmark on JuiceFS 1.4 (Redis + a local directory) with the same
# two quotas set by `juicefs quota set`, in the same run. Prints each round's rows with the CPU
# time per operation of the bench, the mount and the daemon (or Redis), then the medians.
#
#   sudo scripts/bench-quota.sh
#
# Environment:
#   ROUNDS     rounds of each (default 3)
#   FILES      files per metadata benchmark (default 5000)
#   THREADS    threads (default 4)
#   BIG        size of the big file (default 256M)
#   SMALL      small files written and read (default 100, of 128 KiB)
#   JUICEFS=0  strait only
#   STRAIT     strait binary (default: $CARGO_TARGET_DIR/debug/strait, as the tests use)
#   DIR        working directory, emptied first (default /tmp/strait-quota)
set -euo pipefail

ROUNDS=${ROUNDS:-3}
FILES=${FILES:-5000}
THREADS=${THREADS:-4}
BIG=${BIG:-256M}
SMALL=${SMALL:-100}
JUICEFS=${JUICEFS:-1}
DIR=${DIR:-/tmp/strait-quota}
STRAIT=${STRAIT:-${CARGO_TARGET_DIR:-$HOME/.cache/strait-target}/debug/strait}

BENCH=bench-quota.sh
# shellcheck source=scripts/lib/bench.sh
source "$(dirname "$0")/lib/bench.sh"
bench_setup

ROWS=("create" "rename" "unlink" "write small files" "write big file")
UNITS=("ops/s" "ops/s" "ops/s" "files/s" "MiB/s")

# SYSTEM KIND ROUND MNT_DIR name=pid...: one `strait bench` in MNT_DIR, its output kept as
# $DIR/out/SYSTEM-KIND-ROUND
bench_in() {
    local system=$1 kind=$2 round=$3 dir=$4
    shift 4
    local cpu=() kv
    for kv in "$@"; do cpu+=(--cpu-of "$kv"); done
    mkdir -p "$DIR/out"
    "$STRAIT" bench "$dir" --meta-files "$FILES" --threads "$THREADS" --big-file-size "$BIG" \
        --small-file-count "$SMALL" --label "$system, $kind, round $round" "${cpu[@]}" |
        tee "$DIR/out/$system-$kind-$round"
}

# SYSTEM KIND ROW: the row's figures over the rounds
figures() {
    local r
    for r in $(seq 1 "$ROUNDS"); do
        awk -v row="$3" 'index($0, row " ") == 1 {
            rest = substr($0, length(row) + 1); split(rest, f, " "); print f[1]; exit }' \
            "$DIR/out/$1-$2-$r"
    done
}

# SYSTEM: the medians, without and with the quotas, and what the quotas cost
summarize() {
    local system=$1 row free quota i
    echo "== $system: medians over $ROUNDS rounds (no quota / under two nested quotas / change)"
    for i in "${!ROWS[@]}"; do
        row=${ROWS[$i]}
        # shellcheck disable=SC2046
        free=$(median $(figures "$system" free "$row"))
        # shellcheck disable=SC2046
        quota=$(median $(figures "$system" quota "$row"))
        awk -v r="$row" -v a="$free" -v b="$quota" \
            'BEGIN {printf "   %-18s %10.1f %10.1f %+7.1f %%\n", r, a, b, (a > 0 ? (b - a) * 100 / a : 0)}'
        result "$row, no quota" "$system" "$free" "${UNITS[$i]}"
        result "$row, under 2 quotas" "$system" "$quota" "${UNITS[$i]}"
    done
}

echo "== strait bench ($FILES files, $THREADS threads, $SMALL small files, big file $BIG, $ROUNDS rounds each)"
echo "   free: /free/r-N, no quota; quota: /team/r-N, under the quotas of /team and of /team/r-N"

# strait (one primary, one mount) and JuiceFS (Redis + a local directory), both up, the
# directories and quotas made first (a JuiceFS mount loads every quota when it starts: the
# directories are made through a first mount, the quotas set, then the mount that is
# measured). Each round runs strait and then JuiceFS, so that a burst of noise on a shared
# machine falls on both alike; the summary takes the medians.
start_strait quota
mkdir "$DIR/mnt/free" "$DIR/mnt/team"
"$STRAIT" quota set "$DIR/mnt/team" --capacity 1T --inodes 100000000 >/dev/null
for r in $(seq 1 "$ROUNDS"); do
    mkdir "$DIR/mnt/free/r-$r" "$DIR/mnt/team/r-$r"
    "$STRAIT" quota set "$DIR/mnt/team/r-$r" --capacity 1T --inodes 100000000 >/dev/null
done
if [[ $JUICEFS != 0 ]]; then
    start_juicefs_meta
    mount_juicefs
    mkdir "$DIR/jmnt/free" "$DIR/jmnt/team"
    for r in $(seq 1 "$ROUNDS"); do mkdir "$DIR/jmnt/free/r-$r" "$DIR/jmnt/team/r-$r"; done
    umount_juicefs
    for path in /team $(seq -f "/team/r-%g" 1 "$ROUNDS"); do
        juicefs quota set "$JFS_META" --path "$path" --capacity 1024 --inodes 100000000 \
            >>"$DIR/jfs-quota.log" 2>&1 || die "juicefs quota set $path: $(tail -3 "$DIR/jfs-quota.log")"
    done
    mount_juicefs
fi
# odd rounds run without a quota first, even rounds under the quotas first: what comes first
# after the other file system's runs is not always the same case
# (each case's directory: /free/r-N or /team/r-N)
declare -A UNDER=([free]=free [quota]=team)
for r in $(seq 1 "$ROUNDS"); do
    kinds=(free quota)
    ((r % 2)) || kinds=(quota free)
    for kind in "${kinds[@]}"; do
        bench_in strait "$kind" "$r" "$DIR/mnt/${UNDER[$kind]}/r-$r" "mount=$pid_m" "primary=$pid_d"
    done
    if [[ $JUICEFS != 0 ]]; then
        for kind in "${kinds[@]}"; do
            bench_in juicefs "$kind" "$r" "$DIR/jmnt/${UNDER[$kind]}/r-$r" "mount=$pid_j" "redis=$pid_r"
        done
    fi
done
echo "== strait's quotas after the rounds"
"$STRAIT" quota list "$DIR/mnt"
"$STRAIT" quota check "$DIR/mnt/team"
if [[ $JUICEFS != 0 ]]; then
    echo "== JuiceFS's quotas after the rounds"
    juicefs quota list "$JFS_META" 2>/dev/null || true
    umount_juicefs
fi

summarize strait
[[ $JUICEFS == 0 ]] || summarize juicefs
