//! The lifecycle lines etcd logs, in etcd's words, so the scripts, probes and runbooks that
//! grep an etcd log for them ("ready to serve client requests", "serving insecure client
//! requests on ...") work on Keel's log too. Keel's structured fields ride along.
//!
//! The raft lines ("became leader at term", "elected leader") and "published local member to
//! cluster through raft" are logged by the member where those things happen.

use crate::config::{Config, Scheme};
use crate::ids::{Bootstrap, Identity};

/// "starting member" (a new data directory) or "restarting member" (an existing one).
pub fn log_starting(identity: &Identity, bootstrap: &Bootstrap) {
    let (member, cluster) = (
        format!("{:x}", identity.member_id),
        format!("{:x}", identity.cluster_id),
    );
    match bootstrap {
        Bootstrap::New => tracing::info!(
            local_member_id = %member,
            cluster_id = %cluster,
            "starting member {member} in cluster {cluster}"
        ),
        Bootstrap::Restart => tracing::info!(
            local_member_id = %member,
            cluster_id = %cluster,
            "restarting member {member} in cluster {cluster}"
        ),
    }
}

/// "listening for peers on ..." for one peer listener.
pub fn log_listening_for_peers(addr: &std::net::SocketAddr) {
    tracing::info!(address = %addr, "listening for peers on {addr}");
}

/// Once the shards serve: "ready to serve client requests", then one line per client
/// listener as etcd's serve.go words it.
pub fn log_serving(config: &Config) {
    tracing::info!("ready to serve client requests");
    for l in &config.listen_client {
        let addr = l.addr;
        match l.scheme {
            Scheme::Http => tracing::warn!(
                address = %addr,
                "serving insecure client requests on {addr}, this is strongly discouraged!"
            ),
            Scheme::Https => {
                tracing::info!(address = %addr, "serving client requests on {addr}")
            }
        }
    }
    for u in &config.listen_client_unix {
        let path = u.path.display();
        tracing::warn!(
            address = %path,
            "serving insecure client requests on {path}, this is strongly discouraged!"
        );
    }
    for l in &config.listen_metrics {
        let addr = l.addr;
        tracing::info!(address = %addr, "serving metrics requests on {addr}");
    }
}
