#!/usr/bin/env bash
# What confining a credential to a subtree costs (issue 43): the metadata benchmark
# (`strait bench DIR --only meta`) through one `strait primary`, at a mount whose token has no
# rules and at a mount whose credential is confined to /team with root squashed
# ([[credentials]] in the daemon's TOML), in alternating rounds, both in directories of the
# same depth (/team/open-N and, for the confined mount, /team/conf-N). Prints each round's
# rows and the CPU time per operation of the bench, the mount and the daemon.
#
#   sudo scripts/bench-tenants.sh
#
# Environment:
#   ROUNDS     rounds of each (default 3)
#   FILES      files per metadata benchmark (default 5000)
#   THREADS    threads (default 4)
#   STRAIT     strait binary (default: $CARGO_TARGET_DIR/debug/strait, as the tests use)
#   DIR        working directory, emptied first (default /tmp/strait-tenants)
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
ROUNDS=${ROUNDS:-3}
FILES=${FILES:-5000}
THREADS=${THREADS:-4}
DIR=${DIR:-/tmp/strait-tenants}
STRAIT=${STRAIT:-${CARGO_TARGET_DIR:-$HOME/.cache/strait-target}/debug/strait}

die() {
    echo "bench-tenants.sh: $*" >&2
    exit 1
}
[[ $EUID -eq 0 ]] || die "run as root (it mounts FUSE)"
[[ -x "$STRAIT" ]] || die "no strait binary at $STRAIT (cargo build, or set STRAIT)"

rm -rf -- "$DIR"
mkdir -p "$DIR"/{open,team,cache-open,cache-team}
chmod 700 "$DIR"
PID_D=
cleanup() {
    set +e
    for m in "$DIR/open" "$DIR/team"; do
        "$STRAIT" umount "$m" >/dev/null 2>&1 || fusermount3 -u -z "$m" 2>/dev/null
    done
    [[ -n "$PID_D" ]] && kill -TERM "$PID_D" 2>/dev/null && wait "$PID_D" 2>/dev/null
}
trap cleanup EXIT

"$STRAIT" format "rocksdb://$DIR/meta" "file://$DIR/data" --name tenants >/dev/null
open_token=$("$STRAIT" certs token)
team_token=$("$STRAIT" certs token)
printf '[[credentials]]\nname = "team"\ntoken = "%s"\nsubtree = "/team"\nroot_squash = true\n' \
    "$team_token" >"$DIR/primary.toml"
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
STRAIT_TOKEN=$open_token "$STRAIT" primary --meta-url "rocksdb://$DIR/meta" \
    --listen "127.0.0.1:$port" --metrics-listen "" --config "$DIR/primary.toml" \
    >"$DIR/primary.log" 2>&1 &
PID_D=$!
for _ in $(seq 1 300); do
    grep -q "strait primary: serving" "$DIR/primary.log" && break
    sleep 0.1
done
grep -q "strait primary: serving" "$DIR/primary.log" || die "the primary did not start: $(tail -5 "$DIR/primary.log")"

mount_as() { # mount_as TOKEN MOUNTPOINT CACHE: prints the mount's pid
    local said
    said=$("$STRAIT" mount -d "strait://127.0.0.1:$port" "$2" --token "$1" --cache-dir "$3" \
        --log-file "$2.log") || die "mount $2 failed: $(tail -5 "$2.log")"
    echo "$said" >&2
    echo "$said" | sed -nE 's/.*\(pid ([0-9]+),.*/\1/p'
}
pid_open=$(mount_as "$open_token" "$DIR/open" "$DIR/cache-open")
mkdir "$DIR/open/team"
chmod 777 "$DIR/open/team"
pid_team=$(mount_as "$team_token" "$DIR/team" "$DIR/cache-team")
[[ -n "$pid_open" && -n "$pid_team" ]] || die "no mount pid in what strait mount said"

echo "== the metadata benchmark through strait primary ($FILES files, $THREADS threads, $ROUNDS rounds each)"
echo "   open: a token without rules, in /team/open-N; confined: subtree /team, root squashed, in /team/conf-N"
for r in $(seq 1 "$ROUNDS"); do
    mkdir "$DIR/open/team/open-$r"
    "$STRAIT" bench "$DIR/open/team/open-$r" --only meta --meta-files "$FILES" --threads "$THREADS" \
        --label "open-$r" --cpu-of "mount=$pid_open" --cpu-of "primary=$PID_D"
    mkdir "$DIR/team/conf-$r"
    "$STRAIT" bench "$DIR/team/conf-$r" --only meta --meta-files "$FILES" --threads "$THREADS" \
        --label "confined-$r" --cpu-of "mount=$pid_team" --cpu-of "primary=$PID_D"
done
