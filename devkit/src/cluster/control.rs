//! The control socket of `strait dev fault`: one line, `ADMIN_TOKEN FAULT`, changes the link
//! between the regions (partition, isolate one region, heal, delay, bandwidth).

use std::io::{BufRead, BufReader, Write};
use std::sync::Arc;
use std::time::Duration;

use crate::Proxy;

/// Longest line the control socket reads.
const CONTROL_LINE_BYTES_MAX: u64 = 1024;

/// One proxy of the link between the regions, and the two regions it joins (`A`, `B`, `C`).
pub(super) struct Link {
    pub(super) ends: [String; 2],
    pub(super) proxy: Arc<Proxy>,
}

pub(super) fn serve_control(l: std::net::TcpListener, links: Vec<Link>, admin_token: String) {
    let proxies: Vec<Arc<Proxy>> = links.iter().map(|l| l.proxy.clone()).collect();
    use std::io::Read;
    for conn in l.incoming().flatten() {
        let _ = conn.set_read_timeout(Some(Duration::from_secs(5)));
        let mut r = BufReader::new(match conn.try_clone() {
            Ok(c) => c.take(CONTROL_LINE_BYTES_MAX),
            Err(_) => continue,
        });
        let mut w = conn;
        let mut line = String::new();
        if r.read_line(&mut line).is_err() {
            continue;
        }
        // `ADMIN_TOKEN FAULT`: only an operator changes the link
        let (token, cmd) = line.trim().split_once(' ').unwrap_or(("", ""));
        if !strait_auth::Tokens::equal(token, &admin_token) {
            let _ = writeln!(
                w,
                "error: the control socket takes `ADMIN_TOKEN FAULT` with dev up's admin token"
            );
            continue;
        }
        let reply = match cmd {
            "partition" => {
                for p in &proxies {
                    p.update(|f| {
                        f.up.blackhole = true;
                        f.down.blackhole = true;
                    });
                }
                "partitioned: nothing crosses between the regions".to_string()
            }
            c if c.starts_with("isolate=") => {
                let region = c["isolate=".len()..].to_uppercase();
                let cut: Vec<&Link> = links
                    .iter()
                    .filter(|l| l.ends.contains(&region))
                    .collect();
                if cut.is_empty() {
                    format!("error: {c:?}: no link reaches region {region:?} (isolate=a, b or c)")
                } else {
                    for l in &cut {
                        l.proxy.update(|f| {
                            f.up.blackhole = true;
                            f.down.blackhole = true;
                        });
                    }
                    format!(
                        "isolated region {region}: nothing crosses between it and the other regions ({} links cut)",
                        cut.len()
                    )
                }
            }
            "heal" => {
                for p in &proxies {
                    p.update(|f| {
                        f.up.blackhole = false;
                        f.down.blackhole = false;
                    });
                }
                "healed".to_string()
            }
            c if c.starts_with("delay=") => match c[6..].parse::<u64>() {
                Ok(ms) => {
                    for p in &proxies {
                        p.update(|f| {
                            f.up.latency = Duration::from_millis(ms);
                            f.down.latency = Duration::from_millis(ms);
                        });
                    }
                    format!("one-way delay now {ms} ms")
                }
                Err(_) => format!("error: {c:?}: delay=MS with MS a number"),
            },
            c if c.starts_with("bandwidth=") => match c["bandwidth=".len()..].parse::<f64>() {
                Ok(mb) if mb >= 0.0 && mb.is_finite() => {
                    let cap = (mb > 0.0).then_some((mb * 1e6) as u64);
                    for p in &proxies {
                        p.update(|f| {
                            f.up.bandwidth = cap;
                            f.down.bandwidth = cap;
                        });
                    }
                    match cap {
                        Some(_) => format!("bandwidth now {mb} MB/s per proxy"),
                        None => "no bandwidth cap now".to_string(),
                    }
                }
                _ => format!("error: {c:?}: bandwidth=MB_PER_S with a number, 0 for none"),
            },
            other => format!(
                "error: unknown fault {other:?} (partition, isolate=REGION, heal, delay=MS, bandwidth=MB_PER_S)"
            ),
        };
        let _ = writeln!(w, "{reply}");
    }
}
