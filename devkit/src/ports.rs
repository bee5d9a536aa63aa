//! Free TCP ports on 127.0.0.1 for the servers that tests, benchmarks and `dev up` start.

use std::sync::Mutex;

/// Lowest port [`free_port`] hands out, and how many ports it tries in each range (below
/// the ephemeral range, then from it).
const FREE_PORT_LOW: u16 = 20000;
const FREE_PORT_TRIES: usize = 200;

/// A TCP port on 127.0.0.1 that is free now, below the kernel's range of ephemeral ports
/// when there is room there, and never handed out twice by this process.
///
/// A port from the ephemeral range (what binding port 0 gives) can be taken, between this
/// call and the server's own bind, as the local port of any outgoing connection on the
/// machine; under a test suite's load that happens, and the server then cannot listen.
/// Ports below the range are never given to outgoing connections.
pub fn free_port() -> std::io::Result<u16> {
    static HANDED_OUT: Mutex<Vec<u16>> = Mutex::new(Vec::new());
    let mut handed = HANDED_OUT
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    let ephemeral_low = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|r| {
            r.split_whitespace()
                .next()
                .and_then(|p| p.parse::<u16>().ok())
        })
        .unwrap_or(32768);
    let (low, high) = (FREE_PORT_LOW, ephemeral_low);
    if high > low + 1000 {
        for _ in 0..FREE_PORT_TRIES {
            let p = low + rand::random::<u16>() % (high - low);
            if handed.contains(&p) {
                continue;
            }
            if std::net::TcpListener::bind(("127.0.0.1", p)).is_ok() {
                handed.push(p);
                return Ok(p);
            }
        }
    }
    // no room below the ephemeral range (or every try was taken): let the kernel choose
    for _ in 0..FREE_PORT_TRIES {
        let l = std::net::TcpListener::bind("127.0.0.1:0")?;
        let p = l.local_addr()?.port();
        if !handed.contains(&p) {
            handed.push(p);
            return Ok(p);
        }
    }
    Err(std::io::Error::other(format!(
        "no free port on 127.0.0.1 after {FREE_PORT_TRIES} tries in each range"
    )))
}

/// `N` free ports for one server or cluster; [`free_port`] never repeats one.
pub fn distinct_free_ports<const N: usize>() -> std::io::Result<[u16; N]> {
    let mut ports = [0u16; N];
    for p in &mut ports {
        *p = free_port()?;
    }
    Ok(ports)
}
