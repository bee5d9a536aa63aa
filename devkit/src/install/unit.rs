//! deploy/systemd's units as systemd reads them: the lines that start a service, and its
//! environment files, expanded as systemd expands them.

use std::collections::BTreeMap;

use anyhow::{bail, Result};

/// A unit's `ExecStartPre`, `ExecStart` and `EnvironmentFile` lines (`-` marks a file that
/// may be missing), `%i` replaced by the instance.
pub(crate) struct Unit {
    pub(crate) pre: Vec<String>,
    pub(crate) start: String,
    pub(crate) env_files: Vec<(String, bool)>,
}

/// Unit `name`'s text, read for the instance `instance` (empty for a plain unit).
pub(crate) fn parse_unit(name: &str, text: &str, instance: &str) -> Result<Unit> {
    let mut u = Unit {
        pre: vec![],
        start: String::new(),
        env_files: vec![],
    };
    for l in text.lines().map(|l| l.trim().replace("%i", instance)) {
        if let Some(v) = l.strip_prefix("ExecStartPre=") {
            u.pre.push(v.to_string());
        } else if let Some(v) = l.strip_prefix("ExecStart=") {
            u.start = v.to_string();
        } else if let Some(v) = l.strip_prefix("EnvironmentFile=") {
            match v.strip_prefix('-') {
                Some(v) => u.env_files.push((v.to_string(), true)),
                None => u.env_files.push((v.to_string(), false)),
            }
        }
    }
    if u.start.is_empty() {
        bail!("the unit {name} has no ExecStart");
    }
    Ok(u)
}

/// The words of a unit's command line, systemd's way: `${VAR}` is one word, a word that is
/// `$VAR` alone splits its value at whitespace.
pub(crate) fn expand(line: &str, env: &BTreeMap<String, String>) -> Vec<String> {
    let mut words = vec![];
    for w in line.split_whitespace() {
        if let Some(name) = w.strip_prefix('$').filter(|n| !n.starts_with('{')) {
            words.extend(
                env.get(name)
                    .map(|v| v.split_whitespace().map(str::to_string).collect::<Vec<_>>())
                    .unwrap_or_default(),
            );
            continue;
        }
        let mut out = w.to_string();
        for (k, v) in env {
            out = out.replace(&format!("${{{k}}}"), v);
        }
        words.push(out);
    }
    words
}

/// `args` (a unit's command line) with `extra` (the cluster's settings for the service)
/// after it: an option `--name VALUE` in `extra` replaces the unit's `--name VALUE`, which
/// the program would refuse to take twice (the guide's mount sets `--cache-size`, which a
/// harness with small cache disks sets too).
pub(crate) fn with_settings(args: &[String], extra: &[String]) -> Vec<String> {
    let given = |i: usize| {
        let flag = &extra[i];
        let valued = extra.get(i + 1).is_some_and(|v| !v.starts_with("--"));
        (flag.starts_with("--") && valued).then_some(flag)
    };
    let replaced: Vec<&String> = (0..extra.len()).filter_map(given).collect();
    let mut out = Vec::with_capacity(args.len() + extra.len());
    let mut i = 0;
    while i < args.len() {
        let valued = args.get(i + 1).is_some_and(|v| !v.starts_with("--"));
        if valued && replaced.contains(&&args[i]) {
            i += 2;
            continue;
        }
        out.push(args[i].clone());
        i += 1;
    }
    out.extend(extra.iter().cloned());
    out
}

/// `KEY=VALUE` lines of an environment file.
pub(crate) fn parse_env(text: &str) -> BTreeMap<String, String> {
    text.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_units_command_line_expands_as_systemd_does() {
        let env: BTreeMap<String, String> = [
            ("STRAIT_URL", "strait://10.0.2.10:7440"),
            ("STRAIT_MOUNT_ARGS", "--cache-dir /c --cache-size 50G"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        assert_eq!(
            expand(
                "strait mount ${STRAIT_URL} /m $STRAIT_MOUNT_ARGS $UNSET",
                &env
            ),
            vec![
                "strait",
                "mount",
                "strait://10.0.2.10:7440",
                "/m",
                "--cache-dir",
                "/c",
                "--cache-size",
                "50G"
            ]
        );
    }

    #[test]
    fn the_clusters_settings_replace_the_units_options() {
        let own = |a: &[&str]| a.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let unit = own(&[
            "mount",
            "u",
            "/m",
            "--cache-dir",
            "/c",
            "--cache-size",
            "50G",
        ]);
        // the unit's --cache-size gives way; a flag without a value is appended
        let settings = own(&["--cache-size", "24M", "--foreground"]);
        assert_eq!(
            with_settings(&unit, &settings),
            [&unit[..5], &settings[..]].concat()
        );
        // nothing to replace: appended as given
        assert_eq!(
            with_settings(&unit, &own(&["--ca", "x"])),
            [unit.clone(), own(&["--ca", "x"])].concat()
        );
    }

    #[test]
    fn a_template_unit_reads_with_its_instance() {
        let u = parse_unit(
            "strait-mount@.service",
            "[Service]\nEnvironmentFile=/etc/strait/mount-%i.env\nEnvironmentFile=-/etc/strait/s3.env\n\
             ExecStartPre=/bin/mkdir -p ${STRAIT_MOUNTPOINT}\nExecStart=/usr/local/bin/strait mount x\n",
            "data",
        )
        .unwrap();
        assert_eq!(
            u.env_files,
            vec![
                ("/etc/strait/mount-data.env".to_string(), false),
                ("/etc/strait/s3.env".to_string(), true)
            ]
        );
        assert_eq!(u.pre, vec!["/bin/mkdir -p ${STRAIT_MOUNTPOINT}"]);
        assert!(parse_unit("x.service", "[Service]\n", "").is_err());
    }
}
