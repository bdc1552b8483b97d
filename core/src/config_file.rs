//! etcd's `--config-file`: a YAML file of settings in place of flags.
//!
//! etcd 3.4 (etcdmain `config.parse`, embed `ConfigFromFile`) reads the file into its `Config`
//! through sigs.k8s.io/yaml (YAML turned into JSON, then `encoding/json`), and once a file is
//! given every other command-line flag and every `ETCD_*` variable is ignored. The keys are the
//! flag names; `client-transport-security` and `peer-transport-security` are maps of the five
//! TLS settings; durations are integers of nanoseconds; `cipher-suites` and `log-outputs` are
//! lists. We turn the file into the flags it stands for, so that every setting is checked and
//! applied by the one flag parser (one place for every limit and every refusal), and parse
//! those flags with the environment switched off.
//!
//! Differences from etcd, on purpose:
//! - keys etcd's file format lacks but Keel has as flags (`client-crl-file`,
//!   `peer-cert-allowed-cn`, `shards`, `raft-cpu`, ...) are honoured, not dropped: a file
//!   written for Keel can set everything the command line can, and a CRL named in a file is
//!   never silently unchecked;
//! - keys neither knows are ignored as etcd ignores them, but named in the startup log.

use std::path::Path;

use clap::Command;
use yaml_rust2::{Yaml, YamlLoader};

use crate::error::CoreError;

/// etcd's `time.Duration` settings: in the file they are integers of nanoseconds (JSON has no
/// duration type), where the flags take Go duration text.
const DURATION_KEYS: &[&str] = &[
    "backend-batch-interval",
    "grpc-keepalive-min-time",
    "grpc-keepalive-interval",
    "grpc-keepalive-timeout",
    "experimental-corrupt-check-time",
    "experimental-watch-progress-notify-interval",
    "experimental-warning-apply-duration",
];

/// etcd's `[]string` settings: YAML lists in the file, comma-separated on the command line.
const LIST_KEYS: &[&str] = &["cipher-suites", "log-outputs", "log-output"];

/// The five settings of a `*-transport-security` map, and the flag each becomes without the
/// `peer-` prefix.
const SECURITY_KEYS: &[&str] = &[
    "cert-file",
    "key-file",
    "client-cert-auth",
    "trusted-ca-file",
    "auto-tls",
];

/// A configuration file turned into flags.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct FileFlags {
    /// `--name=value` arguments, in the file's order.
    pub args: Vec<String>,
    /// Keys neither etcd 3.4 nor Keel knows, ignored (etcd ignores them silently).
    pub ignored_keys: Vec<String>,
}

/// Reads `path` and turns it into the flags `command` (Keel's flag parser) understands.
pub fn read(path: &Path, command: &Command) -> Result<FileFlags, CoreError> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| CoreError::Config(format!("--config-file {}: {e}", path.display())))?;
    to_flags(&text, command)
        .map_err(|e| CoreError::Config(format!("--config-file {}: {e}", path.display())))
}

/// Turns the file's YAML into flags. Errors name the key, as Go's json errors do.
pub fn to_flags(text: &str, command: &Command) -> Result<FileFlags, String> {
    let docs = YamlLoader::load_from_str(text).map_err(|e| format!("invalid YAML: {e}"))?;
    let mut out = FileFlags::default();
    let root = match docs.into_iter().next() {
        // An empty file sets nothing, as in etcd.
        None | Some(Yaml::Null) => return Ok(out),
        Some(Yaml::Hash(map)) => map,
        Some(_) => return Err("the file must be a map of settings".into()),
    };
    let is_flag = |key: &str| command.get_arguments().any(|a| a.get_long() == Some(key));
    for (key, value) in root {
        let Yaml::String(key) = key else {
            return Err(format!("a key that is not text: {key:?}"));
        };
        if key == "client-transport-security" || key == "peer-transport-security" {
            let prefix = if key.starts_with("peer") { "peer-" } else { "" };
            let map = match value {
                Yaml::Null => continue,
                Yaml::Hash(map) => map,
                _ => return Err(format!("{key}: a map of TLS settings is expected")),
            };
            for (sub, v) in map {
                let Yaml::String(sub) = sub else {
                    return Err(format!("{key}: a key that is not text: {sub:?}"));
                };
                if !SECURITY_KEYS.contains(&sub.as_str()) {
                    out.ignored_keys.push(format!("{key}.{sub}"));
                    continue;
                }
                if let Some(text) = scalar(&format!("{key}.{sub}"), &v)? {
                    out.args.push(format!("--{prefix}{sub}={text}"));
                }
            }
            continue;
        }
        // A file cannot name another file; etcd's file format has no such key.
        if key == "config-file" || !is_flag(&key) {
            out.ignored_keys.push(key);
            continue;
        }
        let text = if DURATION_KEYS.contains(&key.as_str()) {
            match value {
                Yaml::Null => None,
                Yaml::Integer(ns) => Some(format!("{ns}ns")),
                _ => {
                    return Err(format!(
                        "{key}: a duration is an integer of nanoseconds in a config file (as in etcd's)"
                    ))
                }
            }
        } else if LIST_KEYS.contains(&key.as_str()) {
            match value {
                Yaml::Null => None,
                Yaml::Array(items) => {
                    let mut parts = Vec::with_capacity(items.len());
                    for item in &items {
                        match scalar(&key, item)? {
                            Some(t) => parts.push(t),
                            None => return Err(format!("{key}: an empty item in the list")),
                        }
                    }
                    Some(parts.join(","))
                }
                _ => return Err(format!("{key}: a list is expected")),
            }
        } else {
            scalar(&key, &value)?
        };
        // A null value leaves the default, as JSON's null does in Go.
        if let Some(text) = text {
            out.args.push(format!("--{key}={text}"));
        }
    }
    Ok(out)
}

/// The flag text of one YAML scalar; None for null.
fn scalar(key: &str, value: &Yaml) -> Result<Option<String>, String> {
    Ok(Some(match value {
        Yaml::Null => return Ok(None),
        Yaml::String(s) => s.clone(),
        Yaml::Integer(i) => i.to_string(),
        // Real keeps the text as written (e.g. "0.5" stays "0.5").
        Yaml::Real(r) => r.clone(),
        Yaml::Boolean(b) => b.to_string(),
        _ => return Err(format!("{key}: a single value is expected")),
    }))
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    use super::*;
    use crate::config::{Config, Flags};

    fn flags(text: &str) -> Result<FileFlags, String> {
        to_flags(text, &Flags::command())
    }

    #[test]
    fn settings_become_the_flags_they_stand_for() {
        let f = flags(
            "name: 'n1'\n\
             data-dir:\n\
             snapshot-count: 10000\n\
             heartbeat-interval: 100\n\
             listen-client-urls: http://127.0.0.1:2379,http://127.0.0.1:22379\n\
             strict-reconfig-check: false\n\
             experimental-corrupt-check-time: 300000000000\n\
             log-outputs: [stderr]\n\
             cipher-suites: [\n  TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256,\n  TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384\n]\n\
             client-transport-security:\n  cert-file: /c.pem\n  client-cert-auth: true\n  trusted-ca-file:\n\
             peer-transport-security:\n  auto-tls: true\n  crl-file: /x\n\
             self-signed-cert-validity: 1\n\
             shards: 1\n",
        )
        .expect("a valid file");
        assert_eq!(
            f.args,
            vec![
                "--name=n1",
                "--snapshot-count=10000",
                "--heartbeat-interval=100",
                "--listen-client-urls=http://127.0.0.1:2379,http://127.0.0.1:22379",
                "--strict-reconfig-check=false",
                "--experimental-corrupt-check-time=300000000000ns",
                "--log-outputs=stderr",
                "--cipher-suites=TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256,TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384",
                "--cert-file=/c.pem",
                "--client-cert-auth=true",
                "--peer-auto-tls=true",
                "--shards=1",
            ]
        );
        assert_eq!(
            f.ignored_keys,
            vec![
                "peer-transport-security.crl-file",
                "self-signed-cert-validity"
            ]
        );
    }

    #[test]
    fn wrong_shapes_are_refused_with_the_key() {
        for (text, word) in [
            ("- a\n- b\n", "map of settings"),
            ("name: [a, b]\n", "name"),
            ("experimental-corrupt-check-time: 5m\n", "nanoseconds"),
            ("cipher-suites: TLS_AES_128_GCM_SHA256\n", "list"),
            ("client-transport-security: yes-please\n", "map of TLS"),
            ("name: 'unclosed\n", "invalid YAML"),
        ] {
            let err = flags(text).expect_err(text);
            assert!(err.contains(word), "{text:?}: {err}");
        }
        assert_eq!(flags("").expect("empty"), FileFlags::default());
    }

    /// The whole path: a file's settings win, the command line's other flags and the
    /// environment are ignored, as etcd documents.
    #[test]
    fn a_file_replaces_the_command_line_and_the_environment() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("keel.conf.yml");
        std::fs::write(
            &path,
            format!(
                "name: from-file\n\
                 data-dir: {}\n\
                 initial-advertise-peer-urls: http://127.0.0.1:12380\n\
                 initial-cluster: from-file=http://127.0.0.1:12380\n\
                 snapshot-count: 777\n\
                 unknown-setting: 1\n",
                dir.path().join("d").display()
            ),
        )
        .expect("write");
        let args = vec![
            "keel".to_string(),
            "--name=from-flags".to_string(),
            format!("--config-file={}", path.display()),
        ];
        let c = Config::from_args(args).expect("the file's settings are valid");
        assert_eq!(c.name, "from-file");
        assert_eq!(c.snapshot_count, 777);
        assert_eq!(c.config_file.as_deref(), Some(path.as_path()));
        assert!(
            c.warnings.iter().any(|w| w.contains("unknown-setting")),
            "{:?}",
            c.warnings
        );
        // A bad setting is refused with the file's name in front.
        std::fs::write(&path, "snapshot-count: lots\n").expect("write");
        let err = Config::from_args(vec![
            "keel".into(),
            format!("--config-file={}", path.display()),
        ])
        .expect_err("not a number");
        assert!(err.to_string().contains("keel.conf.yml"), "{err}");
    }
}
