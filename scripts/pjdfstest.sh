#!/usr/bin/env bash
# Run the POSIX conformance suite pjdfstest (the Rust rewrite) on a fresh strait file system.
#
#   scripts/pjdfstest.sh META_URL DATA_URL [PATTERN...]
#   PJ_MIRROR=1 scripts/pjdfstest.sh [PATTERN...]
#
# As root: creates the test users pjdfstest switches to (if missing), formats a new file
# system at META_URL + DATA_URL, mounts it in a temporary directory, runs pjdfstest there with
# tests/pjdfstest/pjdfstest.toml, prints a summary and unmounts (also on failure).
# With PJ_MIRROR=1 it runs `strait dev up` (two regions, 1 ms apart) instead and mounts the
# mirror's region: every change goes through the mirror to the primary.
# PATTERNs select test cases by substring of their names (e.g. `chmod rename::`); none = all.
#
# Exits non-zero if any case fails, or if the mount dies during the run. Cases allowed to fail
# are listed in tests/pjdfstest/EXCLUDED.md (and in expected_failures of the TOML).
#
# The URLs must name scratch storage: rocksdb:// and file:// directories under /tmp are wiped
# first; other directories and Redis databases must be empty (STRAIT_PJ_WIPE=1 wipes them).
# S3 buckets are used as they are.
#
# Environment:
#   STRAIT           strait binary (default $CARGO_TARGET_DIR/debug/strait)
#   PJDFSTEST        pjdfstest binary (default: from PATH or ~/.cargo/bin)
#   PJ_LOG_DIR       where logs go (default /tmp/strait-pjdfstest)
#   PJ_TIMEOUT_S     limit for the whole pjdfstest run (default 1800)
#   PJ_MOUNT_ARGS    extra arguments for `strait mount` (e.g. "--attr-ttl 0")
#   PJ_DAEMON=1      serve the metadata with `strait primary` and mount through it over gRPC
#   PJ_SQUASH=1      with PJ_DAEMON=1: the mount presents a credential with root_squash
#                    ([[credentials]] in the daemon's TOML): root's calls act as 65534
#   PJ_MIRROR=1      run the suite at a mirror's mount (`strait dev up --delay-ms 1`)
#   PJ_TLS=1         with PJ_MIRROR=1: `strait dev up --tls` (mutual TLS on every link), the
#                    mount presenting the mount's certificate as well as its token
#   PJ_REGION=a      with PJ_MIRROR=1: mount region A (the primary) instead of B (the mirror)
#   PJ_SUMMARY_FILE  write "PASSED FAILED SKIPPED" there at the end
#   PJ_EXPECTED_FAILURES  a file naming the cases that must fail (one per line, # comments):
#                    the run passes when the failing cases are exactly those
#   PJ_MAX_SKIPPED   fail when more cases than this were skipped
#   AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY  for s3:// data URLs
set -euo pipefail

usage() {
    sed -n '2,9p' "$0" | sed 's/^# \{0,1\}//' >&2
    exit 2
}
if [[ "${PJ_MIRROR:-0}" == 1 ]]; then
    META_URL="mirror"
    DATA_URL="dev-up"
else
    [[ $# -ge 2 ]] || usage
    META_URL=$1
    DATA_URL=$2
    shift 2
fi
PATTERNS=("$@")

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
CONFIG=$ROOT/tests/pjdfstest/pjdfstest.toml
EXCLUDED=$ROOT/tests/pjdfstest/EXCLUDED.md
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$HOME/.cache/strait-target}
STRAIT=${STRAIT:-$CARGO_TARGET_DIR/debug/strait}
PJDFSTEST=${PJDFSTEST:-$(command -v pjdfstest || echo "$HOME/.cargo/bin/pjdfstest")}
PJ_LOG_DIR=${PJ_LOG_DIR:-/tmp/strait-pjdfstest}
PJ_TIMEOUT_S=${PJ_TIMEOUT_S:-1800}
read -r -a MOUNT_EXTRA <<<"${PJ_MOUNT_ARGS:-}"

die() {
    echo "pjdfstest.sh: $*" >&2
    exit 1
}

[[ $EUID -eq 0 ]] || die "run as root (pjdfstest switches users; the mount uses allow_other)"
[[ -x "$STRAIT" ]] || die "no strait binary at $STRAIT (cargo build, or set STRAIT)"
[[ -x "$PJDFSTEST" ]] || die "pjdfstest not found (cargo install pjdfstest, or set PJDFSTEST)"
[[ -e /dev/fuse ]] || die "/dev/fuse is missing"
[[ -f "$CONFIG" ]] || die "missing $CONFIG"

# --- every expected failure in the TOML must be explained in EXCLUDED.md ----------------------
expected_failures() { # one name per line
    python3 -c 'import sys, tomllib
for name in tomllib.load(open(sys.argv[1], "rb")).get("settings", {}).get("expected_failures", []):
    print(name)' "$CONFIG"
}
names=$(expected_failures) || die "cannot read $CONFIG (python3 >= 3.11 parses it)"
missing=()
while IFS= read -r name; do
    [[ -n "$name" ]] || continue
    grep -qF "\`$name\`" "$EXCLUDED" || missing+=("$name")
done <<<"$names"
if ((${#missing[@]})); then
    die "expected_failures in $CONFIG names cases without a reason in $EXCLUDED: ${missing[*]}"
fi

# --- test users ----------------------------------------------------------------------------------
# pjdfstest.toml's [dummy_auth]: nobody:nogroup and tests:tests (user's primary group).
ensure_group() {
    getent group "$1" >/dev/null || groupadd --system "$1"
}
ensure_user() {
    local user=$1 group=$2
    ensure_group "$group"
    if ! getent passwd "$user" >/dev/null; then
        useradd --system --no-create-home --home-dir / --shell /usr/sbin/nologin \
            --gid "$group" --comment "pjdfstest dummy user" "$user"
    fi
    [[ "$(id -g "$user")" == "$(getent group "$group" | cut -d: -f3)" ]] ||
        die "user $user exists but its primary group is not $group (pjdfstest requires it)"
}
ensure_user nobody nogroup
ensure_user tests tests

# --- scratch storage -------------------------------------------------------------------------------
url_path() { # rocksdb:///a/b -> /a/b ; file:///a/b -> /a/b
    local p=${1#*://}
    echo "/${p#/}"
}
wipe_dir() {
    local dir=$1
    [[ -n "$dir" && "$dir" != / ]] || die "refusing to wipe '$dir'"
    if [[ "$dir" == /tmp/* || "${STRAIT_PJ_WIPE:-0}" == 1 ]]; then
        rm -rf -- "$dir"
    elif [[ -d "$dir" && -n "$(ls -A -- "$dir")" ]]; then
        die "$dir is not empty; give a scratch directory (or STRAIT_PJ_WIPE=1 to wipe it)"
    fi
}
case "$META_URL" in
rocksdb://*) wipe_dir "$(url_path "$META_URL")" ;;
redis://* | rediss://*)
    if command -v redis-cli >/dev/null; then
        keys=$(redis-cli -u "$META_URL" dbsize) || die "cannot reach $META_URL"
        if [[ "$keys" != 0 ]]; then
            [[ "${STRAIT_PJ_WIPE:-0}" == 1 ]] ||
                die "$META_URL holds $keys keys; give an empty database (or STRAIT_PJ_WIPE=1 to flush it)"
            redis-cli -u "$META_URL" flushdb >/dev/null
        fi
    fi
    ;;
esac
case "$DATA_URL" in
file://*) wipe_dir "$(url_path "$DATA_URL")" ;;
esac

# --- format, mount, run ------------------------------------------------------------------------------
mkdir -p "$PJ_LOG_DIR"
backend=$(echo "${META_URL%%:*}-${DATA_URL%%:*}" | tr -c 'a-z0-9-\n' '_')
stamp=$(date +%Y%m%d-%H%M%S)
LOG=$PJ_LOG_DIR/pjdfstest-$backend-$stamp.log
MOUNT_LOG=$PJ_LOG_DIR/mount-$backend-$stamp.log
WORK=$(mktemp -d /tmp/strait-pj.XXXXXX)
MNT=$WORK/mnt
SECONDARY=$WORK/secondary # a second file system (the host's /tmp) for the EXDEV cases
mkdir -p "$MNT" "$SECONDARY" "$WORK/cache"
# mktemp makes 0700 directories: the users pjdfstest switches to must reach the mount point
chmod 755 "$WORK" "$MNT" "$SECONDARY"

# Whether PATH is a mount point, from the mount table (stat-free: works for a dead FUSE mount).
is_mounted() {
    awk -v p="$1" '$5 == p { found = 1 } END { exit !found }' /proc/self/mountinfo
}
DAEMON_PID=
DEV_PID=
# shellcheck disable=SC2317 # invoked by the EXIT trap
cleanup() {
    local rc=$?
    set +e
    if is_mounted "$MNT"; then
        if ! "$STRAIT" umount "$MNT" >/dev/null 2>&1; then
            echo "pjdfstest.sh: strait umount failed; detaching lazily" >&2
            umount -l "$MNT" 2>/dev/null || fusermount3 -u -z "$MNT" 2>/dev/null
        fi
    fi
    if [[ -n "$DAEMON_PID" ]]; then
        kill -TERM "$DAEMON_PID" 2>/dev/null
        wait "$DAEMON_PID" 2>/dev/null
    fi
    if [[ -n "$DEV_PID" ]]; then
        # dev up stops both regions' daemons, replicator nodes and proxies
        kill -TERM "$DEV_PID" 2>/dev/null
        wait "$DEV_PID" 2>/dev/null
    fi
    is_mounted "$MNT" || rm -rf -- "$WORK"
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

echo "== pjdfstest on strait: meta $META_URL, data $DATA_URL"
if [[ "${PJ_MIRROR:-0}" != 1 ]]; then
    "$STRAIT" format "$META_URL" "$DATA_URL" --name pjdfstest ||
        die "strait format failed"
fi
MOUNT_URL=$META_URL
if [[ "${PJ_MIRROR:-0}" == 1 ]]; then
    DEV_LOG=$PJ_LOG_DIR/dev-up-$stamp.log
    DEV_ARGS=()
    [[ "${PJ_TLS:-0}" == 1 ]] && DEV_ARGS+=(--tls)
    "$STRAIT" dev up --dir "$WORK/dev" --delay-ms 1 --no-mount "${DEV_ARGS[@]}" >"$DEV_LOG" 2>&1 &
    DEV_PID=$!
    for _ in $(seq 1 600); do
        grep -q "strait dev: ready" "$DEV_LOG" && break
        kill -0 "$DEV_PID" 2>/dev/null || { tail -n 30 "$DEV_LOG" >&2; die "strait dev up exited"; }
        sleep 0.1
    done
    grep -q "strait dev: ready" "$DEV_LOG" || die "strait dev up did not start (log $DEV_LOG)"
    region=mirror
    [[ "${PJ_REGION:-b}" == a ]] && region=primary
    read -r site_addr mount_token < <(python3 -c 'import json, sys
t = json.load(open(sys.argv[1]))
print(t[sys.argv[2]], t["token"])' "$WORK/dev/dev.json" "$region") || die "cannot read $WORK/dev/dev.json"
    MOUNT_URL=strait://$site_addr
    MOUNT_EXTRA+=(--token "$mount_token")
    tls=
    if [[ "${PJ_TLS:-0}" == 1 ]]; then
        pki=$WORK/dev/pki
        MOUNT_EXTRA+=(--tls-ca "$pki/ca.pem" --tls-cert "$pki/mount.pem" --tls-key "$pki/mount.key")
        tls=", mutual TLS"
    fi
    echo "== at the $region's region of strait dev up$tls, $MOUNT_URL (log $DEV_LOG, $WORK/dev)"
elif [[ "${PJ_DAEMON:-0}" == 1 ]]; then
    DAEMON_LOG=$PJ_LOG_DIR/primary-$backend-$stamp.log
    port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
    STRAIT_TOKEN=$(od -An -N16 -tx1 /dev/urandom | tr -d ' \n')
    export STRAIT_TOKEN
    DAEMON_ARGS=()
    squash=
    if [[ "${PJ_SQUASH:-0}" == 1 ]]; then
        # a credential of its own, whose calls as root act as nobody (65534)
        squashed_token=$(od -An -N16 -tx1 /dev/urandom | tr -d ' \n')
        printf '[[credentials]]\nname = "pjdfstest-squashed"\ntoken = "%s"\nroot_squash = true\n' \
            "$squashed_token" >"$WORK/primary.toml"
        DAEMON_ARGS+=(--config "$WORK/primary.toml")
        MOUNT_EXTRA+=(--token "$squashed_token")
        squash=", root squashed"
    fi
    "$STRAIT" primary --meta-url "$META_URL" --listen "127.0.0.1:$port" --metrics-listen "" \
        "${DAEMON_ARGS[@]}" >"$DAEMON_LOG" 2>&1 &
    DAEMON_PID=$!
    for _ in $(seq 1 300); do
        grep -q "strait primary: serving" "$DAEMON_LOG" && break
        kill -0 "$DAEMON_PID" 2>/dev/null || { cat "$DAEMON_LOG" >&2; die "strait primary exited"; }
        sleep 0.1
    done
    grep -q "strait primary: serving" "$DAEMON_LOG" || die "strait primary did not start (log $DAEMON_LOG)"
    MOUNT_URL=strait://127.0.0.1:$port
    echo "== through the site daemon at $MOUNT_URL$squash (log $DAEMON_LOG)"
fi
"$STRAIT" mount -d "$MOUNT_URL" "$MNT" --cache-dir "$WORK/cache" --cache-size 1G \
    --log-file "$MOUNT_LOG" "${MOUNT_EXTRA[@]}" || {
    tail -n 30 "$MOUNT_LOG" >&2 2>/dev/null
    die "strait mount failed (log $MOUNT_LOG)"
}

pj_rc=0
(
    cd "$MNT"
    NO_COLOR=1 RUST_BACKTRACE=0 timeout -k 30 "$PJ_TIMEOUT_S" \
        "$PJDFSTEST" -c "$CONFIG" -p "$MNT" -s "$SECONDARY" -- "${PATTERNS[@]}"
) 2>&1 | tee "$LOG" || pj_rc=$?

# --- report --------------------------------------------------------------------------------------
summary=$(grep -E '^Summary: ' "$LOG" | tail -n 1 || true)
failed_names=$(grep -E '[[:space:]](FAILED|PASSED UNEXPECTEDLY)$' "$LOG" | awk '{print $1}' || true)
mount_alive=1
if ! is_mounted "$MNT" || ! timeout 10 stat "$MNT" >/dev/null 2>&1; then
    mount_alive=0
fi

echo
echo "== pjdfstest ($META_URL, $DATA_URL)"
echo "   log: $LOG"
echo "   mount log: $MOUNT_LOG"
if [[ -n "$failed_names" ]]; then
    echo "   failing cases:"
    while IFS= read -r n; do echo "     $n"; done <<<"$failed_names"
fi
if ((mount_alive == 0)); then
    echo "   the strait mount is gone after the run; last lines of its log:"
    tail -n 30 "$MOUNT_LOG" 2>/dev/null | sed 's/^/     /'
fi
if [[ -n "$summary" ]]; then
    # Summary: F failed, S skipped, P passed, E expected failures, T total
    read -r n_failed n_skipped n_passed n_expected < <(
        echo "$summary" | sed -E 's/^Summary: ([0-9]+) failed, ([0-9]+) skipped, ([0-9]+) passed, ([0-9]+) expected failures.*/\1 \2 \3 \4/'
    )
    echo "pjdfstest: $n_passed passed, $n_failed failed, $n_skipped skipped, $n_expected expected failures"
else
    n_failed=1
    echo "pjdfstest: no summary (pjdfstest exited with status $pj_rc before finishing; timeout is ${PJ_TIMEOUT_S} s)"
fi

if [[ -n "${PJ_SUMMARY_FILE:-}" && -n "$summary" ]]; then
    echo "$n_passed $n_failed $n_skipped" >"$PJ_SUMMARY_FILE"
fi
too_many_skipped=0
if [[ -n "${PJ_MAX_SKIPPED:-}" && -n "$summary" ]] && ((n_skipped > PJ_MAX_SKIPPED)); then
    echo "pjdfstest: $n_skipped cases skipped, more than the $PJ_MAX_SKIPPED allowed (PJ_MAX_SKIPPED)"
    too_many_skipped=1
fi
if [[ -n "${PJ_EXPECTED_FAILURES:-}" ]]; then
    # the failures must be exactly the listed ones: none more, none fewer
    expected=$(grep -vE '^[[:space:]]*(#|$)' "$PJ_EXPECTED_FAILURES" | sort -u)
    got=$(echo "$failed_names" | grep -v '^$' | sort -u || true)
    unexpected=$(comm -13 <(echo "$expected") <(echo "$got") | grep -v '^$' || true)
    missing=$(comm -23 <(echo "$expected") <(echo "$got") | grep -v '^$' || true)
    echo "pjdfstest: $(echo "$got" | grep -c . || true) failed, as $PJ_EXPECTED_FAILURES expects: $(echo "$expected" | grep -c .)"
    [[ -z "$unexpected" ]] || echo "   failed, not expected to: $unexpected"
    [[ -z "$missing" ]] || echo "   expected to fail, passed: $missing"
    if [[ -z "$summary" || -n "$unexpected" || -n "$missing" || $mount_alive == 0 ]]; then
        exit 1
    fi
    exit 0
fi
if ((pj_rc != 0 || n_failed != 0 || mount_alive == 0 || too_many_skipped)); then
    exit 1
fi
exit 0
