# shellcheck shell=bash
# Throwaway servers on 127.0.0.1 for the test and benchmark scripts: redis-server and a
# single-node Garage S3. Source this file, then:
#
#   start_redis PORT DIR       # prints and sets REDIS_URL=redis://127.0.0.1:PORT ; stop_redis
#   start_garage DIR           # prints the S3 endpoint, exports AWS_*, GARAGE_ENDPOINT ; stop_garage
#   stop_servers               # stops whatever was started (use it in an EXIT trap)
#
# Every step waits for a condition (a port, a command that succeeds), never for a fixed time.

# Longest wait for any one readiness condition.
SERVERS_READY_TIMEOUT_S=${SERVERS_READY_TIMEOUT_S:-30}

# Garage's S3 region; clients must sign with it.
GARAGE_REGION=garage
GARAGE_BUCKET=strait
GARAGE_KEY_NAME=strait
# Fixed credentials, so a failing run can be replayed by hand against its server.
GARAGE_ACCESS_KEY=GK0a1b2c3d4e5f60718293a4b5
GARAGE_SECRET_KEY=5f3e2d1c0b0a99887766554433221100ffeeddccbbaa00112233445566778899

_REDIS_PID=
_REDIS_PORT=
_GARAGE_PID=
_GARAGE_CONFIG=
_GARAGE_DIR=

_servers_log() { echo "[servers] $*" >&2; }

# Whether something accepts TCP connections on 127.0.0.1:PORT.
port_open() {
    (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null
}

# A free TCP port on 127.0.0.1 (bound and released by the kernel's choice).
free_port() {
    python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1]); s.close()'
}

# wait_for DESCRIPTION COMMAND...: poll COMMAND every 0.1 s until it succeeds. COMMAND
# returning 2 means "will never succeed" (the server died): give up at once.
wait_for() {
    local what=$1 deadline rc
    shift
    deadline=$((SECONDS + SERVERS_READY_TIMEOUT_S))
    while true; do
        rc=0
        "$@" || rc=$?
        if ((rc == 0)); then
            return 0
        fi
        if ((rc == 2)); then
            _servers_log "gave up waiting for $what: the server exited"
            return 1
        fi
        if ((SECONDS > deadline)); then
            _servers_log "timed out after ${SERVERS_READY_TIMEOUT_S} s waiting for $what"
            return 1
        fi
        sleep 0.1
    done
}

# start_redis PORT DIR: a redis-server without persistence, daemonized, its files in DIR.
# Prints redis://127.0.0.1:PORT and sets REDIS_URL to it. Call it in the current shell (not in
# $(...)), or stop_redis cannot find the server.
start_redis() {
    local port=$1 dir=$2
    mkdir -p "$dir"
    if port_open "$port"; then
        _servers_log "port $port is already in use; not starting redis-server"
        return 1
    fi
    _REDIS_PORT=$port
    redis-server --bind 127.0.0.1 --port "$port" --save "" --appendonly no \
        --daemonize yes --pidfile "$dir/redis.pid" --dir "$dir" \
        --logfile "$dir/redis.log" >/dev/null || {
        _servers_log "redis-server failed to start; see $dir/redis.log"
        return 1
    }
    wait_for "redis-server to answer PING on port $port" _redis_ping "$port" || {
        tail -n 20 "$dir/redis.log" >&2 || true
        return 1
    }
    # remember the pid now: the directory may be gone by the time stop_redis runs
    _REDIS_PID=$(cat "$dir/redis.pid")
    _servers_log "redis-server ready on 127.0.0.1:$port (dir $dir)"
    REDIS_URL=redis://127.0.0.1:$port
    echo "$REDIS_URL"
}

# redis_durable: make the server start_redis started write every command to its append-only
# file and fsync it before answering (`appendonly yes`, `appendfsync always`), as a primary on
# Redis requires (docs/guarantees.md §1).
redis_durable() {
    local set
    for set in "appendonly yes" "appendfsync always"; do
        # shellcheck disable=SC2086 # two words: the setting and its value
        [[ "$(redis-cli -h 127.0.0.1 -p "$_REDIS_PORT" config set $set)" == OK ]] || {
            _servers_log "redis-server on port $_REDIS_PORT refused config set $set"
            return 1
        }
    done
}

_redis_ping() {
    [[ "$(redis-cli -h 127.0.0.1 -p "$1" ping 2>/dev/null)" == PONG ]]
}

stop_redis() {
    if [[ -n "$_REDIS_PID" ]]; then
        local pid=$_REDIS_PID
        kill "$pid" 2>/dev/null || true
        local i
        for ((i = 0; i < 100; i++)); do
            kill -0 "$pid" 2>/dev/null || break
            sleep 0.05
        done
        kill -9 "$pid" 2>/dev/null || true
        _servers_log "redis-server on port $_REDIS_PORT stopped"
    fi
    _REDIS_PID=
}

# garage -c CONFIG ARGS... for the server started by start_garage.
garage_cli() {
    RUST_LOG=warn garage -c "$_GARAGE_CONFIG" "$@" </dev/null
}

_garage_health() {
    [[ "$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$1/health")" == 200 ]]
}

_garage_alive() {
    kill -0 "$_GARAGE_PID" 2>/dev/null
}

# start_garage DIR: a single-node Garage with its config, data and log in DIR; a bucket
# $GARAGE_BUCKET and a key allowed on it. Prints the S3 endpoint http://127.0.0.1:PORT and
# exports AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_REGION, GARAGE_ENDPOINT, GARAGE_BUCKET.
# Run it in the current shell (not in $(...)) when the exports are needed; it also sets
# GARAGE_ENDPOINT, so `start_garage DIR >/dev/null` followed by "$GARAGE_ENDPOINT" works.
start_garage() {
    local dir=$1 s3_port rpc_port admin_port
    mkdir -p "$dir"
    _GARAGE_DIR=$dir
    # three distinct ports
    s3_port=$(free_port)
    rpc_port=$(free_port)
    while [[ "$rpc_port" == "$s3_port" ]]; do rpc_port=$(free_port); done
    admin_port=$(free_port)
    while [[ "$admin_port" == "$s3_port" || "$admin_port" == "$rpc_port" ]]; do admin_port=$(free_port); done

    _GARAGE_CONFIG=$dir/garage.toml
    cat >"$_GARAGE_CONFIG" <<EOF
metadata_dir = "$dir/meta"
data_dir = "$dir/data"
db_engine = "sqlite"
replication_factor = 1

rpc_bind_addr = "127.0.0.1:$rpc_port"
rpc_public_addr = "127.0.0.1:$rpc_port"
rpc_secret = "$(od -An -N32 -tx1 /dev/urandom | tr -d ' \n')"

[s3_api]
s3_region = "$GARAGE_REGION"
api_bind_addr = "127.0.0.1:$s3_port"
root_domain = ".s3.garage.localhost"

[admin]
api_bind_addr = "127.0.0.1:$admin_port"
admin_token = "$(od -An -N16 -tx1 /dev/urandom | tr -d ' \n')"
EOF
    chmod 600 "$_GARAGE_CONFIG"
    RUST_LOG=garage=info garage -c "$_GARAGE_CONFIG" server </dev/null >"$dir/garage.log" 2>&1 &
    _GARAGE_PID=$!

    # Garage keeps running without its S3 API when that port is taken: check both APIs listen,
    # and that it is still our process.
    if ! wait_for "Garage's S3 and admin APIs" _garage_ports "$s3_port" "$admin_port" ||
        ! wait_for "Garage RPC (garage status)" _garage_status; then
        _servers_log "Garage did not start; last lines of $dir/garage.log:"
        tail -n 40 "$dir/garage.log" >&2 || true
        return 1
    fi
    local node
    node=$(garage_cli node id -q) || return 1
    node=${node%%@*}
    if [[ -z "$node" ]]; then
        _servers_log "garage node id -q printed no node id"
        return 1
    fi
    # Until layout version 1 is applied no partition has its quorum and bucket/key commands fail.
    garage_cli layout assign -z dc1 -c 1G "$node" >/dev/null || return 1
    garage_cli layout apply --version 1 >/dev/null || return 1
    wait_for "Garage /health to report quorum" _garage_health "$admin_port" || return 1
    garage_cli bucket create "$GARAGE_BUCKET" >/dev/null || return 1
    garage_cli key import --yes -n "$GARAGE_KEY_NAME" "$GARAGE_ACCESS_KEY" "$GARAGE_SECRET_KEY" >/dev/null || return 1
    garage_cli bucket allow --read --write --owner "$GARAGE_BUCKET" --key "$GARAGE_KEY_NAME" >/dev/null || return 1

    export AWS_ACCESS_KEY_ID=$GARAGE_ACCESS_KEY
    export AWS_SECRET_ACCESS_KEY=$GARAGE_SECRET_KEY
    export AWS_REGION=$GARAGE_REGION
    export GARAGE_ENDPOINT=http://127.0.0.1:$s3_port
    export GARAGE_BUCKET
    _servers_log "Garage ready at $GARAGE_ENDPOINT, bucket $GARAGE_BUCKET (dir $dir)"
    echo "$GARAGE_ENDPOINT"
}

_garage_ports() {
    _garage_alive || return 2
    port_open "$1" && port_open "$2" || return 1
}

_garage_status() {
    _garage_alive || return 2
    garage_cli status >/dev/null 2>&1 || return 1
}

# The strait data URL of the Garage started by start_garage.
garage_data_url() {
    echo "s3://$GARAGE_BUCKET?endpoint=$GARAGE_ENDPOINT&region=$GARAGE_REGION"
}

stop_garage() {
    if [[ -n "$_GARAGE_PID" ]]; then
        # SIGTERM; Garage takes about 1.5 s to exit
        kill "$_GARAGE_PID" 2>/dev/null || true
        local i
        for ((i = 0; i < 100; i++)); do
            kill -0 "$_GARAGE_PID" 2>/dev/null || break
            sleep 0.05
        done
        kill -9 "$_GARAGE_PID" 2>/dev/null || true
        wait "$_GARAGE_PID" 2>/dev/null || true
        _servers_log "Garage stopped (pid $_GARAGE_PID)"
    fi
    _GARAGE_PID=
}

stop_servers() {
    stop_garage
    stop_redis
}
