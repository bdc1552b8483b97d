//! A member joining an existing cluster (`--initial-cluster-state existing` on an empty data
//! directory) learns its own id and the cluster's from the members already running.
//!
//! etcd's MemberAdd mixes the time of the call into the new member's id, so the new member
//! cannot compute it from its flags. Like etcd (which asks its peers' `GET /members` and matches
//! its own advertised peer URLs, `ValidateClusterAndAssignIDs`), it asks the other members
//! listed in `--initial-cluster` over the peer port ([`MEMBERS_QUERY`]) and takes the id of the
//! member whose peer URLs are its own. This runs once, before the raft core starts, so it uses
//! blocking sockets (and rustls's blocking stream for https peers) with short timeouts.

use std::io::{Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::config::{url_scheme_host_port, Config, Scheme};
use crate::error::CoreError;
use crate::ids::Member;
use crate::peer::{
    encode_hello, parse_members_reply, MembersReply, MEMBERS_QUERY, MEMBERS_REPLY_BYTES_MAX,
};

/// How long one peer URL gets to connect and answer.
const QUERY_TIMEOUT: Duration = Duration::from_secs(2);
/// How long the members are asked, round after round, before the start fails: the member
/// that ran MemberAdd may still be applying it.
const JOIN_DEADLINE: Duration = Duration::from_secs(15);

/// What a joining member learned: its id, the cluster's, and every member's id and peer URLs
/// (named from `--initial-cluster` where the URLs match).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Joined {
    pub member_id: u64,
    pub cluster_id: u64,
    pub members: Vec<Member>,
}

/// Asks the other members for the cluster's membership and finds this member in it. Fails,
/// as etcd does, when no member answers or none has this member's peer URLs.
pub fn learn_identity(cfg: &Config) -> Result<Joined, CoreError> {
    let client_tls = match crate::peer_tls::load(cfg)? {
        Some(t) => t.connector.map(|c| c.client_config()),
        None => None,
    };
    let own: Vec<String> = sorted(&cfg.initial_advertise_peer_urls);
    let others: Vec<&String> = cfg
        .initial_cluster
        .iter()
        .filter(|m| m.name != cfg.name)
        .flat_map(|m| &m.peer_urls)
        .collect();
    let deadline = Instant::now() + JOIN_DEADLINE;
    let mut last_error = String::from("no other member is listed in --initial-cluster");
    // Set once a member answered without this member in its list.
    let mut unmatched: Option<String> = None;
    loop {
        for url in &others {
            match ask(url, client_tls.as_ref()) {
                Ok((cluster_id, members)) => {
                    let Some((member_id, _)) = members.iter().find(|(_, urls)| sorted(urls) == own)
                    else {
                        // A follower may not have applied the MemberAdd yet: ask the others,
                        // and again, until the deadline.
                        unmatched = Some(format!("cluster {cluster_id:x} (asked {url})"));
                        continue;
                    };
                    let members = members
                        .iter()
                        .map(|(id, urls)| Member {
                            id: *id,
                            name: cfg
                                .initial_cluster
                                .iter()
                                .find(|m| sorted(&m.peer_urls) == sorted(urls))
                                .map(|m| m.name.clone())
                                .unwrap_or_default(),
                            peer_urls: urls.clone(),
                            client_urls: Vec::new(),
                            is_learner: false,
                        })
                        .collect();
                    tracing::info!(
                        member_id = format!("{member_id:x}"),
                        cluster_id = format!("{cluster_id:x}"),
                        peer = %url,
                        "joining an existing cluster: learned this member's id from a peer"
                    );
                    return Ok(Joined {
                        member_id: *member_id,
                        cluster_id,
                        members,
                    });
                }
                Err(e) => last_error = format!("{url}: {e}"),
            }
        }
        if Instant::now() >= deadline {
            if let Some(asked) = unmatched {
                // etcd: "error validating peerURLs ...: unmatched member while checking PeerURLs".
                return Err(CoreError::Config(format!(
                    "error validating peerURLs: no member of {asked} has this member's peer URLs {own:?}: add it first with `etcdctl member add {} --peer-urls={}`",
                    cfg.name,
                    own.join(",")
                )));
            }
            // etcd's words.
            return Err(CoreError::Config(format!(
                "cannot fetch cluster info from peer urls: could not retrieve cluster information from the given URLs (last: {last_error})"
            )));
        }
        std::thread::sleep(Duration::from_millis(500));
    }
}

fn sorted(urls: &[String]) -> Vec<String> {
    let mut v = urls.to_vec();
    v.sort();
    v
}

/// One members query to one peer URL.
fn ask(url: &str, tls: Option<&Arc<rustls::ClientConfig>>) -> std::io::Result<MembersReply> {
    let (scheme, host, port) =
        url_scheme_host_port("initial-cluster", url).map_err(std::io::Error::other)?;
    // As the peer transport dials: "localhost" is the IPv4 loopback.
    let ip = if host == "localhost" {
        "127.0.0.1"
    } else {
        host.as_str()
    };
    let addr = (ip, port)
        .to_socket_addrs()?
        .next()
        .ok_or_else(|| std::io::Error::other("the host resolves to no address"))?;
    let tcp = TcpStream::connect_timeout(&addr, QUERY_TIMEOUT)?;
    tcp.set_read_timeout(Some(QUERY_TIMEOUT))?;
    tcp.set_write_timeout(Some(QUERY_TIMEOUT))?;
    match scheme {
        Scheme::Http => query(tcp),
        Scheme::Https => {
            let config = tls.ok_or_else(|| {
                std::io::Error::other(
                    "an https peer URL needs --peer-trusted-ca-file (or --peer-auto-tls) to verify the peer with",
                )
            })?;
            let name = rustls::pki_types::ServerName::try_from(host.clone())
                .map_err(std::io::Error::other)?;
            let conn = rustls::ClientConnection::new(config.clone(), name)
                .map_err(std::io::Error::other)?;
            query(rustls::StreamOwned::new(conn, tcp))
        }
    }
}

fn query<S: Read + Write>(mut stream: S) -> std::io::Result<MembersReply> {
    stream.write_all(&encode_hello(&MEMBERS_QUERY))?;
    stream.flush()?;
    let mut prefix = [0u8; 4];
    stream.read_exact(&mut prefix)?;
    let len = crate::peer::frame_len(prefix, MEMBERS_REPLY_BYTES_MAX)?;
    let mut frame = vec![0u8; len];
    stream.read_exact(&mut frame)?;
    parse_members_reply(&frame)
}
