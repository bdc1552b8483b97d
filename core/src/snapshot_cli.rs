//! `keel snapshot status|restore`: etcdctl's snapshot subcommands for moving from etcd.
//!
//! - `keel snapshot status FILE [-w simple|json|table|fields]` prints what
//!   `etcdctl snapshot status` prints, for a snapshot from etcd or from Keel (both are etcd 3.4
//!   bbolt databases).
//! - `keel snapshot restore FILE [--skip-hash-check] --name … --data-dir … --initial-cluster …
//!   --initial-cluster-token … --initial-advertise-peer-urls …` checks the trailing SHA-256 as
//!   etcdctl does and makes a new member's data directory: its identity (from the same flags
//!   `keel` takes, so every member restored from one file with one set of flags computes the
//!   same ids) and one checkpoint at the bootstrap position (raft index 1, term 1) holding every
//!   key with its revisions, the leases, the compact revision and the auth store (users with
//!   their password hashes, roles, the enabled flag, the auth revision). As with etcdctl, the
//!   members form a new cluster; the snapshot's membership and alarms are left behind.

use std::ffi::OsString;
use std::path::Path;

use clap::Parser;
use keel_kv as kv;

use crate::checkpoint;
use crate::config::{normalize_go_args, Config, Flags};
use crate::error::CoreError;
use crate::etcd_snapshot;
use crate::ids::{write_durably, Identity};

/// The raft position a restored member starts from: a new cluster's bootstrap snapshot.
const RESTORED_INDEX: u64 = 1;
const RESTORED_TERM: u64 = 1;

const USAGE: &str = "usage: keel snapshot status FILE [-w simple|json|table|fields]\n       \
                     keel snapshot restore FILE [--skip-hash-check] [--name N] [--data-dir D] \
                     [--wal-dir W] [--initial-cluster C] [--initial-cluster-token T] \
                     [--initial-advertise-peer-urls U]";

/// Runs `keel snapshot ARGS...` (ARGS after "snapshot"); returns the process's exit code.
pub fn run(args: &[String]) -> i32 {
    let result = match args.first().map(String::as_str) {
        Some("status") => status(&args[1..]),
        Some("restore") => restore(&args[1..]),
        _ => Err(CoreError::Config(USAGE.into())),
    };
    match result {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("Error: {e}");
            1
        }
    }
}

/// etcdctl's output formats for `snapshot status`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    Simple,
    Json,
    Table,
    Fields,
}

fn status(args: &[String]) -> Result<(), CoreError> {
    let mut format = Format::Simple;
    let mut file = None;
    let mut i = 0;
    while i < args.len() {
        let arg = args[i].as_str();
        let value = if arg == "-w" || arg == "--write-out" {
            i += 1;
            args.get(i).map(String::as_str)
        } else {
            arg.strip_prefix("--write-out=")
                .or_else(|| arg.strip_prefix("-w="))
        };
        match value {
            Some(v) => {
                format = match v {
                    "simple" => Format::Simple,
                    "json" => Format::Json,
                    "table" => Format::Table,
                    "fields" => Format::Fields,
                    other => {
                        return Err(CoreError::Config(format!(
                            "unknown output format {other:?}"
                        )))
                    }
                }
            }
            None if arg.starts_with('-') => {
                return Err(CoreError::Config(format!("unknown flag {arg}\n{USAGE}")))
            }
            None if file.is_none() => file = Some(arg.to_string()),
            None => {
                return Err(CoreError::Config(
                    "snapshot status requires exactly one argument".into(),
                ))
            }
        }
        i += 1;
    }
    let file = file
        .ok_or_else(|| CoreError::Config("snapshot status requires exactly one argument".into()))?;
    let db = etcd_snapshot::open_file(Path::new(&file))?;
    let status = db
        .status()
        .map_err(|e| CoreError::Snapshot(e.to_string()))?;
    print!("{}", render_status(&status, format));
    Ok(())
}

/// go-humanize's `Bytes`: SI units, one decimal below 10.
fn humanize_bytes(n: u64) -> String {
    const UNITS: [&str; 7] = ["B", "kB", "MB", "GB", "TB", "PB", "EB"];
    if n < 10 {
        return format!("{n} B");
    }
    let e = ((n as f64).ln() / 1000f64.ln()).floor() as usize;
    let e = e.min(UNITS.len() - 1);
    let value = ((n as f64) / 1000f64.powi(e as i32) * 10.0 + 0.5).floor() / 10.0;
    if value < 10.0 {
        format!("{value:.1} {}", UNITS[e])
    } else {
        format!("{value:.0} {}", UNITS[e])
    }
}

/// `etcdctl snapshot status -w FORMAT`'s output, byte for byte.
pub fn render_status(s: &kv::bbolt::Status, format: Format) -> String {
    let row = [
        format!("{:x}", s.hash),
        s.revision.to_string(),
        s.total_key.to_string(),
        humanize_bytes(s.total_size),
    ];
    match format {
        Format::Simple => format!("{}\n", row.join(", ")),
        Format::Json => format!(
            "{{\"hash\":{},\"revision\":{},\"totalKey\":{},\"totalSize\":{}}}\n",
            s.hash, s.revision, s.total_key, s.total_size
        ),
        Format::Fields => format!(
            "\"Hash\" : {}\n\"Revision\" : {}\n\"Keys\" : {}\n\"Size\" : {}\n",
            s.hash, s.revision, s.total_key, s.total_size
        ),
        Format::Table => {
            // olekukonko/tablewriter as etcdctl sets it: upper-case centred headers, cells
            // aligned right, one space of padding.
            let header = ["HASH", "REVISION", "TOTAL KEYS", "TOTAL SIZE"];
            let widths: Vec<usize> = header
                .iter()
                .zip(&row)
                .map(|(h, c)| h.len().max(c.len()))
                .collect();
            let rule: String = widths
                .iter()
                .map(|w| format!("+{}", "-".repeat(w + 2)))
                .collect::<String>()
                + "+\n";
            let mut out = rule.clone();
            for (h, w) in header.iter().zip(&widths) {
                let gap = w - h.len();
                let left = gap / 2;
                out += &format!("| {}{}{} ", " ".repeat(left), h, " ".repeat(gap - left));
            }
            out += "|\n";
            out += &rule;
            for (c, w) in row.iter().zip(&widths) {
                out += &format!("| {c:>w$} ");
            }
            out += "|\n";
            out += &rule;
            out
        }
    }
}

fn restore(args: &[String]) -> Result<(), CoreError> {
    let mut skip_hash_check = false;
    let mut file = None;
    let mut flags: Vec<String> = vec!["keel".into()];
    let mut i = 0;
    while i < args.len() {
        let arg = &args[i];
        match arg.as_str() {
            "--skip-hash-check" | "--skip-hash-check=true" => skip_hash_check = true,
            "--skip-hash-check=false" => skip_hash_check = false,
            a if a.starts_with('-') => {
                flags.push(a.to_string());
                // A flag's value as its own argument ("--name x"); "--name=x" carries it.
                if !a.contains('=') {
                    if let Some(v) = args.get(i + 1).filter(|v| !v.starts_with('-')) {
                        flags.push(v.clone());
                        i += 1;
                    }
                }
            }
            a if file.is_none() => file = Some(a.to_string()),
            _ => {
                return Err(CoreError::Config(
                    "snapshot restore requires exactly one argument".into(),
                ))
            }
        }
        i += 1;
    }
    let file = file.ok_or_else(|| {
        CoreError::Config("snapshot restore requires exactly one argument".into())
    })?;
    let parsed = Flags::try_parse_from(normalize_go_args(flags).into_iter().map(OsString::from))
        .map_err(|e| CoreError::Config(e.to_string()))?;
    let config = Config::from_flags(parsed)?;
    restore_into(Path::new(&file), &config, skip_hash_check)?;
    println!(
        "restored snapshot {} into member {:?} at {}",
        file,
        config.name,
        config.data_dir.display()
    );
    Ok(())
}

/// Makes `config`'s data directory from the snapshot at `path` (see the module's description).
pub fn restore_into(path: &Path, config: &Config, skip_hash_check: bool) -> Result<(), CoreError> {
    for dir in [&config.data_dir, &config.wal_dir] {
        if dir.exists() {
            return Err(CoreError::Config(format!(
                "data-dir {:?} exists",
                dir.display().to_string()
            )));
        }
    }
    if !skip_hash_check {
        etcd_snapshot::verify_sha256(path)?;
    }
    let db = etcd_snapshot::open_file(path)?;
    let imported = etcd_snapshot::read_db(&db)?;
    let keys = imported.versions.len();
    // The auth store goes into the checkpoint whole: users keep their bcrypt hashes (so their
    // passwords work as before), roles their permissions, the flag and the revision stay.
    let auth = imported.auth;
    let image = kv::image_from_versions(
        RESTORED_INDEX,
        imported.current_rev,
        imported.compact_rev,
        imported.leases,
        imported.versions,
    )
    .map_err(|e| CoreError::Snapshot(e.to_string()))?;
    let identity = Identity::from_config(config);
    let mut voters: Vec<u64> = identity.members.iter().map(|m| m.id).collect();
    voters.sort_unstable();
    let conf_state = keel_raft::ConfState {
        voters,
        learners: Vec::new(),
    };
    let file = checkpoint::encode(
        RESTORED_INDEX,
        RESTORED_TERM,
        &conf_state,
        checkpoint::ClusterState {
            members: &identity.members,
            alarms: &[],
            auth: &auth,
            // A restored member starts a new cluster: no member of it was ever removed.
            removed: &[],
        },
        &image,
    );
    let snap_dir = config.data_dir.join("snap");
    write_durably(
        &snap_dir,
        &snap_dir.join(checkpoint::file_name(RESTORED_INDEX)),
        &file,
    )?;
    identity.save(&config.data_dir)?;
    tracing::info!(
        revisions = keys,
        revision = imported.current_rev,
        compact_revision = imported.compact_rev,
        auth_enabled = auth.enabled,
        auth_users = auth.users.len(),
        auth_roles = auth.roles.len(),
        member_id = identity.member_id,
        cluster_id = identity.cluster_id,
        "restored a snapshot"
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_read_as_go_humanize_prints_them() {
        assert_eq!(humanize_bytes(5), "5 B");
        assert_eq!(humanize_bytes(20480), "20 kB");
        assert_eq!(humanize_bytes(2_140_000), "2.1 MB");
        assert_eq!(humanize_bytes(2_150_000), "2.2 MB");
        assert_eq!(humanize_bytes(999), "999 B");
    }

    #[test]
    fn the_table_is_etcdctls() {
        let s = kv::bbolt::Status {
            hash: 0x7c93c49c,
            revision: 10,
            total_key: 15,
            total_size: 20480,
        };
        assert_eq!(
            render_status(&s, Format::Table),
            "+----------+----------+------------+------------+\n\
             |   HASH   | REVISION | TOTAL KEYS | TOTAL SIZE |\n\
             +----------+----------+------------+------------+\n\
             | 7c93c49c |       10 |         15 |      20 kB |\n\
             +----------+----------+------------+------------+\n"
        );
        assert_eq!(
            render_status(&s, Format::Simple),
            "7c93c49c, 10, 15, 20 kB\n"
        );
        assert_eq!(
            render_status(&s, Format::Json),
            "{\"hash\":2090058908,\"revision\":10,\"totalKey\":15,\"totalSize\":20480}\n"
        );
    }
}
