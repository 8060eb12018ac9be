//! Cross-process wake-ups on 32-bit words in the shared segment (Linux futexes, *not* process-private), always
//! with a timeout. No lock lives in shared memory: a killed process can never leave a peer blocked forever.

use std::sync::atomic::AtomicU32;
use std::time::{Duration, Instant};

/// Nanoseconds on the system-wide monotonic clock (comparable across processes on one machine).
pub fn now_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes into the timespec we own.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    (ts.tv_sec as u64) * 1_000_000_000 + ts.tv_nsec as u64
}

/// Sleeps while `*word == expected`, at most `timeout`. Spurious wake-ups are fine: callers re-check.
pub fn wait(word: &AtomicU32, expected: u32, timeout: Duration) {
    #[cfg(target_os = "linux")]
    {
        let ts = libc::timespec {
            tv_sec: timeout.as_secs() as libc::time_t,
            tv_nsec: timeout.subsec_nanos() as libc::c_long,
        };
        // SAFETY: `word` points into a live mapping for the duration of the call; FUTEX_WAIT only reads it.
        unsafe {
            libc::syscall(
                libc::SYS_futex,
                word.as_ptr(),
                libc::FUTEX_WAIT,
                expected,
                &ts as *const libc::timespec,
                std::ptr::null::<u32>(),
                0u32,
            );
        }
    }
    #[cfg(not(target_os = "linux"))]
    {
        let _ = (word, expected);
        std::thread::sleep(timeout.min(Duration::from_micros(200)));
    }
}

/// Wakes up to `n` waiters on `word`.
pub fn wake(word: &AtomicU32, n: i32) {
    #[cfg(target_os = "linux")]
    // SAFETY: as in `wait`; FUTEX_WAKE does not touch memory.
    unsafe {
        libc::syscall(libc::SYS_futex, word.as_ptr(), libc::FUTEX_WAKE, n);
    }
    #[cfg(not(target_os = "linux"))]
    let _ = (word, n);
}

/// Waits until `ready()` is true or `timeout` passes: spins briefly (a wake-up costs tens of microseconds on
/// a busy 2-core machine), then sleeps on `word` in short slices. Returns whether `ready()` became true.
pub fn wait_until(
    word: &AtomicU32,
    timeout: Duration,
    spin: Duration,
    mut ready: impl FnMut() -> bool,
) -> bool {
    use std::sync::atomic::Ordering::Acquire;
    let start = Instant::now();
    while start.elapsed() < spin {
        if ready() {
            return true;
        }
        std::hint::spin_loop();
    }
    loop {
        let seen = word.load(Acquire);
        if ready() {
            return true;
        }
        let left = timeout.saturating_sub(start.elapsed());
        if left.is_zero() {
            return false;
        }
        wait(word, seen, left.min(Duration::from_millis(5)));
    }
}
