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

/// Who waits on a futex word: threads asleep on it and (optionally counted) threads polling it.
#[derive(Clone, Copy)]
pub struct Waiters<'a> {
    /// The futex word, bumped at every event.
    pub word: &'a AtomicU32,
    /// Threads asleep on `word`.
    pub sleepers: &'a AtomicU32,
    /// Threads polling (any one of which will see the event without a wake-up); `None`: not counted.
    pub spinners: Option<&'a AtomicU32>,
}

/// Bumps the word and wakes up to `n` sleepers, skipping the system call when nobody sleeps or, where
/// pollers are counted, when one is polling. Both sides use sequentially consistent order: either this side
/// sees the sleeper (or poller), or that thread sees the new value of the word (and the state published
/// before it) and does not sleep.
pub fn notify(w: Waiters, n: i32) {
    use std::sync::atomic::Ordering::SeqCst;
    w.word.fetch_add(1, SeqCst);
    let polled = w.spinners.is_some_and(|s| s.load(SeqCst) > 0);
    if !polled && w.sleepers.load(SeqCst) > 0 {
        wake(w.word, n);
    }
}

/// Waits until `ready()` is true or `timeout` passes: polls for `spin` (a wake-up from sleep costs tens of
/// microseconds on a busy 2-core machine), then sleeps on the word for at most `slice` at a time (so that
/// `ready()` also sees what is not announced on the word, such as a passed deadline), counted so that
/// [`notify`] makes a system call only when needed. Returns whether `ready()` became true.
pub fn wait_until(
    w: Waiters,
    timeout: Duration,
    spin: Duration,
    slice: Duration,
    mut ready: impl FnMut() -> bool,
) -> bool {
    use std::sync::atomic::Ordering::SeqCst;
    let start = Instant::now();
    if let Some(s) = w.spinners {
        s.fetch_add(1, SeqCst);
    }
    let mut done = false;
    while !done && start.elapsed() < spin {
        done = ready();
        std::hint::spin_loop();
    }
    // Counted as a sleeper before no longer counted as a poller: a post in between sees one of the two.
    w.sleepers.fetch_add(1, SeqCst);
    if let Some(s) = w.spinners {
        s.fetch_sub(1, SeqCst);
    }
    loop {
        let seen = w.word.load(SeqCst);
        done = done || ready();
        let left = timeout.saturating_sub(start.elapsed());
        if done || left.is_zero() {
            w.sleepers.fetch_sub(1, SeqCst);
            return done;
        }
        wait(w.word, seen, left.min(slice));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::Ordering::SeqCst;
    use std::sync::Arc;

    struct Word {
        word: AtomicU32,
        sleepers: AtomicU32,
        spinners: AtomicU32,
        flag: AtomicU32,
    }

    impl Word {
        fn waiters(&self) -> Waiters<'_> {
            Waiters {
                word: &self.word,
                sleepers: &self.sleepers,
                spinners: Some(&self.spinners),
            }
        }
    }

    fn word() -> Arc<Word> {
        Arc::new(Word {
            word: AtomicU32::new(0),
            sleepers: AtomicU32::new(0),
            spinners: AtomicU32::new(0),
            flag: AtomicU32::new(0),
        })
    }

    /// A sleeper with a 10 s slice is woken by `notify` at once: the counted protocol never skips a needed
    /// wake-up (if it did, the waiter would sleep out its slice).
    #[test]
    fn notify_wakes_a_counted_sleeper() {
        for spin in [Duration::ZERO, Duration::from_micros(50)] {
            let w = word();
            let w2 = w.clone();
            let t = std::thread::spawn(move || {
                let start = Instant::now();
                let ok = wait_until(
                    w2.waiters(),
                    Duration::from_secs(20),
                    spin,
                    Duration::from_secs(10),
                    || w2.flag.load(SeqCst) == 1,
                );
                (ok, start.elapsed())
            });
            while w.sleepers.load(SeqCst) == 0 {
                std::thread::yield_now();
            }
            w.flag.store(1, SeqCst);
            notify(w.waiters(), 1);
            let (ok, took) = t.join().unwrap();
            assert!(ok);
            assert!(took < Duration::from_secs(5), "woken after {took:?}");
            assert_eq!(w.sleepers.load(SeqCst), 0);
            assert_eq!(w.spinners.load(SeqCst), 0);
        }
    }

    /// Many posts racing a waiter that alternates between polling and sleeping: every post is seen well before
    /// the 10 s slice would end it.
    #[test]
    fn no_post_is_lost_between_polling_and_sleeping() {
        let w = word();
        let w2 = w.clone();
        let t = std::thread::spawn(move || {
            let mut worst = Duration::ZERO;
            for k in 1..=300u32 {
                let start = Instant::now();
                let ok = wait_until(
                    w2.waiters(),
                    Duration::from_secs(20),
                    Duration::from_micros(u64::from(k % 4) * 20),
                    Duration::from_secs(10),
                    || w2.flag.load(SeqCst) >= k,
                );
                assert!(ok);
                worst = worst.max(start.elapsed());
            }
            worst
        });
        for k in 1..=300u32 {
            if k % 3 == 0 {
                std::thread::sleep(Duration::from_micros(100));
            }
            w.flag.store(k, SeqCst);
            notify(w.waiters(), 1);
        }
        let worst = t.join().unwrap();
        assert!(worst < Duration::from_secs(5), "a post waited {worst:?}");
    }

    #[test]
    fn wait_until_times_out_without_a_post() {
        let w = word();
        let start = Instant::now();
        let ok = wait_until(
            w.waiters(),
            Duration::from_millis(30),
            Duration::ZERO,
            Duration::from_millis(5),
            || false,
        );
        assert!(!ok);
        assert!(start.elapsed() >= Duration::from_millis(30));
        assert_eq!(w.sleepers.load(SeqCst), 0);
    }
}
