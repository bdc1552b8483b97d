//! TLS on the client port, with rustls (no OpenSSL) over the same glommio streams the shards
//! accept.
//!
//! Each shard owns an [`Acceptor`]: it reads the client hello first (rustls's lazy acceptor),
//! then picks its current `rustls::ServerConfig`. Before each handshake it compares the
//! certificate, key, CA and CRL files' modification times, sizes and inodes with those it
//! loaded (a few `stat` calls on the shard, microseconds beside the handshake), and
//! rebuilds the configuration when one changed, so a certificate swapped on disk is served to
//! the next connection without a restart (etcd re-reads its files per handshake too). A file
//! that fails to load (e.g. a half-written swap) keeps the previous configuration in service
//! and is retried on the next handshake.
//!
//! ALPN offers h2 and http/1.1, so /health, /metrics and the other HTTP/1.1 endpoints work over
//! TLS as well as gRPC; the server behind the TLS stream tells them apart by their first bytes,
//! as on a plaintext listener.
//!
//! Differences from etcd 3.4 (Go's crypto/tls), written here so nobody has to rediscover them:
//! - TLS 1.2 and 1.3 only (rustls has no 1.0/1.1), and only AEAD ECDHE cipher suites;
//!   `--cipher-suites` naming a CBC or RSA-key-exchange suite is refused, not ignored.
//! - `--auto-tls` makes a P-256 key (etcd: P-521, which ring cannot sign with).
//!
//! Architecture invariant: the handshake runs on the shard that accepted the connection, and
//! nothing about a connection's TLS state crosses cores.

use std::cell::RefCell;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::SystemTime;

use futures_rustls::server::TlsStream;
use futures_rustls::LazyConfigAcceptor;
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, CertificateRevocationListDer, PrivateKeyDer};
use rustls::server::WebPkiClientVerifier;
use rustls::{CipherSuite, RootCertStore, ServerConfig, SupportedCipherSuite};

use crate::error::CoreError;
use crate::rt::TcpStream;

/// Where the server's certificate comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CertSource {
    /// `--cert-file` and `--key-file`.
    Files {
        cert_file: PathBuf,
        key_file: PathBuf,
    },
    /// `--auto-tls`: a self-signed certificate made (once) under the data directory.
    SelfSigned,
}

/// Whether clients must present a certificate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClientAuth {
    None,
    /// Require one, verified against `--trusted-ca-file` (and `--client-crl-file`).
    Require,
}

/// Client TLS settings, as the flags gave them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientTls {
    pub certs: CertSource,
    pub trusted_ca_file: Option<PathBuf>,
    pub client_auth: ClientAuth,
    pub crl_file: Option<PathBuf>,
    /// TLS 1.2 suites to offer; empty: rustls's defaults. TLS 1.3 suites are always on.
    pub cipher_suites: Vec<CipherSuite>,
}

/// Client TLS with its certificate source resolved to files.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsFiles {
    pub cert_file: PathBuf,
    pub key_file: PathBuf,
    pub trusted_ca_file: Option<PathBuf>,
    pub client_auth: ClientAuth,
    pub crl_file: Option<PathBuf>,
    pub cipher_suites: Vec<CipherSuite>,
}

/// ALPN protocols offered, most preferred first: gRPC needs h2, and HTTP/1.1 clients (curl,
/// health probes) ask for http/1.1.
const ALPN_PROTOCOLS: [&[u8]; 2] = [b"h2", b"http/1.1"];

/// Files larger than this are not certificates, keys or CRLs: refuse instead of reading them.
const TLS_FILE_BYTES_MAX: u64 = 16 * 1024 * 1024;

/// Go's names for the cipher suites etcd 3.4 accepts in `--cipher-suites`, with the IANA
/// name where Go's differs (Go drops "_SHA256" from the ChaCha20 suites).
const GO_SUITE_ALIASES: [(&str, &str); 2] = [
    (
        "TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305",
        "TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256",
    ),
    (
        "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305",
        "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256",
    ),
];

/// Parses `--cipher-suites` (comma-separated, Go's or IANA names) into TLS 1.2 suites rustls
/// implements. A name rustls lacks is refused: serving a suite list other than the one asked
/// for would be a silent change of the security posture.
pub fn parse_cipher_suites(text: &str) -> Result<Vec<CipherSuite>, String> {
    let provider = rustls::crypto::ring::default_provider();
    let mut suites = Vec::new();
    for name in text.split(',').map(str::trim).filter(|n| !n.is_empty()) {
        let iana = GO_SUITE_ALIASES
            .iter()
            .find(|(go, _)| *go == name)
            .map_or(name, |(_, iana)| iana);
        let found = provider.cipher_suites.iter().find(|s| {
            matches!(s, SupportedCipherSuite::Tls12(_)) && s.suite().as_str() == Some(iana)
        });
        match found {
            Some(s) => {
                if !suites.contains(&s.suite()) {
                    suites.push(s.suite());
                }
            }
            None => {
                return Err(format!(
                    "--cipher-suites: unexpected or unsupported TLS cipher suite {name:?} (Keel offers the TLS 1.2 ECDHE AEAD suites: TLS_ECDHE_{{ECDSA,RSA}}_WITH_{{AES_128_GCM_SHA256,AES_256_GCM_SHA384,CHACHA20_POLY1305}})"
                ))
            }
        }
    }
    if suites.is_empty() {
        return Err("--cipher-suites names no cipher suite".into());
    }
    Ok(suites)
}

/// Resolves the certificate source: for `--auto-tls`, makes (or reuses) a self-signed
/// certificate for `hosts` under `<data_dir>/fixtures/client`, where etcd keeps its own.
pub fn prepare(tls: &ClientTls, data_dir: &Path, hosts: &[String]) -> Result<TlsFiles, CoreError> {
    let (cert_file, key_file) = match &tls.certs {
        CertSource::Files {
            cert_file,
            key_file,
        } => (cert_file.clone(), key_file.clone()),
        CertSource::SelfSigned => self_signed(&data_dir.join("fixtures").join("client"), hosts)?,
    };
    Ok(TlsFiles {
        cert_file,
        key_file,
        trusted_ca_file: tls.trusted_ca_file.clone(),
        client_auth: tls.client_auth,
        crl_file: tls.crl_file.clone(),
        cipher_suites: tls.cipher_suites.clone(),
    })
}

/// A self-signed certificate and key in `dir` (cert.pem, key.pem), reused when both exist,
/// valid for a year as etcd's.
fn self_signed(dir: &Path, hosts: &[String]) -> Result<(PathBuf, PathBuf), CoreError> {
    let cert_file = dir.join("cert.pem");
    let key_file = dir.join("key.pem");
    if cert_file.exists() && key_file.exists() {
        return Ok((cert_file, key_file));
    }
    let fail = |what: &str, e: &dyn std::fmt::Display| {
        CoreError::Tls(format!("--auto-tls: {what} in {}: {e}", dir.display()))
    };
    std::fs::create_dir_all(dir).map_err(|e| fail("cannot create the directory", &e))?;
    let mut params = rcgen::CertificateParams::new(hosts.to_vec())
        .map_err(|e| fail("bad host name for the certificate", &e))?;
    let now = SystemTime::now();
    params.not_before = now.into();
    params.not_after = (now + std::time::Duration::from_secs(365 * 24 * 3600)).into();
    params
        .distinguished_name
        .push(rcgen::DnType::OrganizationName, "etcd");
    params.key_usages = vec![
        rcgen::KeyUsagePurpose::KeyEncipherment,
        rcgen::KeyUsagePurpose::DigitalSignature,
    ];
    params.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ServerAuth];
    let key = rcgen::KeyPair::generate().map_err(|e| fail("cannot generate a key", &e))?;
    let cert = params
        .self_signed(&key)
        .map_err(|e| fail("cannot sign the certificate", &e))?;
    write_private(&key_file, key.serialize_pem().as_bytes())
        .map_err(|e| fail("cannot write key.pem", &e))?;
    std::fs::write(&cert_file, cert.pem()).map_err(|e| fail("cannot write cert.pem", &e))?;
    Ok((cert_file, key_file))
}

/// Writes a file only its owner can read (a private key).
fn write_private(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)?;
    file.write_all(bytes)?;
    file.sync_all()
}

/// What identifies one version of a file: its modification time, size and inode (a file
/// renamed into place, or a Kubernetes secret's symlink swap, may keep the old time and size).
type Stamp = Option<(SystemTime, u64, u64)>;

fn stamp(path: &Path) -> Stamp {
    use std::os::unix::fs::MetadataExt;
    let meta = std::fs::metadata(path).ok()?;
    Some((meta.modified().ok()?, meta.len(), meta.ino()))
}

/// One shard's TLS acceptor; see the module documentation.
pub struct Acceptor {
    files: TlsFiles,
    state: RefCell<State>,
}

struct State {
    config: Arc<ServerConfig>,
    /// The stamps of the files `config` was built from, in `TlsFiles::paths` order.
    stamps: Vec<Stamp>,
    /// Stamps that last failed to load: logged once, not on every handshake.
    failed: Option<Vec<Stamp>>,
}

impl Acceptor {
    /// Loads every file; an error here stops the member from starting.
    pub fn new(files: TlsFiles) -> Result<Acceptor, CoreError> {
        let stamps = files.stamps();
        let config = build(&files)?;
        Ok(Acceptor {
            files,
            state: RefCell::new(State {
                config,
                stamps,
                failed: None,
            }),
        })
    }

    /// The configuration for the next handshake, rebuilt first if a file changed.
    pub fn current(&self) -> Arc<ServerConfig> {
        let stamps = self.files.stamps();
        let mut state = self.state.borrow_mut();
        if stamps != state.stamps && state.failed.as_ref() != Some(&stamps) {
            match build(&self.files) {
                Ok(config) => {
                    tracing::info!(cert_file = %self.files.cert_file.display(), "client TLS files changed: reloaded");
                    state.config = config;
                    state.stamps = stamps;
                    state.failed = None;
                }
                Err(e) => {
                    tracing::warn!(error = %e, "client TLS files changed but do not load: still serving the previous ones");
                    state.failed = Some(stamps);
                }
            }
        }
        state.config.clone()
    }

    /// Runs the server side of a handshake. The caller bounds it in time.
    pub async fn accept(&self, stream: TcpStream) -> std::io::Result<TlsStream<TcpStream>> {
        let start = LazyConfigAcceptor::new(rustls::server::Acceptor::default(), stream).await?;
        start.into_stream(self.current()).await
    }
}

impl TlsFiles {
    fn paths(&self) -> impl Iterator<Item = &PathBuf> {
        [Some(&self.cert_file), Some(&self.key_file)]
            .into_iter()
            .chain([self.trusted_ca_file.as_ref(), self.crl_file.as_ref()])
            .flatten()
    }

    fn stamps(&self) -> Vec<Stamp> {
        self.paths().map(|p| stamp(p)).collect()
    }
}

fn read_pem(what: &str, path: &Path) -> Result<Vec<u8>, CoreError> {
    let fail =
        |e: &dyn std::fmt::Display| CoreError::Tls(format!("{what} {}: {e}", path.display()));
    let len = std::fs::metadata(path).map_err(|e| fail(&e))?.len();
    if len > TLS_FILE_BYTES_MAX {
        return Err(fail(&format!(
            "{len} bytes is larger than {TLS_FILE_BYTES_MAX}"
        )));
    }
    std::fs::read(path).map_err(|e| fail(&e))
}

fn certificates(what: &str, path: &Path) -> Result<Vec<CertificateDer<'static>>, CoreError> {
    let pem = read_pem(what, path)?;
    let certs = CertificateDer::pem_slice_iter(&pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| CoreError::Tls(format!("{what} {}: {e}", path.display())))?;
    if certs.is_empty() {
        return Err(CoreError::Tls(format!(
            "{what} {}: no PEM certificate in it",
            path.display()
        )));
    }
    Ok(certs)
}

/// Builds a rustls server configuration from the files as they are now.
fn build(files: &TlsFiles) -> Result<Arc<ServerConfig>, CoreError> {
    let mut provider: CryptoProvider = rustls::crypto::ring::default_provider();
    if !files.cipher_suites.is_empty() {
        provider.cipher_suites.retain(|s| match s {
            SupportedCipherSuite::Tls13(_) => true,
            SupportedCipherSuite::Tls12(_) => files.cipher_suites.contains(&s.suite()),
        });
    }
    let provider = Arc::new(provider);
    let certs = certificates("--cert-file", &files.cert_file)?;
    let key_pem = read_pem("--key-file", &files.key_file)?;
    let key = PrivateKeyDer::from_pem_slice(&key_pem)
        .map_err(|e| CoreError::Tls(format!("--key-file {}: {e}", files.key_file.display())))?;
    let builder = ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| CoreError::Tls(format!("TLS versions: {e}")))?;
    let builder = match files.client_auth {
        ClientAuth::None => builder.with_no_client_auth(),
        ClientAuth::Require => {
            let ca_file = files
                .trusted_ca_file
                .as_ref()
                .expect("config refuses client cert auth without a trusted CA");
            let mut roots = RootCertStore::empty();
            for ca in certificates("--trusted-ca-file", ca_file)? {
                roots.add(ca).map_err(|e| {
                    CoreError::Tls(format!("--trusted-ca-file {}: {e}", ca_file.display()))
                })?;
            }
            let mut verifier =
                WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider);
            if let Some(crl_file) = &files.crl_file {
                let pem = read_pem("--client-crl-file", crl_file)?;
                let crls = CertificateRevocationListDer::pem_slice_iter(&pem)
                    .collect::<Result<Vec<_>, _>>()
                    .map_err(|e| {
                        CoreError::Tls(format!("--client-crl-file {}: {e}", crl_file.display()))
                    })?;
                // etcd only refuses certificates the list names; a certificate from an issuer
                // the list does not cover stays valid there, and here.
                verifier = verifier.with_crls(crls).allow_unknown_revocation_status();
            }
            let verifier = verifier
                .build()
                .map_err(|e| CoreError::Tls(format!("client certificate verifier: {e}")))?;
            builder.with_client_cert_verifier(verifier)
        }
    };
    let mut config = builder.with_single_cert(certs, key).map_err(|e| {
        CoreError::Tls(format!(
            "--cert-file {} with --key-file {}: {e}",
            files.cert_file.display(),
            files.key_file.display()
        ))
    })?;
    config.alpn_protocols = ALPN_PROTOCOLS.iter().map(|p| p.to_vec()).collect();
    Ok(Arc::new(config))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cipher_suites_take_go_and_iana_names_and_refuse_the_rest() {
        let suites = parse_cipher_suites(
            "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256, TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305",
        )
        .expect("both are AEAD ECDHE suites");
        assert_eq!(
            suites,
            vec![
                CipherSuite::TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256,
                CipherSuite::TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256
            ]
        );
        assert!(parse_cipher_suites("TLS_RSA_WITH_AES_128_CBC_SHA").is_err());
        assert!(parse_cipher_suites("nonsense").is_err());
        assert!(parse_cipher_suites(",").is_err());
    }

    /// A self-signed (`--auto-tls`) configuration with no client authentication.
    fn self_signed() -> ClientTls {
        ClientTls {
            certs: CertSource::SelfSigned,
            trusted_ca_file: None,
            client_auth: ClientAuth::None,
            crl_file: None,
            cipher_suites: Vec::new(),
        }
    }

    #[test]
    fn auto_tls_writes_a_loadable_certificate_once_and_reuses_it() {
        let dir = tempfile::tempdir().expect("a temp dir");
        let tls = self_signed();
        let hosts = vec!["127.0.0.1".to_string(), "localhost".to_string()];
        let files = prepare(&tls, dir.path(), &hosts).expect("self-signed certificate");
        assert_eq!(files.cert_file, dir.path().join("fixtures/client/cert.pem"));
        let cert_pem = std::fs::read(&files.cert_file).expect("cert written");
        let acceptor = Acceptor::new(files.clone()).expect("the pair loads");
        assert_eq!(
            acceptor.current().alpn_protocols,
            vec![b"h2".to_vec(), b"http/1.1".to_vec()]
        );
        let again = prepare(&tls, dir.path(), &hosts).expect("reused");
        assert_eq!(again, files);
        assert_eq!(std::fs::read(&again.cert_file).expect("cert"), cert_pem);
    }

    #[test]
    fn a_broken_swap_keeps_the_previous_configuration() {
        let dir = tempfile::tempdir().expect("a temp dir");
        let tls = self_signed();
        let files = prepare(&tls, dir.path(), &["localhost".to_string()]).expect("certificate");
        let acceptor = Acceptor::new(files.clone()).expect("the pair loads");
        let before = acceptor.current();
        std::fs::write(&files.cert_file, "not a certificate, and a different size")
            .expect("overwrite");
        assert!(Arc::ptr_eq(&before, &acceptor.current()));
        assert!(Acceptor::new(files).is_err());
    }
}
