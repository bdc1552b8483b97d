//! Peer TLS settings made ready for the raft core: `--peer-auto-tls`'s certificate written,
//! every file loaded once (an error stops startup), and the acceptor and connector the peer
//! transport uses. The TLS itself (loading, reloading, verifying) is `tls.rs`, shared with the
//! client port.

use crate::config::{url_scheme_host_port, Config, Scheme};
use crate::error::CoreError;
use crate::peer::PeerTls;
use crate::tls::{self, Acceptor, CertSource, Connector};

/// The peer TLS of this member; None when no peer URL is https.
pub fn load(config: &Config) -> Result<Option<PeerTls>, CoreError> {
    let Some(settings) = &config.peer_tls else {
        return Ok(None);
    };
    let files = tls::prepare(settings, &config.data_dir, &self_signed_hosts(config))?;
    // Without a CA (and without auto TLS) there is nothing to verify a dialed peer with: such a
    // member may serve https but not dial it (config refuses https peer URLs it would dial).
    let connector = if files.trusted_ca_file.is_some() || settings.certs == CertSource::SelfSigned {
        Some(Connector::new(files.clone())?)
    } else {
        None
    };
    Ok(Some(PeerTls {
        acceptor: Acceptor::new(files)?,
        connector,
    }))
}

/// The names `--peer-auto-tls`'s certificate is made for: the https peer listeners' and
/// advertised peer URLs' hosts (etcd uses the listen URLs'), and localhost.
fn self_signed_hosts(config: &Config) -> Vec<String> {
    let mut hosts: Vec<String> = config
        .listen_peer
        .iter()
        .filter(|l| l.scheme == Scheme::Https)
        .map(|l| l.addr.ip().to_string())
        .collect();
    for url in &config.initial_advertise_peer_urls {
        if let Ok((Scheme::Https, host, _)) =
            url_scheme_host_port("initial-advertise-peer-urls", url)
        {
            hosts.push(host);
        }
    }
    hosts.push("localhost".to_string());
    let mut unique = Vec::with_capacity(hosts.len());
    for h in hosts {
        if !unique.contains(&h) {
            unique.push(h);
        }
    }
    unique
}
