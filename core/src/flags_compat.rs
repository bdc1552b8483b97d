//! The rest of etcd 3.4's flags (`etcd --help`): those that only tune etcd's internals are
//! accepted and reported as ignored; those whose promise Keel cannot keep are refused with the
//! reason, so an operator never runs a member that silently does less than the flag asked.
//!
//! Each flag also reads its `ETCD_*` variable, as etcd's do. Values are kept as text: Go's flag
//! package would reject a malformed value, but Keel does not act on these, and refusing a
//! deployment over a value nobody reads helps no one.

use clap::Args;

use crate::error::CoreError;

/// etcd flags parsed beside `config::Flags` (flattened into it).
#[derive(Args, Debug, Clone, Default)]
pub struct EtcdCompatFlags {
    // Ignored: etcd internals Keel does not have.
    #[arg(long = "initial-election-tick-advance", env = "ETCD_INITIAL_ELECTION_TICK_ADVANCE", hide = true, num_args = 0..=1, default_missing_value = "true")]
    pub initial_election_tick_advance: Option<String>,
    #[arg(
        long = "backend-batch-interval",
        env = "ETCD_BACKEND_BATCH_INTERVAL",
        hide = true
    )]
    pub backend_batch_interval: Option<String>,
    #[arg(
        long = "backend-batch-limit",
        env = "ETCD_BACKEND_BATCH_LIMIT",
        hide = true
    )]
    pub backend_batch_limit: Option<String>,
    #[arg(
        long = "discovery-fallback",
        env = "ETCD_DISCOVERY_FALLBACK",
        hide = true
    )]
    pub discovery_fallback: Option<String>,
    #[arg(long = "discovery-proxy", env = "ETCD_DISCOVERY_PROXY", hide = true)]
    pub discovery_proxy: Option<String>,
    #[arg(
        long = "discovery-srv-name",
        env = "ETCD_DISCOVERY_SRV_NAME",
        hide = true
    )]
    pub discovery_srv_name: Option<String>,
    /// Read by `Config::from_flags` (crate::host_whitelist::CorsOrigins).
    #[arg(long = "cors", env = "ETCD_CORS", hide = true)]
    pub cors: Option<String>,
    #[arg(
        long = "proxy-failure-wait",
        env = "ETCD_PROXY_FAILURE_WAIT",
        hide = true
    )]
    pub proxy_failure_wait: Option<String>,
    #[arg(
        long = "proxy-refresh-interval",
        env = "ETCD_PROXY_REFRESH_INTERVAL",
        hide = true
    )]
    pub proxy_refresh_interval: Option<String>,
    #[arg(
        long = "proxy-dial-timeout",
        env = "ETCD_PROXY_DIAL_TIMEOUT",
        hide = true
    )]
    pub proxy_dial_timeout: Option<String>,
    #[arg(
        long = "proxy-write-timeout",
        env = "ETCD_PROXY_WRITE_TIMEOUT",
        hide = true
    )]
    pub proxy_write_timeout: Option<String>,
    #[arg(
        long = "proxy-read-timeout",
        env = "ETCD_PROXY_READ_TIMEOUT",
        hide = true
    )]
    pub proxy_read_timeout: Option<String>,
    #[arg(
        long = "experimental-enable-v2v3",
        env = "ETCD_EXPERIMENTAL_ENABLE_V2V3",
        hide = true
    )]
    pub experimental_enable_v2v3: Option<String>,
    #[arg(
        long = "experimental-backend-bbolt-freelist-type",
        env = "ETCD_EXPERIMENTAL_BACKEND_BBOLT_FREELIST_TYPE",
        hide = true
    )]
    pub experimental_backend_bbolt_freelist_type: Option<String>,
    #[arg(long = "experimental-enable-lease-checkpoint", env = "ETCD_EXPERIMENTAL_ENABLE_LEASE_CHECKPOINT", hide = true, num_args = 0..=1, default_missing_value = "true")]
    pub experimental_enable_lease_checkpoint: Option<String>,
    #[arg(
        long = "experimental-compaction-batch-limit",
        env = "ETCD_EXPERIMENTAL_COMPACTION_BATCH_LIMIT",
        hide = true
    )]
    pub experimental_compaction_batch_limit: Option<String>,
    #[arg(long = "experimental-peer-skip-client-san-verification", env = "ETCD_EXPERIMENTAL_PEER_SKIP_CLIENT_SAN_VERIFICATION", hide = true, num_args = 0..=1, default_missing_value = "true")]
    pub experimental_peer_skip_client_san_verification: Option<String>,
    #[arg(
        long = "experimental-warning-apply-duration",
        env = "ETCD_EXPERIMENTAL_WARNING_APPLY_DURATION",
        hide = true
    )]
    pub experimental_warning_apply_duration: Option<String>,
    #[arg(
        long = "log-package-levels",
        env = "ETCD_LOG_PACKAGE_LEVELS",
        hide = true
    )]
    pub log_package_levels: Option<String>,
    #[arg(long = "debug", env = "ETCD_DEBUG", hide = true, num_args = 0..=1, default_missing_value = "true")]
    pub debug: Option<String>,

    // Refused unless they ask for etcd's default: Keel cannot do what they promise.
    #[arg(long = "discovery", env = "ETCD_DISCOVERY", hide = true)]
    pub discovery: Option<String>,
    #[arg(long = "discovery-srv", env = "ETCD_DISCOVERY_SRV", hide = true)]
    pub discovery_srv: Option<String>,
    #[arg(long = "proxy", env = "ETCD_PROXY", hide = true)]
    pub proxy: Option<String>,
    #[arg(long = "force-new-cluster", env = "ETCD_FORCE_NEW_CLUSTER", hide = true, num_args = 0..=1, default_missing_value = "true")]
    pub force_new_cluster: Option<String>,
    /// Read by `Config::from_flags` (crate::host_whitelist).
    #[arg(long = "host-whitelist", env = "ETCD_HOST_WHITELIST", hide = true)]
    pub host_whitelist: Option<String>,
    /// Read by `Config::from_args`: the file's settings replace every other flag and variable.
    #[arg(long = "config-file", env = "ETCD_CONFIG_FILE", hide = true)]
    pub config_file: Option<String>,
}

/// Go's boolean flag values (strconv.ParseBool).
fn go_bool(flag: &str, value: &str) -> Result<bool, CoreError> {
    match value {
        "1" | "t" | "T" | "true" | "TRUE" | "True" => Ok(true),
        "0" | "f" | "F" | "false" | "FALSE" | "False" => Ok(false),
        other => Err(CoreError::Config(format!(
            "invalid boolean value {other:?} for -{flag}"
        ))),
    }
}

impl EtcdCompatFlags {
    /// Refuses the flags Keel cannot honour; returns the ignored ones that were given, for
    /// the startup log. `--debug` turns the log level to debug, as in etcd: the caller reads
    /// [`EtcdCompatFlags::debug_logging`].
    pub fn check(&self) -> Result<Vec<&'static str>, CoreError> {
        let given = |v: &Option<String>| v.as_deref().is_some_and(|s| !s.is_empty());
        if given(&self.discovery) || given(&self.discovery_srv) {
            return Err(CoreError::Config(
                "--discovery and --discovery-srv are not supported: bootstrap with --initial-cluster (refusing to start a member that would not find its cluster)".into(),
            ));
        }
        if let Some(p) = self
            .proxy
            .as_deref()
            .filter(|p| !p.is_empty() && *p != "off")
        {
            return Err(CoreError::Config(format!(
                "--proxy {p:?} is not supported: Keel runs only as a member (etcd's v2 proxy mode is gone in etcd 3.5); use --proxy off"
            )));
        }
        if let Some(v) = self.force_new_cluster.as_deref() {
            if go_bool("force-new-cluster", v)? {
                return Err(CoreError::Config(
                    "--force-new-cluster is not supported: Keel cannot rewrite the membership to this member alone; restore a snapshot into a new one-member cluster instead".into(),
                ));
            }
        }
        if let Some(v) = self.debug.as_deref() {
            go_bool("debug", v)?;
        }
        let ignored = [
            (
                "initial-election-tick-advance",
                &self.initial_election_tick_advance,
            ),
            ("backend-batch-interval", &self.backend_batch_interval),
            ("backend-batch-limit", &self.backend_batch_limit),
            ("discovery-fallback", &self.discovery_fallback),
            ("discovery-proxy", &self.discovery_proxy),
            ("discovery-srv-name", &self.discovery_srv_name),
            ("proxy-failure-wait", &self.proxy_failure_wait),
            ("proxy-refresh-interval", &self.proxy_refresh_interval),
            ("proxy-dial-timeout", &self.proxy_dial_timeout),
            ("proxy-write-timeout", &self.proxy_write_timeout),
            ("proxy-read-timeout", &self.proxy_read_timeout),
            ("experimental-enable-v2v3", &self.experimental_enable_v2v3),
            (
                "experimental-backend-bbolt-freelist-type",
                &self.experimental_backend_bbolt_freelist_type,
            ),
            (
                "experimental-enable-lease-checkpoint",
                &self.experimental_enable_lease_checkpoint,
            ),
            (
                "experimental-compaction-batch-limit",
                &self.experimental_compaction_batch_limit,
            ),
            (
                "experimental-peer-skip-client-san-verification",
                &self.experimental_peer_skip_client_san_verification,
            ),
            (
                "experimental-warning-apply-duration",
                &self.experimental_warning_apply_duration,
            ),
            ("log-package-levels", &self.log_package_levels),
            ("proxy", &self.proxy),
            ("force-new-cluster", &self.force_new_cluster),
        ];
        Ok(ignored
            .into_iter()
            .filter(|(_, v)| v.is_some())
            .map(|(name, _)| name)
            .collect())
    }

    /// `--debug` (deprecated in etcd 3.4 in favour of `--log-level debug`) was given as true.
    pub fn debug_logging(&self) -> bool {
        self.debug
            .as_deref()
            .is_some_and(|v| go_bool("debug", v).unwrap_or(false))
    }
}

#[cfg(test)]
mod tests {
    use clap::{CommandFactory, Parser};

    use crate::config::{normalize_go_args, Config, Flags};
    use crate::error::CoreError;

    fn parse(args: &[String]) -> Result<Config, CoreError> {
        let argv =
            normalize_go_args(std::iter::once("keel".to_string()).chain(args.iter().cloned()));
        Config::from_flags(
            Flags::try_parse_from(argv).map_err(|e| CoreError::Config(e.to_string()))?,
        )
    }

    /// Flags whose etcd 3.4 default text is a placeholder, with a real value of that default.
    fn default_value(flag: &str, shown: &str) -> String {
        match flag {
            "data-dir" => std::env::temp_dir()
                .join("keel-flag-test.etcd")
                .display()
                .to_string(),
            "max-concurrent-streams" => u32::MAX.to_string(),
            _ => shown.to_string(),
        }
    }

    /// Every flag `etcd --help` (etcd 3.4) lists, with the default it shows.
    fn etcd_help_flags() -> Vec<(String, String)> {
        let out = std::process::Command::new("etcd")
            .arg("--help")
            .output()
            .expect("etcd 3.4 is installed (Debian: etcd-server): its help is the reference");
        let text = String::from_utf8_lossy(&out.stdout).into_owned()
            + &String::from_utf8_lossy(&out.stderr);
        let mut flags = Vec::new();
        for line in text.lines() {
            let line = line.trim();
            let Some(rest) = line.strip_prefix("--") else {
                continue;
            };
            let (name, default) = rest.split_once(' ').unwrap_or((rest, ""));
            let default = default.trim().trim_matches('\'').to_string();
            if matches!(name, "help" | "version") {
                continue;
            }
            flags.push((name.to_string(), default));
        }
        // The usage lines name "etcd --config-file" without a default.
        if text.contains("etcd --config-file") && !flags.iter().any(|(n, _)| n == "config-file") {
            flags.push(("config-file".into(), String::new()));
        }
        assert!(
            flags.len() >= 80,
            "etcd 3.4 lists about 80 flags: {flags:?}"
        );
        flags
    }

    /// Each flag refused when given something other than etcd's default, with a value that
    /// asks for what Keel cannot do and a word its message must carry.
    const REFUSED: &[(&str, &str, &str)] = &[
        ("discovery", "https://discovery.etcd.io/x", "--discovery"),
        ("discovery-srv", "example.com", "--discovery"),
        ("proxy", "on", "--proxy"),
        ("force-new-cluster", "true", "--force-new-cluster"),
    ];

    #[test]
    fn every_etcd_flag_with_its_default_is_accepted() {
        let mut failures = Vec::new();
        for (flag, shown) in etcd_help_flags() {
            let value = default_value(&flag, &shown);
            let args = vec![format!("--{flag}={value}")];
            if let Err(e) = parse(&args) {
                failures.push(format!("--{flag}={value}: {e}"));
            }
        }
        assert!(failures.is_empty(), "refused etcd defaults: {failures:#?}");
    }

    #[test]
    fn every_etcd_flag_is_implemented_ignored_or_refused_with_a_reason() {
        for (flag, shown) in etcd_help_flags() {
            if let Some((_, value, word)) = REFUSED.iter().find(|(f, _, _)| *f == flag) {
                let err = parse(&[format!("--{flag}={value}")])
                    .expect_err("a flag Keel cannot honour is refused");
                let text = err.to_string();
                assert!(text.contains(word), "--{flag}: {text}");
                assert!(
                    text.contains("not supported"),
                    "--{flag}'s refusal says why: {text}"
                );
                continue;
            }
            let value = default_value(&flag, &shown);
            let c = parse(&[format!("--{flag}={value}")])
                .unwrap_or_else(|e| panic!("--{flag}={value}: {e}"));
            // A flag is either acted on (it has a field Keel reads: not listed as ignored) or
            // reported as ignored at startup; which one is fixed per flag.
            let ignored = c.ignored_flags.contains(&flag.as_str());
            let implemented = IMPLEMENTED.contains(&flag.as_str());
            assert!(
                ignored != implemented,
                "--{flag}: implemented={implemented} ignored={ignored}: each flag is one or the other"
            );
        }
    }

    /// The etcd flags Keel acts on: implemented, or refused when set to anything but etcd's
    /// default (the rest are accepted and reported as ignored).
    const IMPLEMENTED: &[&str] = &[
        "name",
        "data-dir",
        "wal-dir",
        "snapshot-count",
        "heartbeat-interval",
        "election-timeout",
        "listen-peer-urls",
        "listen-client-urls",
        "quota-backend-bytes",
        "max-txn-ops",
        "max-request-bytes",
        "max-concurrent-streams",
        "initial-advertise-peer-urls",
        "initial-cluster",
        "initial-cluster-state",
        "initial-cluster-token",
        "advertise-client-urls",
        "auto-compaction-retention",
        "auto-compaction-mode",
        "cert-file",
        "key-file",
        "client-cert-auth",
        "client-crl-file",
        "client-cert-allowed-hostname",
        "trusted-ca-file",
        "auto-tls",
        "peer-cert-file",
        "peer-key-file",
        "peer-client-cert-auth",
        "peer-trusted-ca-file",
        "peer-cert-allowed-cn",
        "peer-cert-allowed-hostname",
        "peer-auto-tls",
        "peer-crl-file",
        "cipher-suites",
        "auth-token",
        "auth-token-ttl",
        "bcrypt-cost",
        "listen-metrics-urls",
        "log-level",
        "experimental-initial-corrupt-check",
        "experimental-corrupt-check-time",
        "debug",
        "discovery",
        "discovery-srv",
        "config-file",
        "host-whitelist",
        "strict-reconfig-check",
        "cors",
    ];

    #[test]
    fn every_etcd_flag_reads_its_etcd_variable() {
        let cmd = Flags::command();
        for (flag, _) in etcd_help_flags() {
            let arg = cmd
                .get_arguments()
                .find(|a| a.get_long() == Some(flag.as_str()))
                .unwrap_or_else(|| panic!("--{flag} is not a Keel flag"));
            let want = format!("ETCD_{}", flag.to_ascii_uppercase().replace('-', "_"));
            assert_eq!(
                arg.get_env().and_then(|e| e.to_str()),
                Some(want.as_str()),
                "--{flag}"
            );
        }
    }

    #[test]
    fn debug_turns_on_debug_logging_and_the_initial_corrupt_check_is_accepted() {
        let c = parse(&["--debug".into()]).expect("valid");
        assert_eq!(c.log_level, "debug");
        let c = parse(&["--experimental-initial-corrupt-check".into()]).expect("accepted");
        assert!(c.initial_corrupt_check);
        let c = parse(&["--proxy=off".into(), "--host-whitelist=*".into()]).expect("defaults");
        assert!(!c.host_whitelist.restricts());
        assert!(c.ignored_flags.contains(&"proxy"));
        assert!(parse(&["--debug=maybe".into()]).is_err());
    }

    #[test]
    fn cors_takes_star_or_urls_with_a_port_as_etcd() {
        let every = parse(&[]).expect("default");
        assert_eq!(every.cors.allow_origin(Some("http://x:1")), Some("*"));
        let listed = parse(&["--cors=http://a.example:8080, https://b.example:443".into()])
            .expect("URLs with ports");
        assert_eq!(
            listed.cors.allow_origin(Some("https://b.example:443")),
            Some("https://b.example:443")
        );
        assert_eq!(listed.cors.allow_origin(Some("http://c.example:80")), None);
        let err = parse(&["--cors=http://a.example".into()])
            .expect_err("etcd refuses a URL without a port")
            .to_string();
        assert!(err.contains("--cors") && err.contains("no port"), "{err}");
    }
}
