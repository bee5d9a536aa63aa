#!/usr/bin/env bash
# strait at scale, through the whole two-region system (`strait dev up`, issue 42 item 4):
# many files spread over many directories and many in one directory, created at region A's
# mount; then the mirror's lag, listing at both regions, a new mirror bootstrapping from
# nothing, `fsck --compare`, `rm -rf`, and each process's memory after each phase.
#
#   sudo scripts/bench-scale.sh
#
# Environment (defaults are the issue's scale; a quick look: SPREAD=100000 DIRS=100 ONE=20000):
#   SPREAD     files spread over DIRS directories (default 10000000)
#   DIRS       directories for them (default 10000)
#   ONE        files in one directory (default 1000000)
#   WRITERS    processes creating files at once (default 8)
#   DELAY_MS   one-way delay between the regions (default 15)
#   STRAIT     strait binary (default: the release build, made here if missing)
#   DIR        working directory, emptied first (default /tmp/strait-scale)
#   STEP       files created between two lines of figures (default 1000000)
#   RM_DIRS    how many of the DIRS directories `rm -rf` removes at the end (default all;
#              rm -rf is one process, about 1,000 files/s here: 10 million take ~3 h)
#
# Prints one line per phase: what, how long, the rate, and the resident memory of every
# process (primary, mirror, replicator nodes, both mounts; the new mirror once it runs).
# Each memory line also gives what the primary's and the mirror's engines hold, by part
# (strait_engine_memory_bytes, MiB). Needs root (FUSE mounts), python3 and curl.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
SPREAD=${SPREAD:-10000000}
DIRS=${DIRS:-10000}
ONE=${ONE:-1000000}
WRITERS=${WRITERS:-8}
DELAY_MS=${DELAY_MS:-15}
DIR=${DIR:-/tmp/strait-scale}
STEP=${STEP:-1000000}
RM_DIRS=${RM_DIRS:-$DIRS}

if [[ $EUID -ne 0 ]]; then
    echo "bench-scale.sh: run as root (it mounts FUSE)" >&2
    exit 1
fi
command -v python3 >/dev/null || { echo "bench-scale.sh: needs python3" >&2; exit 1; }
command -v curl >/dev/null || { echo "bench-scale.sh: needs curl" >&2; exit 1; }
if [[ -z "${STRAIT:-}" ]]; then
    export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$HOME/.cache/strait-target}
    (cd "$ROOT" && cargo build --release --bin strait >&2)
    STRAIT=$CARGO_TARGET_DIR/release/strait
fi

UP_PID=
NEW_PID=
cleanup() {
    [[ -n "$NEW_PID" ]] && kill "$NEW_PID" 2>/dev/null && wait "$NEW_PID" 2>/dev/null
    [[ -n "$UP_PID" ]] && kill "$UP_PID" 2>/dev/null && wait "$UP_PID" 2>/dev/null
    true
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

echo "==> strait dev up --delay-ms $DELAY_MS in $DIR (lazy block copy: the files are empty)"
rm -rf -- "$DIR"
"$STRAIT" dev up --dir "$DIR" --delay-ms "$DELAY_MS" --sync lazy >"$DIR.devup.log" 2>&1 &
UP_PID=$!
for _ in $(seq 1 600); do
    if [[ -s "$DIR/dev.json" ]] && mountpoint -q "$DIR/region-b/mnt" 2>/dev/null; then break; fi
    if ! kill -0 "$UP_PID" 2>/dev/null; then
        echo "bench-scale.sh: dev up stopped; its log: $DIR.devup.log" >&2
        exit 1
    fi
    sleep 0.2
done
mountpoint -q "$DIR/region-b/mnt" || { echo "bench-scale.sh: the regions did not come up" >&2; exit 1; }
json() { python3 -c "import json,sys; print(json.load(open('$DIR/dev.json'))$1)"; }
ADMIN=$(json "['admin_token']")
PRIMARY=$(json "['primary']")
MIRROR=$(json "['mirror']")
A=$DIR/region-a/mnt
B=$DIR/region-b/mnt

# resident memory of each process, MiB
rss_of() { # pattern -> MiB summed over the processes that match
    local rss=0 p
    for p in $(pgrep -f "$1" || true); do
        rss=$((rss + $(awk '/VmRSS/ {print $2}' "/proc/$p/status" 2>/dev/null || echo 0)))
    done
    echo $((rss / 1024))
}
memory() {
    local out
    out="primary=$(rss_of "$STRAIT primary") mirror=$(rss_of "$STRAIT mirror --config $DIR/region-b")"
    out+=" replicators=$(rss_of "$STRAIT replicator") mount-a=$(rss_of "$STRAIT mount .*region-a")"
    out+=" mount-b=$(rss_of "$STRAIT mount .*region-b")"
    out+=" disk-free=$(df -BG --output=avail "$DIR" | tail -1 | tr -d " ")"
    if [[ -n "$NEW_PID" ]]; then
        out+=" new-mirror=$(rss_of "$STRAIT mirror --config $DIR/new-mirror")"
    fi
    out+=" | engine parts, primary: $(engine_of "$DIR/region-a/etc/primary.toml")"
    out+="; mirror: $(engine_of "$DIR/region-b/etc/mirror.toml")"
    echo "MiB: $out"
}
# what a daemon's metadata engine holds in memory, by part (its strait_engine_memory_bytes)
engine_of() { # config file -> "block_cache=.. memtables=.. table_readers=.."
    local addr
    addr=$(awk -F'"' '/^metrics_listen/ {print $2}' "$1")
    curl -s --max-time 5 "http://$addr/metrics" | awk '
        /^strait_engine_memory_bytes\{part="(block_cache|memtables|table_readers)"\}/ {
            split($1, p, "\""); printf "%s%s=%d", sep, p[2], $2 / 1048576; sep = " "
        }'
}
now() { date +%s.%N; }
report() { # what count start: the time since start, and count per second unless count is -
    awk -v what="$1" -v n="$2" -v t0="$3" -v t1="$(now)" -v mem="$(memory)" 'BEGIN {
        s = t1 - t0
        if (n == "-") printf "%-40s %12s in %8.1f s                  %s\n", what, "", s, mem
        else printf "%-40s %12d in %8.1f s = %9.0f /s   %s\n", what, n, s, n / s, mem
    }'
}

# create files LO..HI-1 under ROOT, file i in directory i % NDIRS (0: in ROOT itself)
create() {
    python3 - "$1" "$2" "$3" "$4" "$WRITERS" <<'EOF'
import os, sys
from multiprocessing import Process
root, lo, hi, ndirs, writers = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
if ndirs:
    for d in range(ndirs):
        os.makedirs(f"{root}/d{d}", exist_ok=True)
else:
    os.makedirs(root, exist_ok=True)
def work(w):
    for i in range(lo + w, hi, writers):
        p = f"{root}/d{i % ndirs}/f{i}" if ndirs else f"{root}/f{i}"
        os.close(os.open(p, os.O_CREAT | os.O_WRONLY, 0o644))
ps = [Process(target=work, args=(w,)) for w in range(writers)]
for p in ps: p.start()
for p in ps: p.join()
sys.exit(max(p.exitcode for p in ps))
EOF
}

# create COUNT files under ROOT in NDIRS directories, STEP at a time, a line (rate, memory)
# after each step: whether a process's memory grows with the number of files
create_stepped() {
    local root=$1 count=$2 ndirs=$3 lo=0 hi t0 t
    t0=$(now)
    while ((lo < count)); do
        hi=$((lo + STEP < count ? lo + STEP : count))
        t=$(now)
        create "$root" "$lo" "$hi" "$ndirs"
        report "  files $lo..$hi" $((hi - lo)) "$t"
        lo=$hi
    done
    report "create in $(basename "$root") ($ndirs dirs)" "$count" "$t0"
}

echo "==> at start: $(memory)"
create_stepped "$A/spread" "$SPREAD" "$DIRS"
create_stepped "$A/one" "$ONE" 0

echo "==> the mirror at the end of the creates"
"$STRAIT" mirror status --addr "$MIRROR" --token "$ADMIN" || true
t=$(now)
for _ in $(seq 1 3000); do
    if "$STRAIT" fsck --compare "$PRIMARY" "$MIRROR" --token "$ADMIN" --digest 2>/dev/null |
        grep -q '^match'; then break; fi
    sleep 0.2
done
report "mirror caught up (fsck --compare: match)" - "$t"

TOTAL=$((SPREAD + ONE))
for r in a b; do
    t=$(now)
    n=$(find "$DIR/region-$r/mnt" -type f | wc -l)
    report "find at region $r ($n files)" "$n" "$t"
    [[ "$n" == "$TOTAL" ]] || { echo "bench-scale.sh: region $r lists $n files, not $TOTAL" >&2; exit 1; }
done

echo "==> a new mirror bootstrapping from nothing (region B's settings, its own engine)"
NEW=$DIR/new-mirror
mkdir -p "$NEW/meta" "$NEW/data"
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
sed -e "s|^id = .*|id = \"scale-new\"|" \
    -e "s|^listen = .*|listen = \"127.0.0.1:$(free_port)\"|" \
    -e "s|^metrics_listen = .*|metrics_listen = \"127.0.0.1:$(free_port)\"|" \
    -e "s|^meta_url = .*|meta_url = \"rocksdb://$NEW/meta\"|" \
    -e "s|^data_url = .*|data_url = \"file://$NEW/data\"|" \
    "$DIR/region-b/etc/mirror.toml" >"$NEW/mirror.toml"
t=$(now)
"$STRAIT" mirror --config "$NEW/mirror.toml" >"$NEW/mirror.log" 2>&1 &
NEW_PID=$!
for _ in $(seq 1 36000); do
    grep -q "bootstrapped at version" "$NEW/mirror.log" && break
    kill -0 "$NEW_PID" 2>/dev/null || { echo "bench-scale.sh: the new mirror stopped: $NEW/mirror.log" >&2; exit 1; }
    sleep 0.1
done
pairs=$(grep -o 'bootstrapped at version [0-9]*: [0-9]* pairs' "$NEW/mirror.log" | awk '{print $5}')
report "bootstrap ($pairs entries)" "$pairs" "$t"
# what crossed the link is the snapshot: its pairs, as the new engine holds them
echo "    the new mirror's engine on disk after the load: $(du -sh "$NEW/meta" | cut -f1)"
kill "$NEW_PID" && wait "$NEW_PID" 2>/dev/null || true
NEW_PID=

t=$(now); rm -rf "$A/one"; report "rm -rf the one dir" "$ONE" "$t"
if ((RM_DIRS >= DIRS)); then
    t=$(now); rm -rf "$A/spread"; report "rm -rf the $DIRS dirs" "$SPREAD" "$t"
else
    # the first RM_DIRS directories (file i is in directory i % DIRS)
    n=0
    for ((d = 0; d < RM_DIRS; d++)); do n=$((n + (SPREAD - d + DIRS - 1) / DIRS)); done
    t=$(now)
    for ((d = 0; d < RM_DIRS; d++)); do rm -rf "$A/spread/d$d"; done
    report "rm -rf $RM_DIRS of the $DIRS dirs" "$n" "$t"
fi
echo "==> at the end: $(memory)"
