#!/usr/bin/env python3
"""Summarises folded stacks from bench/scripts/flamegraph.sh into the tables of BENCHMARKS.md.

    bench/scripts/flame-top.py OUT_PREFIX.folded [--funcs N] [--match REGEX]

Prints, as shares of all sampled server CPU:
  * each thread group's share (shard executors, the raft core, io_uring workers);
  * per cost group (syscalls by kind, h2, prost, raft, kv, allocation, ...): "inclusive",
    the share of samples with any frame of the group on the stack, and "leaf", where each
    sample counts once, for the group of its leaf-most frame that belongs to a group (so the
    leaf column adds up to 100 % with "other");
  * the top N functions by inclusive share (default 25), optionally only those matching REGEX.
The folded counts are cpu-clock nanoseconds, so the shares are shares of CPU time.
"""

import re
import sys
from collections import defaultdict

# Leaf-most match wins in the leaf column: kernel work is listed first so that a write(2)
# under h2 counts as the syscall, and allocator and libc leaves count as themselves.
GROUPS = [
    ("kernel: socket send (write/sendmsg/writev)",
     r"(tcp_sendmsg|sock_write_iter|__x64_sys_write|__x64_sys_sendmsg|__x64_sys_sendto|__x64_sys_writev|ksys_write|do_writev)"),
    ("kernel: socket recv (read/recvmsg)",
     r"(tcp_recvmsg|sock_read_iter|__x64_sys_read\b|__x64_sys_recvfrom|__x64_sys_recvmsg|ksys_read)"),
    ("kernel: fdatasync / block I/O", r"(fsync|fdatasync|blk_|submit_bio|ext4_|xfs_|iomap_dio|nvme|virtio_queue|iowrite16)"),
    ("kernel: futex", r"(do_futex|__x64_sys_futex|futex_wait|futex_wake).*_\[k\]$"),
    ("kernel: eventfd", r"eventfd"),
    ("kernel: io_uring enter/complete", r"(io_uring|io_submit_sqes|io_cqring|__sys_io_uring_enter|iou-wrk|io_wq|io_issue_sqe)"),
    ("kernel: epoll/poll", r"(epoll|do_sys_poll|__x64_sys_poll)"),
    ("kernel: page faults (fresh memory)", r"(asm_exc_page_fault|do_user_addr_fault|handle_mm_fault|clear_page)"),
    ("kernel: mmap/munmap/madvise", r"(__x64_sys_mmap|__x64_sys_munmap|__x64_sys_madvise|do_madvise|vm_mmap|__vm_munmap)"),
    ("kernel: scheduler / context switch", r"(schedule|finish_task_switch|__switch_to|try_to_wake_up|ttwu_)"),
    ("kernel: softirq / net stack", r"(net_rx_action|__napi_poll|process_backlog|do_softirq|handle_softirqs|ip_rcv|tcp_v4_rcv|ip_finish_output)"),
    ("kernel: timers (clock_gettime, hrtimer)", r"(clock_gettime|hrtimer|vdso)"),
    ("kernel: other", r"_\[k\]$"),
    ("allocation (mimalloc)", r"^(mi_|_mi_|__rust_alloc|__rust_dealloc|__rust_realloc|mimalloc)"),
    ("memcpy/memset/memcmp (libc)", r"^__(memcpy|memmove|memset|memcmp|mempcpy)"),
    ("crc32", r"(crc32|crc_fast|crc32fast)"),
    ("tracing", r"^(tracing|tracing_core|tracing_subscriber)::"),
    ("prost encode/decode (keel-proto)", r"(^prost::|^keel_proto::|encode_raw|merge_field|encoded_len)"),
    ("h2 (framing, hpack, streams)", r"^(<)?h2::"),
    ("keel-grpc (gRPC layer)", r"^(<)?keel_grpc::"),
    ("bytes (refcounts, BytesMut)", r"^(<)?bytes::"),
    ("std Mutex lock/unlock (h2 stream refs, futures_lite split)", r"(std::sys::sync::mutex|std::sync::poison::mutex)"),
    ("keel-raft (RawNode, log, tracker)", r"^(<)?keel_raft::"),
    ("keel-io (WAL, segment store)", r"^(<)?keel_io::"),
    ("keel-kv (apply, index, reader)", r"^(<)?(keel_kv::|crossbeam_skiplist|crossbeam_epoch)"),
    ("cross-core mailboxes and wake-ups (eventfd, foreign wakers)",
     r"(keel_core::rt::Mailbox|crossbeam_queue|AtomicWaker|futures_channel::oneshot|atomic_waker|glommio::sys::(SleepNotifier|write_eventfd|get_sleep_notifier_for|uring::Reactor::process_foreign_wakes|uring::SleepableRing::install_eventfd|uring::Reactor::install_eventfd))"),
    ("keel-core watch hub", r"keel_core::watch"),
    ("keel-core raft core / member / peers", r"(keel_core::raftcore|keel_core::member|keel_core::peer)"),
    ("keel-core service (decode, route, reply)", r"(keel_core::service|keel_core::convert)"),
    ("keel-core shard / lease / other", r"^(<)?keel_core::"),
    ("glommio executor and reactor", r"^(<)?glommio::"),
]
GROUPS = [(name, re.compile(rx)) for name, rx in GROUPS]


def group_of(frame):
    for name, rx in GROUPS:
        if rx.search(frame):
            return name
    return None


def leaf_group_of(frames, groups):
    # The kernel part of a stack counts for what entered the kernel (the syscall, the page
    # fault, the interrupt's softirq): the root-most specific kernel group in that part.
    k = len(frames)
    while k > 0 and frames[k - 1].endswith("_[k]"):
        k -= 1
    if k < len(frames):
        specific = [g for g in groups[k:] if g and g != "kernel: other"]
        return specific[0] if specific else "kernel: other"
    return next((g for g in reversed(groups) if g), "other (unattributed)")


def thread_group(comm):
    if comm.startswith("keel-shard"):
        return "shard executors (keel-shard-*)"
    if comm.startswith("keel-raft"):
        # With --host-shards-on-raft-cpu (members sharing a host) it runs shards too.
        return "raft core (keel-raft-*)"
    if comm.startswith("iou-wrk"):
        return "io_uring workers (iou-wrk-*)"
    return comm


def main():
    args = sys.argv[1:]
    path = args[0]
    nfuncs = 25
    match = None
    if "--funcs" in args:
        nfuncs = int(args[args.index("--funcs") + 1])
    if "--match" in args:
        match = re.compile(args[args.index("--match") + 1])
    total = 0
    threads = defaultdict(int)
    incl = defaultdict(int)
    leaf = defaultdict(int)
    func_incl = defaultdict(int)
    cache = {}
    with open(path) as f:
        for line in f:
            line = line.rstrip("\n")
            stack, _, count = line.rpartition(" ")
            n = int(count)
            frames = stack.split(";")
            total += n
            threads[thread_group(frames[0])] += n
            frames = [fr.strip() for fr in frames[1:]]
            groups = []
            for fr in frames:
                if fr not in cache:
                    cache[fr] = group_of(fr)
                groups.append(cache[fr])
            for g in set(g for g in groups if g):
                incl[g] += n
            leaf_group = leaf_group_of(frames, groups)
            leaf[leaf_group] += n
            for fr in set(frames):
                func_incl[fr] += n
    pct = lambda n: 100.0 * n / total if total else 0.0
    print(f"sampled server CPU: {total / 1e9:.2f} s")
    print("\n| thread | share |\n|---|---|")
    for t, n in sorted(threads.items(), key=lambda kv: -kv[1]):
        print(f"| {t} | {pct(n):.1f} % |")
    print("\n| group | inclusive | leaf |\n|---|---|---|")
    names = set(incl) | set(leaf)
    for g in sorted(names, key=lambda g: -leaf.get(g, 0)):
        if pct(max(incl.get(g, 0), leaf.get(g, 0))) < 0.5:
            continue
        i = f"{pct(incl[g]):.1f} %" if g in incl else ""
        print(f"| {g} | {i} | {pct(leaf.get(g, 0)):.1f} % |")
    print(f"\ntop functions by inclusive share{' matching ' + match.pattern if match else ''}:")
    shown = 0
    for fr, n in sorted(func_incl.items(), key=lambda kv: -kv[1]):
        if match and not match.search(fr):
            continue
        print(f"  {pct(n):5.1f} %  {fr[:160]}")
        shown += 1
        if shown >= nfuncs:
            break


if __name__ == "__main__":
    main()
