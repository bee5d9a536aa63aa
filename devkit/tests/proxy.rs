//! The fault proxy against a real echo server on 127.0.0.1: bytes arrive intact and in order,
//! and each fault does what it says, switched while connections are open. Time is only
//! checked from below (a delay lasts at least what was asked), never from above: these
//! machines are shared and noisy.

use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::time::{Duration, Instant};

use strait_devkit::{Faults, Link, Proxy};

/// An echo server on a thread per connection.
fn echo_server() -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    std::thread::spawn(move || {
        for c in l.incoming() {
            let Ok(mut c) = c else { continue };
            std::thread::spawn(move || {
                let mut buf = [0u8; 65536];
                loop {
                    match c.read(&mut buf) {
                        Ok(0) | Err(_) => return,
                        Ok(n) => {
                            if c.write_all(&buf[..n]).is_err() {
                                return;
                            }
                        }
                    }
                }
            });
        }
    });
    addr
}

fn proxy() -> Proxy {
    Proxy::start_blocking("127.0.0.1:0".parse().unwrap(), echo_server()).unwrap()
}

fn connect(p: &Proxy) -> TcpStream {
    let s = TcpStream::connect(p.addr()).unwrap();
    s.set_nodelay(true).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s
}

fn round_trip(s: &mut TcpStream, msg: &[u8]) -> Vec<u8> {
    s.write_all(msg).unwrap();
    let mut got = vec![0u8; msg.len()];
    s.read_exact(&mut got).unwrap();
    got
}

#[test]
fn bytes_arrive_intact_and_in_order() {
    let p = proxy();
    let mut s = connect(&p);
    let data: Vec<u8> = (0..3_000_000u32).map(|i| (i * 7 % 251) as u8).collect();
    let mut w = s.try_clone().unwrap();
    let sent = data.clone();
    let writer = std::thread::spawn(move || w.write_all(&sent).unwrap());
    let mut got = vec![0u8; data.len()];
    s.read_exact(&mut got).unwrap();
    writer.join().unwrap();
    assert!(got == data, "the echo differs from what was sent");
    assert!(
        p.stats()
            .bytes_up
            .load(std::sync::atomic::Ordering::Relaxed)
            >= data.len() as u64
    );
}

#[test]
fn latency_applies_each_way_and_can_be_changed_on_an_open_connection() {
    let p = proxy();
    let mut s = connect(&p);
    assert_eq!(round_trip(&mut s, b"warm"), b"warm");
    p.set(Faults::delay(Duration::from_millis(40)));
    let t = Instant::now();
    assert_eq!(round_trip(&mut s, b"slow"), b"slow");
    let rtt = t.elapsed();
    assert!(
        rtt >= Duration::from_millis(80),
        "40 ms each way gives a round trip of at least 80 ms, not {rtt:?}"
    );
    p.heal();
    assert_eq!(round_trip(&mut s, b"fast"), b"fast");
}

#[test]
fn bandwidth_caps_the_byte_rate() {
    let p = proxy();
    p.update(|f| {
        f.up.bandwidth = Some(1 << 20); // 1 MiB/s
    });
    let mut s = connect(&p);
    let data = vec![7u8; 1 << 20];
    let t = Instant::now();
    let got = round_trip(&mut s, &data);
    let took = t.elapsed();
    assert_eq!(got, data);
    // 1 MiB at 1 MiB/s, minus the first chunk that leaves at once
    assert!(
        took >= Duration::from_millis(900),
        "1 MiB through a 1 MiB/s link took only {took:?}"
    );
}

#[test]
fn the_bandwidth_is_shared_by_every_connection() {
    let p = proxy();
    p.update(|f| f.up.bandwidth = Some(2 << 20)); // 2 MiB/s up, shared
                                                  // four connections each send 1 MiB at once (their echoes come back unpaced): 4 MiB at
                                                  // 2 MiB/s is 2 s at least, whatever the pacer's slack
    let t = Instant::now();
    let senders: Vec<_> = (0..4u8)
        .map(|i| {
            let mut s = connect(&p);
            std::thread::spawn(move || {
                let data = vec![i; 1 << 20];
                assert!(round_trip(&mut s, &data) == data, "connection {i} differs");
            })
        })
        .collect();
    for s in senders {
        s.join().unwrap();
    }
    let took = t.elapsed();
    assert!(
        took >= Duration::from_millis(1900),
        "4 MiB through a 2 MiB/s link took only {took:?}"
    );
}

#[test]
fn a_one_way_blackhole_drops_only_that_direction_and_heals() {
    let p = proxy();
    let mut s = connect(&p);
    assert_eq!(round_trip(&mut s, b"before"), b"before");

    // client -> server dropped: nothing comes back
    p.update(|f| f.up.blackhole = true);
    s.set_read_timeout(Some(Duration::from_millis(500)))
        .unwrap();
    s.write_all(b"lost").unwrap();
    let mut buf = [0u8; 16];
    let e = s.read(&mut buf).unwrap_err();
    assert!(
        matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut),
        "{e}"
    );
    assert!(
        p.stats()
            .dropped_up
            .load(std::sync::atomic::Ordering::Relaxed)
            >= 4
    );

    // server -> client dropped on a second connection: the server gets the bytes (counted
    // going up) but the echo never arrives
    p.set(Faults {
        down: Link {
            blackhole: true,
            ..Link::default()
        },
        ..Faults::default()
    });
    let mut s2 = connect(&p);
    s2.set_read_timeout(Some(Duration::from_millis(500)))
        .unwrap();
    let up_before = p
        .stats()
        .bytes_up
        .load(std::sync::atomic::Ordering::Relaxed);
    s2.write_all(b"one-way").unwrap();
    assert!(s2.read(&mut buf).is_err(), "the echo crossed a blackhole");
    assert!(
        p.stats()
            .bytes_up
            .load(std::sync::atomic::Ordering::Relaxed)
            >= up_before + 7
    );

    // healed: the connection that lost bytes is reset, as TCP would have given up on it
    // (its stream has a hole); a new connection carries bytes again at once
    p.heal();
    s2.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let broke = s2
        .write_all(b"after")
        .and_then(|()| s2.read(&mut buf))
        .map_or(true, |n| n == 0);
    assert!(
        broke,
        "a connection with a hole in its stream went on after the heal"
    );
    let mut s3 = connect(&p);
    assert_eq!(round_trip(&mut s3, b"healed"), b"healed");
}

#[test]
fn reset_breaks_open_connections_and_refuse_breaks_new_ones() {
    let p = proxy();
    let mut s = connect(&p);
    assert_eq!(round_trip(&mut s, b"hello"), b"hello");
    p.reset();
    let mut buf = [0u8; 8];
    let deadline = Instant::now() + Duration::from_secs(10);
    let broke = loop {
        // the reset may arrive before or after this write; either the write or the read fails
        let r = s.write_all(b"x").and_then(|()| s.read(&mut buf));
        match r {
            Err(e) => break e,
            Ok(0) => panic!("the connection closed with a FIN, not a reset"),
            Ok(_) => {}
        }
        assert!(Instant::now() < deadline, "the connection survived a reset");
    };
    assert!(
        matches!(
            broke.kind(),
            ErrorKind::ConnectionReset | ErrorKind::BrokenPipe
        ),
        "{broke}"
    );
    // new connections work after a reset
    let mut s2 = connect(&p);
    assert_eq!(round_trip(&mut s2, b"again"), b"again");

    p.update(|f| f.refuse = true);
    let mut s3 = connect(&p);
    let r = s3.write_all(b"x").and_then(|()| s3.read(&mut buf));
    assert!(
        matches!(r, Err(_) | Ok(0)),
        "a refused connection carried data: {r:?}"
    );
    p.heal();
    let mut s4 = connect(&p);
    assert_eq!(round_trip(&mut s4, b"open"), b"open");
}
