//! Faults an operator meets, answered as etcd answers them: requests at every size limit, a
//! raft core that cannot go on (an oversized entry, a full disk) stopping the member loudly,
//! and space management (quota, NOSPACE alarm, compact + defragment + disarm).

use std::time::{Duration, Instant};

use etcd_client::{AlarmAction, AlarmType, GetOptions};

use crate::common::{client, free_bytes, grpc_error, Kind, Server, SmallDisk};

const MIB: usize = 1024 * 1024;
/// etcd's default --max-request-bytes (1.5 MiB).
const REQUEST_BYTES_MAX: usize = 1_572_864;

/// Puts `value_bytes` under key "k" and answers Ok or the gRPC (code, message).
async fn put_sized(
    c: &mut etcd_client::Client,
    value_bytes: usize,
) -> Result<(), (String, String)> {
    let value = vec![b'v'; value_bytes];
    match c.put("k", value, None).await {
        Ok(_) => Ok(()),
        Err(e) => Err(grpc_error::<()>(Err(e))),
    }
}

/// After each large request, the member must still commit a small put and answer a
/// linearizable get: a large request never stops the raft core.
async fn still_serves(c: &mut etcd_client::Client, step: usize) {
    let key = format!("after/{step}");
    c.put(key.as_str(), "ok", None)
        .await
        .unwrap_or_else(|e| panic!("small put after step {step}: {e}"));
    let got = c
        .get(key.as_str(), None)
        .await
        .unwrap_or_else(|e| panic!("linearizable get after step {step}: {e}"));
    assert_eq!(got.kvs()[0].value(), b"ok");
}

/// The sizes the issue names, with etcd's answer for each: accepted up to --max-request-bytes
/// of marshalled request (a 1-byte key and 23–25 bytes of envelope), refused above it.
async fn request_sizes(server: &Server) -> Vec<(usize, Result<(), (String, String)>)> {
    let mut c = client(server).await;
    let mut answers = Vec::new();
    let sizes = [
        MIB - 64,
        MIB,
        MIB + 64,
        // The largest value whose request fits 1.5 MiB whatever the header id's length.
        REQUEST_BYTES_MAX - 25,
        REQUEST_BYTES_MAX + 1,
    ];
    for (step, bytes) in sizes.into_iter().enumerate() {
        answers.push((bytes, put_sized(&mut c, bytes).await));
        still_serves(&mut c, step).await;
    }
    answers
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_up_to_max_request_bytes_are_accepted_as_etcd_accepts_them() {
    let keel = Server::keel(&[]);
    let got = request_sizes(&keel).await;
    let too_large = Err((
        "InvalidArgument".to_string(),
        "etcdserver: request is too large".to_string(),
    ));
    let expected = vec![
        (MIB - 64, Ok(())),
        (MIB, Ok(())),
        (MIB + 64, Ok(())),
        (REQUEST_BYTES_MAX - 25, Ok(())),
        (REQUEST_BYTES_MAX + 1, too_large),
    ];
    assert_eq!(got, expected, "keel log:\n{}", keel.log_tail());
    // Real etcd 3.4 answers the same sizes the same way.
    let etcd = Server::etcd(&[]);
    assert_eq!(request_sizes(&etcd).await, expected);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_raft_core_failure_stops_the_member_loudly_and_loses_nothing_acknowledged() {
    // A test-only knob forces the WAL's record limit below the raft entry limit, so a request
    // the shard accepts makes the raft core fail, as any WAL error would.
    let mut server = Server::start_in(
        Kind::Keel,
        &[],
        &[("KEEL_TEST_WAL_RECORD_BYTES_MAX", "65536")],
        None,
    );
    let mut c = client(&server).await;
    for i in 0..20 {
        c.put(format!("before/{i}"), format!("v{i}"), None)
            .await
            .expect("small puts commit");
    }
    let sent = Instant::now();
    let failed = c.put("big", vec![b'x'; 100 * 1024], None).await;
    assert!(failed.is_err(), "the oversized entry was acknowledged");
    let status = server
        .wait_exit(
            Duration::from_secs(1).saturating_sub(sent.elapsed()) + Duration::from_millis(200),
        )
        .unwrap_or_else(|| {
            panic!(
                "the member still runs after its raft core failed:\n{}",
                server.log_tail()
            )
        });
    assert!(!status.success(), "the member exited with {status}");
    let log = server.log_all();
    assert!(
        log.contains("the raft core failed") && log.contains("exceeds the limit"),
        "the log does not say why the member stopped:\n{log}"
    );
    assert!(
        log.contains("\"term\"") && log.contains("\"applied_index\""),
        "the failure line names no raft position:\n{log}"
    );
    // Without the knob the member starts again with every acknowledged write.
    let mut c = restart_without_knobs(&mut server, 20).await;
    assert!(c.get("big", None).await.expect("get").kvs().is_empty());
    c.put("after", "restart", None)
        .await
        .expect("writes work again");
}

/// A raft core whose thread hangs for good (a test-only knob blocks it, as a task that never
/// yields would) must not leave a member that holds its ports and serves nothing: the
/// watchdog sees the loop's timer long overdue, logs why with the raft position, and ends
/// the process non-zero. Restarted without the knob, it has every acknowledged write.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_raft_loop_that_hangs_stops_the_member_loudly_and_loses_nothing_acknowledged() {
    let hang_after_ms = 5_000u64;
    let mut server = Server::start_in(
        Kind::Keel,
        &[],
        &[("KEEL_TEST_HANG_RAFT_EXECUTOR_AFTER_MS", "5000")],
        None,
    );
    let started = Instant::now();
    let mut c = client(&server).await;
    for i in 0..20 {
        c.put(format!("before/{i}"), format!("v{i}"), None)
            .await
            .expect("puts commit before the hang");
    }
    // The hang, then the idle loop's overdue bound (10 s), then a look of the watchdog.
    let bound = Duration::from_millis(hang_after_ms + 10_000 + 5_000);
    let status =
        tokio::task::block_in_place(|| server.wait_exit(bound.saturating_sub(started.elapsed())))
            .unwrap_or_else(|| {
                panic!(
                    "the member still runs {:?} after its raft core hung:\n{}",
                    started.elapsed(),
                    server.log_tail()
                )
            });
    assert_eq!(status.code(), Some(4), "the member exited with {status}");
    let log = server.log_all();
    for phrase in [
        "the raft loop has not turned for longer than an election timeout",
        "the raft loop is stuck; this member cannot go on and stops",
        "overdue",
        "\"applied_index\"",
    ] {
        assert!(log.contains(phrase), "the log lacks {phrase:?}:\n{log}");
    }
    restart_without_knobs(&mut server, 20).await;
}

/// Restarts `server` without its test-only knobs and checks that the `before/` keys it
/// acknowledged (`acknowledged` of them) are all there; returns a client of the new process.
async fn restart_without_knobs(server: &mut Server, acknowledged: usize) -> etcd_client::Client {
    server.env.clear();
    server.restart();
    let mut c = client(server).await;
    let got = c
        .get("before/", Some(GetOptions::new().with_prefix()))
        .await
        .expect("a linearizable get after restart");
    assert_eq!(got.kvs().len(), acknowledged);
    c
}

/// The other side of the watchdog: a whole process paused (SIGSTOP, as a frozen VM would be)
/// for longer than the watchdog's bound is not a hung raft loop, and must go on serving once
/// resumed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_paused_longer_than_the_watchdog_bound_serves_on_after_it_resumes() {
    let mut server = Server::keel(&[]);
    let mut c = client(&server).await;
    c.put("before", "pause", None).await.expect("a put");
    let pid = server.pid() as libc::pid_t;
    // SAFETY: kill has no memory preconditions; pid is our own child.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGSTOP) }, 0);
    std::thread::sleep(Duration::from_secs(12));
    // SAFETY: as above.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGCONT) }, 0);
    std::thread::sleep(Duration::from_secs(3));
    assert!(
        tokio::task::block_in_place(|| server.wait_exit(Duration::ZERO)).is_none(),
        "the member stopped after a pause:\n{}",
        server.log_tail()
    );
    let mut c = client(&server).await;
    c.put("after", "pause", None)
        .await
        .expect("a put after the pause");
    assert!(!server.log_all().contains("the raft loop is stuck"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_disk_stops_the_member_and_a_restart_keeps_every_acknowledged_write() {
    let scratch = tempfile::Builder::new()
        .prefix("keel-enospc-")
        .tempdir()
        .expect("a temp dir");
    // Big enough that freeing the ballast leaves room for the restart, which needs more than
    // the failed run held: WAL replay writes every value after the newest checkpoint into the
    // value log again (the unreferenced segment files are deleted first, but the run that
    // failed had not yet written all of its), and the WAL prepares a fresh 64 MiB spare. A
    // 256 MiB disk left about 100 MiB for that and failed one restart in three.
    let disk = SmallDisk::new(scratch.path(), 512);
    let data_dir = disk.mount.join("data");
    let mut server = Server::start_in(Kind::Keel, &[], &[], Some(data_dir));
    // Leave less room than the next 64 MiB WAL segment needs: the WAL fills its active
    // segment, then cannot create the next one.
    let ballast = disk.mount.join("ballast");
    let free = free_bytes(&disk.mount);
    let keep_free = 40 * MIB as u64;
    assert!(
        free > keep_free,
        "the disk is already too full: {free} bytes free"
    );
    let file = std::fs::File::create(&ballast).expect("ballast");
    // SAFETY: fallocate on a file we own; it only reserves blocks.
    let rc = unsafe {
        libc::fallocate(
            std::os::fd::AsRawFd::as_raw_fd(&file),
            0,
            0,
            (free - keep_free) as i64,
        )
    };
    assert_eq!(rc, 0, "fallocate: {}", std::io::Error::last_os_error());
    drop(file);

    let mut c = client(&server).await;
    let value = vec![b'd'; 512 * 1024];
    let mut acknowledged = Vec::new();
    let mut failed_at = None;
    for i in 0..400 {
        let key = format!("fill/{i:04}");
        match c.put(key.as_str(), value.clone(), None).await {
            Ok(_) => acknowledged.push(key),
            Err(_) => {
                failed_at = Some(Instant::now());
                break;
            }
        }
    }
    let failed_at = failed_at.unwrap_or_else(|| {
        panic!(
            "400 puts of 512 KiB fit on a nearly full disk:\n{}",
            server.log_tail()
        )
    });
    let status = server
        .wait_exit(
            Duration::from_secs(1).saturating_sub(failed_at.elapsed()) + Duration::from_millis(300),
        )
        .unwrap_or_else(|| panic!("the member lingers on a full disk:\n{}", server.log_tail()));
    assert!(!status.success());
    let log = server.log_all();
    assert!(
        log.contains("the raft core failed") && log.contains("No space left on device"),
        "the log does not say the disk is full:\n{log}"
    );
    assert!(
        acknowledged.len() > 20,
        "only {} puts succeeded",
        acknowledged.len()
    );

    // Free space and restart: every acknowledged write is there.
    std::fs::remove_file(&ballast).expect("freeing the ballast");
    server.restart();
    let mut c = client(&server).await;
    let got = c
        .get(
            "fill/",
            Some(GetOptions::new().with_prefix().with_keys_only()),
        )
        .await
        .expect("a get after restart");
    let keys: Vec<String> = got
        .kvs()
        .iter()
        .map(|kv| kv.key_str().expect("utf-8").to_string())
        .collect();
    for key in &acknowledged {
        assert!(keys.contains(key), "acknowledged {key} is lost");
    }
    // The refused put was never acknowledged, so it may or may not be there; nothing else is.
    assert!(keys.len() <= acknowledged.len() + 1);
    c.put("after", "space freed", None)
        .await
        .expect("writes work again");
    server.stop();
    drop(disk);
}

async fn alarm_list(c: &mut etcd_client::Client) -> Vec<(u64, AlarmType)> {
    c.alarm(AlarmAction::Get, AlarmType::None, None)
        .await
        .expect("alarm list")
        .alarms()
        .iter()
        .map(|a| (a.member_id(), a.alarm()))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_quota_refuses_the_write_that_would_pass_it_and_defragment_gives_space_back() {
    let quota_bytes = 4 * MIB;
    let mut server = Server::keel(&["--quota-backend-bytes", &quota_bytes.to_string()]);
    let mut c = client(&server).await;
    let value = vec![b'q'; 256 * 1024];
    let mut written = 0;
    let refused = loop {
        match c.put(format!("big/{written}"), value.clone(), None).await {
            Ok(_) => written += 1,
            Err(e) => break grpc_error::<()>(Err(e)),
        }
        assert!(written < 64, "a 4 MiB quota took {written} puts of 256 KiB");
    };
    assert_eq!(
        refused,
        (
            "ResourceExhausted".to_string(),
            "etcdserver: mvcc: database space exceeded".to_string()
        )
    );
    // The refused write was never applied: the store stayed under the quota.
    let status = c.status().await.expect("status");
    assert!(
        (status.db_size() as usize) < quota_bytes,
        "db size {} passed the quota {quota_bytes}",
        status.db_size()
    );
    let member = status.header().expect("a header").member_id();
    assert_eq!(alarm_list(&mut c).await, vec![(member, AlarmType::Nospace)]);
    // Status reads the alarms the member has applied and published; the status above may have
    // been answered before the raised alarm was, so ask again until it shows (or time out).
    let want = format!("memberID:{member} alarm:NOSPACE ");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    loop {
        let errors = c.status().await.expect("status").errors().to_vec();
        if errors.contains(&want) {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "Status errors {errors:?} never showed {want:?}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    let (code, body) = server.http_get("/health");
    assert_eq!(code, 503);
    assert!(body.contains("ALARM NOSPACE"), "{body}");

    // While armed: small puts, txns with puts and lease grants are refused; reads, deletes
    // and compaction work.
    let small = c.put("small", "x", None).await;
    assert_eq!(
        grpc_error(small).1,
        "etcdserver: mvcc: database space exceeded"
    );
    assert_eq!(
        grpc_error(c.lease_grant(60, None).await).1,
        "etcdserver: mvcc: database space exceeded"
    );
    let txn = etcd_client::Txn::new().and_then([etcd_client::TxnOp::put("t", "v", None)]);
    assert_eq!(
        grpc_error(c.txn(txn).await).1,
        "etcdserver: mvcc: database space exceeded"
    );
    assert_eq!(
        c.get("big/0", None).await.expect("reads work").kvs().len(),
        1
    );
    let read_only = etcd_client::Txn::new()
        .when([etcd_client::Compare::version(
            "big/0",
            etcd_client::CompareOp::Greater,
            0,
        )])
        .and_then([etcd_client::TxnOp::get("big/0", None)]);
    let r = c.txn(read_only).await.expect("a read-only txn works");
    assert!(r.succeeded());
    // etcdctl agrees, and prints the alarm as etcd does.
    let out = server.etcdctl(&["alarm", "list"]).ok();
    assert_eq!(
        out.stdout.trim(),
        format!("memberID:{member} alarm:NOSPACE")
    );

    // Compact, defragment and disarm: writes work again and keep working.
    let deleted = c
        .delete(
            "big/",
            Some(etcd_client::DeleteOptions::new().with_prefix()),
        )
        .await
        .expect("deletes work under NOSPACE");
    assert_eq!(deleted.deleted(), written);
    let rev = deleted.header().expect("header").revision();
    c.compact(
        rev,
        Some(etcd_client::CompactionOptions::new().with_physical()),
    )
    .await
    .expect("compaction works under NOSPACE");
    let out = server.etcdctl(&["defrag"]).ok();
    assert!(
        out.stdout.contains("Finished defragmenting etcd member"),
        "{}",
        out.stdout
    );
    let after = c.status().await.expect("status").db_size();
    assert!(
        after * 4 < status.db_size(),
        "compact and defragment did not give the space back: {} -> {after} bytes",
        status.db_size()
    );
    let out = server.etcdctl(&["alarm", "disarm"]).ok();
    assert_eq!(
        out.stdout.trim(),
        format!("memberID:{member} alarm:NOSPACE")
    );
    assert!(alarm_list(&mut c).await.is_empty());
    for i in 0..8 {
        c.put(format!("again/{i}"), value.clone(), None)
            .await
            .unwrap_or_else(|e| panic!("put {i} after disarm: {e}"));
    }
    let (code, _) = server.http_get("/health");
    assert_eq!(code, 200);

    // The alarm is replicated state: it survives a restart until disarmed.
    while c
        .put(format!("fill/{written}"), value.clone(), None)
        .await
        .is_ok()
    {
        written += 1;
    }
    drop(c);
    server.stop();
    server.relaunch();
    let mut c = client(&server).await;
    let deadline = Instant::now() + Duration::from_secs(10);
    let listed = loop {
        match c.alarm(AlarmAction::Get, AlarmType::None, None).await {
            Ok(resp) => break resp,
            Err(e) => assert!(Instant::now() < deadline, "alarm list after restart: {e}"),
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let listed: Vec<(u64, AlarmType)> = listed
        .alarms()
        .iter()
        .map(|a| (a.member_id(), a.alarm()))
        .collect();
    assert_eq!(listed, vec![(member, AlarmType::Nospace)]);
    assert_eq!(
        grpc_error(c.put("small", "x", None).await).1,
        "etcdserver: mvcc: database space exceeded"
    );
}
