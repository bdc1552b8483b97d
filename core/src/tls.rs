//! TLS with rustls (no OpenSSL) over glommio streams, for the client port (each shard's
//! [`Acceptor`]) and the peer port (the raft core's [`Acceptor`] and [`Connector`]).
//!
//! An acceptor reads the client hello first (rustls's lazy acceptor), then picks its current
//! `rustls::ServerConfig`; a connector picks its current `rustls::ClientConfig` before dialing.
//! Before each handshake both compare the certificate, key, CA and CRL files' modification
//! times, sizes and inodes with those they loaded (a few `stat` calls, microseconds beside
//! the handshake), and rebuild the configuration when one changed, so a certificate swapped on
//! disk is served to the next connection without a restart (etcd re-reads its files per
//! handshake too). A file that fails to load (e.g. a half-written swap) keeps the previous
//! configuration in service and is retried on the next handshake.
//!
//! On the client port ALPN offers h2 and http/1.1, so /health, /metrics and the other HTTP/1.1
//! endpoints work over TLS as well as gRPC; the server behind the TLS stream tells them apart
//! by their first bytes, as on a plaintext listener. The peer port speaks Keel's own framing
//! and offers no ALPN.
//!
//! Peers, as in etcd: the dialing member presents its peer certificate as a client
//! certificate and verifies the accepting member's against `--peer-trusted-ca-file` and the
//! host of the peer URL it dials; `--peer-cert-allowed-cn` / `--peer-cert-allowed-hostname`
//! further restrict the other side's certificate, on both sides (etcd sets Go's
//! `VerifyPeerCertificate` in the configuration both sides share); with `--peer-auto-tls` the
//! dialer verifies nothing (etcd's `InsecureSkipVerify` for self-signed certificates).
//!
//! Differences from etcd 3.4 (Go's crypto/tls), written here so nobody has to rediscover them:
//! - TLS 1.2 and 1.3 only (rustls has no 1.0/1.1), and only AEAD ECDHE cipher suites;
//!   `--cipher-suites` naming a CBC or RSA-key-exchange suite is refused, not ignored.
//! - `--auto-tls` / `--peer-auto-tls` make a P-256 key (etcd: P-521, which ring cannot sign
//!   with).
//! - A peer dialing `https://` without `--peer-trusted-ca-file` (and without auto TLS) is
//!   refused at startup; etcd would fall back to the system's roots.
//!
//! Architecture invariant: a handshake runs on the executor that owns the connection (a shard
//! for clients, the raft core for peers), and nothing about a connection's TLS state crosses
//! cores.

use std::cell::RefCell;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::SystemTime;

use futures_rustls::server::TlsStream;
use futures_rustls::{LazyConfigAcceptor, TlsConnector};
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::WebPkiServerVerifier;
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{
    CertificateDer, CertificateRevocationListDer, PrivateKeyDer, ServerName, UnixTime,
};
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::server::WebPkiClientVerifier;
use rustls::{
    CipherSuite, ClientConfig, DigitallySignedStruct, DistinguishedName, RootCertStore,
    ServerConfig, SignatureScheme, SupportedCipherSuite,
};

use crate::error::CoreError;
use crate::rt::TcpStream;

/// Which port a TLS configuration serves: it names the flags in messages, the `--auto-tls`
/// directory and the ALPN protocols.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Side {
    Client,
    Peer,
}

impl Side {
    /// The flag that set `what` ("cert-file", "key-file", "trusted-ca-file", "crl-file").
    fn flag(self, what: &str) -> String {
        match (self, what) {
            (Side::Client, "crl-file") => "--client-crl-file".into(),
            (Side::Client, _) => format!("--{what}"),
            (Side::Peer, _) => format!("--peer-{what}"),
        }
    }

    fn auto_tls_flag(self) -> &'static str {
        match self {
            Side::Client => "--auto-tls",
            Side::Peer => "--peer-auto-tls",
        }
    }

    /// etcd's directory for the self-signed certificate, under `<data-dir>/fixtures`.
    fn fixtures(self) -> &'static str {
        match self {
            Side::Client => "client",
            Side::Peer => "peer",
        }
    }

    fn name(self) -> &'static str {
        match self {
            Side::Client => "client",
            Side::Peer => "peer",
        }
    }
}

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

/// Which verified certificates of the other side are accepted (peers only:
/// `--peer-cert-allowed-cn`, `--peer-cert-allowed-hostname`, mutually exclusive as in etcd).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Allowed {
    Any,
    /// The leaf's subject common name equals this.
    CommonName(String),
    /// The leaf is valid for this host name or IP address.
    Hostname(String),
}

/// TLS settings of one port, as the flags gave them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsSettings {
    pub side: Side,
    pub certs: CertSource,
    pub trusted_ca_file: Option<PathBuf>,
    pub client_auth: ClientAuth,
    pub crl_file: Option<PathBuf>,
    /// TLS 1.2 suites to offer; empty: rustls's defaults. TLS 1.3 suites are always on.
    pub cipher_suites: Vec<CipherSuite>,
    pub allowed: Allowed,
}

/// TLS settings with the certificate source resolved to files.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsFiles {
    pub side: Side,
    pub cert_file: PathBuf,
    pub key_file: PathBuf,
    /// The certificate is `--auto-tls`'s own: a dialer does not verify the other side.
    pub self_signed: bool,
    pub trusted_ca_file: Option<PathBuf>,
    pub client_auth: ClientAuth,
    pub crl_file: Option<PathBuf>,
    pub cipher_suites: Vec<CipherSuite>,
    pub allowed: Allowed,
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

/// Resolves the certificate source: for `--auto-tls` (`--peer-auto-tls`), makes (or reuses) a
/// self-signed certificate for `hosts` under `<data_dir>/fixtures/client` (`.../peer`), where
/// etcd keeps its own.
pub fn prepare(
    tls: &TlsSettings,
    data_dir: &Path,
    hosts: &[String],
) -> Result<TlsFiles, CoreError> {
    let (cert_file, key_file, self_signed) = match &tls.certs {
        CertSource::Files {
            cert_file,
            key_file,
        } => (cert_file.clone(), key_file.clone(), false),
        CertSource::SelfSigned => {
            let dir = data_dir.join("fixtures").join(tls.side.fixtures());
            let (cert, key) = make_self_signed(tls.side, &dir, hosts)?;
            (cert, key, true)
        }
    };
    Ok(TlsFiles {
        side: tls.side,
        cert_file,
        key_file,
        self_signed,
        trusted_ca_file: tls.trusted_ca_file.clone(),
        client_auth: tls.client_auth,
        crl_file: tls.crl_file.clone(),
        cipher_suites: tls.cipher_suites.clone(),
        allowed: tls.allowed.clone(),
    })
}

/// A self-signed certificate and key in `dir` (cert.pem, key.pem), reused when both exist,
/// valid for a year as etcd's.
fn make_self_signed(
    side: Side,
    dir: &Path,
    hosts: &[String],
) -> Result<(PathBuf, PathBuf), CoreError> {
    let cert_file = dir.join("cert.pem");
    let key_file = dir.join("key.pem");
    if cert_file.exists() && key_file.exists() {
        return Ok((cert_file, key_file));
    }
    let fail = |what: &str, e: &dyn std::fmt::Display| {
        CoreError::Tls(format!(
            "{}: {what} in {}: {e}",
            side.auto_tls_flag(),
            dir.display()
        ))
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
    if side == Side::Peer {
        // A dialing peer presents the same certificate as its client certificate.
        params
            .extended_key_usages
            .push(rcgen::ExtendedKeyUsagePurpose::ClientAuth);
    }
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

/// A rustls configuration rebuilt from its files when they change; see the module
/// documentation. Owned by one executor (a `RefCell`, no lock).
struct Reloading<C> {
    files: TlsFiles,
    build: fn(&TlsFiles) -> Result<Arc<C>, CoreError>,
    state: RefCell<State<C>>,
}

struct State<C> {
    config: Arc<C>,
    /// The stamps of the files `config` was built from, in `TlsFiles::paths` order.
    stamps: Vec<Stamp>,
    /// Stamps that last failed to load: logged once, not on every handshake.
    failed: Option<Vec<Stamp>>,
}

impl<C> Reloading<C> {
    /// Loads every file; an error here stops the member from starting.
    fn new(
        files: TlsFiles,
        build: fn(&TlsFiles) -> Result<Arc<C>, CoreError>,
    ) -> Result<Self, CoreError> {
        let stamps = files.stamps();
        let config = build(&files)?;
        Ok(Reloading {
            files,
            build,
            state: RefCell::new(State {
                config,
                stamps,
                failed: None,
            }),
        })
    }

    /// The configuration for the next handshake, rebuilt first if a file changed.
    fn current(&self) -> Arc<C> {
        let stamps = self.files.stamps();
        let mut state = self.state.borrow_mut();
        if stamps != state.stamps && state.failed.as_ref() != Some(&stamps) {
            match (self.build)(&self.files) {
                Ok(config) => {
                    tracing::info!(side = self.files.side.name(), cert_file = %self.files.cert_file.display(), "TLS files changed: reloaded");
                    state.config = config;
                    state.stamps = stamps;
                    state.failed = None;
                }
                Err(e) => {
                    tracing::warn!(side = self.files.side.name(), error = %e, "TLS files changed but do not load: still using the previous ones");
                    state.failed = Some(stamps);
                }
            }
        }
        state.config.clone()
    }
}

/// The server side of TLS on one executor; see the module documentation.
pub struct Acceptor {
    configs: Reloading<ServerConfig>,
}

impl Acceptor {
    /// Loads every file; an error here stops the member from starting.
    pub fn new(files: TlsFiles) -> Result<Acceptor, CoreError> {
        Ok(Acceptor {
            configs: Reloading::new(files, build_server)?,
        })
    }

    /// The configuration for the next handshake, rebuilt first if a file changed.
    pub fn current(&self) -> Arc<ServerConfig> {
        self.configs.current()
    }

    /// Runs the server side of a handshake. The caller bounds it in time.
    pub async fn accept(&self, stream: TcpStream) -> std::io::Result<TlsStream<TcpStream>> {
        let start = LazyConfigAcceptor::new(rustls::server::Acceptor::default(), stream).await?;
        start.into_stream(self.current()).await
    }
}

/// The dialing side of peer TLS, on the raft core; see the module documentation.
pub struct Connector {
    configs: Reloading<ClientConfig>,
}

impl Connector {
    /// Loads every file; an error here stops the member from starting.
    pub fn new(files: TlsFiles) -> Result<Connector, CoreError> {
        assert_eq!(files.side, Side::Peer, "only peers dial with TLS");
        Ok(Connector {
            configs: Reloading::new(files, build_client)?,
        })
    }

    /// The dialing configuration as the files are now (for a blocking dial before the raft core
    /// runs: a joining member asking its peers who it is).
    pub fn client_config(&self) -> Arc<ClientConfig> {
        self.configs.current()
    }

    /// Runs the client side of a handshake with the member at `host` (the peer URL's host,
    /// which its certificate must name unless auto TLS skips verification). The caller bounds
    /// it in time.
    pub async fn connect(
        &self,
        host: &str,
        stream: TcpStream,
    ) -> std::io::Result<futures_rustls::client::TlsStream<TcpStream>> {
        let name = ServerName::try_from(host.to_string()).map_err(|e| {
            std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                format!("peer host {host:?} is not a TLS server name: {e}"),
            )
        })?;
        TlsConnector::from(self.configs.current())
            .connect(name, stream)
            .await
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

    fn provider(&self) -> Arc<CryptoProvider> {
        let mut provider: CryptoProvider = rustls::crypto::ring::default_provider();
        if !self.cipher_suites.is_empty() {
            provider.cipher_suites.retain(|s| match s {
                SupportedCipherSuite::Tls13(_) => true,
                SupportedCipherSuite::Tls12(_) => self.cipher_suites.contains(&s.suite()),
            });
        }
        Arc::new(provider)
    }

    /// The certificate chain and key this side presents.
    fn identity(
        &self,
    ) -> Result<(Vec<CertificateDer<'static>>, PrivateKeyDer<'static>), CoreError> {
        let certs = certificates(&self.side.flag("cert-file"), &self.cert_file)?;
        let key_flag = self.side.flag("key-file");
        let key_pem = read_pem(&key_flag, &self.key_file)?;
        let key = PrivateKeyDer::from_pem_slice(&key_pem)
            .map_err(|e| CoreError::Tls(format!("{key_flag} {}: {e}", self.key_file.display())))?;
        Ok((certs, key))
    }

    fn roots(&self) -> Result<Option<Arc<RootCertStore>>, CoreError> {
        let Some(ca_file) = &self.trusted_ca_file else {
            return Ok(None);
        };
        let flag = self.side.flag("trusted-ca-file");
        let mut roots = RootCertStore::empty();
        for ca in certificates(&flag, ca_file)? {
            roots
                .add(ca)
                .map_err(|e| CoreError::Tls(format!("{flag} {}: {e}", ca_file.display())))?;
        }
        Ok(Some(Arc::new(roots)))
    }

    fn crls(&self) -> Result<Vec<CertificateRevocationListDer<'static>>, CoreError> {
        let Some(crl_file) = &self.crl_file else {
            return Ok(Vec::new());
        };
        let flag = self.side.flag("crl-file");
        let pem = read_pem(&flag, crl_file)?;
        CertificateRevocationListDer::pem_slice_iter(&pem)
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| CoreError::Tls(format!("{flag} {}: {e}", crl_file.display())))
    }
}

fn read_pem(flag: &str, path: &Path) -> Result<Vec<u8>, CoreError> {
    let fail =
        |e: &dyn std::fmt::Display| CoreError::Tls(format!("{flag} {}: {e}", path.display()));
    let len = std::fs::metadata(path).map_err(|e| fail(&e))?.len();
    if len > TLS_FILE_BYTES_MAX {
        return Err(fail(&format!(
            "{len} bytes is larger than {TLS_FILE_BYTES_MAX}"
        )));
    }
    std::fs::read(path).map_err(|e| fail(&e))
}

fn certificates(flag: &str, path: &Path) -> Result<Vec<CertificateDer<'static>>, CoreError> {
    let pem = read_pem(flag, path)?;
    let certs = CertificateDer::pem_slice_iter(&pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| CoreError::Tls(format!("{flag} {}: {e}", path.display())))?;
    if certs.is_empty() {
        return Err(CoreError::Tls(format!(
            "{flag} {}: no PEM certificate in it",
            path.display()
        )));
    }
    Ok(certs)
}

/// Builds a rustls server configuration from the files as they are now.
fn build_server(files: &TlsFiles) -> Result<Arc<ServerConfig>, CoreError> {
    let provider = files.provider();
    let (certs, key) = files.identity()?;
    let builder = ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| CoreError::Tls(format!("TLS versions: {e}")))?;
    let builder = match files.client_auth {
        ClientAuth::None => builder.with_no_client_auth(),
        ClientAuth::Require => {
            let roots = files
                .roots()?
                .expect("config refuses client cert auth without a trusted CA");
            let mut verifier = WebPkiClientVerifier::builder_with_provider(roots, provider);
            let crls = files.crls()?;
            if !crls.is_empty() {
                // etcd only refuses certificates the list names; a certificate from an issuer
                // the list does not cover stays valid there, and here.
                verifier = verifier.with_crls(crls).allow_unknown_revocation_status();
            }
            let verifier = verifier
                .build()
                .map_err(|e| CoreError::Tls(format!("client certificate verifier: {e}")))?;
            match &files.allowed {
                Allowed::Any => builder.with_client_cert_verifier(verifier),
                allowed => builder.with_client_cert_verifier(Arc::new(AllowedClients {
                    inner: verifier,
                    allowed: allowed.clone(),
                })),
            }
        }
    };
    let mut config = builder.with_single_cert(certs, key).map_err(|e| {
        CoreError::Tls(format!(
            "{} {} with {} {}: {e}",
            files.side.flag("cert-file"),
            files.cert_file.display(),
            files.side.flag("key-file"),
            files.key_file.display()
        ))
    })?;
    if files.side == Side::Client {
        config.alpn_protocols = ALPN_PROTOCOLS.iter().map(|p| p.to_vec()).collect();
    }
    Ok(Arc::new(config))
}

/// Builds the dialing peer's rustls client configuration from the files as they are now.
fn build_client(files: &TlsFiles) -> Result<Arc<ClientConfig>, CoreError> {
    let provider = files.provider();
    let (certs, key) = files.identity()?;
    let builder = ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| CoreError::Tls(format!("TLS versions: {e}")))?;
    let verifier: Arc<dyn ServerCertVerifier> = if files.self_signed {
        // etcd: a self-signed peer certificate cannot be verified, so auto TLS dials without
        // verifying (Go's InsecureSkipVerify); only the handshake's signatures are checked.
        Arc::new(Unverified { provider })
    } else {
        let roots = files.roots()?.ok_or_else(|| {
            CoreError::Tls(format!(
                "{} is needed to verify the peers an https:// peer URL dials",
                files.side.flag("trusted-ca-file")
            ))
        })?;
        let mut verifier = WebPkiServerVerifier::builder_with_provider(roots, provider);
        let crls = files.crls()?;
        if !crls.is_empty() {
            verifier = verifier.with_crls(crls).allow_unknown_revocation_status();
        }
        let verifier = verifier
            .build()
            .map_err(|e| CoreError::Tls(format!("peer certificate verifier: {e}")))?;
        match &files.allowed {
            Allowed::Any => verifier,
            allowed => Arc::new(AllowedServers {
                inner: verifier,
                allowed: allowed.clone(),
            }),
        }
    };
    let config = builder
        .dangerous()
        .with_custom_certificate_verifier(verifier)
        .with_client_auth_cert(certs, key)
        .map_err(|e| {
            CoreError::Tls(format!(
                "{} {} with {} {}: {e}",
                files.side.flag("cert-file"),
                files.cert_file.display(),
                files.side.flag("key-file"),
                files.key_file.display()
            ))
        })?;
    Ok(Arc::new(config))
}

/// Checks a verified leaf certificate against `--peer-cert-allowed-cn` /
/// `--peer-cert-allowed-hostname`, as etcd's `VerifyPeerCertificate` does.
fn check_allowed(allowed: &Allowed, leaf: &CertificateDer<'_>) -> Result<(), rustls::Error> {
    let ok = match allowed {
        Allowed::Any => true,
        Allowed::CommonName(cn) => subject_common_name(leaf).as_deref() == Some(cn.as_str()),
        Allowed::Hostname(host) => match ServerName::try_from(host.as_str()) {
            Ok(name) => webpki::EndEntityCert::try_from(leaf)
                .and_then(|cert| cert.verify_is_valid_for_subject_name(&name))
                .is_ok(),
            Err(_) => false,
        },
    };
    if ok {
        Ok(())
    } else {
        // etcd's words for the same refusal.
        Err(rustls::Error::General(
            "client certificate authentication failed".into(),
        ))
    }
}

/// A WebPKI client verifier that also applies [`Allowed`].
#[derive(Debug)]
struct AllowedClients {
    inner: Arc<dyn ClientCertVerifier>,
    allowed: Allowed,
}

impl ClientCertVerifier for AllowedClients {
    fn offer_client_auth(&self) -> bool {
        self.inner.offer_client_auth()
    }
    fn client_auth_mandatory(&self) -> bool {
        self.inner.client_auth_mandatory()
    }
    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        self.inner.root_hint_subjects()
    }
    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        let verified = self
            .inner
            .verify_client_cert(end_entity, intermediates, now)?;
        check_allowed(&self.allowed, end_entity)?;
        Ok(verified)
    }
    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls12_signature(message, cert, dss)
    }
    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls13_signature(message, cert, dss)
    }
    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.inner.supported_verify_schemes()
    }
}

/// A WebPKI server verifier that also applies [`Allowed`].
#[derive(Debug)]
struct AllowedServers {
    inner: Arc<WebPkiServerVerifier>,
    allowed: Allowed,
}

impl ServerCertVerifier for AllowedServers {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        let verified = self.inner.verify_server_cert(
            end_entity,
            intermediates,
            server_name,
            ocsp_response,
            now,
        )?;
        check_allowed(&self.allowed, end_entity)?;
        Ok(verified)
    }
    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls12_signature(message, cert, dss)
    }
    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls13_signature(message, cert, dss)
    }
    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.inner.supported_verify_schemes()
    }
}

/// `--peer-auto-tls`'s dialer: accepts any server certificate (etcd does the same), but still
/// checks the handshake's signatures, so the session is at least bound to the certificate shown.
#[derive(Debug)]
struct Unverified {
    provider: Arc<CryptoProvider>,
}

impl ServerCertVerifier for Unverified {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }
    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }
    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }
    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.provider
            .signature_verification_algorithms
            .supported_schemes()
    }
}

/// One DER element: its tag, its contents and what follows it; None when malformed. Lengths
/// up to 4 bytes (a certificate over 4 GiB is not one).
fn der_element(input: &[u8]) -> Option<(u8, &[u8], &[u8])> {
    let (&tag, rest) = input.split_first()?;
    let (&first, mut rest) = rest.split_first()?;
    let len = if first < 0x80 {
        usize::from(first)
    } else {
        let n = usize::from(first & 0x7f);
        if n == 0 || n > 4 || rest.len() < n {
            return None;
        }
        let len = rest[..n]
            .iter()
            .fold(0usize, |len, b| (len << 8) | usize::from(*b));
        rest = &rest[n..];
        len
    };
    if rest.len() < len {
        return None;
    }
    Some((tag, &rest[..len], &rest[len..]))
}

/// The subject common name of a DER certificate (the last CN attribute, as Go's
/// `pkix.Name` keeps); None when it has none or the certificate is malformed.
pub fn subject_common_name(cert_der: &[u8]) -> Option<String> {
    const SEQUENCE: u8 = 0x30;
    const SET: u8 = 0x31;
    const OID: u8 = 0x06;
    const EXPLICIT_VERSION: u8 = 0xa0;
    const OID_COMMON_NAME: [u8; 3] = [0x55, 0x04, 0x03];
    let (SEQUENCE, certificate, _) = der_element(cert_der)? else {
        return None;
    };
    let (SEQUENCE, tbs, _) = der_element(certificate)? else {
        return None;
    };
    let (tag, _, mut rest) = der_element(tbs)?;
    if tag == EXPLICIT_VERSION {
        // The version came first; the serial number follows it.
        rest = der_element(rest)?.2;
    }
    // Signature algorithm, issuer, validity, then the subject.
    for _ in 0..3 {
        rest = der_element(rest)?.2;
    }
    let (SEQUENCE, mut names, _) = der_element(rest)? else {
        return None;
    };
    let mut common_name = None;
    while !names.is_empty() {
        let (SET, mut attributes, next) = der_element(names)? else {
            return None;
        };
        names = next;
        while !attributes.is_empty() {
            let (SEQUENCE, attribute, next) = der_element(attributes)? else {
                return None;
            };
            attributes = next;
            let (OID, oid, value) = der_element(attribute)? else {
                return None;
            };
            if oid == OID_COMMON_NAME {
                let (_, text, _) = der_element(value)?;
                common_name = Some(String::from_utf8_lossy(text).into_owned());
            }
        }
    }
    common_name
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
    fn self_signed() -> TlsSettings {
        TlsSettings {
            side: Side::Client,
            allowed: Allowed::Any,
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

    #[test]
    fn allowed_cn_and_hostname_read_the_leaf_certificate() {
        let mut params =
            rcgen::CertificateParams::new(vec!["127.0.0.1".to_string(), "peer.example".into()])
                .expect("names");
        params
            .distinguished_name
            .push(rcgen::DnType::OrganizationName, "etcd");
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, "member-a");
        let key = rcgen::KeyPair::generate().expect("a key");
        let cert = params.self_signed(&key).expect("signed");
        let der = cert.der();
        assert_eq!(subject_common_name(der).as_deref(), Some("member-a"));
        let check = |allowed: Allowed| check_allowed(&allowed, der).is_ok();
        assert!(check(Allowed::CommonName("member-a".into())));
        assert!(!check(Allowed::CommonName("member-b".into())));
        assert!(check(Allowed::Hostname("peer.example".into())));
        assert!(check(Allowed::Hostname("127.0.0.1".into())));
        assert!(!check(Allowed::Hostname("other.example".into())));
        // Truncated or garbage DER has no common name, and never panics.
        for cut in 0..der.len() {
            let _ = subject_common_name(&der[..cut]);
        }
        assert_eq!(subject_common_name(b"\x30\x84\xff\xff\xff\xff"), None);
    }
}
