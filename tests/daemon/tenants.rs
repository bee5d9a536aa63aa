//! Many teams on one file system (issue 43, item 2): a credential of the role `mount` may carry
//! rules (a subtree it is confined to, root squashing), here in its certificate (`strait certs
//! issue --subtree /team-a --root-squash`), and every daemon holds its calls to them: the
//! primary for its own mounts, the mirror for its region's (its reads from its own metadata,
//! its forwarded changes by passing the rules on to the primary).
//!
//! Two teams at two regions of `strait dev up --tls` (mutual TLS on every link). Team A's
//! FUSE mounts, at the primary and at the mirror, see `/team-a` as their whole file system,
//! and root there acts as 65534. Team A's plain gRPC clients then name team B's inodes (and
//! random inode numbers) in every call that takes one, at both regions: each is refused, and
//! team B's files are as they were. The answers are printed as a table.

use std::collections::BTreeSet;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::support::dev_up::DevUp;
use crate::support::wait_until;
use strait_proto::meta as w;
use strait_proto::meta::meta_service_client::MetaServiceClient;
use tonic::transport::Channel;
use tonic::{Code, Request, Status};

/// Team A's subtree.
const A: &str = "/team-a";

/// A client of the metadata service at `addr` presenting `pki`'s certificate `name` (no
/// token: the certificate names the role).
async fn client(pki: &Path, name: &str, addr: &str) -> MetaServiceClient<Channel> {
    let read = |f: &str| std::fs::read(pki.join(f)).unwrap();
    let tls = strait_auth::ClientTls {
        ca_pem: read("ca.pem"),
        identity: Some((read(&format!("{name}.pem")), read(&format!("{name}.key")))),
        domain: None,
    };
    let creds = strait_auth::Credentials::new(None, Some(tls)).unwrap();
    let ch = creds
        .endpoint(addr)
        .unwrap()
        .timeout(Duration::from_secs(60))
        .connect()
        .await
        .unwrap_or_else(|e| panic!("connect to {addr}: {e}"));
    MetaServiceClient::new(ch)
}

fn req<T>(msg: T, sid: u64) -> Request<T> {
    let mut r = Request::new(msg);
    if sid != 0 {
        r.metadata_mut()
            .insert("x-strait-session", sid.to_string().parse().unwrap());
    }
    r
}

/// Root's ids, as a mount run by root sends them.
fn root() -> Option<w::Ctx> {
    Some(w::Ctx {
        uid: 0,
        gid: 0,
        groups: vec![0],
        pid: 1,
    })
}

/// A call's answer for the table: `OK` or the status code and errno.
fn said<T>(r: &Result<tonic::Response<T>, Status>) -> String {
    match r {
        Ok(_) => "OK".into(),
        Err(s) => match strait_proto::status_errno(s) {
            Some(e) => format!("{:?} ({})", s.code(), errno_name(e)),
            None => format!("{:?}", s.code()),
        },
    }
}

fn errno_name(e: i32) -> &'static str {
    match e {
        libc::ENOENT => "ENOENT",
        libc::EACCES => "EACCES",
        libc::EPERM => "EPERM",
        libc::EBADF => "EBADF",
        libc::EXDEV => "EXDEV",
        _ => "another errno",
    }
}

async fn open_session(c: &mut MetaServiceClient<Channel>, resume: u64) -> Result<u64, Status> {
    c.open_session(req(
        w::OpenSessionRequest {
            info: "tenants".into(),
            resume_session: resume,
            ..Default::default()
        },
        0,
    ))
    .await
    .map(|r| r.into_inner().session)
}

/// Every name under `dir`, with its inode number (a walk of an unrestricted mount).
fn walk(dir: &Path) -> Vec<(PathBuf, u64)> {
    let mut out = vec![];
    for e in std::fs::read_dir(dir).unwrap() {
        let e = e.unwrap();
        let p = e.path();
        out.push((p.clone(), e.metadata().unwrap().ino()));
        if e.file_type().unwrap().is_dir() {
            out.extend(walk(&p));
        }
    }
    out
}

/// What team B holds, as an unrestricted mount reads it: each path and its bytes (or
/// `dir`), and the xattr of its file.
fn team_b_state(mnt: &Path) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = walk(&mnt.join("team-b"))
        .into_iter()
        .map(|(p, _)| {
            let what = if p.is_dir() {
                "dir".to_string()
            } else {
                String::from_utf8_lossy(&std::fs::read(&p).unwrap()).into_owned()
            };
            (p.display().to_string(), what)
        })
        .collect();
    out.sort();
    out
}

fn setxattr(p: &Path, name: &str, value: &[u8]) {
    let path = std::ffi::CString::new(p.as_os_str().as_encoded_bytes()).unwrap();
    let name = std::ffi::CString::new(name).unwrap();
    // SAFETY: both strings are NUL-terminated and live across the call
    let rc = unsafe {
        libc::setxattr(
            path.as_ptr(),
            name.as_ptr(),
            value.as_ptr().cast(),
            value.len(),
            0,
        )
    };
    assert_eq!(
        rc,
        0,
        "setxattr {}: {}",
        p.display(),
        std::io::Error::last_os_error()
    );
}

/// A FUSE mount of `addr` with `pki`'s certificate `name`, at `at`; unmounted when dropped.
struct TeamMount {
    at: PathBuf,
    child: std::process::Child,
}

impl TeamMount {
    fn start(pki: &Path, name: &str, addr: &str, at: &Path) -> TeamMount {
        std::fs::create_dir_all(at).unwrap();
        let log = at.with_extension("log");
        let f = |s: &str| pki.join(s).display().to_string();
        let args: Vec<String> = vec![
            "mount".into(),
            format!("strait://{addr}"),
            at.display().to_string(),
            "--tls-ca".into(),
            f("ca.pem"),
            "--tls-cert".into(),
            f(&format!("{name}.pem")),
            "--tls-key".into(),
            f(&format!("{name}.key")),
            "--cache-dir".into(),
            at.with_extension("cache").display().to_string(),
        ];
        let child = crate::support::spawn_strait(args, vec![], log.clone(), false)
            .expect("start strait mount");
        wait_until("the team's mount", Duration::from_secs(30), || {
            let mounted = std::fs::read_to_string("/proc/mounts")
                .unwrap_or_default()
                .contains(&format!(" {} fuse", at.display()));
            if mounted {
                Ok(())
            } else {
                Err(std::fs::read_to_string(&log).unwrap_or_default())
            }
        });
        TeamMount {
            at: at.to_path_buf(),
            child,
        }
    }
}

impl Drop for TeamMount {
    fn drop(&mut self) {
        let _ = std::process::Command::new("fusermount3")
            .arg("-u")
            .arg(&self.at)
            .status();
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn two_teams_at_two_regions_over_mutual_tls_each_reach_only_their_own_subtree() {
    let work = tempfile::tempdir().unwrap();
    let dev = DevUp::start(&work.path().join("dev"), &["--tls"]);
    let t = dev.topology();
    let s = |k: &str| t[k].as_str().unwrap().to_string();
    let (primary, mirror, pki) = (s("primary"), s("mirror"), PathBuf::from(s("pki")));
    let (ma, mb) = (PathBuf::from(s("mount_a")), PathBuf::from(s("mount_b")));

    // the operator's part, at an unrestricted mount: the teams' directories, team B's files
    for d in ["team-a", "team-b", "team-b/sub"] {
        std::fs::create_dir(ma.join(d)).unwrap();
    }
    for d in ["team-a", "team-b"] {
        std::fs::set_permissions(
            ma.join(d),
            std::os::unix::fs::PermissionsExt::from_mode(0o777),
        )
        .unwrap();
    }
    std::fs::write(ma.join("team-b/secret"), b"team b's secret\n").unwrap();
    std::fs::write(ma.join("team-b/sub/deep"), b"deeper\n").unwrap();
    setxattr(&ma.join("team-b/secret"), "user.owner", b"team-b");
    // a file of root's in team A's own directory, which squashed root may read, not write
    std::fs::write(ma.join("team-a/roots"), b"root's own\n").unwrap();
    for (name, subtree) in [("team-a", A), ("team-b", "/team-b")] {
        let out = std::process::Command::new(crate::support::strait_bin())
            .args(["certs", "issue", "--dir"])
            .arg(&pki)
            .args(["--name", name, "--role", "mount", "--host", "127.0.0.1"])
            .args(["--subtree", subtree, "--root-squash"])
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
        eprintln!("{}", String::from_utf8_lossy(&out.stdout).trim());
    }
    let b_inodes: Vec<(PathBuf, u64)> = std::iter::once((
        ma.join("team-b"),
        std::fs::metadata(ma.join("team-b")).unwrap().ino(),
    ))
    .chain(walk(&ma.join("team-b")))
    .collect();
    let ino_of = |rel: &str| {
        b_inodes
            .iter()
            .find(|(p, _)| p.ends_with(rel))
            .map(|(_, i)| *i)
            .unwrap()
    };
    let (b_dir, secret, sub) = (ino_of("team-b"), ino_of("secret"), ino_of("sub"));
    let before = team_b_state(&ma);
    // the mirror has it all before team A looks there
    wait_until(
        "the mirror has team B's files",
        Duration::from_secs(30),
        || mb.join("team-b/sub/deep").exists() && mb.join("team-a/roots").exists(),
    );

    // team A's mounts at both regions: /team-a is their root, root acts as 65534
    for (region, addr) in [("A", &primary), ("B", &mirror)] {
        let at = work.path().join(format!("team-a-{region}"));
        let m = TeamMount::start(&pki, "team-a", addr, &at);
        let names: BTreeSet<String> = std::fs::read_dir(&at)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert!(names.contains("roots"), "{region}: {names:?}");
        assert!(
            !names.contains("team-b") && !names.contains("team-a"),
            "{region}: {names:?}"
        );
        // ".." of the root is the root: nothing above it
        let up: BTreeSet<String> = std::fs::read_dir(at.join(".."))
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert!(!up.contains("team-b"), "{region}: {up:?}");
        assert!(std::fs::metadata(at.join("../team-b")).is_err() || up.contains("roots"));
        let mine = at.join(format!("written-at-{region}"));
        std::fs::write(&mine, format!("team a at {region}\n")).unwrap();
        assert_eq!(
            std::fs::read_to_string(&mine).unwrap(),
            format!("team a at {region}\n")
        );
        let md = std::fs::metadata(&mine).unwrap();
        assert_eq!(
            (md.uid(), md.gid()),
            (65_534, 65_534),
            "{region}: squashed root"
        );
        // root's file: readable, not writable by the squashed root
        assert_eq!(std::fs::read(at.join("roots")).unwrap(), b"root's own\n");
        let e = std::fs::OpenOptions::new()
            .append(true)
            .open(at.join("roots"))
            .unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::EACCES), "{region}: {e}");
        eprintln!(
            "team A's mount at region {region}: sees {names:?}, writes as {}:{}, root's file \
             refused for writing ({e})",
            md.uid(),
            md.gid()
        );
        drop(m);
        // the file is under /team-a for everyone else
        wait_until(
            "the team's file at the primary",
            Duration::from_secs(10),
            || ma.join(format!("team-a/written-at-{region}")).exists(),
        );
    }
    // team A's own inodes: its directory and what lies in it
    let mut a_inodes: BTreeSet<u64> = walk(&ma.join("team-a")).iter().map(|(_, i)| *i).collect();
    a_inodes.insert(std::fs::metadata(ma.join("team-a")).unwrap().ino());

    // team A's plain gRPC clients, at both regions: every call naming team B's inodes
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let mut table: Vec<(String, String, String)> = vec![];
    rt.block_on(async {
        for (region, addr) in [("A", &primary), ("B", &mirror)] {
            let mut a = client(&pki, "team-a", addr).await;
            let mut b = client(&pki, "team-b", addr).await;
            let sa = open_session(&mut a, 0).await.unwrap();
            let sb = open_session(&mut b, 0).await.unwrap();
            let mut row = |call: &str, got: String| {
                table.push((region.to_string(), call.to_string(), got));
            };
            let x = |name: &str| w::XattrRequest {
                ctx: root(),
                ino: secret,
                name: name.into(),
            };
            macro_rules! refused {
                ($call:expr, $fut:expr) => {{
                    let r = $fut.await;
                    assert!(r.is_err(), "{region}: {} was answered OK", $call);
                    row($call, said(&r));
                }};
            }
            refused!(
                "Lookup(team-a's root, \"team-b\")",
                a.lookup(req(
                    w::LookupRequest {
                        ctx: root(),
                        parent: 1,
                        name: b"team-b".to_vec()
                    },
                    sa
                ))
            );
            refused!(
                "Lookup(team-b, \"secret\")",
                a.lookup(req(
                    w::LookupRequest {
                        ctx: root(),
                        parent: b_dir,
                        name: b"secret".to_vec()
                    },
                    sa
                ))
            );
            // ".." of its root is its root
            let up = a
                .lookup(req(
                    w::LookupRequest {
                        ctx: root(),
                        parent: 1,
                        name: b"..".to_vec(),
                    },
                    sa,
                ))
                .await
                .unwrap()
                .into_inner();
            assert_eq!(up.ino, 1, "{region}");
            row(
                "Lookup(team-a's root, \"..\")",
                format!("OK: inode {}", up.ino),
            );
            for (what, ino) in [
                ("team-b", b_dir),
                ("team-b/secret", secret),
                ("team-b/sub", sub),
            ] {
                refused!(
                    &format!("GetAttr({what})"),
                    a.get_attr(req(w::InodeRequest { ctx: root(), ino }, sa))
                );
            }
            refused!(
                "ReadDir(team-b)",
                a.read_dir(req(
                    w::InodeRequest {
                        ctx: root(),
                        ino: b_dir
                    },
                    sa
                ))
            );
            refused!(
                "ReadDir(team-b/sub)",
                a.read_dir(req(
                    w::InodeRequest {
                        ctx: root(),
                        ino: sub
                    },
                    sa
                ))
            );
            refused!(
                "Access(team-b/secret)",
                a.access(req(
                    w::AccessRequest {
                        ctx: root(),
                        ino: secret,
                        mask: libc::R_OK as u32
                    },
                    sa
                ))
            );
            refused!(
                "Open(team-b/secret) by inode number",
                a.open(req(
                    w::OpenRequest {
                        ctx: root(),
                        ino: secret,
                        flags: libc::O_RDONLY,
                        chunk0: true
                    },
                    sa
                ))
            );
            refused!(
                "ReadChunk(team-b/secret, 0)",
                a.read_chunk(req(
                    w::ChunkRequest {
                        ino: secret,
                        index: 0
                    },
                    sa
                ))
            );
            refused!(
                "GetXattr(team-b/secret)",
                a.get_xattr(req(x("user.owner"), sa))
            );
            refused!(
                "ListXattr(team-b/secret)",
                a.list_xattr(req(
                    w::InodeRequest {
                        ctx: root(),
                        ino: secret
                    },
                    sa
                ))
            );
            refused!(
                "SetXattr(team-b/secret)",
                a.set_xattr(req(
                    w::SetXattrRequest {
                        ctx: root(),
                        ino: secret,
                        name: "user.owner".into(),
                        value: b"team-a".to_vec(),
                        flags: 0
                    },
                    sa
                ))
            );
            refused!(
                "RemoveXattr(team-b/secret)",
                a.remove_xattr(req(x("user.owner"), sa))
            );
            refused!(
                "SetAttr(team-b/secret, mode 0777)",
                a.set_attr(req(
                    w::SetAttrRequest {
                        ctx: root(),
                        ino: secret,
                        mode: Some(0o777),
                        ..Default::default()
                    },
                    sa
                ))
            );
            refused!(
                "SetAttr(team-b/secret, size 0, through a handle)",
                a.set_attr(req(
                    w::SetAttrRequest {
                        ctx: root(),
                        ino: secret,
                        size: Some(0),
                        via_handle: true,
                        ..Default::default()
                    },
                    sa
                ))
            );
            refused!(
                "Unlink(team-b, \"secret\")",
                a.unlink(req(
                    w::NameRequest {
                        ctx: root(),
                        parent: b_dir,
                        name: b"secret".to_vec()
                    },
                    sa
                ))
            );
            refused!(
                "Rename(team-b/secret -> team-a/stolen)",
                a.rename(req(
                    w::RenameRequest {
                        ctx: root(),
                        parent: b_dir,
                        name: b"secret".to_vec(),
                        new_parent: 1,
                        new_name: b"stolen".to_vec(),
                        flags: 0
                    },
                    sa
                ))
            );
            refused!(
                "Link(team-b/secret -> team-a/stolen)",
                a.link(req(
                    w::LinkRequest {
                        ctx: root(),
                        ino: secret,
                        new_parent: 1,
                        new_name: b"stolen".to_vec()
                    },
                    sa
                ))
            );
            refused!(
                "Create(team-b, \"planted\")",
                a.create(req(
                    w::MkNodRequest {
                        ctx: root(),
                        parent: b_dir,
                        name: b"planted".to_vec(),
                        mode: 0o644,
                        ..Default::default()
                    },
                    sa
                ))
            );
            refused!(
                "Symlink(team-b, \"planted\")",
                a.symlink(req(
                    w::SymlinkRequest {
                        ctx: root(),
                        parent: b_dir,
                        name: b"planted".to_vec(),
                        target: b"/etc/passwd".to_vec()
                    },
                    sa
                ))
            );
            refused!(
                "ReadLink(team-b/secret)",
                a.read_link(req(
                    w::InodeRequest {
                        ctx: root(),
                        ino: secret
                    },
                    sa
                ))
            );
            refused!(
                "SetLk(team-b/secret)",
                a.set_lk(req(
                    w::LockRequest {
                        ino: secret,
                        owner: 7,
                        pid: 1,
                        typ: 1,
                        start: 0,
                        end: 10
                    },
                    sa
                ))
            );
            refused!(
                "Flock(team-b/secret)",
                a.flock(req(
                    w::FlockRequest {
                        ino: secret,
                        owner: 7,
                        typ: 1
                    },
                    sa
                ))
            );
            // team B's session, named by team A
            refused!(
                "CloseSession(team B's)",
                a.close_session(req(w::Empty {}, sb))
            );
            let r = open_session(&mut a, sb).await;
            assert_eq!(
                r.as_ref().map_err(|s| s.code()),
                Err(Code::PermissionDenied)
            );
            row(
                "OpenSession(resume team B's)",
                format!("{:?}", Code::PermissionDenied),
            );
            // squashed root may not write data through a handle it did not open for writing
            let roots = a
                .lookup(req(
                    w::LookupRequest {
                        ctx: root(),
                        parent: 1,
                        name: b"roots".to_vec(),
                    },
                    sa,
                ))
                .await
                .unwrap()
                .into_inner()
                .ino;
            // nor read a file's data without a handle on it (its open checks the permission)
            refused!(
                "ReadChunk(team-a/roots) without a handle",
                a.read_chunk(req(
                    w::ChunkRequest {
                        ino: roots,
                        index: 0
                    },
                    sa
                ))
            );
            a.open(req(
                w::OpenRequest {
                    ctx: root(),
                    ino: roots,
                    flags: libc::O_RDONLY,
                    chunk0: false,
                },
                sa,
            ))
            .await
            .unwrap();
            let got = a
                .read_chunk(req(
                    w::ChunkRequest {
                        ino: roots,
                        index: 0,
                    },
                    sa,
                ))
                .await;
            assert!(got.is_ok(), "{region}: ReadChunk through a handle: {got:?}");
            row(
                "ReadChunk(team-a/roots) through a read-only handle",
                "OK".into(),
            );
            refused!(
                "SetAttr(team-a/roots, size 0, through a read-only handle)",
                a.set_attr(req(
                    w::SetAttrRequest {
                        ctx: root(),
                        ino: roots,
                        size: Some(0),
                        via_handle: true,
                        ..Default::default()
                    },
                    sa
                ))
            );
            refused!(
                "WriteSlice(team-a/roots, through a read-only handle)",
                a.write_slice(req(
                    w::WriteSliceRequest {
                        ino: roots,
                        index: 0,
                        slice: Some(w::SliceRef {
                            id: 1,
                            size: 3,
                            off: 0,
                            len: 3,
                            pos: 0,
                            crcs: vec![0]
                        }),
                        mtime_ns: 0
                    },
                    sa
                ))
            );
            // random inode numbers: none outside /team-a answers anything but ENOENT
            let mut answered = std::collections::BTreeMap::<String, usize>::new();
            let mut guesses: Vec<u64> = (2..400).collect();
            guesses.extend((0..200).map(|_| rand::random::<u64>() >> 1));
            guesses.retain(|i| !a_inodes.contains(i));
            let guessed = guesses.len();
            for ino in guesses {
                let r = a
                    .get_attr(req(w::InodeRequest { ctx: root(), ino }, sa))
                    .await;
                let got = said(&r);
                assert!(
                    got.contains("ENOENT"),
                    "{region}: GetAttr of inode {ino} (outside /team-a): {got}"
                );
                *answered.entry(got).or_default() += 1;
                let r = a
                    .read_dir(req(w::InodeRequest { ctx: root(), ino }, sa))
                    .await;
                assert!(r.is_err(), "{region}: ReadDir of inode {ino} answered");
                let r = a
                    .open(req(
                        w::OpenRequest {
                            ctx: root(),
                            ino,
                            flags: libc::O_RDWR,
                            chunk0: true,
                        },
                        sa,
                    ))
                    .await;
                assert!(r.is_err(), "{region}: Open of inode {ino} answered");
                let r = a
                    .read_chunk(req(w::ChunkRequest { ino, index: 0 }, sa))
                    .await;
                assert!(r.is_err(), "{region}: ReadChunk of inode {ino} answered");
                let r = a
                    .create(req(
                        w::MkNodRequest {
                            ctx: root(),
                            parent: ino,
                            name: b"planted".to_vec(),
                            mode: 0o644,
                            ..Default::default()
                        },
                        sa,
                    ))
                    .await;
                assert!(r.is_err(), "{region}: Create under inode {ino} answered");
            }
            row(
                &format!(
                    "GetAttr, ReadDir, Open, ReadChunk and Create naming each of {guessed} \
                     guessed inode numbers outside /team-a"
                ),
                format!("GetAttr: {answered:?}; every other call refused"),
            );
            a.close_session(req(w::Empty {}, sa)).await.unwrap();
            b.close_session(req(w::Empty {}, sb)).await.unwrap();
        }
    });
    eprintln!("\n| region | team A's call | answer |\n|---|---|---|");
    for (region, call, got) in &table {
        eprintln!("| {region} | {call} | {got} |");
    }
    // nothing of team B's changed, at either region
    assert_eq!(team_b_state(&ma), before);
    wait_until("the mirror agrees", Duration::from_secs(10), || {
        let at_b: Vec<(String, String)> = team_b_state(&mb)
            .into_iter()
            .map(|(p, v)| {
                (
                    p.replace(&mb.display().to_string(), &ma.display().to_string()),
                    v,
                )
            })
            .collect();
        if at_b == before {
            Ok(())
        } else {
            Err(format!("{at_b:?}"))
        }
    });
    assert!(!ma.join("team-a/stolen").exists());
    assert!(!ma.join("team-b/planted").exists());
    // nowhere else either: the top holds the two teams' directories alone, and nothing was
    // planted in any directory
    let top: BTreeSet<String> = std::fs::read_dir(&ma)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(top, BTreeSet::from(["team-a".into(), "team-b".into()]));
    assert!(walk(&ma).iter().all(|(p, _)| !p.ends_with("planted")));
    drop(dev);
}

/// The same rules for a token, from `[[credentials]]` in the primary's TOML: a named
/// credential is confined and squashed (`all_squash`), its principal is its name (a session
/// opened with one of its tokens is resumed with the other, as when a token is replaced), and
/// a plain mount token cannot take its session up.
#[test]
fn a_named_token_from_the_toml_is_confined_squashed_and_one_principal_across_its_tokens() {
    use crate::support::daemon::Primary;
    use crate::support::mount::TestFs;
    use crate::support::site::Site;
    const OLD: &str = "team-c-old-token-0123456789";
    const NEW: &str = "team-c-new-token-0123456789";
    let fs = TestFs::rocks_local(&[]);
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("primary.toml");
    std::fs::write(
        &config,
        format!(
            "[[credentials]]\nname = \"team-c\"\ntoken = [\"{OLD}\", \"{NEW}\"]\n\
             subtree = \"/team-c\"\nall_squash = true\nanon_uid = 5000\nanon_gid = 5000\n"
        ),
    )
    .unwrap();
    let check = std::process::Command::new(crate::support::strait_bin())
        .args([
            "primary",
            "--meta-url",
            &fs.meta_url,
            "--token",
            "test-token-0123456789abc",
        ])
        .arg("--config")
        .arg(&config)
        .arg("--check-config")
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&check.stdout);
    assert!(
        said.contains(
            "credential: team-c (roles mount; subtree=/team-c;all_squash;anon_uid=5000;anon_gid=5000)"
        ),
        "{said}"
    );
    let config_arg = config.display().to_string();
    let daemon = Primary::start(&fs.meta_url, &[], &["--config", &config_arg]);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let mut op = Site::connect(&daemon.addr, &daemon.token).await;
        // before its subtree exists, the credential's session is refused, saying why
        let mut early = crate::support::site::meta_client(&daemon.addr).await;
        let e = early
            .open_session(crate::support::site::request(
                w::OpenSessionRequest::default(),
                OLD,
                0,
            ))
            .await
            .unwrap_err();
        assert_eq!(e.code(), Code::FailedPrecondition);
        assert!(e.message().contains("/team-c") && e.message().contains("does not exist"));
        let c_dir = op.mkdir(1, "team-c").await.unwrap();
        op.chmod(c_dir, 0o777).await.unwrap();
        let other = op.mkdir(1, "other").await.unwrap();

        let mut c = Site::connect(&daemon.addr, OLD).await;
        let f = c.mknod(1, "f").await.unwrap();
        assert_eq!(op.lookup(c_dir, "f").await.unwrap(), f);
        let attr =
            op.c.get_attr(op.req(w::InodeRequest {
                ctx: root(),
                ino: f,
            }))
            .await
            .unwrap()
            .into_inner()
            .attr
            .unwrap();
        assert_eq!((attr.uid, attr.gid), (5000, 5000), "all_squash");
        assert_eq!(attr.parent, c_dir);
        // its own view: the root is /team-c, whose entry's parent is 1
        let own =
            c.c.get_attr(c.req(w::InodeRequest {
                ctx: root(),
                ino: f,
            }))
            .await
            .unwrap()
            .into_inner()
            .attr
            .unwrap();
        assert_eq!(own.parent, 1);
        assert_eq!(c.names(1).await.unwrap(), BTreeSet::from(["f".to_string()]));
        assert_eq!(
            c.lookup(1, "other").await.unwrap_err().code(),
            Code::NotFound
        );
        let e =
            c.c.get_attr(c.req(w::InodeRequest {
                ctx: root(),
                ino: other,
            }))
            .await
            .unwrap_err();
        assert_eq!(e.code(), Code::NotFound);
        // the other token is the same principal: it takes the session up
        let mut rotated = crate::support::site::meta_client(&daemon.addr).await;
        let r = rotated
            .open_session(crate::support::site::request(
                w::OpenSessionRequest {
                    resume_session: c.sid,
                    ..Default::default()
                },
                NEW,
                0,
            ))
            .await
            .unwrap()
            .into_inner();
        assert!(r.resumed);
        assert_eq!(r.session, c.sid);
        // a plain mount token is another principal
        let e = rotated
            .open_session(crate::support::site::request(
                w::OpenSessionRequest {
                    resume_session: c.sid,
                    ..Default::default()
                },
                &daemon.token,
                0,
            ))
            .await
            .unwrap_err();
        assert_eq!(e.code(), Code::PermissionDenied);
    });
}
