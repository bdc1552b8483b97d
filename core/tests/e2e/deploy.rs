//! deploy/: the Kubernetes manifests are schema-checked (kubernetes-validate, which carries
//! Kubernetes' JSON schemas offline), their fields must match the binary's flags, and the
//! StatefulSet's container is run here as three pods would run it (same shell script, same
//! environment, the image's ENV underneath, each "pod" on its own loopback address) and must
//! form a cluster that answers etcdctl and the probes, and survive a pod restart.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::common::{etcdctl_at, http_get, require_tool};

fn deploy_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy")
}

/// Every document of a YAML file, as JSON (python3's PyYAML does the parsing).
fn yaml_documents(path: &Path) -> Vec<Value> {
    require_tool("python3");
    let out = Command::new("python3")
        .args([
            "-c",
            "import json, sys, yaml; print(json.dumps([d for d in yaml.safe_load_all(open(sys.argv[1])) if d]))",
        ])
        .arg(path)
        .output()
        .expect("python3 runs");
    assert!(
        out.status.success(),
        "PyYAML parses {}: {}",
        path.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice::<Value>(&out.stdout)
        .expect("JSON")
        .as_array()
        .expect("a list")
        .clone()
}

fn manifests() -> Vec<Value> {
    yaml_documents(&deploy_dir().join("kubernetes/keel.yaml"))
}

fn of_kind<'a>(docs: &'a [Value], kind: &str) -> Vec<&'a Value> {
    docs.iter().filter(|d| d["kind"] == kind).collect()
}

#[test]
fn the_manifests_pass_kubernetes_schemas() {
    require_tool("kubernetes-validate");
    let out = Command::new("kubernetes-validate")
        .args(["--strict", "-k", "1.30.0"])
        .arg(deploy_dir().join("kubernetes/keel.yaml"))
        .output()
        .expect("kubernetes-validate runs");
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{text}");
    for kind in [
        "service/keel",
        "statefulset/keel",
        "poddisruptionbudget/keel",
    ] {
        assert!(
            text.contains(&format!("passed for resource {kind}")),
            "{text}"
        );
    }
}

/// The port a `http://host:port` URL names.
fn url_port(url: &str) -> u64 {
    url.rsplit(':')
        .next()
        .and_then(|p| p.trim_end_matches('/').parse().ok())
        .unwrap_or_else(|| panic!("{url} has a port"))
}

/// The container's environment with Kubernetes' `$(VAR)` references expanded, as the kubelet
/// does (a reference to an earlier variable in the list), given the downward-API values.
fn container_env(container: &Value, downward: &[(&str, &str)]) -> Vec<(String, String)> {
    let mut env: Vec<(String, String)> = Vec::new();
    for e in container["env"].as_array().expect("env") {
        let name = e["name"].as_str().expect("name").to_string();
        let mut value = match e["value"].as_str() {
            Some(v) => v.to_string(),
            None => {
                let field = e["valueFrom"]["fieldRef"]["fieldPath"]
                    .as_str()
                    .expect("a downward-API field");
                downward
                    .iter()
                    .find(|(f, _)| *f == field)
                    .unwrap_or_else(|| panic!("no value for {field}"))
                    .1
                    .to_string()
            }
        };
        for (k, v) in &env {
            value = value.replace(&format!("$({k})"), v);
        }
        env.push((name, value));
    }
    env
}

#[test]
fn the_manifests_agree_with_each_other_and_the_binary() {
    let docs = manifests();
    let sts = of_kind(&docs, "StatefulSet")[0];
    let services = of_kind(&docs, "Service");
    let headless = services
        .iter()
        .find(|s| s["spec"]["clusterIP"] == "None")
        .expect("a headless Service");
    assert_eq!(sts["spec"]["serviceName"], headless["metadata"]["name"]);
    assert_eq!(headless["spec"]["publishNotReadyAddresses"], true);
    let pod = &sts["spec"]["template"];
    let labels = pod["metadata"]["labels"].as_object().expect("pod labels");
    for s in &services {
        for (k, v) in s["spec"]["selector"].as_object().expect("selector") {
            assert_eq!(labels.get(k), Some(v), "Service selector {k}");
        }
    }
    let pdb = of_kind(&docs, "PodDisruptionBudget")[0];
    for (k, v) in pdb["spec"]["selector"]["matchLabels"]
        .as_object()
        .expect("PDB selector")
    {
        assert_eq!(labels.get(k), Some(v), "PDB selector {k}");
    }
    assert_eq!(
        pdb["spec"]["maxUnavailable"], 1,
        "a 3-member cluster loses at most one"
    );
    let c = &pod["spec"]["containers"][0];
    let ports: Vec<(String, u64)> = c["ports"]
        .as_array()
        .expect("ports")
        .iter()
        .map(|p| {
            (
                p["name"].as_str().expect("port name").to_string(),
                p["containerPort"].as_u64().expect("port"),
            )
        })
        .collect();
    let port = |name: &str| {
        ports
            .iter()
            .find(|(n, _)| n == name)
            .unwrap_or_else(|| panic!("no {name} port"))
            .1
    };
    let env = container_env(c, &[("metadata.name", "keel-0")]);
    let var = |name: &str| {
        env.iter()
            .find(|(n, _)| n == name)
            .unwrap_or_else(|| panic!("no {name}"))
            .1
            .clone()
    };
    assert_eq!(url_port(&var("ETCD_LISTEN_CLIENT_URLS")), port("client"));
    assert_eq!(url_port(&var("ETCD_ADVERTISE_CLIENT_URLS")), port("client"));
    assert_eq!(url_port(&var("ETCD_LISTEN_PEER_URLS")), port("peer"));
    assert_eq!(
        url_port(&var("ETCD_INITIAL_ADVERTISE_PEER_URLS")),
        port("peer")
    );
    assert_eq!(url_port(&var("ETCD_LISTEN_METRICS_URLS")), port("metrics"));
    // The headless Service's ports are the container's.
    for p in headless["spec"]["ports"].as_array().expect("ports") {
        let name = p["targetPort"].as_str().expect("a named target");
        assert_eq!(p["port"].as_u64(), Some(port(name)), "{name}");
    }
    // Probes: etcd 3.5's endpoints on a named port that exists.
    for (probe, path) in [
        ("livenessProbe", "/livez"),
        ("readinessProbe", "/readyz"),
        ("startupProbe", "/readyz"),
    ] {
        assert_eq!(c[probe]["httpGet"]["path"], path, "{probe}");
        let p = c[probe]["httpGet"]["port"].as_str().expect("named port");
        port(p);
    }
    // The data directory lives on the volume claim.
    let mount = c["volumeMounts"][0]["mountPath"].as_str().expect("mount");
    assert_eq!(
        c["volumeMounts"][0]["name"],
        sts["spec"]["volumeClaimTemplates"][0]["metadata"]["name"]
    );
    assert!(
        var("ETCD_DATA_DIR").starts_with(mount),
        "data dir on the volume"
    );
    // Each peer URL in the initial cluster is a pod's name under the headless Service.
    let replicas = sts["spec"]["replicas"].as_u64().expect("replicas");
    let initial = var("ETCD_INITIAL_CLUSTER");
    for i in 0..replicas {
        assert!(
            initial.contains(&format!("keel-{i}=http://keel-{i}.keel.")),
            "{initial}"
        );
    }
    assert!(var("ETCD_INITIAL_ADVERTISE_PEER_URLS").starts_with("http://keel-0.keel."));
    // The image runs as the user the pod's security context names.
    let dockerfile = std::fs::read_to_string(deploy_dir().join("Dockerfile")).expect("Dockerfile");
    let uid = pod["spec"]["securityContext"]["runAsUser"]
        .as_u64()
        .expect("runAsUser");
    assert!(
        dockerfile.contains(&format!("--uid {uid}")),
        "Dockerfile user"
    );
}

/// The image's `ENV` settings (the pod's env is laid over them, as a container runtime does).
fn dockerfile_env() -> Vec<(String, String)> {
    let text = std::fs::read_to_string(deploy_dir().join("Dockerfile")).expect("Dockerfile");
    let joined = text.replace("\\\n", " ");
    let mut env = Vec::new();
    for line in joined.lines().filter(|l| l.starts_with("ENV ")) {
        for pair in line["ENV ".len()..].split_whitespace() {
            let (k, v) = pair.split_once('=').expect("ENV k=v");
            env.push((k.to_string(), v.to_string()));
        }
    }
    assert!(!env.is_empty(), "the image sets etcd's variables");
    env
}

/// One emulated pod: the StatefulSet's container script run with its environment, with the
/// cluster's DNS names and the wildcard address replaced by the pod's own loopback address.
struct Pod {
    name: String,
    ip: String,
    root: PathBuf,
    child: Option<Child>,
    runs: u32,
}

const POD_IPS: [&str; 3] = ["127.0.1.1", "127.0.1.2", "127.0.1.3"];

impl Pod {
    fn localize(&self, text: &str) -> String {
        let mut t = text.replace("/var/lib/keel", &self.root.display().to_string());
        t = t.replace("/usr/local/bin/keel", env!("CARGO_BIN_EXE_keel"));
        t = t.replace("0.0.0.0", &self.ip);
        for (i, ip) in POD_IPS.iter().enumerate() {
            t = t.replace(&format!("keel-{i}.keel.default.svc.cluster.local"), ip);
        }
        t
    }

    fn start(&mut self, container: &Value) {
        self.runs += 1;
        let command: Vec<String> = container["command"]
            .as_array()
            .expect("command")
            .iter()
            .chain(container["args"].as_array().expect("args"))
            .map(|v| self.localize(v.as_str().expect("text")))
            .collect();
        let mut env: Vec<(String, String)> = dockerfile_env();
        for (k, v) in container_env(container, &[("metadata.name", &self.name)]) {
            env.retain(|(n, _)| *n != k);
            env.push((k, v));
        }
        let log = std::fs::File::create(self.root.join(format!("pod-{}.log", self.runs)))
            .expect("log file");
        let child = Command::new(&command[0])
            .args(&command[1..])
            .env_clear()
            .env("PATH", std::env::var("PATH").unwrap_or_default())
            // Three members share this small machine: one client shard each.
            .env("KEEL_SHARDS", "1")
            .envs(env.iter().map(|(k, v)| (k.clone(), self.localize(v))))
            .current_dir(&self.root)
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log"))
            .stderr(log)
            .spawn()
            .expect("the pod's command starts");
        self.child = Some(child);
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.root.join(format!("pod-{}.log", self.runs)))
            .unwrap_or_default()
    }

    fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            // SAFETY: kill() on a pid we spawned and have not reaped.
            unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
            let deadline = Instant::now() + Duration::from_secs(15);
            while Instant::now() < deadline {
                if child.try_wait().expect("wait").is_some() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for Pod {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Whether `path` on `addr` answers 200 "ok" (false while nothing listens there yet).
fn probe_ok(addr: &str, path: &str) -> bool {
    let sock: std::net::SocketAddr = addr.parse().expect("an address");
    std::net::TcpStream::connect_timeout(&sock, Duration::from_secs(1)).is_ok()
        && http_get(addr, path) == (200, "ok".into())
}

fn wait_until(
    what: &str,
    timeout: Duration,
    mut ok: impl FnMut() -> bool,
    logs: &dyn Fn() -> String,
) {
    let deadline = Instant::now() + timeout;
    while Instant::now() < deadline {
        if ok() {
            return;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    panic!("timed out waiting for {what}\n{}", logs());
}

#[test]
fn the_statefulset_forms_a_cluster_as_three_pods_would() {
    let docs = manifests();
    let sts = of_kind(&docs, "StatefulSet")[0];
    let container = sts["spec"]["template"]["spec"]["containers"][0].clone();
    let dir = tempfile::tempdir().expect("temp dir");
    let mut pods: Vec<Pod> = (0..3)
        .map(|i| {
            let root = dir.path().join(format!("keel-{i}"));
            std::fs::create_dir_all(&root).expect("pod root");
            Pod {
                name: format!("keel-{i}"),
                ip: POD_IPS[i].to_string(),
                root,
                child: None,
                runs: 0,
            }
        })
        .collect();
    for p in &mut pods {
        p.start(&container);
    }
    let logs = |pods: &[Pod]| -> String {
        pods.iter()
            .map(|p| format!("--- {}:\n{}", p.name, p.log()))
            .collect::<Vec<_>>()
            .join("\n")
    };
    let all = POD_IPS
        .iter()
        .map(|ip| format!("{ip}:2379"))
        .collect::<Vec<_>>()
        .join(",");
    wait_until(
        "every pod ready (/readyz on the metrics port)",
        Duration::from_secs(30),
        || {
            POD_IPS
                .iter()
                .all(|ip| probe_ok(&format!("{ip}:2381"), "/readyz"))
        },
        &|| logs(&pods),
    );
    for ip in POD_IPS {
        assert_eq!(
            http_get(&format!("{ip}:2381"), "/livez"),
            (200, "ok".into())
        );
        let (_, metrics) = http_get(&format!("{ip}:2381"), "/metrics");
        assert!(
            metrics.contains("\netcd_server_has_leader 1\n"),
            "{metrics}"
        );
    }
    let health = etcdctl_at(&all, &["endpoint", "health"], None);
    assert_eq!(health.code, 0, "{health:?}\n{}", logs(&pods));
    etcdctl_at(
        &format!("{}:2379", POD_IPS[0]),
        &["put", "deploy/k", "v1"],
        None,
    )
    .ok();
    let got = etcdctl_at(
        &format!("{}:2379", POD_IPS[2]),
        &["get", "deploy/k", "--print-value-only"],
        None,
    )
    .ok();
    assert_eq!(got.stdout.trim(), "v1");
    // Members advertise their pod DNS names (resolved here to the pods' addresses).
    let members = etcdctl_at(&all, &["member", "list"], None).ok();
    for ip in POD_IPS {
        assert!(
            members.stdout.contains(&format!("http://{ip}:2379")),
            "{members:?}"
        );
    }
    for (i, p) in pods.iter().enumerate() {
        let log = p.log();
        assert!(log.contains("starting member"), "pod {i}: {log}");
    }

    // A pod restarts (rescheduled, same volume): its script finds the WAL and says "existing".
    pods[1].stop();
    // If the stopped pod led, a write waits for the next election (a proposal forwarded to
    // the dead leader times out, as on etcd): retry until the two others have a leader.
    let mut put = etcdctl_at(
        &format!("{}:2379", POD_IPS[0]),
        &["put", "deploy/k", "v2"],
        None,
    );
    let deadline = Instant::now() + Duration::from_secs(30);
    while put.code != 0 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(500));
        put = etcdctl_at(
            &format!("{}:2379", POD_IPS[0]),
            &["put", "deploy/k", "v2"],
            None,
        );
    }
    assert_eq!(put.code, 0, "{put:?}\n{}", logs(&pods));
    pods[1].start(&container);
    wait_until(
        "the restarted pod ready",
        Duration::from_secs(30),
        || probe_ok(&format!("{}:2381", POD_IPS[1]), "/readyz"),
        &|| logs(&pods),
    );
    let log = pods[1].log();
    assert!(log.contains("restarting member"), "{log}");
    let got = etcdctl_at(
        &format!("{}:2379", POD_IPS[1]),
        &["get", "deploy/k", "--print-value-only", "--consistency=s"],
        None,
    )
    .ok();
    assert_eq!(got.stdout.trim(), "v2", "the restarted member caught up");
    for p in &mut pods {
        p.stop();
    }
}

/// Helm cannot be installed here (no Debian or PyPI package carries it), so the chart is not
/// rendered; this checks what can be checked without it: the chart parses, every value a
/// template reads is defined, and the StatefulSet template sets the same etcd variables,
/// ports and probes as the plain manifest the other tests run.
#[test]
fn the_helm_chart_is_complete_and_matches_the_manifest() {
    let chart = deploy_dir().join("helm/keel");
    let meta = &yaml_documents(&chart.join("Chart.yaml"))[0];
    assert_eq!(meta["apiVersion"], "v2");
    assert_eq!(meta["name"], "keel");
    let values = yaml_documents(&chart.join("values.yaml"))[0].clone();
    let mut templates = String::new();
    for entry in std::fs::read_dir(chart.join("templates")).expect("templates") {
        let path = entry.expect("entry").path();
        templates += &std::fs::read_to_string(&path).expect("template");
    }
    // Every `.Values.a.b` a template reads is in values.yaml.
    let mut rest = templates.as_str();
    let mut read = 0;
    while let Some(at) = rest.find(".Values.") {
        rest = &rest[at + ".Values.".len()..];
        let end = rest
            .find(|c: char| !(c.is_alphanumeric() || c == '.' || c == '_'))
            .unwrap_or(rest.len());
        let path = rest[..end].trim_end_matches('.');
        let mut v = &values;
        for part in path.split('.') {
            v = &v[part];
        }
        assert!(!v.is_null(), ".Values.{path} is not in values.yaml");
        read += 1;
    }
    assert!(read >= 20, "the templates read their values");
    let docs = manifests();
    let sts = of_kind(&docs, "StatefulSet")[0];
    let c = &sts["spec"]["template"]["spec"]["containers"][0];
    for e in c["env"].as_array().expect("env") {
        let name = e["name"].as_str().expect("name");
        if name == "NAMESPACE" {
            continue; // the chart uses .Release.Namespace instead
        }
        assert!(
            templates.contains(&format!("- name: {name}\n")),
            "the chart lacks {name}"
        );
    }
    for needle in [
        "path: /livez",
        "path: /readyz",
        "podManagementPolicy: Parallel",
        "publishNotReadyAddresses: true",
        "clusterIP: None",
        "kind: PodDisruptionBudget",
        "state=existing",
        "secretName:",
    ] {
        assert!(templates.contains(needle), "the chart lacks {needle:?}");
    }
}
