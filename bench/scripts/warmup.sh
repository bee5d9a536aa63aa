#!/usr/bin/env bash
# `strait warmup` of a tree at a lazy mirror over a capped link: the time against the link's
# floor (bytes / cap), and the CPU each process spent. Run as root, after `cargo build`:
#
#   ./bench/scripts/warmup.sh                 # 2 GiB, 200 MB/s, 15 ms one way
#   CAP=100 SIZE_MIB=1024 ./bench/scripts/warmup.sh
#
# Brings up `strait dev up --store garage --sync lazy --link-mb-s CAP` (a Garage per region;
# the mirror reaches A's only through the link), writes SIZE_MIB in 128 MiB files at A's
# mount, waits until B lists them, runs `strait warmup` at B and prints its wall time, the
# floor, the share of the link used, and CPU ticks (1/100 s) of the mirror, the proxies (the
# `dev up` process) and each Garage (A's then B's) over the warm-up. Not in CI (timing).
set -euo pipefail
CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$HOME/.cache/strait-target}
STRAIT=${STRAIT:-$CARGO_TARGET_DIR/debug/strait}
CAP=${CAP:-200}
SIZE_MIB=${SIZE_MIB:-2048}
WORK=${BENCH_DIR:-$(mktemp -d /tmp/strait-bench-warmup.XXXXXX)}
D=$WORK/dev
FILES=$((SIZE_MIB / 128))

"$STRAIT" dev up --dir "$D" --store garage --sync lazy --link-mb-s "$CAP" --seconds 3600 \
    >"$WORK/devup.log" 2>&1 &
DEVPID=$!
cleanup() {
    kill -INT "$DEVPID" 2>/dev/null && wait "$DEVPID" 2>/dev/null
    rm -rf "$WORK"
}
trap cleanup EXIT
for _ in $(seq 1 120); do
    grep -q "strait dev: ready" "$WORK/devup.log" && break
    kill -0 "$DEVPID" 2>/dev/null || break
    sleep 1
done
grep -q "strait dev: ready" "$WORK/devup.log" || {
    echo "dev up did not come up:" >&2
    tail -20 "$WORK/devup.log" >&2
    exit 1
}
MIRROR=$(sed -n 's/^  "mirror": "\(.*\)",$/\1/p' "$D/dev.json")
MA=$D/region-a/mnt
MB=$D/region-b/mnt

head -c $((128 << 20)) /dev/urandom >"$WORK/f"
mkdir -p "$MA/tree"
t0=$(date +%s.%N)
for i in $(seq 1 "$FILES"); do cp "$WORK/f" "$MA/tree/f$i"; done
sync -f "$MA/tree/f$FILES"
echo "wrote $SIZE_MIB MiB at A in $(echo "$(date +%s.%N) - $t0" | bc) s"
for _ in $(seq 1 240); do
    [ "$(ls "$MB/tree" 2>/dev/null | wc -l)" = "$FILES" ] && break
    sleep 0.5
done

cpu() { awk '{print $14+$15}' "/proc/$1/stat"; }
MPID=$(pgrep -f "strait mirror --config $D" | head -1)
GPIDS=$(pgrep -f "garage.*$D" | tr '\n' ' ')
m0=$(cpu "$MPID")
d0=$(cpu "$DEVPID")
g0=""
for g in $GPIDS; do g0="$g0 $(cpu "$g")"; done
t0=$(date +%s.%N)
"$STRAIT" warmup --addr "$MIRROR" --token-file "$D/tokens/admin.token" /tree
el=$(echo "$(date +%s.%N) - $t0" | bc)
g1=""
for g in $GPIDS; do g1="$g1 $(cpu "$g")"; done
bytes=$((SIZE_MIB << 20))
echo "warm-up: $el s; the link's floor at $CAP MB/s: $(echo "scale=2; $bytes / ($CAP * 1000000)" | bc) s;" \
    "link used: $(echo "scale=1; $bytes / $el / $CAP / 10000" | bc) %"
echo "CPU ticks over the warm-up ($((bytes >> 22)) blocks): mirror $(($(cpu "$MPID") - m0))," \
    "dev up's proxies $(($(cpu "$DEVPID") - d0)), Garages (A B) before [$g0 ] after [$g1 ]"
