//! strait's dev and test kit: what the tests, the benchmarks and `strait dev up` need to run
//! strait on one machine.
//!
//! - [`process`]: child processes tied to this one ([`process::spawn_tied_with`]): the
//!   servers, daemons and mounts that a test, a benchmark or `dev up` starts never outlive
//!   it, and get no copy of its files (forked from a file table of their own);
//! - [`ports`]: free ports on 127.0.0.1 that no other server of this process was given and
//!   that an outgoing connection cannot take first ([`free_port`]);
//! - [`garage`]: a single-node Garage S3 server, ready to use ([`Garage`]);
//! - [`redis`]: a throwaway Redis server ([`redis::RedisServer`]);
//! - [`pki`]: a CA and certificates naming their holders' roles, for TLS on this machine;
//! - [`proxy`]: a TCP fault proxy (delay, bandwidth cap, blackhole, resets) to put between
//!   processes, as between regions ([`Proxy`]);
//! - [`install`]: deploy/README.md's installation (its hosts, files and steps), carried out
//!   on a placement of the hosts;
//! - [`cluster`]: `strait dev up`: the installation on this machine's loopback, with a fault
//!   proxy on every link between two regions and dev up's settings over the guide's files;
//! - [`netns`]: the installation on network namespaces at the guide's addresses (`strait dev
//!   netns`);
//! - [`tls_front`]: a TLS front relaying to a plain-text server (S3 over `https`);
//! - [`usage`]: CPU time and resident memory, of this machine and of a process, for the
//!   benchmarks' figures.

pub mod cluster;
pub mod garage;
pub mod install;
pub mod mounts;
pub mod netns;
pub mod pki;
pub mod ports;
pub mod process;
pub mod proxy;
pub mod redis;
pub mod tls_front;
pub mod usage;

pub use garage::{Garage, ACCESS_KEY, BUCKET, REGION, SECRET_KEY};
pub use ports::{distinct_free_ports, free_port};
pub use process::spawn_tied;
pub use proxy::{Direction, Faults, Link, Proxy, Stats};
