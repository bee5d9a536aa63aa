#!/usr/bin/env bash
# What a directory quota costs (issue 44): `strait bench DIR` (its metadata rows, and its data
# rows with small files and one big file) through one `strait primary` and one mount, in
# alternating rounds in a directory without a quota (/free/r-N) and in one under two nested
# quotas (/team with a quota, /team/r-N with its own), both at the same depth, the limits far
# away. Prints each round's rows with the CPU time per operation of the bench, the mount and
# the daemon.
#
#   sudo scripts/bench-quota.sh
#
# Environment:
#   ROUNDS     rounds of each (default 3)
#   FILES      files per metadata benchmark (default 5000)
#   THREADS    threads (default 4)
#   BIG        size of the big file (default 256M)
#   STRAIT     strait binary (default: $CARGO_TARGET_DIR/debug/strait, as the tests use)
#   DIR        working directory, emptied first (default /tmp/strait-quota)
set -euo pipefail

ROUNDS=${ROUNDS:-3}
FILES=${FILES:-5000}
THREADS=${THREADS:-4}
BIG=${BIG:-256M}
DIR=${DIR:-/tmp/strait-quota}
STRAIT=${STRAIT:-${CARGO_TARGET_DIR:-$HOME/.cache/strait-target}/debug/strait}

die() {
    echo "bench-quota.sh: $*" >&2
    exit 1
}
[[ $EUID -eq 0 ]] || die "run as root (it mounts FUSE and sets quotas)"
[[ -x "$STRAIT" ]] || die "no strait binary at $STRAIT (cargo build, or set STRAIT)"

rm -rf -- "$DIR"
mkdir -p "$DIR"/{mnt,cache}
chmod 700 "$DIR"
PID_D=
cleanup() {
    set +e
    "$STRAIT" umount "$DIR/mnt" >/dev/null 2>&1 || fusermount3 -u -z "$DIR/mnt" 2>/dev/null
    [[ -n "$PID_D" ]] && kill -TERM "$PID_D" 2>/dev/null && wait "$PID_D" 2>/dev/null
}
trap cleanup EXIT

"$STRAIT" format "rocksdb://$DIR/meta" "file://$DIR/data" --name quota >/dev/null
token=$("$STRAIT" certs token)
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
STRAIT_TOKEN=$token "$STRAIT" primary --meta-url "rocksdb://$DIR/meta" \
    --listen "127.0.0.1:$port" --metrics-listen "" >"$DIR/primary.log" 2>&1 &
PID_D=$!
for _ in $(seq 1 300); do
    grep -q "strait primary: serving" "$DIR/primary.log" && break
    sleep 0.1
done
grep -q "strait primary: serving" "$DIR/primary.log" || die "the primary did not start: $(tail -5 "$DIR/primary.log")"
said=$("$STRAIT" mount -d "strait://127.0.0.1:$port" "$DIR/mnt" --token "$token" \
    --cache-dir "$DIR/cache" --log-file "$DIR/mount.log") || die "mount failed: $(tail -5 "$DIR/mount.log")"
pid_m=$(echo "$said" | sed -nE 's/.*\(pid ([0-9]+),.*/\1/p')
[[ -n "$pid_m" ]] || die "no mount pid in: $said"

mkdir "$DIR/mnt/free" "$DIR/mnt/team"
"$STRAIT" quota set "$DIR/mnt/team" --capacity 1T --inodes 100000000

echo "== strait bench through strait primary ($FILES files, $THREADS threads, big file $BIG, $ROUNDS rounds each)"
echo "   free: /free/r-N, no quota; quota: /team/r-N, under the quotas of /team and of /team/r-N"
for r in $(seq 1 "$ROUNDS"); do
    mkdir "$DIR/mnt/free/r-$r"
    "$STRAIT" bench "$DIR/mnt/free/r-$r" --meta-files "$FILES" --threads "$THREADS" \
        --big-file-size "$BIG" --label "free-$r" --cpu-of "mount=$pid_m" --cpu-of "primary=$PID_D"
    mkdir "$DIR/mnt/team/r-$r"
    "$STRAIT" quota set "$DIR/mnt/team/r-$r" --capacity 1T --inodes 100000000 >/dev/null
    "$STRAIT" bench "$DIR/mnt/team/r-$r" --meta-files "$FILES" --threads "$THREADS" \
        --big-file-size "$BIG" --label "quota-$r" --cpu-of "mount=$pid_m" --cpu-of "primary=$PID_D"
done
echo "== the quotas after the rounds"
"$STRAIT" quota list "$DIR/mnt"
"$STRAIT" quota check "$DIR/mnt/team"
