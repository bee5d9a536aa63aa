//! A throwaway `redis-server` for one test ([`strait_devkit::redis::RedisServer`]), or a skip
//! when the program is missing.

use std::ops::{Deref, DerefMut};

pub struct RedisServer {
    server: strait_devkit::redis::RedisServer,
}

impl RedisServer {
    /// Start a server, or None (after printing SKIPPED) when `redis-server` is not installed.
    /// Under `CI=true` a missing `redis-server` or a server that does not start is a panic.
    pub fn start() -> Option<Self> {
        if !super::require_program("redis-server") {
            return None;
        }
        match strait_devkit::redis::RedisServer::start() {
            Ok(server) => Some(RedisServer { server }),
            Err(e) => panic!("start redis-server: {e:#}"),
        }
    }
}

impl RedisServer {
    /// [`RedisServer::start`] with a TLS listener too.
    pub fn start_tls(tls: &strait_devkit::redis::RedisTls) -> Option<Self> {
        if !super::require_program("redis-server") {
            return None;
        }
        match strait_devkit::redis::RedisServer::start_tls(tls) {
            Ok(server) => Some(RedisServer { server }),
            Err(e) => panic!("start redis-server with TLS: {e:#}"),
        }
    }
}

impl Deref for RedisServer {
    type Target = strait_devkit::redis::RedisServer;

    fn deref(&self) -> &Self::Target {
        &self.server
    }
}

impl DerefMut for RedisServer {
    fn deref_mut(&mut self) -> &mut Self::Target {
        &mut self.server
    }
}
