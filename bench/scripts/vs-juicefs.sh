#!/usr/bin/env bash
# strait against JuiceFS 1.4.2 on one machine, with the same workload. Run as root:
#
#   ./bench/scripts/vs-juicefs.sh
#
# Starts a redis-server on 127.0.0.1; formats and mounts JuiceFS (Redis metadata, local
# directory storage) and strait twice: in-process (RocksDB metadata opened by the mount) and
# through a site daemon (`strait primary` owning a RocksDB engine, the mount talking gRPC to
# it); runs `strait bench` with the same parameters on the three mount points, and
# `juicefs bench` on the JuiceFS mount for reference; prints the tables and a ratio table
# against JuiceFS (every figure is a throughput, so a ratio above 1 means strait is faster).
# The machine's limits are measured in the same rounds: the data part of `strait bench` on a
# tmpfs directory (memory: what a warm read can reach) and on a directory of the local disk
# (what a cold read of a `file://` store can reach). Every row says the CPU time per
# operation (or per MiB) of each process: the benchmark, the mount, the daemon.
# The three run in turn, ROUNDS times (JuiceFS, in-process, daemon, JuiceFS, ...), so a
# burst of noise on a shared machine hits all three alike; the ratio table takes each
# system's median over the rounds.
# Cleans up on exit. For the metadata part only: BENCH_ARGS="--only meta --meta-files 5000 --threads 4".
#
# Environment:
#   BENCH_ARGS   parameters of `strait bench` (default below)
#   STRAIT       strait binary (default: a release build, made here if missing or stale)
#   STRAIT_BENCH the binary whose `strait bench` measures (default: STRAIT); to measure an
#                older build with the same benchmark, STRAIT=old STRAIT_BENCH=new
#   BENCH_DIR    scratch directory (default: a new one under /tmp)
#   KEEP_RESULTS directory to copy the result tables into (optional)
#   ROUNDS       rounds of the three benchmarks (default 3; the table shows medians)
#   JFS_BENCH=0  skip `juicefs bench`
#   MIRROR=0     skip the second region: by default `strait dev up` also runs (a primary and a
#                mirror DELAY_MS apart, default 15 ms), and the same bench runs at the mirror's
#                mount (its files' blocks are in the mirror's region: what it writes it stores
#                there), in the "mirror" column
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$ROOT"

export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$HOME/.cache/strait-target}
BENCH_ARGS=${BENCH_ARGS:-"--big-file-size 1G --block-size 1M --small-file-count 100 --small-file-size 128K --meta-files 5000 --threads 4"}
read -r -a BENCH_ARGV <<<"$BENCH_ARGS"

if [[ $EUID -ne 0 ]]; then
    echo "bench-vs-juicefs.sh: run as root (it mounts FUSE and drops the page cache)" >&2
    exit 1
fi

# shellcheck source=scripts/lib/prereqs.sh
source "$ROOT/scripts/lib/prereqs.sh"
# shellcheck source=scripts/lib/servers.sh
source "$ROOT/scripts/lib/servers.sh"

bench_prerequisites

STRAIT_BENCH=${STRAIT_BENCH:-$STRAIT}
WORK=${BENCH_DIR:-$(mktemp -d /tmp/strait-bench.XXXXXX)}
mkdir -p "$WORK"
JFS_MNT=$WORK/juicefs-mnt
STRAIT_MNT=$WORK/strait-mnt
DAEMON_MNT=$WORK/daemon-mnt
DAEMON_PID=
DEVUP_PID=
MIRROR_MNT=$WORK/dev/region-b/mnt
mkdir -p "$JFS_MNT" "$STRAIT_MNT" "$DAEMON_MNT" "$WORK/juicefs-cache" "$WORK/strait-cache" \
    "$WORK/daemon-cache"

# Whether PATH is a mount point, from the mount table (stat-free: works for a dead FUSE mount).
is_mounted() {
    awk -v p="$1" '$5 == p { found = 1 } END { exit !found }' /proc/self/mountinfo
}
# shellcheck disable=SC2317 # invoked by the EXIT trap
cleanup() {
    local rc=$?
    set +e
    if is_mounted "$JFS_MNT"; then
        juicefs umount "$JFS_MNT" >/dev/null 2>&1 || umount -l "$JFS_MNT"
    fi
    if is_mounted "$STRAIT_MNT"; then
        "$STRAIT" umount "$STRAIT_MNT" >/dev/null 2>&1 || umount -l "$STRAIT_MNT"
    fi
    if is_mounted "$DAEMON_MNT"; then
        "$STRAIT" umount "$DAEMON_MNT" >/dev/null 2>&1 || umount -l "$DAEMON_MNT"
    fi
    if [[ -n "$DAEMON_PID" ]]; then
        kill -TERM "$DAEMON_PID" 2>/dev/null
        wait "$DAEMON_PID" 2>/dev/null
    fi
    if [[ -n "$DEVUP_PID" ]]; then
        # dev up unmounts both regions and stops every process it started
        kill -TERM "$DEVUP_PID" 2>/dev/null
        wait "$DEVUP_PID" 2>/dev/null
    fi
    stop_servers
    if [[ -n "${KEEP_RESULTS:-}" ]]; then
        mkdir -p "$KEEP_RESULTS" && cp "$WORK"/*.txt "$KEEP_RESULTS"/ 2>/dev/null
    fi
    if ! is_mounted "$JFS_MNT" && ! is_mounted "$STRAIT_MNT" && ! is_mounted "$DAEMON_MNT" &&
        ! is_mounted "$MIRROR_MNT"; then
        rm -rf -- "$WORK"
    fi
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

echo "==> redis-server for JuiceFS"
start_redis "$(free_port)" "$WORK/redis" >/dev/null
JFS_META=$REDIS_URL/1

echo "==> JuiceFS $(juicefs --version | awk '{print $3}'): Redis metadata, local storage"
# no trash, and strait's dead blocks deleted at the next GC pass: the rounds write tens of
# GiB in turn, which must not pile up on the disk
juicefs format --storage file --bucket "$WORK/juicefs-data/" --trash-days 0 "$JFS_META" bench \
    >/dev/null
juicefs mount -d --no-usage-report --cache-dir "$WORK/juicefs-cache" --log "$WORK/juicefs.log" \
    "$JFS_META" "$JFS_MNT"

echo "==> strait: RocksDB metadata, local storage"
"$STRAIT" format "rocksdb://$WORK/strait-meta" "file://$WORK/strait-data" --name bench \
    --gc-delay 0 >/dev/null
"$STRAIT" mount -d "rocksdb://$WORK/strait-meta" "$STRAIT_MNT" --cache-dir "$WORK/strait-cache" \
    --log-file "$WORK/strait-mount.log"

echo "==> strait through a site daemon: strait primary (RocksDB), mount over gRPC"
"$STRAIT" format "rocksdb://$WORK/daemon-meta" "file://$WORK/daemon-data" --name bench-daemon \
    --gc-delay 0 >/dev/null
DAEMON_PORT=$(free_port)
STRAIT_TOKEN=$(od -An -N16 -tx1 /dev/urandom | tr -d ' \n')
export STRAIT_TOKEN
"$STRAIT" primary --meta-url "rocksdb://$WORK/daemon-meta" --listen "127.0.0.1:$DAEMON_PORT" \
    --metrics-listen "" --gc-interval-s 5 >"$WORK/primary.log" 2>&1 &
DAEMON_PID=$!
for _ in $(seq 1 300); do
    grep -q "strait primary: serving" "$WORK/primary.log" && break
    sleep 0.1
done
"$STRAIT" mount -d "strait://127.0.0.1:$DAEMON_PORT" "$DAEMON_MNT" \
    --cache-dir "$WORK/daemon-cache" --log-file "$WORK/daemon-mount.log"

# The processes serving a mount point (a daemonised mount may be a watchdog and its child),
# as a comma-separated list for `strait bench --cpu-of`.
mount_pids() {
    pgrep -f -- " $1( |\$)" | paste -sd, -
}
JFS_PIDS=$(mount_pids "$JFS_MNT")
# JuiceFS's metadata server is a process of its own, as strait's daemon is
REDIS_PID=$(cat "$WORK/redis/redis.pid")
STRAIT_PIDS=$(mount_pids "$STRAIT_MNT")
DAEMON_MNT_PIDS=$(mount_pids "$DAEMON_MNT")
MIRROR=${MIRROR:-1}
if [[ "$MIRROR" == 1 ]]; then
    echo "==> strait at a mirror: strait dev up --delay-ms ${DELAY_MS:-15} (a primary, a mirror, three replicator nodes), the bench at region B's mount"
    "$STRAIT" dev up --dir "$WORK/dev" --delay-ms "${DELAY_MS:-15}" --gc-delay 0 \
        >"$WORK/devup.log" 2>&1 &
    DEVUP_PID=$!
    for _ in $(seq 1 600); do
        is_mounted "$MIRROR_MNT" && break
        if ! kill -0 "$DEVUP_PID" 2>/dev/null; then
            echo "bench-vs-juicefs.sh: strait dev up stopped; its log:" >&2
            tail -20 "$WORK/devup.log" >&2
            exit 1
        fi
        sleep 0.2
    done
    MIRROR_MNT_PIDS=$(mount_pids "$MIRROR_MNT")
    MIRROR_PID=$(pgrep -f -- "mirror --config $WORK/dev/region-b/" | paste -sd, -)
    DEV_PRIMARY_PID=$(pgrep -f -- "primary --config $WORK/dev/region-a/" | paste -sd, -)
    for v in MIRROR_MNT_PIDS MIRROR_PID DEV_PRIMARY_PID; do
        if [[ -z "${!v}" ]]; then
            echo "bench-vs-juicefs.sh: no process found for $v" >&2
            exit 1
        fi
    done
fi
for v in JFS_PIDS REDIS_PID STRAIT_PIDS DAEMON_MNT_PIDS; do
    if [[ -z "${!v}" ]]; then
        echo "bench-vs-juicefs.sh: no process found for $v" >&2
        exit 1
    fi
done
# the machine's limits: memory and the local disk
SHM_DIR=$(mktemp -d /dev/shm/strait-bench-limit.XXXXXX)
DISK_DIR=$WORK/disk-limit
mkdir -p "$DISK_DIR"
# the data part of BENCH_ARGS only (the limits have no metadata to compare); none at all when
# BENCH_ARGS asks for the metadata part only
DATA_ARGV=("${BENCH_ARGV[@]}" --only data)
LIMITS=1
for ((i = 0; i + 1 < ${#BENCH_ARGV[@]}; i++)); do
    if [[ "${BENCH_ARGV[i]}" == --only && "${BENCH_ARGV[i + 1]}" == meta ]]; then
        LIMITS=0
    fi
done

ROUNDS=${ROUNDS:-3}
for r in $(seq 1 "$ROUNDS"); do
    echo "==> round $r of $ROUNDS: strait bench ${BENCH_ARGV[*]} on the three (JuiceFS first), then the limits"
    "$STRAIT_BENCH" bench "$JFS_MNT" "${BENCH_ARGV[@]}" --label "juicefs-redis-file (round $r)" \
        --cpu-of "juicefs=$JFS_PIDS" --cpu-of "redis=$REDIS_PID" | tee "$WORK/juicefs.$r.txt"
    echo
    "$STRAIT_BENCH" bench "$STRAIT_MNT" "${BENCH_ARGV[@]}" --label "strait-rocksdb-file (round $r)" \
        --cpu-of "mount=$STRAIT_PIDS" | tee "$WORK/strait.$r.txt"
    echo
    "$STRAIT_BENCH" bench "$DAEMON_MNT" "${BENCH_ARGV[@]}" \
        --label "strait-daemon-rocksdb-file (round $r)" \
        --cpu-of "mount=$DAEMON_MNT_PIDS" --cpu-of "daemon=$DAEMON_PID" |
        tee "$WORK/daemon.$r.txt"
    echo
    if [[ "$MIRROR" == 1 ]]; then
        "$STRAIT_BENCH" bench "$MIRROR_MNT" "${BENCH_ARGV[@]}" \
            --label "strait at a mirror, ${DELAY_MS:-15} ms from its primary (round $r)" \
            --cpu-of "mount=$MIRROR_MNT_PIDS" --cpu-of "mirror=$MIRROR_PID" \
            --cpu-of "primary=$DEV_PRIMARY_PID" | tee "$WORK/mirror.$r.txt"
        echo
    else
        : >"$WORK/mirror.$r.txt"
    fi
    if [[ "$LIMITS" == 0 ]]; then
        : >"$WORK/limit-tmpfs.$r.txt"
        : >"$WORK/limit-disk.$r.txt"
        continue
    fi
    "$STRAIT_BENCH" bench "$SHM_DIR" "${DATA_ARGV[@]}" --label "limit: tmpfs (round $r)" |
        tee "$WORK/limit-tmpfs.$r.txt"
    echo
    "$STRAIT_BENCH" bench "$DISK_DIR" "${DATA_ARGV[@]}" --label "limit: local disk (round $r)" |
        tee "$WORK/limit-disk.$r.txt"
    echo
done
rm -rf -- "$SHM_DIR"

echo
if [[ "${JFS_BENCH:-1}" == 1 ]]; then
    echo "==> juicefs bench on the JuiceFS mount (JuiceFS's own tool, for reference)"
    juicefs bench "$JFS_MNT" 2>&1 | tee "$WORK/juicefs-bench.txt"
fi

# "ITEM (26 columns) VALUE UNIT DETAIL" rows of a `strait bench` table -> name<TAB>value<TAB>unit
rows() {
    awk 'seen && length($0) > 26 {
            name = substr($0, 1, 26); sub(/ +$/, "", name)
            split(substr($0, 27), f, " ")
            print name "\t" f[1] "\t" f[2]
        }
        /^ITEM / { seen = 1 }' "$1"
}
# the median of each item over the rounds: name<TAB>median<TAB>unit
medians() {
    for f in "$WORK/$1".*.txt; do rows "$f"; done |
        awk -F'\t' '{ v[$1] = v[$1] " " $2; unit[$1] = $3; if (!($1 in seen)) { seen[$1] = 1; order[++n] = $1 } }
            END {
                for (i = 1; i <= n; i++) {
                    k = order[i]; m = split(substr(v[k], 2), a, " ")
                    for (x = 1; x <= m; x++) for (y = x + 1; y <= m; y++) if (a[y] + 0 < a[x] + 0) { t = a[x]; a[x] = a[y]; a[y] = t }
                    med = (m % 2) ? a[(m + 1) / 2] : (a[m / 2] + a[m / 2 + 1]) / 2
                    print k "\t" med "\t" unit[k]
                }
            }'
}
medians juicefs >"$WORK/juicefs.tsv"
medians strait >"$WORK/strait.tsv"
medians daemon >"$WORK/daemon.tsv"
medians mirror >"$WORK/mirror.tsv"
medians limit-tmpfs >"$WORK/limit-tmpfs.tsv"
medians limit-disk >"$WORK/limit-disk.tsv"
echo
echo "==> strait / JuiceFS, medians of $ROUNDS rounds (higher is better for strait); the limits"
echo "    are the same data rows on tmpfs and on the local disk; DAEMON/LIM is the daemon's"
echo "    figure over tmpfs's for warm reads and over the disk's for the others; \"mirror\" is"
echo "    the bench at a mirror's mount (\`strait dev up\`), MIRROR/J its figure over JuiceFS's"
awk -F'\t' '
    BEGIN {
        n = split("create|stat|stat (cold cache)|rename|unlink|write small files|read small files|write big file|read big file|read big file (warm)|read 8 files, 8 threads", order, "|")
        printf "%-24s %11s %11s %11s %11s %11s %11s %-8s %9s %9s %9s %9s\n", "ITEM", "in-process", "daemon", "mirror", "JuiceFS", "tmpfs", "disk", "UNIT", "IN-PROC/J", "DAEMON/J", "DAEMON/LIM", "MIRROR/J"
    }
    FILENAME ~ /juicefs/ { jfs[$1] = $2; unit[$1] = $3; next }
    FILENAME ~ /daemon/ { dm[$1] = $2; next }
    FILENAME ~ /mirror/ { mi[$1] = $2; next }
    FILENAME ~ /limit-tmpfs/ { shm[$1] = $2; next }
    FILENAME ~ /limit-disk/ { disk[$1] = $2; next }
    { st[$1] = $2 }
    END {
        for (i = 1; i <= n; i++) {
            k = order[i]
            if (!(k in jfs)) continue
            r1 = (jfs[k] > 0 && (k in st)) ? sprintf("%.2fx", st[k] / jfs[k]) : "-"
            r2 = (jfs[k] > 0 && (k in dm)) ? sprintf("%.2fx", dm[k] / jfs[k]) : "-"
            # membership first: reading an absent key would add it
            lim = 0
            if (k ~ /warm/ && (k in shm)) lim = shm[k]
            if (k !~ /warm/ && (k in disk)) lim = disk[k]
            r3 = (lim > 0 && (k in dm)) ? sprintf("%.0f%%", 100 * dm[k] / lim) : "-"
            r4 = (jfs[k] > 0 && (k in mi)) ? sprintf("%.2fx", mi[k] / jfs[k]) : "-"
            printf "%-24s %11.1f %11.1f %11s %11.1f %11s %11s %-8s %9s %9s %9s %9s\n", k, st[k], dm[k], \
                (k in mi) ? sprintf("%.1f", mi[k]) : "-", jfs[k], \
                (k in shm) ? sprintf("%.1f", shm[k]) : "-", (k in disk) ? sprintf("%.1f", disk[k]) : "-", \
                unit[k], r1, r2, r3, r4
        }
    }' "$WORK/juicefs.tsv" "$WORK/strait.tsv" "$WORK/daemon.tsv" "$WORK/mirror.tsv" \
    "$WORK/limit-tmpfs.tsv" "$WORK/limit-disk.tsv" | tee "$WORK/ratio.txt"
