//! deploy/: the Kubernetes manifests and the Helm chart (rendered by deploy/helm/render, Helm's
//! engine rebuilt from Debian's Go and Sprig) are schema-checked (kubernetes-validate, which
//! carries Kubernetes' JSON schemas offline), their fields must match each other and the
//! binary's flags, and each StatefulSet's container is run here as three pods would run it
//! (same shell script, same environment, the image's ENV underneath, each "pod" on its own
//! loopback address) and must form a cluster that answers etcdctl and the probes, and survive
//! a pod restart.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::common::{etcdctl_at, http_get, require_tool, OpensslPki, Output};

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

/// Runs kubernetes-validate (Kubernetes 1.30's schemas, unknown fields refused) on a file and
/// checks that it named every document of `docs` as passed: a document it skipped (an unknown
/// kind, say) would otherwise pass unnoticed.
fn assert_schemas_pass(path: &Path, docs: &[Value]) {
    require_tool("kubernetes-validate");
    let out = Command::new("kubernetes-validate")
        .args(["--strict", "-k", "1.30.0"])
        .arg(path)
        .output()
        .expect("kubernetes-validate runs");
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{text}");
    assert!(!docs.is_empty());
    for d in docs {
        let kind = d["kind"].as_str().expect("kind").to_lowercase();
        let name = d["metadata"]["name"].as_str().expect("name");
        assert!(
            text.contains(&format!("passed for resource {kind}/{name} ")),
            "{kind}/{name}: {text}"
        );
    }
}

#[test]
fn the_manifests_pass_kubernetes_schemas() {
    let docs = manifests();
    let kinds: Vec<&str> = docs
        .iter()
        .map(|d| d["kind"].as_str().expect("kind"))
        .collect();
    assert_eq!(
        kinds,
        ["Service", "Service", "PodDisruptionBudget", "StatefulSet"]
    );
    assert_schemas_pass(&deploy_dir().join("kubernetes/keel.yaml"), &docs);
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
    assert_consistent(&manifests());
}

/// The documents of one deployment (the manifest, or a rendering of the chart) agree with each
/// other and with the binary's flags: selectors select the pods, URLs carry the ports the
/// container and the Services name, probes hit a port that exists, the data lives on the
/// volume claim, and the initial cluster lists every replica under the headless Service.
fn assert_consistent(docs: &[Value]) {
    let sts = of_kind(docs, "StatefulSet")[0];
    let name = sts["metadata"]["name"].as_str().expect("name");
    let services = of_kind(docs, "Service");
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
    let pdb = of_kind(docs, "PodDisruptionBudget")[0];
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
    let env = container_env(c, &[("metadata.name", &format!("{name}-0"))]);
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
    let service = sts["spec"]["serviceName"].as_str().expect("serviceName");
    let initial = var("ETCD_INITIAL_CLUSTER");
    assert_eq!(
        initial.split(',').count() as u64,
        replicas,
        "one member per replica: {initial}"
    );
    for i in 0..replicas {
        assert!(
            initial.contains(&format!("{name}-{i}=http://{name}-{i}.{service}.")),
            "{initial}"
        );
    }
    assert!(
        var("ETCD_INITIAL_ADVERTISE_PEER_URLS").starts_with(&format!("http://{name}-0.{service}."))
    );
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
    /// What the container names that is something else here: the members' DNS names (their
    /// loopback addresses) and mounted Secrets (local directories).
    stand_ins: Vec<(String, String)>,
    child: Option<Child>,
    runs: u32,
}

/// The pods' addresses, one set per test so that two emulated clusters can run at once.
const MANIFEST_POD_IPS: [&str; 3] = ["127.0.1.1", "127.0.1.2", "127.0.1.3"];
const CHART_POD_IPS: [&str; 3] = ["127.0.2.1", "127.0.2.2", "127.0.2.3"];

impl Pod {
    fn localize(&self, text: &str) -> String {
        let mut t = text.replace("/var/lib/keel", &self.root.display().to_string());
        t = t.replace("/usr/local/bin/keel", env!("CARGO_BIN_EXE_keel"));
        t = t.replace("0.0.0.0", &self.ip);
        for (from, to) in &self.stand_ins {
            t = t.replace(from, to);
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
    assert_forms_a_cluster(
        of_kind(&docs, "StatefulSet")[0],
        "default",
        MANIFEST_POD_IPS,
        None,
        &[],
    );
}

/// A named port of a container.
fn container_port(container: &Value, name: &str) -> u64 {
    container["ports"]
        .as_array()
        .expect("ports")
        .iter()
        .find(|p| p["name"] == name)
        .and_then(|p| p["containerPort"].as_u64())
        .unwrap_or_else(|| panic!("no {name} port"))
}

/// Client TLS for an emulated cluster: the directory standing for the Secret the pods mount,
/// and the flags that make etcdctl a client the members accept.
struct ClientTls {
    secret_dir: PathBuf,
    etcdctl_flags: Vec<String>,
}

/// Runs a StatefulSet's container as three pods in `namespace` would (see `Pod`), on `ips`:
/// they must become ready, answer the probes and etcdctl (over TLS when the pods mount a
/// Secret), advertise their DNS names, run with `flags` on keel's command line, and take back
/// a restarted pod.
fn assert_forms_a_cluster(
    sts: &Value,
    namespace: &str,
    ips: [&str; 3],
    tls: Option<&ClientTls>,
    flags: &[&str],
) {
    let set = sts["metadata"]["name"].as_str().expect("name");
    let service = sts["spec"]["serviceName"].as_str().expect("serviceName");
    let pod_spec = &sts["spec"]["template"]["spec"];
    let container = pod_spec["containers"][0].clone();
    let client_port = container_port(&container, "client");
    let metrics_port = container_port(&container, "metrics");
    let scheme = if tls.is_some() { "https" } else { "http" };
    let advertised = container_env(&container, &[("metadata.name", "x")])
        .into_iter()
        .find(|(n, _)| n == "ETCD_ADVERTISE_CLIENT_URLS")
        .expect("an advertised client URL")
        .1;
    assert!(
        advertised.starts_with(&format!("{scheme}://")),
        "{advertised}"
    );
    // Each pod's DNS name under the headless Service stands for its address.
    let mut stand_ins: Vec<(String, String)> = ips
        .iter()
        .enumerate()
        .map(|(i, ip)| {
            (
                format!("{set}-{i}.{service}.{namespace}.svc.cluster.local"),
                ip.to_string(),
            )
        })
        .collect();
    // Only a Secret volume can be emulated (the TLS directory stands for its mount): any other
    // kind fails here rather than leave the pods without it.
    for v in pod_spec["volumes"].as_array().into_iter().flatten() {
        assert!(v["secret"].is_object(), "only Secret volumes: {v}");
        let mount = container["volumeMounts"]
            .as_array()
            .expect("mounts")
            .iter()
            .find(|m| m["name"] == v["name"])
            .expect("the Secret is mounted");
        let tls = tls.expect("the pods mount a TLS Secret: the test must provide one");
        stand_ins.push((
            mount["mountPath"].as_str().expect("path").to_string(),
            tls.secret_dir.display().to_string(),
        ));
    }
    let dir = tempfile::tempdir().expect("temp dir");
    let mut pods: Vec<Pod> = (0..3)
        .map(|i| {
            let root = dir.path().join(format!("{set}-{i}"));
            std::fs::create_dir_all(&root).expect("pod root");
            Pod {
                name: format!("{set}-{i}"),
                ip: ips[i].to_string(),
                root,
                stand_ins: stand_ins.clone(),
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
    let endpoint = |ip: &str| format!("{scheme}://{ip}:{client_port}");
    let all = ips
        .iter()
        .map(|ip| endpoint(ip))
        .collect::<Vec<_>>()
        .join(",");
    let etcdctl = |endpoints: &str, args: &[&str]| -> Output {
        let mut full: Vec<&str> = tls
            .map(|t| t.etcdctl_flags.iter().map(String::as_str).collect())
            .unwrap_or_default();
        full.extend_from_slice(args);
        etcdctl_at(endpoints, &full, None)
    };
    let metrics = |ip: &str| format!("{ip}:{metrics_port}");
    wait_until(
        "every pod ready (/readyz on the metrics port)",
        Duration::from_secs(30),
        || ips.iter().all(|ip| probe_ok(&metrics(ip), "/readyz")),
        &|| logs(&pods),
    );
    for ip in ips {
        assert_eq!(http_get(&metrics(ip), "/livez"), (200, "ok".into()));
        let (_, text) = http_get(&metrics(ip), "/metrics");
        assert!(text.contains("\netcd_server_has_leader 1\n"), "{text}");
    }
    // The shell script exec'd keel with the flags the container asked for.
    for p in &pods {
        let pid = p.child.as_ref().expect("running").id();
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).expect("cmdline");
        let args: Vec<String> = cmdline
            .split(|b| *b == 0)
            .map(|a| String::from_utf8_lossy(a).into_owned())
            .collect();
        assert_eq!(args[0], env!("CARGO_BIN_EXE_keel"), "{args:?}");
        assert_eq!(args[1], "--initial-cluster-state=new", "{args:?}");
        for f in flags {
            assert!(args.iter().any(|a| a == f), "{f} in {args:?}");
        }
    }
    let health = etcdctl(&all, &["endpoint", "health"]);
    assert_eq!(health.code, 0, "{health:?}\n{}", logs(&pods));
    etcdctl(&endpoint(ips[0]), &["put", "deploy/k", "v1"]).ok();
    let got = etcdctl(
        &endpoint(ips[2]),
        &["get", "deploy/k", "--print-value-only"],
    )
    .ok();
    assert_eq!(got.stdout.trim(), "v1");
    // Members advertise their pod DNS names (resolved here to the pods' addresses).
    let members = etcdctl(&all, &["member", "list"]).ok();
    for ip in ips {
        assert!(members.stdout.contains(&endpoint(ip)), "{members:?}");
    }
    for (i, p) in pods.iter().enumerate() {
        let log = p.log();
        assert!(log.contains("starting member"), "pod {i}: {log}");
    }

    // A pod restarts (rescheduled, same volume): its script finds the WAL and says "existing".
    pods[1].stop();
    // If the stopped pod led, a write waits for the next election (a proposal forwarded to
    // the dead leader times out, as on etcd): retry until the two others have a leader.
    let mut put = etcdctl(&endpoint(ips[0]), &["put", "deploy/k", "v2"]);
    let deadline = Instant::now() + Duration::from_secs(30);
    while put.code != 0 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(500));
        put = etcdctl(&endpoint(ips[0]), &["put", "deploy/k", "v2"]);
    }
    assert_eq!(put.code, 0, "{put:?}\n{}", logs(&pods));
    pods[1].start(&container);
    wait_until(
        "the restarted pod ready",
        Duration::from_secs(30),
        || probe_ok(&metrics(ips[1]), "/readyz"),
        &|| logs(&pods),
    );
    let log = pods[1].log();
    assert!(log.contains("restarting member"), "{log}");
    let got = etcdctl(
        &endpoint(ips[1]),
        &["get", "deploy/k", "--print-value-only", "--consistency=s"],
    )
    .ok();
    assert_eq!(got.stdout.trim(), "v2", "the restarted member caught up");
    for p in &mut pods {
        p.stop();
    }
}

/// The chart renderer (deploy/helm/render), built once per test process by Debian's Go in
/// GOPATH mode against the sources Debian's -dev packages install (no module proxy is
/// reachable here, and no package carries helm itself).
fn renderer() -> &'static Path {
    static RENDERER: OnceLock<PathBuf> = OnceLock::new();
    RENDERER.get_or_init(|| {
        require_tool("go");
        let tmp = Path::new(env!("CARGO_TARGET_TMPDIR"));
        let bin = tmp.join("helm-render");
        let out = Command::new("go")
            .args(["build", "-o"])
            .arg(&bin)
            .arg(".")
            .current_dir(deploy_dir().join("helm/render"))
            .env("GO111MODULE", "off")
            .env("GOPATH", "/usr/share/gocode")
            // Go needs a build cache; HOME may be unset or read-only where tests run.
            .env("GOCACHE", tmp.join("go-build-cache"))
            .output()
            .expect("go runs");
        assert!(
            out.status.success(),
            "building deploy/helm/render (Debian: golang-go golang-github-masterminds-sprig-dev \
             golang-k8s-sigs-yaml-dev): {}",
            String::from_utf8_lossy(&out.stderr)
        );
        bin
    })
}

/// `helm template <release> deploy/helm/keel --namespace <namespace> <args>`, by the renderer.
fn helm_template(release: &str, namespace: &str, args: &[&str]) -> Output {
    let out = Command::new(renderer())
        .arg(release)
        .arg(deploy_dir().join("helm/keel"))
        .args(["--namespace", namespace])
        .args(args)
        .output()
        .expect("the renderer runs");
    Output {
        code: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

/// The chart rendered with `args`, each document schema-checked as the manifests are, and the
/// whole deployment consistent (`assert_consistent`).
fn render_chart(release: &str, namespace: &str, args: &[&str]) -> Vec<Value> {
    let out = helm_template(release, namespace, args).ok();
    let dir = tempfile::tempdir().expect("temp dir");
    let file = dir.path().join("rendered.yaml");
    std::fs::write(&file, &out.stdout).expect("write the rendering");
    let docs = yaml_documents(&file);
    // helm template's layout: each document after "---" and its source, kinds in helm's
    // install order.
    let sources: Vec<&str> = out
        .stdout
        .lines()
        .filter(|l| l.starts_with("# Source: "))
        .collect();
    assert_eq!(
        out.stdout.matches("---\n# Source: keel/templates/").count(),
        docs.len()
    );
    assert_eq!(sources.len(), docs.len(), "{}", out.stdout);
    let kinds: Vec<&str> = docs
        .iter()
        .map(|d| d["kind"].as_str().expect("kind"))
        .collect();
    assert_eq!(
        kinds,
        ["PodDisruptionBudget", "Service", "Service", "StatefulSet"]
    );
    assert_schemas_pass(&file, &docs);
    assert_consistent(&docs);
    docs
}

/// The one StatefulSet's container's expanded environment as a name → value map.
fn env_of(docs: &[Value], pod_name: &str) -> std::collections::BTreeMap<String, String> {
    let sts = of_kind(docs, "StatefulSet")[0];
    container_env(
        &sts["spec"]["template"]["spec"]["containers"][0],
        &[("metadata.name", pod_name)],
    )
    .into_iter()
    .collect()
}

/// A document with what the chart adds by design taken out: the `app.kubernetes.io/instance`
/// label (one release's pods apart from another's) and the container's environment replaced by
/// its expansion (the manifest spells the namespace as $(NAMESPACE), the chart inlines it).
fn comparable(doc: &Value) -> Value {
    fn strip(v: &mut Value) {
        match v {
            Value::Object(m) => {
                m.remove("app.kubernetes.io/instance");
                m.values_mut().for_each(strip);
            }
            Value::Array(a) => a.iter_mut().for_each(strip),
            _ => {}
        }
    }
    let mut d = doc.clone();
    strip(&mut d);
    if d["kind"] == "StatefulSet" {
        let c = &mut d["spec"]["template"]["spec"]["containers"][0];
        let env: Vec<Value> = container_env(c, &[("metadata.name", "keel-0")])
            .into_iter()
            // NAMESPACE exists in the manifest only to be referenced; ETCD_QUOTA_BACKEND_BYTES=0
            // (etcd's default, what an unset variable means) exists in the chart only.
            .filter(|(n, v)| n != "NAMESPACE" && !(n == "ETCD_QUOTA_BACKEND_BYTES" && v == "0"))
            .map(|(n, v)| serde_json::json!({ "name": n, "value": v }))
            .collect();
        c["env"] = Value::Array(env);
    }
    d
}

#[test]
fn the_helm_chart_renders_as_the_manifest_with_default_values() {
    let chart = render_chart("keel", "default", &[]);
    assert_eq!(
        env_of(&chart, "keel-0")["ETCD_QUOTA_BACKEND_BYTES"],
        "0",
        "the chart's default quota is etcd's"
    );
    let mut manifest = manifests();
    let key = |d: &Value| format!("{}/{}", d["kind"], d["metadata"]["name"]);
    manifest.sort_by_key(key);
    let mut chart: Vec<Value> = chart.iter().map(comparable).collect();
    chart.sort_by_key(key);
    let manifest: Vec<Value> = manifest.iter().map(comparable).collect();
    for (c, m) in chart.iter().zip(&manifest) {
        assert_eq!(
            c,
            m,
            "{}: chart\n{}\nmanifest\n{}",
            key(m),
            serde_json::to_string_pretty(c).expect("json"),
            serde_json::to_string_pretty(m).expect("json")
        );
    }
    assert_eq!(chart.len(), manifest.len());
}

#[test]
fn the_helm_chart_renders_value_overrides_as_helm_would() {
    // A values file (numbers from a file are floats to helm) under --set (which wins).
    let dir = tempfile::tempdir().expect("temp dir");
    let values = dir.path().join("prod.yaml");
    std::fs::write(
        &values,
        "replicas: 5\nquotaBackendBytes: 8589934592\nports:\n  client: 12379\n\
         persistence:\n  storageClassName: fast\nclusterToken: prod-keel\nimage:\n  tag: v1\n",
    )
    .expect("write values");
    let values = values.display().to_string();
    let docs = render_chart("kv", "prod", &["-f", &values, "--set", "image.tag=v2"]);
    let sts = of_kind(&docs, "StatefulSet")[0];
    assert_eq!(sts["metadata"]["name"], "kv");
    assert_eq!(sts["spec"]["replicas"], 5);
    let c = &sts["spec"]["template"]["spec"]["containers"][0];
    assert_eq!(c["image"], "keel:v2", "--set wins over -f");
    assert_eq!(container_port(c, "client"), 12379);
    assert_eq!(
        container_port(c, "peer"),
        2380,
        "values.yaml fills what the file leaves out"
    );
    assert_eq!(
        sts["spec"]["volumeClaimTemplates"][0]["spec"]["storageClassName"],
        "fast"
    );
    let env = env_of(&docs, "kv-4");
    assert_eq!(
        env["ETCD_QUOTA_BACKEND_BYTES"], "8589934592",
        "not 8.589934592e+09"
    );
    assert_eq!(env["ETCD_INITIAL_CLUSTER_TOKEN"], "prod-keel");
    assert_eq!(
        env["ETCD_ADVERTISE_CLIENT_URLS"],
        "http://kv-4.kv.prod.svc.cluster.local:12379"
    );
    assert!(
        env["ETCD_INITIAL_CLUSTER"].ends_with(",kv-4=http://kv-4.kv.prod.svc.cluster.local:2380")
    );
    assert!(!env.contains_key("ETCD_CERT_FILE"));

    // Client TLS from a Secret: https client URLs, the Secret's files mounted read-only.
    let docs = render_chart(
        "kv",
        "prod",
        &[
            "--set",
            "tls.enabled=true,tls.secretName=prod-tls,tls.clientCertAuth=false",
        ],
    );
    let env = env_of(&docs, "kv-0");
    assert_eq!(env["ETCD_LISTEN_CLIENT_URLS"], "https://0.0.0.0:2379");
    assert_eq!(
        env["ETCD_ADVERTISE_CLIENT_URLS"],
        "https://kv-0.kv.prod.svc.cluster.local:2379"
    );
    assert_eq!(env["ETCD_LISTEN_PEER_URLS"], "http://0.0.0.0:2380");
    assert_eq!(env["ETCD_CLIENT_CERT_AUTH"], "false");
    let pod = &of_kind(&docs, "StatefulSet")[0]["spec"]["template"]["spec"];
    assert_eq!(pod["volumes"][0]["secret"]["secretName"], "prod-tls");
    let mount = pod["containers"][0]["volumeMounts"]
        .as_array()
        .expect("mounts")
        .iter()
        .find(|m| m["name"] == pod["volumes"][0]["name"])
        .expect("the Secret is mounted");
    assert_eq!(mount["readOnly"], true);
    let dir = mount["mountPath"].as_str().expect("path");
    for (var, file) in [
        ("ETCD_CERT_FILE", "tls.crt"),
        ("ETCD_KEY_FILE", "tls.key"),
        ("ETCD_TRUSTED_CA_FILE", "ca.crt"),
    ] {
        assert_eq!(env[var], format!("{dir}/{file}"), "{var}");
    }

    // Extra flags reach keel as the words given, whatever the shell would make of them.
    let docs = render_chart("kv", "prod", &["--set", "extraArgs={it's $HOME,--x=`y`}"]);
    let c = &of_kind(&docs, "StatefulSet")[0]["spec"]["template"]["spec"]["containers"][0];
    let script = c["args"][0].as_str().expect("the script");
    assert!(script.contains("exec /usr/local/bin/keel "), "{script}");
    let script = script.replace("exec /usr/local/bin/keel ", "exec printf '%s\\n' ");
    let out = Command::new(c["command"][0].as_str().expect("shell"))
        .args([c["command"][1].as_str().expect("flags"), &script])
        .output()
        .expect("sh runs");
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "--initial-cluster-state=new\nit's $HOME\n--x=`y`\n",
        "{script}"
    );

    // A template error fails the render with helm's message and prints nothing.
    let bad = helm_template("kv", "prod", &["--set", "ports=3"]);
    assert_ne!(bad.code, 0, "{bad:?}");
    assert!(bad.stdout.is_empty(), "{bad:?}");
    assert!(
        bad.stderr.contains("keel/templates/statefulset.yaml")
            && bad.stderr.contains(".Values.ports."),
        "{bad:?}"
    );
    // `required` fails as helm's does, its message cut out of text/template's.
    let bad = helm_template("kv", "prod", &["--set", "image.repository="]);
    assert_ne!(bad.code, 0, "{bad:?}");
    assert!(
        bad.stderr
            .starts_with("Error: execution error at (keel/templates/statefulset.yaml:")
            && bad.stderr.ends_with("): image.repository is required\n"),
        "{bad:?}"
    );
    let bad = helm_template("Not_A_Release", "prod", &[]);
    assert_ne!(bad.code, 0, "{bad:?}");
    assert!(bad.stderr.contains("invalid release name"), "{bad:?}");
}

/// The rendered chart, with a release and namespace of its own, client TLS from a Secret and an
/// extra flag, forms a cluster as the manifest's pods do.
#[test]
fn the_helm_chart_forms_a_tls_cluster_as_three_pods_would() {
    let docs = render_chart(
        "kv",
        "prod",
        &[
            "--set",
            "tls.enabled=true",
            "--set",
            "extraArgs={--snapshot-count=50000}",
        ],
    );
    let pki = OpensslPki::new("keel-helm-", &["ca"]);
    let sans = CHART_POD_IPS
        .iter()
        .map(|ip| format!("IP:{ip}"))
        .collect::<Vec<_>>()
        .join(",");
    pki.issue(
        "ca",
        "server",
        &format!(
            "subjectAltName={sans},DNS:*.kv.prod.svc.cluster.local\n\
             extendedKeyUsage=serverAuth,clientAuth\n"
        ),
    );
    pki.issue("ca", "client", "extendedKeyUsage=clientAuth\n");
    // The Secret as Kubernetes mounts it: one file per key.
    let secret = pki.path("secret");
    std::fs::create_dir(&secret).expect("secret dir");
    for (from, key) in [
        ("server.pem", "tls.crt"),
        ("server.key", "tls.key"),
        ("ca.pem", "ca.crt"),
    ] {
        std::fs::copy(pki.path(from), secret.join(key)).expect("copy into the Secret");
    }
    let tls = ClientTls {
        secret_dir: secret,
        etcdctl_flags: vec![
            format!("--cacert={}", pki.arg("ca.pem")),
            format!("--cert={}", pki.arg("client.pem")),
            format!("--key={}", pki.arg("client.key")),
        ],
    };
    assert_forms_a_cluster(
        of_kind(&docs, "StatefulSet")[0],
        "prod",
        CHART_POD_IPS,
        Some(&tls),
        &["--snapshot-count=50000"],
    );
}

/// A value a template reads but values.yaml lacks renders as nothing, not as an error (helm's
/// missingkey=zero): so every `.Values.a.b` the templates name must be defined there.
#[test]
fn every_value_the_chart_reads_is_in_values_yaml() {
    let chart = deploy_dir().join("helm/keel");
    let values = yaml_documents(&chart.join("values.yaml"))[0].clone();
    let mut templates = String::new();
    for entry in std::fs::read_dir(chart.join("templates")).expect("templates") {
        let path = entry.expect("entry").path();
        templates += &std::fs::read_to_string(&path).expect("template");
    }
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
}

/// The systemd unit: `systemd-analyze verify` accepts it, and its command started as systemd
/// would start it (the unit's `Environment=` lines under an `EnvironmentFile` of `ETCD_*`
/// settings, no arguments, nothing else from the caller's environment) serves etcdctl, and
/// stops on the unit's `KillSignal` with status 0 within `TimeoutStopSec`, so
/// `Restart=on-failure` restarts only a member that failed.
#[test]
fn the_systemd_unit_verifies_and_its_command_starts_and_stops_a_member() {
    require_tool("systemd-analyze");
    let unit = std::fs::read_to_string(deploy_dir().join("keel.service")).expect("keel.service");
    let dir = tempfile::tempdir().expect("tempdir");
    let keel = env!("CARGO_BIN_EXE_keel");
    // verify checks that ExecStart's binary exists, so point it at the one under test.
    let local = dir.path().join("keel.service");
    std::fs::write(&local, unit.replace("/usr/local/bin/keel", keel)).expect("write unit");
    let verify = Command::new("systemd-analyze")
        .args(["verify", &local.display().to_string()])
        .output()
        .expect("systemd-analyze runs");
    let complaints: Vec<String> = String::from_utf8_lossy(&verify.stderr)
        .lines()
        .filter(|l| l.contains("keel.service"))
        .map(String::from)
        .collect();
    assert!(
        verify.status.success() && complaints.is_empty(),
        "systemd-analyze verify: {:?} {complaints:#?}",
        verify.status
    );

    let setting = |key: &str| -> Vec<String> {
        unit.lines()
            .filter_map(|l| l.strip_prefix(&format!("{key}=")))
            .map(|v| v.trim().to_string())
            .collect()
    };
    assert_eq!(setting("ExecStart"), vec!["/usr/local/bin/keel"]);
    assert_eq!(setting("KillSignal"), vec!["SIGTERM"]);
    let stop_timeout_s: u64 = setting("TimeoutStopSec")[0].parse().expect("seconds");
    // The EnvironmentFile an operator writes, as the unit's comment shows, on free ports.
    let (client, peer) = (crate::common::free_port(), crate::common::free_port());
    let env_file = format!(
        "# /etc/default/keel\n\
         ETCD_NAME=n1\n\
         ETCD_LISTEN_CLIENT_URLS=http://127.0.0.1:{client}\n\
         ETCD_ADVERTISE_CLIENT_URLS=http://127.0.0.1:{client}\n\
         ETCD_LISTEN_PEER_URLS=http://127.0.0.1:{peer}\n\
         ETCD_INITIAL_ADVERTISE_PEER_URLS=http://127.0.0.1:{peer}\n\
         ETCD_INITIAL_CLUSTER=n1=http://127.0.0.1:{peer}\n\
         ETCD_INITIAL_CLUSTER_STATE=new\n"
    );
    assert_eq!(
        setting("EnvironmentFile"),
        vec!["-/etc/default/keel"],
        "the unit reads /etc/default/keel"
    );
    let state = dir.path().join("var-lib-keel");
    let mut env: Vec<(String, String)> = Vec::new();
    for line in setting("Environment") {
        let (k, v) = line.split_once('=').expect("Environment=K=V");
        env.push((
            k.into(),
            v.replace("/var/lib/keel", &state.display().to_string()),
        ));
    }
    // systemd applies EnvironmentFile after Environment=.
    for line in env_file.lines().filter(|l| !l.starts_with('#')) {
        let (k, v) = line.split_once('=').expect("K=V");
        env.push((k.into(), v.into()));
    }
    assert!(
        env.iter().any(|(k, _)| k == "ETCD_DATA_DIR"),
        "the unit names the data dir"
    );
    let log = dir.path().join("journal.log");
    let out = std::fs::File::create(&log).expect("log");
    let mut child = Command::new(keel)
        .env_clear()
        .envs(env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
        .stdin(Stdio::null())
        .stdout(out.try_clone().expect("clone"))
        .stderr(out)
        .spawn()
        .expect("keel starts");
    let endpoint = format!("127.0.0.1:{client}");
    let journal = || std::fs::read_to_string(&log).unwrap_or_default();
    wait_until(
        "the member to serve",
        Duration::from_secs(20),
        || etcdctl_at(&endpoint, &["put", "unit", "ok"], None).code == 0,
        &journal,
    );
    assert_eq!(
        etcdctl_at(&endpoint, &["get", "unit", "--print-value-only"], None)
            .ok()
            .stdout,
        "ok\n"
    );
    assert!(state.join("member.json").exists(), "data in ETCD_DATA_DIR");
    let stopped_at = Instant::now();
    // SAFETY: kill(2) on our own child's pid.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait") {
            break status;
        }
        assert!(
            stopped_at.elapsed() < Duration::from_secs(stop_timeout_s),
            "keel outlived TimeoutStopSec after SIGTERM\n{}",
            journal()
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(
        status.success(),
        "SIGTERM ends keel with status 0, not {status:?}\n{}",
        journal()
    );
}
