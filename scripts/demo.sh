#!/usr/bin/env bash
# strait in one command: run as root on a Debian machine, no input needed.
#
#   ./scripts/demo.sh
#
# Installs the build prerequisites, builds strait, formats an embedded file system
# (RocksDB metadata + a local directory as object store, under /tmp/strait-demo; wiped and
# formatted anew on every run), mounts it, writes a large file and a directory tree, verifies
# them by SHA-256, unmounts, mounts again and verifies once more (now read back from the object
# store), unmounts, and prints `strait status`, the head of the change log and `strait fsck`
# (with RocksDB metadata these run once the mount process has let go of the database).
# Then two regions with `strait dev up` (a primary and replicator nodes 1 and 2 in region A,
# node 3 and a mirror in region B, 15 ms each way between them), both mounted: the tree is
# written at A, read at B and verified by SHA-256, then `strait mirror status` and
# `strait fsck --compare` are shown.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"

export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$HOME/.cache/strait-target}
STRAIT=${STRAIT:-$CARGO_TARGET_DIR/debug/strait}
DEMO=${STRAIT_DEMO_DIR:-/tmp/strait-demo}
META_URL=rocksdb://$DEMO/meta
DATA_URL=file://$DEMO/data
MNT=$DEMO/mnt
SRC=$DEMO/src
# The big file spans two 64 MiB chunks, so the demo shows chunks, slices and 4 MiB blocks.
BIG_FILE_MIB=${STRAIT_DEMO_BIG_MIB:-80}

if [[ $EUID -ne 0 ]]; then
    echo "demo.sh: run as root: it installs packages and mounts FUSE" >&2
    exit 1
fi

# step TITLE: starts a step, after saying how long the one before took.
STEP_TITLE=
STEP_START=$SECONDS
step() {
    step_took
    STEP_TITLE=$*
    STEP_START=$SECONDS
    printf '\n==> %s\n' "$*"
}
step_took() {
    [[ -z "$STEP_TITLE" ]] || printf '    (took %d s)\n' $((SECONDS - STEP_START))
}

# shellcheck source=scripts/lib/prereqs.sh
source "$ROOT/scripts/lib/prereqs.sh"

step "prerequisites (skipped when present)"
apt_ensure build-essential clang libclang-dev pkg-config protobuf-compiler fuse3 attr \
    curl ca-certificates util-linux
ensure_rust
[[ -e /dev/fuse ]] || modprobe fuse 2>/dev/null || true
[[ -e /dev/fuse ]] || {
    echo "demo.sh: /dev/fuse is missing" >&2
    exit 1
}

if [[ -z "${STRAIT_SKIP_BUILD:-}" ]]; then
    # The same command as scripts/test.sh's build, so the two share one build (another
    # package selection would unify features differently and compile RocksDB's C++ again).
    step "cargo build --workspace --all-targets (into $CARGO_TARGET_DIR; a first build takes ~15 minutes)"
    cargo build --workspace --all-targets
fi
"$STRAIT" --help >/dev/null

# Whether PATH is a mount point, from the mount table (stat-free: works for a dead FUSE mount).
is_mounted() {
    awk -v p="$1" '$5 == p { found = 1 } END { exit !found }' /proc/self/mountinfo
}
unmount_demo() {
    if is_mounted "$MNT"; then
        "$STRAIT" umount "$MNT" || umount -l "$MNT" || fusermount3 -u -z "$MNT"
    fi
}
# shellcheck disable=SC2317 # invoked by the EXIT trap
# The script's exit status: the trap's argument when the trap runs something first.
cleanup() {
    local rc=${1:-$?}
    set +e
    unmount_demo >/dev/null 2>&1
    if ((rc != 0)); then
        echo "demo.sh: FAILED (exit $rc); mount log: $DEMO/mount.log" >&2
    fi
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

step "a fresh file system in $DEMO"
unmount_demo # left over from an interrupted run
rm -rf -- "$DEMO"
mkdir -p "$MNT" "$SRC" "$DEMO/cache"
"$STRAIT" format "$META_URL" "$DATA_URL" --name demo

mount_demo() {
    "$STRAIT" mount -d "$META_URL" "$MNT" --cache-dir "$DEMO/cache" --cache-size 1G \
        --log-file "$DEMO/mount.log"
}
step "strait mount -d $META_URL $MNT"
mount_demo

step "sample data: a ${BIG_FILE_MIB} MiB file and a directory tree"
head -c "$((BIG_FILE_MIB * 1024 * 1024))" /dev/urandom >"$SRC/big.bin"
mkdir -p "$SRC/tree/a/b/c" "$SRC/tree/empty"
for i in $(seq 1 50); do
    head -c "$((i * 997))" /dev/urandom >"$SRC/tree/a/file-$i"
done
echo "hello from strait" >"$SRC/tree/a/b/c/hello.txt"
seq 1 100000 >"$SRC/tree/a/b/numbers.txt"
ln -s a/b/c/hello.txt "$SRC/tree/link-to-hello"

checksums() { # sha256 of every regular file under $1, by relative path
    (cd "$1" && find . -type f -print0 | sort -z | xargs -0 sha256sum)
}
cp -a "$SRC/big.bin" "$SRC/tree" "$MNT/"
ln "$MNT/tree/a/b/c/hello.txt" "$MNT/tree/hardlink-to-hello"
ln "$SRC/tree/a/b/c/hello.txt" "$SRC/tree/hardlink-to-hello"
checksums "$SRC" >"$DEMO/expected.sha256"
if command -v setfattr >/dev/null; then
    setfattr -n user.origin -v demo "$MNT/tree/a/b/c/hello.txt"
fi
sync

verify() {
    checksums "$MNT" >"$DEMO/actual.sha256"
    if ! diff -u "$DEMO/expected.sha256" "$DEMO/actual.sha256"; then
        echo "demo.sh: content read back from strait differs from what was written" >&2
        return 1
    fi
    [[ "$(readlink "$MNT/tree/link-to-hello")" == a/b/c/hello.txt ]]
    [[ "$(stat -c %h "$MNT/tree/hardlink-to-hello")" == 2 ]]
    if command -v getfattr >/dev/null; then
        [[ "$(getfattr --absolute-names --only-values -n user.origin "$MNT/tree/a/b/c/hello.txt")" == demo ]]
    fi
    echo "verified $(wc -l <"$DEMO/actual.sha256") files by SHA-256, plus a symlink, a hard link and an xattr"
}
step "read back and verify"
verify
ls -la "$MNT" "$MNT/tree"
df -h "$MNT"

step "unmount, mount again, verify again (reads now come from the object store)"
"$STRAIT" umount "$MNT"
mount_demo
verify
"$STRAIT" umount "$MNT"

step "the object store: blocks of at most 4 MiB under chunks/"
find "$DEMO/data" -type f -size +1M | sed "s|^$DEMO/data/||" | sort -V | head -n 5
echo "... $(find "$DEMO/data" -type f | wc -l) objects, $(du -sh "$DEMO/data" | cut -f1)"

step "strait status $META_URL"
"$STRAIT" status "$META_URL"

step "strait changelog $META_URL --limit 5"
"$STRAIT" changelog "$META_URL" --limit 5

step "strait fsck $META_URL"
"$STRAIT" fsck "$META_URL"

# ---- two regions ---------------------------------------------------------------------------
DEV=$DEMO/dev
step "two regions: strait dev up --dir $DEV (primary + replicator nodes 1, 2 in A; node 3 + mirror in B; 15 ms each way between them)"
"$STRAIT" dev up --dir "$DEV" >"$DEMO/dev-up.log" 2>&1 &
DEV_PID=$!
stop_dev() {
    if kill -0 "$DEV_PID" 2>/dev/null; then
        kill -TERM "$DEV_PID" 2>/dev/null || true
        wait "$DEV_PID" 2>/dev/null || true
    fi
}
# (the status first: `cleanup` after `stop_dev` would see stop_dev's, and a failure would exit 0)
trap 'rc=$?; stop_dev; cleanup "$rc"' EXIT
for _ in $(seq 1 600); do
    grep -q "strait dev: ready" "$DEMO/dev-up.log" 2>/dev/null && break
    kill -0 "$DEV_PID" 2>/dev/null || {
        cat "$DEMO/dev-up.log" >&2
        exit 1
    }
    sleep 0.2
done
grep -q "strait dev: ready" "$DEMO/dev-up.log" || {
    echo "demo.sh: strait dev up did not get ready in 2 minutes" >&2
    cat "$DEMO/dev-up.log" >&2
    exit 1
}
cat "$DEMO/dev-up.log"
# the operators' token (role admin): every daemon accepts it (docs/security.md)
ADMIN_TOKEN_FILE=$DEV/tokens/admin.token
# the addresses: top-level keys of dev.json (two spaces in; `replicator_tokens` holds keys
# of the same names one level down)
dev_json() {
    sed -n "s/^  \"$1\": \"\(.*\)\",\{0,1\}\$/\1/p" "$DEV/dev.json"
}
PRIMARY=$(dev_json primary)
MIRROR=$(dev_json mirror)
[[ "$PRIMARY" == *:* && "$MIRROR" == *:* ]] || {
    echo "demo.sh: no primary and mirror addresses in $DEV/dev.json" >&2
    exit 1
}
MNT_A=$DEV/region-a/mnt
MNT_B=$DEV/region-b/mnt

step "write the tree at region A ($MNT_A)"
cp -a "$SRC/tree" "$MNT_A/" # with its hard link, kept as one by cp -a
sync
checksums "$SRC/tree" >"$DEMO/expected-tree.sha256"

step "wait for the mirror to apply the primary's latest version"
want=$("$STRAIT" mirror status --addr "$PRIMARY" --token-file "$ADMIN_TOKEN_FILE" --json | sed -n 's/.*"primary_version": \([0-9]*\).*/\1/p' | head -n 1)
for _ in $(seq 1 300); do
    got=$("$STRAIT" mirror status --addr "$MIRROR" --token-file "$ADMIN_TOKEN_FILE" --json | sed -n 's/.*"applied_version": \([0-9]*\).*/\1/p' | head -n 1)
    ((got >= want)) && break
    sleep 0.1
done
echo "the primary is at version $want; the mirror has applied $got"

step "read the tree at region B ($MNT_B) and verify it by SHA-256"
checksums "$MNT_B/tree" >"$DEMO/mirror-tree.sha256"
diff -u "$DEMO/expected-tree.sha256" "$DEMO/mirror-tree.sha256"
[[ "$(readlink "$MNT_B/tree/link-to-hello")" == a/b/c/hello.txt ]]
[[ "$(stat -c %h "$MNT_B/tree/hardlink-to-hello")" == 2 ]]
echo "region B serves $(wc -l <"$DEMO/mirror-tree.sha256") files byte-identical to region A's"

step "write at region B: the change is made at the primary, and B reads it back at once"
echo "written at region B" >"$MNT_B/tree/written-at-b"
[[ "$(cat "$MNT_B/tree/written-at-b")" == "written at region B" ]]
[[ "$(cat "$MNT_A/tree/written-at-b")" == "written at region B" ]]
echo "region A reads the file written at region B: $(cat "$MNT_A/tree/written-at-b")"

step "wait for region B's background copy of the blocks"
for _ in $(seq 1 600); do
    pending=$("$STRAIT" mirror status --addr "$MIRROR" --token-file "$ADMIN_TOKEN_FILE" --json |
        sed -n 's/.*"pending_blocks": \([0-9]*\).*/\1/p' | head -1)
    [[ "$pending" == 0 ]] && break
    sleep 0.1
done
[[ "$pending" == 0 ]] || { echo "demo.sh: region B still has $pending blocks to copy" >&2; exit 1; }
echo "region B's object store holds $(find "$DEV/region-b/data/chunks" -type f | wc -l) blocks; region A's $(find "$DEV/region-a/data/chunks" -type f | wc -l)"

step "strait mirror status --addr $MIRROR"
"$STRAIT" mirror status --addr "$MIRROR" --token-file "$ADMIN_TOKEN_FILE"

step "strait fsck --compare $PRIMARY $MIRROR"
"$STRAIT" fsck --compare "$PRIMARY" "$MIRROR" --token-file "$ADMIN_TOKEN_FILE"

step "stop both regions"
stop_dev

step "done: the single-region file system stays in $DEMO (mount it again with: $STRAIT mount -d $META_URL $MNT);"
echo "    run both regions again, mounted, until Ctrl-C: $STRAIT dev up --dir $DEV"
echo "demo.sh: done in $SECONDS s"
