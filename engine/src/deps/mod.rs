//! The server's dependencies (Redis in its uses: the policy store, session pins, stored responses, the ledger,
//! the tenants' sync, the answer cache): every call to one has a deadline, and a breaker in front of it
//! ([`breaker`]). A call that fails or misses its deadline opens the breaker for a cooldown; while it is open,
//! calls are not made at all (the caller serves from local state: a pin in memory, the last policy, the
//! ledger's spool) and one call after the cooldown probes whether the dependency is back. A dependency that
//! accepts connections and never answers (paused, partitioned, swapping) costs one deadline per call until the
//! breaker opens, then nothing. Each is in `/ready`'s `dependencies`, the console and
//! `tiergate_dependency_up{dependency}`.
//!
//! Connections are made outside any lock and within the call's deadline; the blocking clients (the ledger's
//! writer thread, the Responses store) set their socket's read and write timeouts to the deadline.

pub(crate) mod breaker;

use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use breaker::{Breaker, State};

/// How long a breaker stays open before a probe.
const COOLDOWN: Duration = Duration::from_secs(1);

/// Why a call was not answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Refused {
    /// The breaker is open: not called.
    Open,
    /// No answer within the deadline.
    Late(Duration),
    /// It answered with an error.
    Failed(String),
}

impl std::fmt::Display for Refused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Open => write!(f, "not called: its breaker is open after a failure"),
            Self::Late(d) => write!(f, "no answer within {} ms", d.as_millis()),
            Self::Failed(e) => write!(f, "{e}"),
        }
    }
}

/// One dependency as calls see it: its name, its deadline, its breaker.
pub(crate) struct Dependency {
    name: &'static str,
    deadline: Duration,
    breaker: Mutex<Breaker>,
    last_error: Mutex<Option<String>>,
}

impl Dependency {
    /// `name` (a metrics label), whose calls may take `deadline`.
    pub(crate) fn new(name: &'static str, deadline: Duration) -> Arc<Self> {
        metrics::gauge!(crate::metrics::DEPENDENCY_UP, "dependency" => name).set(1.0);
        Arc::new(Self {
            name,
            deadline,
            breaker: Mutex::new(Breaker::new(1, COOLDOWN)),
            last_error: Mutex::new(None),
        })
    }

    /// How long a call may take.
    pub(crate) fn deadline(&self) -> Duration {
        self.deadline
    }

    /// Whether its breaker is closed (the last call answered).
    pub(crate) fn is_up(&self) -> bool {
        self.lock().state() == State::Closed
    }

    /// Runs `call` within the deadline, when the breaker lets it.
    pub(crate) async fn call<T, E, F>(&self, call: F) -> Result<T, Refused>
    where
        E: std::fmt::Display,
        F: Future<Output = Result<T, E>>,
    {
        self.admit()?;
        let r = match tokio::time::timeout(self.deadline, call).await {
            Ok(Ok(v)) => Ok(v),
            Ok(Err(e)) => Err(Refused::Failed(e.to_string())),
            Err(_) => Err(Refused::Late(self.deadline)),
        };
        self.settle(r)
    }

    /// Runs the blocking `call` (whose socket timeouts are the deadline, so each of its reads is bounded), when
    /// the breaker lets it.
    pub(crate) fn blocking<T, E: std::fmt::Display>(
        &self,
        call: impl FnOnce() -> Result<T, E>,
    ) -> Result<T, Refused> {
        self.admit()?;
        let r = match call() {
            Ok(v) => Ok(v),
            Err(e) => Err(Refused::Failed(e.to_string())),
        };
        self.settle(r)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Breaker> {
        self.breaker.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn admit(&self) -> Result<(), Refused> {
        if self.lock().allow(Instant::now()) {
            return Ok(());
        }
        metrics::counter!(crate::metrics::DEPENDENCY_CALLS_TOTAL, "dependency" => self.name, "outcome" => "skipped").increment(1);
        Err(Refused::Open)
    }

    fn settle<T>(&self, r: Result<T, Refused>) -> Result<T, Refused> {
        let outcome = match &r {
            Ok(_) => "ok",
            Err(Refused::Late(_)) => "late",
            Err(_) => "failed",
        };
        metrics::counter!(crate::metrics::DEPENDENCY_CALLS_TOTAL, "dependency" => self.name, "outcome" => outcome).increment(1);
        let (was, now) = {
            let mut b = self.lock();
            let was = b.state() == State::Closed;
            match &r {
                Ok(_) => b.success(),
                Err(_) => b.failure(Instant::now()),
            }
            (was, b.state() == State::Closed)
        };
        if let Err(e) = &r {
            *self.last_error.lock().unwrap_or_else(|p| p.into_inner()) = Some(e.to_string());
        }
        if was != now {
            if now {
                tracing::info!(dependency = self.name, "dependency answers again");
            } else {
                tracing::warn!(dependency = self.name, error = %r.as_ref().err().map(ToString::to_string).unwrap_or_default(), "dependency failed: served from local state until it answers");
            }
        }
        metrics::gauge!(crate::metrics::DEPENDENCY_UP, "dependency" => self.name).set(if now {
            1.0
        } else {
            0.0
        });
        r
    }

    /// What `/ready` and the console say of it.
    pub(crate) fn view(&self) -> serde_json::Value {
        let (state, trips) = {
            let b = self.lock();
            let s = match b.state() {
                State::Closed => "up",
                State::Open { .. } => "open: served from local state",
                State::HalfOpen { .. } => "probing",
            };
            (s, b.trips())
        };
        serde_json::json!({
            "name": self.name,
            "state": state,
            "deadline_ms": self.deadline.as_millis() as u64,
            "trips": trips,
            "last_error": *self.last_error.lock().unwrap_or_else(|p| p.into_inner()),
        })
    }
}

/// The dependencies a server has (for `/ready` and the console).
#[derive(Default)]
pub(crate) struct Registry(Mutex<Vec<Arc<Dependency>>>);

impl Registry {
    /// Adds `d`.
    pub(crate) fn add(&self, d: &Arc<Dependency>) {
        self.0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(d.clone());
    }

    /// Each one's view; `false` when one's breaker is not closed.
    pub(crate) fn views(&self) -> (bool, Vec<serde_json::Value>) {
        let all = self.0.lock().unwrap_or_else(|p| p.into_inner());
        (
            all.iter().all(|d| d.is_up()),
            all.iter().map(|d| d.view()).collect(),
        )
    }
}

/// A Redis connection kept for reuse and made again after a failure, never made under a lock.
#[derive(Default)]
pub(crate) struct Kept(Mutex<Option<redis::aio::MultiplexedConnection>>);

impl Kept {
    /// The kept connection, or a new one from `client` (made outside the lock; the caller's deadline bounds
    /// it).
    pub(crate) async fn get(
        &self,
        client: &redis::Client,
    ) -> redis::RedisResult<redis::aio::MultiplexedConnection> {
        if let Some(c) = self.0.lock().unwrap_or_else(|p| p.into_inner()).clone() {
            return Ok(c);
        }
        let c = client.get_multiplexed_async_connection().await?;
        *self.0.lock().unwrap_or_else(|p| p.into_inner()) = Some(c.clone());
        Ok(c)
    }

    /// Drops the kept connection (after a failure or a late answer: the next call connects again).
    pub(crate) fn forget(&self) {
        *self.0.lock().unwrap_or_else(|p| p.into_inner()) = None;
    }
}

/// A blocking Redis connection whose reads and writes time out after `deadline`, made within `deadline`: the
/// client's own setup (AUTH, SELECT) reads with no timeout, so it runs on a thread of its own that is left to
/// finish alone when Redis does not answer (the breaker makes that at most one a cooldown).
pub(crate) fn blocking_connection(
    client: &redis::Client,
    deadline: Duration,
) -> redis::RedisResult<redis::Connection> {
    let (tx, rx) = std::sync::mpsc::sync_channel(1);
    let client = client.clone();
    std::thread::Builder::new()
        .name("tiergate-redis-connect".into())
        .spawn(move || {
            let _ = tx.send(client.get_connection_with_timeout(deadline));
        })
        .map_err(redis::RedisError::from)?;
    let c = rx.recv_timeout(deadline).map_err(|_| {
        redis::RedisError::from((redis::ErrorKind::IoError, "connect: no answer in time"))
    })??;
    c.set_read_timeout(Some(deadline))?;
    c.set_write_timeout(Some(deadline))?;
    Ok(c)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_late_call_opens_the_breaker_and_later_calls_are_not_made_until_a_probe() {
        let d = Dependency::new("test", Duration::from_millis(20));
        let t0 = Instant::now();
        let r: Result<(), Refused> = d
            .call(async {
                tokio::time::sleep(Duration::from_secs(10)).await;
                Ok::<_, String>(())
            })
            .await;
        assert_eq!(r, Err(Refused::Late(Duration::from_millis(20))));
        assert!(t0.elapsed() < Duration::from_secs(1));
        assert!(!d.is_up());
        let mut made = false;
        let r = d
            .call(async {
                made = true;
                Ok::<_, String>(1)
            })
            .await;
        assert_eq!(r, Err(Refused::Open));
        assert!(!made, "an open breaker makes no call");
        tokio::time::sleep(COOLDOWN + Duration::from_millis(50)).await;
        let r = d.call(async { Ok::<_, String>(2) }).await;
        assert_eq!(r, Ok(2), "the probe after the cooldown is made");
        assert!(d.is_up());
        assert_eq!(d.view()["trips"], 1);
    }

    #[test]
    fn a_blocking_call_that_fails_opens_it_too() {
        let d = Dependency::new("test-blocking", Duration::from_millis(20));
        let r: Result<(), Refused> = d.blocking(|| Err("refused"));
        assert_eq!(r, Err(Refused::Failed("refused".into())));
        assert_eq!(d.blocking(|| Ok::<_, String>(())), Err(Refused::Open));
        let reg = Registry::default();
        reg.add(&d);
        let (up, views) = reg.views();
        assert!(!up);
        assert_eq!(views[0]["last_error"], "refused");
    }
}
