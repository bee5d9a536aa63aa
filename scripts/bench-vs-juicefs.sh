#!/usr/bin/env bash
# strait against JuiceFS 1.4 on this machine, every side-by-side benchmark in one run, with one
# summary table (issues 42 and 44). Run as root:
#
#   sudo scripts/bench-vs-juicefs.sh
#
# The parts, in this order (PARTS picks some):
#   path   the path users take (issue 42, rows 1-2): bench/scripts/vs-juicefs.sh, `strait bench`
#          at strait in-process, through a site daemon and at a mirror, at JuiceFS, and on tmpfs
#          and the local disk (the limits), with its own tables
#   trash  `rm -rf` of a flat directory of 100,000 empty files, trash on and off
#          (scripts/bench-trash.sh)
#   clone  a tree of 100,000 files cloned, against `cp -r` (scripts/bench-clone.sh)
#   quota  creates and writes in a directory under two nested quotas against one without
#          (scripts/bench-quota.sh)
# strait runs as users run it, through `strait primary` and a mount (the daemon's path), JuiceFS
# on Redis; both store blocks in a local directory. Every row prints the CPU time per operation
# of each process. The summary at the end puts each of the last three parts' rows side by side
# (strait / JuiceFS: above 1, strait is faster) and says what a quota costs each.
#
# Environment:
#   PARTS      parts to run (default "path trash clone quota")
#   STRAIT     strait binary (default: a release build, made here if missing or stale)
#   BENCH_DIR  working directory (default /tmp/strait-vs-juicefs), emptied first
#   FILES      files of the trash and clone parts (default 100000)
#   TRASH_ROUNDS, CLONE_ROUNDS, QUOTA_ROUNDS  rounds of each part (defaults 1, 3, 3; ROUNDS
#              sets all), strait and JuiceFS in turn in each round
#   and each part's own variables (BENCH_ARGS, ROUNDS, MIRROR, ...: see its script)
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$HOME/.cache/strait-target}
PARTS=${PARTS:-"path trash clone quota"}
WORK=${BENCH_DIR:-/tmp/strait-vs-juicefs}

if [[ $EUID -ne 0 ]]; then
    echo "bench-vs-juicefs.sh: run as root (it mounts FUSE and drops the page cache)" >&2
    exit 1
fi
for part in $PARTS; do
    case $part in
    path | trash | clone | quota) ;;
    *)
        echo "bench-vs-juicefs.sh: no part '$part' (path, trash, clone, quota)" >&2
        exit 1
        ;;
    esac
done

# shellcheck source=scripts/lib/prereqs.sh
source "$ROOT/scripts/lib/prereqs.sh"
# shellcheck source=scripts/lib/servers.sh
source "$ROOT/scripts/lib/servers.sh"
bench_prerequisites
export STRAIT

rm -rf -- "$WORK"
mkdir -p "$WORK"
export RESULTS=$WORK/results.tsv
: >"$RESULTS"
echo "== strait $("$STRAIT" --version 2>/dev/null | awk '{print $NF}') ($STRAIT), $(juicefs version 2>/dev/null | head -1)"
echo "== $(date -u '+%F %T') UTC, $(nproc) cores, parts: $PARTS"

for part in $PARTS; do
    echo
    echo "######## $part"
    case $part in
    path) BENCH_DIR=$WORK/path "$ROOT/bench/scripts/vs-juicefs.sh" ;;
    trash) DIR=$WORK/trash ROUNDS=${TRASH_ROUNDS:-${ROUNDS:-1}} "$ROOT/scripts/bench-trash.sh" ;;
    clone) DIR=$WORK/clone ROUNDS=${CLONE_ROUNDS:-${ROUNDS:-3}} "$ROOT/scripts/bench-clone.sh" ;;
    quota) DIR=$WORK/quota ROUNDS=${QUOTA_ROUNDS:-${ROUNDS:-3}} "$ROOT/scripts/bench-quota.sh" ;;
    esac
done

[[ -s "$RESULTS" ]] || exit 0
echo
echo "######## summary (strait through \`strait primary\` and a mount; JuiceFS on Redis)"
awk -F'\t' '
    function median(list,    n, v, i, j, t) {
        n = split(list, v, " ")
        for (i = 2; i <= n; i++) for (j = i; j > 1 && v[j - 1] + 0 > v[j] + 0; j--) { t = v[j]; v[j] = v[j - 1]; v[j - 1] = t }
        return n % 2 ? v[(n + 1) / 2] : (v[n / 2] + v[n / 2 + 1]) / 2
    }
    { key = $1; if (!(key in seen)) { seen[key] = 1; order[++n] = key }
      vals[key, $2] = vals[key, $2] " " $3; runs[key, $2]++; unit[key] = $4 }
    END {
        printf "| %-44s | %16s | %16s | %14s |\n", "row", "strait", "JuiceFS", "strait/JuiceFS"
        printf "|%s|%s|%s|%s|\n", "----------------------------------------------", "------------------", "------------------", "----------------"
        for (i = 1; i <= n; i++) {
            k = order[i]; s = ""; j = ""
            if ((k, "strait") in vals) s = median(vals[k, "strait"])
            if ((k, "juicefs") in vals) j = median(vals[k, "juicefs"])
            r = (s != "" && j != "" && j > 0) ? sprintf("%.2fx", s / j) : ""
            printf "| %-44s | %16s | %16s | %14s |\n", k " (" unit[k] ")", \
                s (runs[k, "strait"] > 1 ? " (" runs[k, "strait"] ")" : ""), \
                j (runs[k, "juicefs"] > 1 ? " (" runs[k, "juicefs"] ")" : ""), r
        }
        print "   (N): the median of N runs"
    }' "$RESULTS"
# what a quota costs each: the median under two quotas against the median without (a negative
# change is the cost)
awk -F'\t' '
    $1 ~ /, no quota$/ { sub(/, no quota$/, "", $1); free[$1, $2] = $3; rows[$1] = 1 }
    $1 ~ /, under 2 quotas$/ { sub(/, under 2 quotas$/, "", $1); quota[$1, $2] = $3 }
    END {
        for (r in rows) for (s = 1; s <= 2; s++) {
            sys = s == 1 ? "strait" : "juicefs"
            if (free[r, sys] > 0 && quota[r, sys] != "")
                printf "   under two quotas, against none: %-8s %-18s %+6.1f %%\n", sys, r, (quota[r, sys] - free[r, sys]) * 100 / free[r, sys]
        }
    }' "$RESULTS" | sort
