//! The differential test: the scenario in testdata/differential.txt runs against keel and
//! against a real etcd 3.4, and every command's normalised output must match.

use std::fmt::Write as _;

use crate::common::{json_of, strip_member_fields, Kind, Output, Server};

const SCENARIO: &str = include_str!("../testdata/differential.txt");

/// One scenario line: etcdctl's arguments and what to feed its stdin.
#[derive(Debug)]
struct Step {
    line_number: usize,
    line: String,
    args: Vec<String>,
    stdin: Option<String>,
}

fn parse_scenario(text: &str) -> Vec<Step> {
    let mut steps = Vec::new();
    for (i, raw) in text.lines().enumerate() {
        let line = raw.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let (command, stdin) = match line.split_once(" <<< ") {
            Some((c, input)) => (c, Some(input.replace("\\n", "\n"))),
            None => (line, None),
        };
        steps.push(Step {
            line_number: i + 1,
            line: line.to_string(),
            args: split_words(command),
            stdin,
        });
    }
    assert!(!steps.is_empty(), "the scenario has no commands");
    steps
}

/// Splits on spaces; "double" and 'single' quotes group words, and "" is an empty word.
fn split_words(text: &str) -> Vec<String> {
    let mut words = Vec::new();
    let mut word = String::new();
    let mut in_word = false;
    let mut quote: Option<char> = None;
    for c in text.chars() {
        match quote {
            Some(q) if c == q => quote = None,
            Some(_) => word.push(c),
            None if c == '"' || c == '\'' => {
                quote = Some(c);
                in_word = true;
            }
            None if c.is_whitespace() => {
                if in_word {
                    words.push(std::mem::take(&mut word));
                    in_word = false;
                }
            }
            None => {
                word.push(c);
                in_word = true;
            }
        }
    }
    assert!(quote.is_none(), "unbalanced quote in {text:?}");
    if in_word {
        words.push(word);
    }
    words
}

/// How etcdctl prints its answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Format {
    Json,
    Text,
}

impl Step {
    fn format(&self) -> Format {
        let json = self.args.windows(2).any(|w| w[0] == "-w" && w[1] == "json")
            || self
                .args
                .iter()
                .any(|a| a == "--write-out=json" || a == "-w=json");
        if json {
            Format::Json
        } else {
            Format::Text
        }
    }
}

/// What of an etcdctl run must be the same on keel and on etcd. `endpoint` (the server's own
/// address, which differs) is replaced by a placeholder.
fn normalise(out: &Output, format: Format, endpoint: &str) -> String {
    let mut text = format!("exit {}\n", out.code);
    match (format, json_of(&out.stdout)) {
        (Format::Json, Some(mut v)) => {
            strip_member_fields(&mut v);
            // The interactive txn prompts come before the document.
            let prompt_end = out.stdout.find(['{', '[']).unwrap_or(0);
            text.push_str(&out.stdout[..prompt_end]);
            writeln!(text, "{v}").expect("writing to a String");
        }
        _ => {
            let member_specific = ["\"ClusterID\" : ", "\"MemberID\" : ", "\"RaftTerm\" : "];
            for line in out.stdout.lines() {
                if !member_specific.iter().any(|p| line.starts_with(p)) {
                    writeln!(text, "{line}").expect("writing to a String");
                }
            }
        }
    }
    for line in out.stderr.lines() {
        match serde_json::from_str::<serde_json::Value>(line) {
            // etcdctl's client log lines: the time and the client's random target differ.
            Ok(serde_json::Value::Object(mut map)) if map.contains_key("level") => {
                map.remove("ts");
                map.remove("target");
                writeln!(text, "stderr {}", serde_json::Value::Object(map))
                    .expect("writing to a String");
            }
            _ => writeln!(text, "stderr {line}").expect("writing to a String"),
        }
    }
    text.replace(endpoint, "<endpoint>")
}

fn run(server: &Server, step: &Step) -> Output {
    let args: Vec<&str> = step.args.iter().map(String::as_str).collect();
    match &step.stdin {
        Some(input) => server.etcdctl_stdin(&args, input),
        None => server.etcdctl(&args),
    }
}

#[test]
fn split_words_handles_quotes_and_empty_words() {
    assert_eq!(
        split_words(r#"put c "with spaces""#),
        vec!["put", "c", "with spaces"]
    );
    assert_eq!(
        split_words(r#"get "" --from-key"#),
        vec!["get", "", "--from-key"]
    );
    assert_eq!(split_words("a 'b c'  d"), vec!["a", "b c", "d"]);
}

#[test]
fn normalise_drops_only_member_specific_fields() {
    let out = |stdout: &str, stderr: &str| Output {
        code: 1,
        stdout: stdout.into(),
        stderr: stderr.into(),
    };
    let a = r#"{"header":{"cluster_id":1,"member_id":2,"revision":7,"raft_term":3},"count":1}"#;
    let b = r#"{"header":{"cluster_id":9,"member_id":8,"revision":7,"raft_term":4},"count":1}"#;
    let c = r#"{"header":{"cluster_id":1,"member_id":2,"revision":8,"raft_term":3},"count":1}"#;
    let log = |ts: &str| format!(r#"{{"level":"warn","ts":"{ts}","target":"x","error":"e"}}"#);
    let n =
        |stdout: &str, stderr: &str| normalise(&out(stdout, stderr), Format::Json, "127.0.0.1:1");
    assert_eq!(
        n(a, &log("t1")),
        n(b, &log("t2")),
        "ids, term, time and target are member-specific"
    );
    assert_ne!(n(a, ""), n(c, ""), "the revision is not");
    assert_ne!(
        n(a, "Error: x"),
        n(a, "Error: y"),
        "stderr text is compared"
    );
    let text = |code: i32| Output {
        code,
        stdout: "OK\n".into(),
        stderr: String::new(),
    };
    assert_ne!(
        normalise(&text(0), Format::Text, "e"),
        normalise(&text(1), Format::Text, "e"),
        "exit status is compared"
    );
}

#[test]
fn etcdctl_outputs_match_real_etcd() {
    let steps = parse_scenario(SCENARIO);
    // Start both at once: etcd needs about a second to elect itself.
    let etcd = std::thread::spawn(|| Server::start(Kind::Etcd, &[]));
    let keel = Server::keel(&[]);
    let etcd = etcd.join().expect("etcd starts");
    let mut report = String::new();
    let mut mismatches = 0;
    for step in &steps {
        let want = normalise(&run(&etcd, step), step.format(), &etcd.endpoint());
        let got = normalise(&run(&keel, step), step.format(), &keel.endpoint());
        if want != got {
            mismatches += 1;
            writeln!(
                report,
                "line {}: {}\n--- etcd\n{want}--- keel\n{got}",
                step.line_number, step.line
            )
            .expect("writing to a String");
        }
    }
    assert_eq!(
        mismatches,
        0,
        "{mismatches} of {} commands differ from etcd 3.4:\n{report}",
        steps.len()
    );
}
