//! `free_port`: ports a test server can listen on, never handed out twice, and kept out of
//! the kernel's ephemeral range (where an outgoing connection could take them first).

use std::collections::HashSet;

#[test]
fn free_ports_are_distinct_bindable_and_below_the_ephemeral_range() {
    let ephemeral_low: u16 = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .unwrap()
        .split_whitespace()
        .next()
        .unwrap()
        .parse()
        .unwrap();
    let mut seen = HashSet::new();
    for _ in 0..50 {
        let p = strait_devkit::free_port().unwrap();
        assert!(seen.insert(p), "port {p} was handed out twice");
        if ephemeral_low > 21_000 {
            assert!(
                (20_000..ephemeral_low).contains(&p),
                "port {p} is not below the ephemeral range (from {ephemeral_low})"
            );
        }
        std::net::TcpListener::bind(("127.0.0.1", p))
            .unwrap_or_else(|e| panic!("listen on the free port {p}: {e}"));
    }
}
