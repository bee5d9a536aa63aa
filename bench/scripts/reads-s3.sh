#!/usr/bin/env bash
# Reads from an `s3://` store against a plain S3 client on the same server, at both regions
# (issue 42, item 1). Run as root:
#
#   ./bench/scripts/reads-s3.sh
#
# Brings up `strait dev up --store garage --sync lazy` (a Garage S3 server per region, a
# primary in A, a mirror in B, DELAY_MS apart; lazy, so the mirror copies no block of A's in
# the background while the regions are measured), mounts each region's daemon with no disk cache (every cold
# read goes to the region's Garage), then, ROUNDS times:
#   - `strait bench --only data` at region A's mount: the primary's daemon, its blocks in A's
#     Garage;
#   - the same at region B's mount: a mirror writes the blocks of what it writes to its own
#     region's store, so its reads are of blocks present in its region;
#   - `strait bench s3` against each region's Garage: the AWS SDK alone putting and getting
#     objects of the block size, with 1, 4 and 16 requests in flight, the page cache dropped
#     before each (the limit of a cold read from that server).
# Every row says the CPU time per MiB of each process (bench, mount, daemon, Garage). The
# summary takes each figure's median over the rounds and divides the mounts' cold reads by the
# plain client's best GET rate from the same server.
#
# Environment:
#   BENCH_ARGS  parameters of `strait bench` (default below; --only data is added)
#   ROUNDS      rounds (default 3)
#   DELAY_MS    one-way delay between the regions (default 15)
#   STRAIT      strait binary (default: the release build, made here if missing or stale)
#   BENCH_DIR   scratch directory (default: a new one under /tmp)
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$ROOT"
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$HOME/.cache/strait-target}
BENCH_ARGS=${BENCH_ARGS:-"--big-file-size 4G --block-size 4M --small-file-count 1000 --small-file-size 128K"}
read -r -a BENCH_ARGV <<<"$BENCH_ARGS"
ROUNDS=${ROUNDS:-3}
DELAY_MS=${DELAY_MS:-15}

if [[ $EUID -ne 0 ]]; then
    echo "reads-s3.sh: run as root (it mounts FUSE and drops the page cache)" >&2
    exit 1
fi
# shellcheck source=scripts/lib/prereqs.sh
source "$ROOT/scripts/lib/prereqs.sh"
apt_ensure build-essential clang libclang-dev pkg-config protobuf-compiler fuse3 python3
ensure_rust
command -v garage >/dev/null || ensure_cargo_tool garage garage --version "$GARAGE_VERSION" --locked
if [[ -z "${STRAIT:-}" ]]; then
    echo "==> cargo build --release -p strait (the first one takes ~15 minutes)"
    cargo build --release -p strait
    STRAIT=$CARGO_TARGET_DIR/release/strait
fi

WORK=${BENCH_DIR:-$(mktemp -d /tmp/strait-reads-s3.XXXXXX)}
mkdir -p "$WORK"
DEVUP_PID=
# shellcheck disable=SC2317 # invoked by the EXIT trap
cleanup() {
    local rc=$?
    set +e
    for m in "$WORK/mnt-a" "$WORK/mnt-b"; do
        if grep -q " $m " /proc/self/mountinfo; then
            "$STRAIT" umount "$m" >/dev/null 2>&1 || umount -l "$m"
        fi
    done
    if [[ -n "$DEVUP_PID" ]]; then
        # dev up unmounts both regions and stops every process it started
        kill -TERM "$DEVUP_PID" 2>/dev/null
        wait "$DEVUP_PID" 2>/dev/null
    fi
    if ! grep -q " $WORK/" /proc/self/mountinfo; then
        rm -rf -- "$WORK"
    fi
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

echo "==> strait dev up --store garage --sync lazy --delay-ms $DELAY_MS"
"$STRAIT" dev up --dir "$WORK/dev" --store garage --delay-ms "$DELAY_MS" --gc-delay 0 --sync lazy \
    >"$WORK/devup.log" 2>&1 &
DEVUP_PID=$!
for _ in $(seq 1 900); do
    grep -q "strait dev: ready" "$WORK/devup.log" && break
    if ! kill -0 "$DEVUP_PID" 2>/dev/null; then
        echo "reads-s3.sh: strait dev up stopped; its log:" >&2
        tail -20 "$WORK/devup.log" >&2
        exit 1
    fi
    sleep 0.2
done
grep -q "strait dev: ready" "$WORK/devup.log" || { echo "reads-s3.sh: dev up not ready" >&2; exit 1; }
# "  object stores: A s3://...?endpoint=...&region=garage, B s3://..."
STORES=$(grep "object stores:" "$WORK/devup.log")
URL_A=$(sed -E 's/.*A (s3:[^,]*), B .*/\1/' <<<"$STORES")
URL_B=$(sed -E 's/.*, B (s3:[^ ]*).*/\1/' <<<"$STORES")
eval "$(grep -o 'AWS_ACCESS_KEY_ID=[^ ]* AWS_SECRET_ACCESS_KEY=[^ ]* AWS_REGION=[^ )]*' "$WORK/devup.log" |
    sed 's/^/export /')"
pids() { pgrep -f -- "$1" | paste -sd, -; }
json() { python3 -c "import json,sys; print(json.load(open('$WORK/dev/dev.json'))$1)"; }
# A mount of each region's daemon with no disk cache: `dev up`'s own mounts keep what they
# write in a 10 GiB disk cache, so their "cold" reads would be of the local disk; these read
# every block from the region's Garage (the page cache dropped before each read).
MNT_A=$WORK/mnt-a
MNT_B=$WORK/mnt-b
mkdir -p "$MNT_A" "$MNT_B"
for r in a b; do
    addr=$(json "['primary']")
    [[ $r == b ]] && addr=$(json "['mirror']")
    mnt=$WORK/mnt-$r
    "$STRAIT" mount -d "strait://$addr" "$mnt" --token-file "$WORK/dev/tokens/mount.token" \
        --cache-size 0 --cache-dir "$WORK/cache-$r" --log-file "$WORK/mount-$r.log"
done
MOUNT_A=$(pids "mount .* $MNT_A( |\$)")
MOUNT_B=$(pids "mount .* $MNT_B( |\$)")
PRIMARY=$(pids "primary --config $WORK/dev/region-a/")
MIRROR=$(pids "mirror --config $WORK/dev/region-b/")
# each region's Garage: the server whose config is under that region's directory
GARAGE_A=$(pids "garage .*$WORK/dev/region-a/.* server")
GARAGE_B=$(pids "garage .*$WORK/dev/region-b/.* server")
for v in URL_A URL_B MOUNT_A MOUNT_B PRIMARY MIRROR GARAGE_A GARAGE_B; do
    if [[ -z "${!v}" ]]; then
        echo "reads-s3.sh: found no $v; dev up's processes:" >&2
        pgrep -af "strait|garage" >&2
        exit 1
    fi
done
echo "    A: $URL_A"
echo "    B: $URL_B"

for r in $(seq 1 "$ROUNDS"); do
    echo "==> round $r of $ROUNDS"
    "$STRAIT" bench "$MNT_A" "${BENCH_ARGV[@]}" --only data \
        --label "region A's mount (primary, s3:// Garage) (round $r)" \
        --cpu-of "mount=$MOUNT_A" --cpu-of "primary=$PRIMARY" --cpu-of "garage=$GARAGE_A" |
        tee "$WORK/a.$r.txt"
    "$STRAIT" bench "$MNT_B" "${BENCH_ARGV[@]}" --only data \
        --label "region B's mount (mirror, s3:// Garage, its blocks in B) (round $r)" \
        --cpu-of "mount=$MOUNT_B" --cpu-of "mirror=$MIRROR" --cpu-of "garage=$GARAGE_B" |
        tee "$WORK/b.$r.txt"
    "$STRAIT" bench s3 --url "$URL_A" --label "plain S3 client, region A's Garage (round $r)" \
        --cpu-of "garage=$GARAGE_A" | tee "$WORK/s3a.$r.txt"
    "$STRAIT" bench s3 --url "$URL_B" --label "plain S3 client, region B's Garage (round $r)" \
        --cpu-of "garage=$GARAGE_B" | tee "$WORK/s3b.$r.txt"
done

# "ITEM (26 columns) VALUE UNIT DETAIL" rows -> the median of each item over the rounds
medians() {
    for f in "$WORK/$1".*.txt; do
        awk 'seen && length($0) > 26 {
                name = substr($0, 1, 26); sub(/ +$/, "", name)
                split(substr($0, 27), f, " "); print name "\t" f[1] "\t" f[2]
            }
            /^ITEM / { seen = 1 }' "$f"
    done | awk -F'\t' '{ v[$1] = v[$1] " " $2; unit[$1] = $3; if (!($1 in s)) { s[$1] = 1; o[++n] = $1 } }
        END { for (i = 1; i <= n; i++) { k = o[i]; m = split(substr(v[k], 2), a, " ")
                for (x = 1; x <= m; x++) for (y = x + 1; y <= m; y++) if (a[y] + 0 < a[x] + 0) { t = a[x]; a[x] = a[y]; a[y] = t }
                print k "\t" ((m % 2) ? a[(m + 1) / 2] : (a[m / 2] + a[m / 2 + 1]) / 2) "\t" unit[k] } }'
}
echo
echo "==> medians of $ROUNDS rounds; LIMIT is the plain client's best GET rate from the same Garage"
printf '%-28s %12s %12s %-8s %8s %8s\n' ITEM "region A" "region B" UNIT "A/LIMIT" "B/LIMIT"
{
    medians a | sed 's/^/a\t/'
    medians b | sed 's/^/b\t/'
    medians s3a | sed 's/^/sa\t/'
    medians s3b | sed 's/^/sb\t/'
} | awk -F'\t' '
    $1 == "a" { a[$2] = $3; unit[$2] = $4; if (!($2 in seen)) { seen[$2] = 1; order[++n] = $2 } }
    $1 == "b" { b[$2] = $3 }
    $1 == "sa" { sa[$2] = $3; if ($2 ~ /GET/ && $3 > la) la = $3 }
    $1 == "sb" { sb[$2] = $3; if ($2 ~ /GET/ && $3 > lb) lb = $3 }
    END {
        for (i = 1; i <= n; i++) {
            k = order[i]
            ra = (k ~ /read/ && k !~ /warm/ && la > 0 && unit[k] == "MiB/s") ? sprintf("%.0f%%", 100 * a[k] / la) : "-"
            rb = (k ~ /read/ && k !~ /warm/ && lb > 0 && unit[k] == "MiB/s") ? sprintf("%.0f%%", 100 * b[k] / lb) : "-"
            printf "%-28s %12.1f %12.1f %-8s %8s %8s\n", k, a[k], b[k], unit[k], ra, rb
        }
        for (k in sa) printf "%-28s %12.1f %12.1f %-8s\n", k, sa[k], sb[k], "MiB/s"
    }' | tee "$WORK/summary.txt"
