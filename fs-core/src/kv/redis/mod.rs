//! Redis backend: the metadata of several clients in one Redis database.
//!
//! # Layout
//! - Every KV key `k` is a Redis string at `s:` + `k` (binary safe).
//! - Redis has no ordered scan, so each group (the first [`GROUP_LEN`] bytes of a key) keeps
//!   an index: the sorted set `i:` + group, every member at score 0 and named by the full KV
//!   key. A scan is a `ZRANGEBYLEX` on that index followed by an `MGET` of the values; with
//!   equal scores Redis orders members bytewise, which is the trait's order.
//! - Counters are 8-byte little-endian i64 strings like in every other backend, not Redis
//!   integers, so [`crate::kv::decode_counter`] reads them everywhere. Lua does the arithmetic
//!   byte by byte: Lua numbers are doubles and would round above 2^53.
//!
//! # Transactions
//! Optimistic, with `WATCH`: every read of a read-write transaction first watches what it
//! reads (the string for a `get`; the group's index and every returned string for a `scan`),
//! writes are buffered in a [`WriteSet`], and the commit is one Lua script inside
//! `MULTI`/`EXEC`. The script applies the writes, the blind counter additions, the log
//! append and the versioned writes (which take the version it assigns) together (a script is atomic, and it checks every counter before its first write
//! because Redis does not roll a failed script back). If a watched key changed, `EXEC`
//! answers nil and the closure runs again from scratch with a fresh write set, at most
//! [`TXN_RETRIES_MAX`] more times, after a short random pause. The log version is assigned
//! by the script, so it is gapless however many times the closure ran.
//!
//! A closure that fails or writes nothing still validates its reads with an empty
//! `MULTI`/`EXEC`: an answer computed from reads that a concurrent commit had already
//! overwritten must not escape (it would describe a state that never existed).
//!
//! # Durability
//! A committed transaction is in the Redis server's memory when `txn` returns, so it
//! survives a crash of the calling process. Surviving a crash of the Redis machine is the
//! server's configuration (`appendonly yes` with `appendfsync always` or `everysec`);
//! [`KvEngine::sync`] cannot force it (Redis 7.0 has no `WAITAOF`) and does nothing.
//!
//! # Connections
//! The trait is synchronous and called from many threads, so the engine keeps a pool of idle
//! blocking connections, at most `POOL_IDLE_CONNECTIONS_MAX`; a caller that finds none opens
//! a new one. A connection that saw an I/O error, or is dropped in the middle of a
//! transaction, is closed instead of being returned; after an I/O error every idle connection
//! is closed too, since they most likely point at the same dead server. A connection idle for
//! `POOL_IDLE_CHECK_MS` is pinged before use, and a transaction whose pooled connection
//! fails before anything was sent for commit runs once more on a fresh connection. A commit
//! whose connection fails is never resent: whether the server applied it is unknown.

use std::time::{Duration, Instant};

use parking_lot::Mutex;
use redis::{Connection, ConnectionLike, Pipeline, Value};

use super::{
    decode_counter, prefix_end, KvEngine, KvPairs, KvTxn, WriteSet, GROUP_LEN, LAST_VERSION_KEY,
    LOG_GROUP, TXN_RETRIES_MAX,
};
use crate::error::{Error, Result};
use crate::Version;

mod tls;
pub use tls::TlsFiles;

/// Idle connections kept for reuse; more may be open while many threads are busy.
const POOL_IDLE_CONNECTIONS_MAX: usize = 16;
/// A connection idle for longer than this is checked with PING before it is used, so that a
/// server restarted in the meantime costs a reconnect rather than a failed request.
const POOL_IDLE_CHECK_MS: u64 = 1_000;
/// Time allowed to open a TCP connection to the server.
const CONNECT_TIMEOUT_MS: u64 = 5_000;
/// Time allowed for one request/response exchange before the connection is given up.
const IO_TIMEOUT_MS: u64 = 30_000;
/// The random pause before rerunning a conflicting transaction is drawn from
/// `0..=min(TXN_BACKOFF_US_BASE << attempt, TXN_BACKOFF_US_MAX)`.
const TXN_BACKOFF_US_BASE: u64 = 50;
const TXN_BACKOFF_US_MAX: u64 = 20_000;

/// Prefix of the Redis string holding a KV key's value. The Lua scripts strip it with
/// `string.sub(k, 3)`: keep it two bytes long.
const STRING_PREFIX: &[u8] = b"s:";
/// Prefix of a group's index (a sorted set). Also two bytes, for the same reason.
const INDEX_PREFIX: &[u8] = b"i:";

/// 64-bit two's complement addition of two 8-byte little-endian strings, exact (no doubles).
const LUA_ADD64: &str = r#"
local function add64(a, b)
  local out = {}
  local carry = 0
  for i = 1, 8 do
    local s = string.byte(a, i) + string.byte(b, i) + carry
    out[i] = s % 256
    carry = math.floor(s / 256)
  end
  return string.char(unpack(out))
end
local ZERO = string.rep('\0', 8)
local function counter(k)
  local v = redis.call('GET', k)
  if not v then return ZERO end
  if #v ~= 8 then return nil end
  return v
end
"#;

/// Commit a write set.
/// ARGV: np nd na nl nv (counts of puts, deletes, adds, log records: 0 or 1, versioned puts:
/// 0 unless nl = 1), then np values, na 8-byte deltas, nl records, nv values.
/// KEYS: (string, index) pairs for the np puts, nd deletes and na adds, then, if nl = 1, the
/// last-version string, its index, and the log group's index, then (string, index) pairs for
/// the nv versioned puts.
/// Returns the new version (8 bytes LE) or an empty string when there is no record.
const LUA_COMMIT: &str = r#"
local np, nd, na, nl, nv = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])
local ka = 2 * (np + nd)
local cur = {}
for i = 1, na do
  cur[i] = counter(KEYS[ka + 2 * i - 1])
  if not cur[i] then return redis.error_reply('ECORRUPT counter is not 8 bytes long') end
end
local last
if nl == 1 then
  last = counter(KEYS[ka + 2 * na + 1])
  if not last then return redis.error_reply('ECORRUPT last version is not 8 bytes long') end
end
for i = 1, np do
  local k = KEYS[2 * i - 1]
  redis.call('SET', k, ARGV[5 + i])
  redis.call('ZADD', KEYS[2 * i], 'NX', 0, string.sub(k, 3))
end
for i = 1, nd do
  local k = KEYS[2 * np + 2 * i - 1]
  redis.call('DEL', k)
  redis.call('ZREM', KEYS[2 * np + 2 * i], string.sub(k, 3))
end
for i = 1, na do
  local k = KEYS[ka + 2 * i - 1]
  redis.call('SET', k, add64(cur[i], ARGV[5 + np + i]))
  redis.call('ZADD', KEYS[ka + 2 * i], 'NX', 0, string.sub(k, 3))
end
if nl == 1 then
  local k = KEYS[ka + 2 * na + 1]
  local logidx = KEYS[ka + 2 * na + 3]
  local v = add64(last, '\1\0\0\0\0\0\0\0')
  redis.call('SET', k, v)
  redis.call('ZADD', KEYS[ka + 2 * na + 2], 'NX', 0, string.sub(k, 3))
  local member = string.sub(logidx, 3) .. string.reverse(v)
  redis.call('SET', 's:' .. member, ARGV[5 + np + na + 1])
  redis.call('ZADD', logidx, 'NX', 0, member)
  local kv = ka + 2 * na + 3
  for i = 1, nv do
    local vk = KEYS[kv + 2 * i - 1]
    redis.call('SET', vk, ARGV[5 + np + na + 1 + i] .. string.reverse(v))
    redis.call('ZADD', KEYS[kv + 2 * i], 'NX', 0, string.sub(vk, 3))
  end
  return v
end
return ''
"#;

/// Add ARGV[1] (8 bytes LE) to the counter KEYS[1] indexed in KEYS[2]; returns the new value.
const LUA_INCR: &str = r#"
local v = counter(KEYS[1])
if not v then return redis.error_reply('ECORRUPT counter is not 8 bytes long') end
local n = add64(v, ARGV[1])
redis.call('SET', KEYS[1], n)
redis.call('ZADD', KEYS[2], 'NX', 0, string.sub(KEYS[1], 3))
return n
"#;

pub struct RedisKv {
    client: redis::Client,
    /// `host:port/db` for messages; never the password.
    server: String,
    /// Idle connections and when each was last returned.
    idle: Mutex<Vec<(Connection, Instant)>>,
    commit_script: redis::Script,
    incr_script: redis::Script,
}

fn string_key(key: &[u8]) -> Vec<u8> {
    [STRING_PREFIX, key].concat()
}

fn index_key(key: &[u8]) -> Vec<u8> {
    let group = &key[..key.len().min(GROUP_LEN)];
    [INDEX_PREFIX, group].concat()
}

impl RedisKv {
    /// Connect to `redis://[user:password@]host:port/db`, or over TLS to
    /// `rediss://...[?ca=CA.pem][&cert=CLIENT.pem&key=CLIENT.key]` (see [`TlsFiles`]). One
    /// connection is opened right away so that a wrong address, password or certificate fails
    /// here rather than at the first transaction.
    pub fn open(url: &str) -> Result<Self> {
        let (url, tls) = TlsFiles::split(url)?;
        let client = match tls.certificates()? {
            Some(certs) => {
                // rustls asks for the process's crypto provider when two are built in
                let _ = rustls::crypto::ring::default_provider().install_default();
                redis::Client::build_with_tls(url.as_str(), certs)
            }
            None => redis::Client::open(url.as_str()),
        }
        .map_err(|e| Error::Invalid(format!("parse redis URL: {e}")))?;
        let info = client.get_connection_info();
        let server = format!("{}/{}", info.addr(), info.redis_settings().db());
        let kv = Self {
            client,
            server,
            idle: Mutex::new(Vec::new()),
            commit_script: redis::Script::new(&format!("{LUA_ADD64}{LUA_COMMIT}")),
            incr_script: redis::Script::new(&format!("{LUA_ADD64}{LUA_INCR}")),
        };
        let conn = kv.connect()?;
        kv.idle.lock().push((conn, Instant::now()));
        Ok(kv)
    }

    /// Why a commit this server acknowledged may not survive its crash or a power loss
    /// (None: `appendonly yes` with `appendfsync always`, so each write is on disk before its
    /// answer). A server that does not let `CONFIG GET` be asked (a managed Redis) cannot be
    /// shown durable, and says so.
    pub fn durability_problem(&self) -> Result<Option<String>> {
        let mut lease = self.lease()?;
        let mut get = |name: &str| -> Result<Option<String>> {
            let mut pipe = redis::pipe();
            pipe.cmd("CONFIG").arg("GET").arg(name);
            match lease.query_ok(&format!("CONFIG GET {name}"), &pipe) {
                Ok(mut v) => {
                    let pair = v.pop().unwrap_or(Value::Nil);
                    let word = |v: Value| match v {
                        Value::BulkString(b) => String::from_utf8(b).ok(),
                        Value::SimpleString(s) => Some(s),
                        _ => None,
                    };
                    let words: Vec<String> = match pair {
                        Value::Array(items) => items.into_iter().filter_map(word).collect(),
                        Value::Map(items) => items
                            .into_iter()
                            .flat_map(|(k, v)| [k, v])
                            .filter_map(word)
                            .collect(),
                        _ => vec![],
                    };
                    Ok(words.get(1).cloned())
                }
                Err(_) => Ok(None),
            }
        };
        let appendonly = get("appendonly")?;
        let appendfsync = get("appendfsync")?;
        Ok(match (appendonly.as_deref(), appendfsync.as_deref()) {
            (Some("yes"), Some("always")) => None,
            (None, _) | (_, None) => Some(format!(
                "redis server {} does not answer CONFIG GET appendonly/appendfsync, so its \
                 durability cannot be checked",
                self.server
            )),
            (Some(a), Some(f)) => Some(format!(
                "redis server {} runs with appendonly {a}, appendfsync {f}: a write it \
                 acknowledged is on disk only later (or never), so its crash or a power loss \
                 takes back acknowledged changes and the slice-id counter (ids handed out \
                 twice); run it with `appendonly yes` and `appendfsync always`",
                self.server
            )),
        })
    }

    fn err(&self, action: &str, e: impl std::fmt::Display) -> Error {
        Error::Meta(format!("{action} (redis server {}): {e}", self.server))
    }

    fn connect(&self) -> Result<Connection> {
        let mut conn = self
            .client
            .get_connection_with_timeout(Duration::from_millis(CONNECT_TIMEOUT_MS))
            .map_err(|e| Error::Meta(format!("connect to redis server {}: {e}", self.server)))?;
        let timeout = Some(Duration::from_millis(IO_TIMEOUT_MS));
        conn.set_read_timeout(timeout)
            .and_then(|()| conn.set_write_timeout(timeout))
            .map_err(|e| self.err("set connection timeouts", e))?;
        self.load_scripts(&mut conn)?;
        Ok(conn)
    }

    /// Load the Lua scripts into the server's cache, so that commits can send only their hash.
    fn load_scripts(&self, conn: &mut Connection) -> Result<()> {
        for script in [&self.commit_script, &self.incr_script] {
            let hash = script
                .load(conn)
                .map_err(|e| self.err("load lua script", e))?;
            if hash != script.get_hash() {
                return Err(self.err("load lua script", format!("server answered hash {hash}")));
            }
        }
        Ok(())
    }

    fn lease(&self) -> Result<Lease<'_>> {
        let pooled = self.idle.lock().pop();
        let pooled = pooled.and_then(|(mut conn, since)| {
            if since.elapsed() < Duration::from_millis(POOL_IDLE_CHECK_MS) {
                return Some(conn);
            }
            if redis::cmd("PING").query::<String>(&mut conn).is_ok() {
                return Some(conn);
            }
            // The others have most likely lost the same server.
            self.idle.lock().clear();
            None
        });
        let (conn, from_pool) = match pooled {
            Some(c) => (c, true),
            None => (self.connect()?, false),
        };
        Ok(Lease {
            kv: self,
            conn: Some(conn),
            from_pool,
            watching: false,
            io_failed: false,
        })
    }

    fn backoff(attempt: usize) {
        let shift = attempt.min(16) as u32;
        let max_us = (TXN_BACKOFF_US_BASE << shift).min(TXN_BACKOFF_US_MAX);
        let us = rand::random_range(0..=max_us);
        std::thread::sleep(Duration::from_micros(us));
    }

    /// Run `f` until it commits, fails on a consistent view, or conflicts too often.
    fn run(
        &self,
        isolated: bool,
        f: &mut dyn FnMut(&mut dyn KvTxn) -> Result<()>,
    ) -> Result<Option<Version>> {
        let mut stale_retried = false;
        let mut attempt = 0;
        // Not backon: a WATCH conflict reruns the closure after a full-jitter pause (`backoff`,
        // which backon's jitter cannot draw), and a stale pooled connection once at once.
        loop {
            let mut lease = self.lease()?;
            let mut t = RedisTxn {
                lease: &mut lease,
                ws: WriteSet::default(),
                isolated,
            };
            let res = f(&mut t);
            let ws = std::mem::take(&mut t.ws);
            let outcome = match res {
                // A connection that sat idle in the pool may have died with a restarted
                // server; nothing was written yet, so one fresh try is safe.
                Err(_) if lease.io_failed && lease.from_pool && !stale_retried => {
                    stale_retried = true;
                    continue;
                }
                Err(e) if lease.io_failed || !lease.watching => return Err(e),
                Err(e) => match lease.commit(None)? {
                    Outcome::Committed(_) => return Err(e),
                    other => other,
                },
                Ok(()) if !isolated => return Ok(None),
                Ok(()) => lease.commit(Some(ws))?,
            };
            match outcome {
                Outcome::Committed(v) => return Ok(v),
                Outcome::Conflict => {}
                Outcome::NoScript => lease.reload_scripts()?,
            }
            drop(lease);
            attempt += 1;
            if attempt > TXN_RETRIES_MAX {
                return Err(self.err(
                    "commit transaction",
                    format!(
                        "conflict with concurrent transactions {attempt} times in a row, giving up"
                    ),
                ));
            }
            Self::backoff(attempt);
        }
    }
}

enum Outcome {
    Committed(Option<Version>),
    /// A watched key changed before `EXEC`: rerun the closure.
    Conflict,
    /// The server lost the cached script (restart or `SCRIPT FLUSH`): load it and rerun.
    NoScript,
}

/// One connection borrowed from the pool, returned on drop when it is in a clean state.
struct Lease<'a> {
    kv: &'a RedisKv,
    /// None once an I/O error made the connection unusable.
    conn: Option<Connection>,
    from_pool: bool,
    /// Keys are watched on this connection (cleared by `EXEC`).
    watching: bool,
    io_failed: bool,
}

impl Drop for Lease<'_> {
    fn drop(&mut self) {
        let Some(conn) = self.conn.take() else { return };
        // A connection still watching keys (a panic in the closure) would leak its watches
        // into the next transaction: close it instead.
        if self.watching || !conn.is_open() {
            return;
        }
        let mut idle = self.kv.idle.lock();
        if idle.len() < POOL_IDLE_CONNECTIONS_MAX {
            idle.push((conn, Instant::now()));
        }
    }
}

impl Lease<'_> {
    /// Send `pipe` and return one reply per command; server errors stay in the replies.
    fn query(&mut self, action: &str, pipe: &Pipeline) -> Result<Vec<Value>> {
        let Some(conn) = self.conn.as_mut() else {
            return Err(self.kv.err(
                action,
                "the connection was lost earlier in this transaction",
            ));
        };
        match conn.req_packed_commands(&pipe.get_packed_pipeline(), 0, pipe.len()) {
            Ok(replies) if replies.len() == pipe.len() => Ok(replies),
            Ok(replies) => {
                self.conn = None;
                Err(self.kv.err(
                    action,
                    format!("{} replies to {} commands", replies.len(), pipe.len()),
                ))
            }
            Err(e) => {
                self.conn = None;
                self.io_failed = true;
                self.kv.idle.lock().clear();
                Err(self.kv.err(action, e))
            }
        }
    }

    /// Like [`Lease::query`], failing on the first server error.
    fn query_ok(&mut self, action: &str, pipe: &Pipeline) -> Result<Vec<Value>> {
        let replies = self.query(action, pipe)?;
        for r in &replies {
            if let Value::ServerError(e) = r {
                return Err(self.kv.err(action, e));
            }
        }
        Ok(replies)
    }

    fn reload_scripts(&mut self) -> Result<()> {
        let Some(conn) = self.conn.as_mut() else {
            return Err(self.kv.err("load lua script", "the connection was lost"));
        };
        let res = self.kv.load_scripts(conn);
        if res.is_err() {
            self.conn = None;
        }
        res
    }

    /// `MULTI`, the commit script for `ws` (nothing when `ws` is None or empty: that only
    /// validates the watched reads), `EXEC`.
    fn commit(&mut self, ws: Option<WriteSet>) -> Result<Outcome> {
        let script = match ws {
            Some(ws) => self.commit_command(ws)?,
            None => None,
        };
        if script.is_none() && !self.watching {
            return Ok(Outcome::Committed(None));
        }
        let mut pipe = redis::pipe();
        pipe.cmd("MULTI");
        if let Some(cmd) = script {
            pipe.add_command(cmd);
        }
        pipe.cmd("EXEC");
        let mut replies = self.query("commit transaction", &pipe)?;
        self.watching = false;
        let exec = replies.pop().unwrap_or(Value::Nil);
        let queued = replies.pop().unwrap_or(Value::Nil);
        let script_reply = match exec {
            // EXEC answers nil when a watched key changed.
            Value::Nil => return Ok(Outcome::Conflict),
            Value::Array(mut items) if items.len() <= 1 => match items.pop() {
                None => return Ok(Outcome::Committed(None)),
                Some(v) => v,
            },
            // EXECABORT: the script was refused when queued; its reason is in `queued`.
            Value::ServerError(e) => match queued {
                Value::ServerError(q) => Value::ServerError(q),
                _ => Value::ServerError(e),
            },
            other => {
                return Err(self.kv.err(
                    "commit transaction",
                    format!("unexpected EXEC reply {other:?}"),
                ))
            }
        };
        match script_reply {
            Value::BulkString(b) if b.is_empty() => Ok(Outcome::Committed(None)),
            Value::BulkString(b) => {
                let v = decode_counter(Some(b))?;
                if v <= 0 {
                    return Err(Error::corrupt(format!(
                        "log version {v} assigned by redis server {}",
                        self.kv.server
                    )));
                }
                Ok(Outcome::Committed(Some(Version(v as u64))))
            }
            Value::ServerError(e) if e.code() == "NOSCRIPT" => Ok(Outcome::NoScript),
            Value::ServerError(e) if e.code() == "ECORRUPT" => Err(Error::corrupt(format!(
                "redis server {}: {}",
                self.kv.server,
                e.details().unwrap_or("")
            ))),
            Value::ServerError(e) => Err(self.kv.err("commit transaction", e)),
            other => Err(self.kv.err(
                "commit transaction",
                format!("unexpected script reply {other:?}"),
            )),
        }
    }

    /// The `EVALSHA` applying `ws`, or None when `ws` writes nothing.
    fn commit_command(&self, ws: WriteSet) -> Result<Option<redis::Cmd>> {
        ws.check_versioned()?;
        let WriteSet {
            mut writes,
            adds,
            log,
            versioned,
        } = ws;
        // An addition to a key this transaction also writes is folded into that write, so
        // the script only sees blind additions, one per key.
        let mut blind: std::collections::BTreeMap<Vec<u8>, i64> = Default::default();
        for (key, delta) in adds {
            if let Some(w) = writes.get_mut(&key) {
                let cur = decode_counter(w.take())?;
                *w = Some(cur.wrapping_add(delta).to_le_bytes().to_vec());
            } else {
                let sum = blind.entry(key).or_insert(0);
                *sum = sum.wrapping_add(delta);
            }
        }
        if writes.is_empty() && blind.is_empty() && log.is_none() {
            return Ok(None);
        }
        let (mut puts, mut deletes) = (Vec::new(), Vec::new());
        for (k, v) in writes {
            match v {
                Some(v) => puts.push((k, v)),
                None => deletes.push(k),
            }
        }
        let mut keys: Vec<Vec<u8>> =
            Vec::with_capacity(2 * (puts.len() + deletes.len() + blind.len()) + 3);
        let mut args: Vec<Vec<u8>> = vec![
            puts.len().to_string().into_bytes(),
            deletes.len().to_string().into_bytes(),
            blind.len().to_string().into_bytes(),
            if log.is_some() {
                b"1".to_vec()
            } else {
                b"0".to_vec()
            },
            versioned.len().to_string().into_bytes(),
        ];
        for (k, _) in &puts {
            keys.push(string_key(k));
            keys.push(index_key(k));
        }
        for k in &deletes {
            keys.push(string_key(k));
            keys.push(index_key(k));
        }
        for k in blind.keys() {
            keys.push(string_key(k));
            keys.push(index_key(k));
        }
        args.extend(puts.into_iter().map(|(_, v)| v));
        args.extend(blind.values().map(|d| d.to_le_bytes().to_vec()));
        if let Some(record) = log {
            keys.push(string_key(LAST_VERSION_KEY));
            keys.push(index_key(LAST_VERSION_KEY));
            keys.push(index_key(&LOG_GROUP));
            args.push(record);
            // check_versioned: versioned writes come only with a record
            for (k, v) in versioned {
                keys.push(string_key(&k));
                keys.push(index_key(&k));
                args.push(v);
            }
        }
        let mut cmd = redis::cmd("EVALSHA");
        cmd.arg(self.kv.commit_script.get_hash())
            .arg(keys.len())
            .arg(keys)
            .arg(args);
        Ok(Some(cmd))
    }
}

struct RedisTxn<'l, 'a> {
    lease: &'l mut Lease<'a>,
    ws: WriteSet,
    /// Read-write transaction: watch everything read. False for [`KvEngine::read`].
    isolated: bool,
}

fn bytes_reply(kv: &RedisKv, action: &str, v: Value) -> Result<Option<Vec<u8>>> {
    match v {
        Value::Nil => Ok(None),
        Value::BulkString(b) => Ok(Some(b)),
        Value::SimpleString(s) => Ok(Some(s.into_bytes())),
        Value::ServerError(e) => Err(kv.err(action, e)),
        other => Err(kv.err(action, format!("unexpected reply {other:?}"))),
    }
}

impl RedisTxn<'_, '_> {
    /// Send `cmd`, preceded by a `WATCH` of `watch` in a read-write transaction; returns the
    /// reply to `cmd`.
    fn watched(&mut self, action: &str, watch: &[Vec<u8>], cmd: redis::Cmd) -> Result<Value> {
        let mut pipe = redis::pipe();
        if self.isolated && !watch.is_empty() {
            pipe.cmd("WATCH").arg(watch);
            self.lease.watching = true;
        }
        pipe.add_command(cmd);
        let mut replies = self.lease.query_ok(action, &pipe)?;
        Ok(replies.pop().unwrap_or(Value::Nil))
    }
}

impl KvTxn for RedisTxn<'_, '_> {
    fn get(&mut self, key: &[u8]) -> Result<Option<Vec<u8>>> {
        if let Some(v) = self.ws.lookup(key) {
            return Ok(v);
        }
        let skey = string_key(key);
        let mut cmd = redis::cmd("GET");
        cmd.arg(&skey);
        let reply = self.watched("read key", &[skey], cmd)?;
        bytes_reply(self.lease.kv, "read key", reply)
    }

    fn scan(&mut self, prefix: &[u8], start_after: Option<&[u8]>, limit: usize) -> Result<KvPairs> {
        if prefix.len() < GROUP_LEN {
            return Err(Error::Invalid(format!(
                "scan prefix of {} bytes, shorter than a group ({GROUP_LEN} bytes)",
                prefix.len()
            )));
        }
        if limit == 0 {
            return Ok(Vec::new());
        }
        let kv = self.lease.kv;
        // Own deletes may hide fetched keys: fetch enough that `limit` remain.
        let fetch = limit.saturating_add(self.ws.writes.len());
        let count = i64::try_from(fetch).unwrap_or(-1);
        let min = match start_after {
            Some(a) if a >= prefix => [&b"("[..], a].concat(),
            _ => [&b"["[..], prefix].concat(),
        };
        let max = match prefix_end(prefix) {
            Some(end) => [&b"("[..], &end].concat(),
            None => b"+".to_vec(),
        };
        let index = index_key(prefix);
        let mut range = redis::cmd("ZRANGEBYLEX");
        range
            .arg(&index)
            .arg(min)
            .arg(max)
            .arg("LIMIT")
            .arg(0)
            .arg(count);
        let members = match self.watched("scan index", &[index], range)? {
            Value::Array(items) => items
                .into_iter()
                .map(|m| {
                    bytes_reply(kv, "scan index", m)?
                        .ok_or_else(|| kv.err("scan index", "nil member"))
                })
                .collect::<Result<Vec<_>>>()?,
            other => return Err(kv.err("scan index", format!("unexpected reply {other:?}"))),
        };
        let mut base = Vec::with_capacity(members.len());
        if !members.is_empty() {
            let skeys: Vec<Vec<u8>> = members.iter().map(|m| string_key(m)).collect();
            let mut mget = redis::cmd("MGET");
            mget.arg(&skeys);
            let values = match self.watched("read scanned keys", &skeys, mget)? {
                Value::Array(values) if values.len() == members.len() => values,
                other => {
                    return Err(kv.err("read scanned keys", format!("unexpected reply {other:?}")))
                }
            };
            for (k, v) in members.into_iter().zip(values) {
                // Deleted between the two requests: in a read-write transaction the watches
                // make the commit fail; a read-only closure simply does not see the key.
                if let Some(v) = bytes_reply(kv, "read scanned keys", v)? {
                    base.push((k, v));
                }
            }
        }
        Ok(self.ws.overlay_scan(base, prefix, start_after, limit))
    }

    fn put(&mut self, key: &[u8], value: &[u8]) {
        self.ws.put(key, value)
    }
    fn delete(&mut self, key: &[u8]) {
        self.ws.delete(key)
    }
    fn add(&mut self, key: &[u8], delta: i64) {
        self.ws.add(key, delta)
    }
    fn append_log(&mut self, record: Vec<u8>) {
        self.ws.append_log(record)
    }
    fn put_versioned(&mut self, key: &[u8], value: &[u8]) {
        self.ws.put_versioned(key, value)
    }
}

impl KvEngine for RedisKv {
    fn name(&self) -> &'static str {
        "redis"
    }

    fn txn(&self, f: &mut dyn FnMut(&mut dyn KvTxn) -> Result<()>) -> Result<Option<Version>> {
        self.run(true, f)
    }

    fn read(&self, f: &mut dyn FnMut(&mut dyn KvTxn) -> Result<()>) -> Result<()> {
        self.run(false, f).map(|_| ())
    }

    fn incr(&self, key: &[u8], delta: i64) -> Result<i64> {
        let mut lease = self.lease()?;
        let mut cmd = redis::cmd("EVALSHA");
        cmd.arg(self.incr_script.get_hash())
            .arg(2)
            .arg(string_key(key))
            .arg(index_key(key))
            .arg(&delta.to_le_bytes()[..]);
        let mut pipe = redis::pipe();
        pipe.add_command(cmd);
        let mut reply = lease
            .query("add to counter", &pipe)?
            .pop()
            .unwrap_or(Value::Nil);
        if matches!(&reply, Value::ServerError(e) if e.code() == "NOSCRIPT") {
            lease.reload_scripts()?;
            reply = lease
                .query("add to counter", &pipe)?
                .pop()
                .unwrap_or(Value::Nil);
        }
        match reply {
            Value::ServerError(e) if e.code() == "ECORRUPT" => Err(Error::corrupt(format!(
                "redis server {}: {}",
                self.server,
                e.details().unwrap_or("")
            ))),
            other => decode_counter(bytes_reply(self, "add to counter", other)?),
        }
    }

    /// Nothing to do: durability beyond the Redis server's memory is its `appendfsync` setting.
    fn sync(&self) -> Result<()> {
        Ok(())
    }

    fn last_version(&self) -> Result<Version> {
        let mut lease = self.lease()?;
        let mut pipe = redis::pipe();
        pipe.cmd("GET").arg(string_key(LAST_VERSION_KEY));
        let reply = lease
            .query_ok("read last version", &pipe)?
            .pop()
            .unwrap_or(Value::Nil);
        let v = decode_counter(bytes_reply(self, "read last version", reply)?)?;
        u64::try_from(v)
            .map(Version)
            .map_err(|_| Error::corrupt(format!("last version {v}")))
    }

    fn wipe(&self) -> Result<()> {
        let mut lease = self.lease()?;
        let mut pipe = redis::pipe();
        pipe.cmd("FLUSHDB");
        lease.query_ok("wipe database", &pipe).map(|_| ())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_namespaced_and_grouped() {
        let key = b"D\0\0\0\0\0\0\0\x05name";
        assert_eq!(string_key(key), b"s:D\0\0\0\0\0\0\0\x05name");
        assert_eq!(index_key(key), b"i:D\0\0\0\0\0\0\0\x05");
        // The scripts strip these prefixes with string.sub(k, 3).
        assert_eq!(STRING_PREFIX.len(), 2);
        assert_eq!(INDEX_PREFIX.len(), 2);
        assert!(LUA_COMMIT.contains("'s:' .. member"));
    }

    #[test]
    fn open_names_the_server_without_its_password() {
        let Err(e) = RedisKv::open("redis://:hunter2@127.0.0.1:1/3") else {
            panic!("port 1 should refuse connections")
        };
        let msg = e.to_string();
        assert!(
            msg.contains("connect to redis server 127.0.0.1:1/3"),
            "{msg}"
        );
        assert!(!msg.contains("hunter2"), "{msg}");
    }
}
