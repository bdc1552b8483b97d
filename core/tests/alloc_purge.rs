//! The allocator's purges as the member runs them (`rt::leave_freed_memory_to_the_purger`):
//! memory one thread freed goes back to the OS when another thread, which never allocated
//! through mimalloc (the watchdog's case), calls `rt::release_freed_memory`. A test binary of
//! its own, with this one test, so that nothing else in the process allocates, frees or purges
//! meanwhile and its resident size tells what the purge did.

use libmimalloc_sys as mi;

const BLOCK_BYTES: usize = 64 << 10;
const BLOCKS: usize = 1024;

/// This process's resident bytes, from /proc/self/statm.
fn resident_bytes() -> usize {
    let statm = std::fs::read_to_string("/proc/self/statm").expect("/proc/self/statm reads");
    let pages: usize = statm
        .split_whitespace()
        .nth(1)
        .expect("statm's second field")
        .parse()
        .expect("a page count");
    // SAFETY: sysconf takes no pointers.
    pages * unsafe { libc::sysconf(libc::_SC_PAGESIZE) } as usize
}

#[test]
fn memory_one_thread_freed_goes_back_when_a_thread_that_never_allocated_purges() {
    // As a member starts: the allocating threads leave the purges to the purger (10 s), so
    // nothing below is purged but by the call under test.
    keel_core::rt::leave_freed_memory_to_the_purger();
    // 64 MiB allocated through mimalloc, touched, freed, on a thread that then ends (its
    // emptied pages go back to the arena, scheduled for a purge). This test binary's global
    // allocator is the system's, so only these blocks are mimalloc's.
    std::thread::spawn(|| {
        let blocks: Vec<usize> = (0..BLOCKS)
            .map(|_| {
                // SAFETY: a fresh block of BLOCK_BYTES, written within its bounds.
                unsafe {
                    let p = mi::mi_malloc(BLOCK_BYTES) as *mut u8;
                    assert!(!p.is_null(), "mimalloc allocates");
                    std::ptr::write_bytes(p, 1, BLOCK_BYTES);
                    p as usize
                }
            })
            .collect();
        for p in blocks {
            // SAFETY: each block came from mi_malloc above and is freed once.
            unsafe { mi::mi_free(p as *mut std::ffi::c_void) };
        }
    })
    .join()
    .expect("the allocating thread ends");
    let before = resident_bytes();
    // A thread that never allocated through mimalloc, as the watchdog's may not have.
    std::thread::spawn(keel_core::rt::release_freed_memory)
        .join()
        .expect("the purging thread ends");
    let after = resident_bytes();
    let freed = (BLOCKS * BLOCK_BYTES) as isize;
    assert!(
        before as isize - after as isize >= freed / 2,
        "resident {before} bytes before the purge and {after} after: the {freed} bytes freed \
         did not go back"
    );
}
