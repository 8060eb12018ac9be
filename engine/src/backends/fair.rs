//! A fair share of the LLM between tenants. The workers take `capacity` jobs at once; a job that finds them
//! busy waits in its tenant's short queue (at most `lane` jobs each, and no longer than its deadline allows),
//! and each freed slot goes to the next job in start-time fair queueing ([`Sfq`], a relative of deficit round
//! robin that also counts the jobs dispatched at once): tenants get slots in proportion to their weights
//! while they have jobs waiting, and an idle tenant's share goes to the others.
//! Jobs are dispatched to the shared-memory queue only when a worker can take them, so its FIFO order never
//! decides who waits. A server without tenants has one lane (`default`): the
//! capacity in flight and the rest of the in-flight limit waiting.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

/// Start-time fair queueing over per-tenant lanes, each job costing one slot (a pure state machine). A job is
/// tagged when it is queued or dispatched: it starts at the later of the virtual clock and its tenant's last
/// finish, and finishes `1 / weight` later; the waiting job with the earliest start goes next, and the clock
/// moves to its start. So tenants with jobs waiting get slots in proportion to their weights, a tenant whose
/// job was just dispatched waits behind one that had none, and an idle tenant banks no credit (the clock has
/// moved past its last finish).
#[derive(Debug)]
pub(crate) struct Sfq<T> {
    lanes: HashMap<Arc<str>, Lane<T>>,
    /// The start tag of the last dispatched job.
    clock: f64,
    /// Jobs one lane holds at most.
    bound: usize,
    waiting: usize,
}

#[derive(Debug)]
struct Lane<T> {
    /// (id, start tag, job), in tag order.
    jobs: VecDeque<(u64, f64, T)>,
    /// The finish tag of its last tagged job.
    finish: f64,
}

impl<T> Sfq<T> {
    /// Lanes of at most `bound` jobs.
    pub(crate) fn new(bound: usize) -> Self {
        Self {
            lanes: HashMap::new(),
            clock: 0.0,
            bound,
            waiting: 0,
        }
    }

    /// Jobs waiting, all lanes.
    pub(crate) fn len(&self) -> usize {
        self.waiting
    }

    /// No job waits.
    pub(crate) fn is_empty(&self) -> bool {
        self.waiting == 0
    }

    /// Jobs waiting in `tenant`'s lane.
    pub(crate) fn waiting(&self, tenant: &str) -> usize {
        self.lanes.get(tenant).map_or(0, |l| l.jobs.len())
    }

    /// The next start tag of `tenant` (weight `weight`), which is then charged for one job.
    fn tag(&mut self, tenant: &Arc<str>, weight: f64) -> f64 {
        let clock = self.clock;
        let lane = self.lanes.entry(tenant.clone()).or_insert_with(|| Lane {
            jobs: VecDeque::new(),
            finish: clock,
        });
        let start = lane.finish.max(clock);
        lane.finish = start + 1.0 / weight.max(1e-3);
        start
    }

    /// A job of `tenant` dispatched without waiting (a slot was free): it still counts in its share.
    pub(crate) fn dispatched(&mut self, tenant: &Arc<str>, weight: f64) {
        self.clock = self.tag(tenant, weight);
        self.forget_idle();
    }

    /// Queues job `id` in `tenant`'s lane; the job back when the lane is full.
    pub(crate) fn push(
        &mut self,
        tenant: &Arc<str>,
        weight: f64,
        id: u64,
        job: T,
    ) -> Result<(), T> {
        if self.waiting(tenant) >= self.bound {
            return Err(job);
        }
        let start = self.tag(tenant, weight);
        if let Some(lane) = self.lanes.get_mut(tenant) {
            lane.jobs.push_back((id, start, job));
            self.waiting += 1;
        }
        Ok(())
    }

    /// The next job to dispatch: the earliest start tag (the earlier job on a tie).
    pub(crate) fn pop(&mut self) -> Option<(Arc<str>, T)> {
        let tenant = self
            .lanes
            .iter()
            .filter_map(|(t, l)| l.jobs.front().map(|(id, start, _)| (*start, *id, t)))
            .min_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)))
            .map(|(_, _, t)| t.clone())?;
        let (_, start, job) = self.lanes.get_mut(&tenant)?.jobs.pop_front()?;
        self.waiting -= 1;
        self.clock = self.clock.max(start);
        self.forget_idle();
        Some((tenant, job))
    }

    /// Takes job `id` out of `tenant`'s lane (it gave up waiting); `None` when it is no longer there. Its tag
    /// is not refunded: the lane's later jobs keep their places.
    pub(crate) fn remove(&mut self, tenant: &str, id: u64) -> Option<T> {
        let lane = self.lanes.get_mut(tenant)?;
        let at = lane.jobs.iter().position(|(i, _, _)| *i == id)?;
        let (_, _, job) = lane.jobs.remove(at)?;
        self.waiting -= 1;
        Some(job)
    }

    /// Lanes with nothing waiting whose last finish the clock has passed carry nothing: dropped.
    fn forget_idle(&mut self) {
        let clock = self.clock;
        self.lanes
            .retain(|_, l| !l.jobs.is_empty() || l.finish > clock);
    }

    /// Jobs dispatched before a new job of `tenant` would be: those waiting with an earlier start tag than it
    /// would get.
    pub(crate) fn ahead(&self, tenant: &str) -> usize {
        let start = self
            .lanes
            .get(tenant)
            .map_or(self.clock, |l| l.finish.max(self.clock));
        self.lanes
            .values()
            .flat_map(|l| l.jobs.iter())
            .filter(|(_, s, _)| *s <= start)
            .count()
    }
}

/// Why a job got no slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum NoSlot {
    /// Its tenant's lane is full.
    Full,
    /// It waited as long as its deadline allows.
    Timeout,
}

/// The LLM's slots and the tenants' lanes: one set of lanes for short jobs (reranks), one for generations. A
/// worker keeps one of its job threads for reranks (generations may hold the others), and so does this: at
/// most `generations` of the `capacity` slots go to generations, and a freed slot goes to a waiting rerank
/// before a waiting generation — so a rerank on the request path never waits for a long generation to end.
pub(crate) struct Share {
    state: Mutex<State>,
    capacity: usize,
    generations: usize,
}

struct State {
    running: usize,
    /// Slots held by generations.
    generating: usize,
    lanes: Sfq<tokio::sync::oneshot::Sender<()>>,
    generation_lanes: Sfq<tokio::sync::oneshot::Sender<()>>,
    next_id: u64,
}

impl State {
    fn lanes(&mut self, generation: bool) -> &mut Sfq<tokio::sync::oneshot::Sender<()>> {
        if generation {
            &mut self.generation_lanes
        } else {
            &mut self.lanes
        }
    }
}

impl Share {
    /// `capacity` jobs at once, any of them generations; lanes of `lane` jobs (tests and benchmarks).
    #[cfg(test)]
    pub(crate) fn new(capacity: usize, lane: usize) -> Arc<Self> {
        Self::with_generations(capacity, capacity, lane)
    }

    /// `capacity` jobs at once, at most `generations` of them generations; lanes of `lane` jobs.
    pub(crate) fn with_generations(capacity: usize, generations: usize, lane: usize) -> Arc<Self> {
        let capacity = capacity.max(1);
        Arc::new(Self {
            state: Mutex::new(State {
                running: 0,
                generating: 0,
                lanes: Sfq::new(lane),
                generation_lanes: Sfq::new(lane),
                next_id: 0,
            }),
            capacity,
            generations: generations.clamp(1, capacity),
        })
    }

    /// Jobs holding a slot, and jobs waiting.
    pub(crate) fn load(&self) -> (usize, usize) {
        self.state.lock().map_or((0, 0), |s| {
            (s.running, s.lanes.len() + s.generation_lanes.len())
        })
    }

    /// Jobs of `tenant` waiting for a slot.
    pub(crate) fn waiting(&self, tenant: &str) -> usize {
        self.state.lock().map_or(0, |s| {
            s.lanes.waiting(tenant) + s.generation_lanes.waiting(tenant)
        })
    }

    /// Jobs dispatched before a new job of `tenant` would be, itself included.
    pub(crate) fn ahead(&self, tenant: &str) -> usize {
        self.state.lock().map_or(1, |s| {
            if s.running < self.capacity && s.lanes.is_empty() && s.generation_lanes.is_empty() {
                s.running + 1
            } else {
                s.running + s.lanes.ahead(tenant) + s.generation_lanes.ahead(tenant) + 1
            }
        })
    }

    /// A slot for background work, only while it leaves `spare` slots free for requests and nobody waits:
    /// `None` otherwise (the work is shed, never queued).
    pub(crate) fn try_spare(self: &Arc<Self>, spare: usize) -> Option<Slot> {
        let mut s = self.state.lock().ok()?;
        if !s.lanes.is_empty()
            || !s.generation_lanes.is_empty()
            || s.running + 1 + spare > self.capacity
        {
            return None;
        }
        s.running += 1;
        drop(s);
        Some(self.slot(false))
    }

    /// Whether a job of this kind may take a slot now, nobody of its priority waiting.
    fn free(&self, s: &State, generation: bool) -> bool {
        s.running < self.capacity
            && s.lanes.is_empty()
            && (!generation || (s.generating < self.generations && s.generation_lanes.is_empty()))
    }

    /// A slot for a job of `tenant` (a generation, or a short job): at once when one is free and nobody
    /// waits, else after waiting in its lane for at most `wait`. Dropping the future while it waits gives its
    /// place (or a slot just granted) back.
    pub(crate) async fn acquire(
        self: &Arc<Self>,
        tenant: &Arc<str>,
        weight: f64,
        wait: Duration,
        generation: bool,
    ) -> Result<Slot, NoSlot> {
        let (id, rx) = {
            let mut s = self.state.lock().map_err(|_| NoSlot::Full)?;
            if self.free(&s, generation) {
                s.running += 1;
                s.generating += usize::from(generation);
                s.lanes(generation).dispatched(tenant, weight);
                return Ok(self.slot(generation));
            }
            let (tx, rx) = tokio::sync::oneshot::channel();
            let id = s.next_id;
            s.next_id += 1;
            s.lanes(generation)
                .push(tenant, weight, id, tx)
                .map_err(|_| NoSlot::Full)?;
            (id, rx)
        };
        let mut waiting = Waiting {
            share: self,
            tenant,
            id,
            generation,
            done: false,
        };
        let granted = tokio::time::timeout(wait, rx).await;
        waiting.done = true;
        match granted {
            Ok(Ok(())) => Ok(self.slot(generation)),
            _ => {
                if waiting.give_up() {
                    Err(NoSlot::Timeout)
                } else {
                    // Granted as the wait ran out: the slot is this job's.
                    Ok(self.slot(generation))
                }
            }
        }
    }

    fn slot(self: &Arc<Self>, generation: bool) -> Slot {
        Slot {
            share: Arc::downgrade(self),
            since: Instant::now(),
            generation,
            on_release: None,
        }
    }

    /// A slot is free: it goes to the next waiting short job, else to the next waiting generation while
    /// generations may take one (a job whose waiter is gone is skipped).
    fn release(&self, generation: bool) {
        let Ok(mut s) = self.state.lock() else {
            return;
        };
        s.running = s.running.saturating_sub(1);
        if generation {
            s.generating = s.generating.saturating_sub(1);
        }
        while s.running < self.capacity {
            if let Some((_, tx)) = s.lanes.pop() {
                if tx.send(()).is_ok() {
                    s.running += 1;
                }
                continue;
            }
            if s.generating >= self.generations {
                break;
            }
            let Some((_, tx)) = s.generation_lanes.pop() else {
                break;
            };
            if tx.send(()).is_ok() {
                s.running += 1;
                s.generating += 1;
            }
        }
    }
}

/// A job waiting in its lane; dropped early (the request went away), it leaves the lane or hands back the
/// slot it was granted.
struct Waiting<'a> {
    share: &'a Arc<Share>,
    tenant: &'a str,
    id: u64,
    generation: bool,
    done: bool,
}

impl Waiting<'_> {
    /// Leaves the lane: true when it was still waiting, false when a slot was granted meanwhile (sent under
    /// the lock, so not in the lane means granted).
    fn give_up(&self) -> bool {
        self.share.state.lock().is_ok_and(|mut s| {
            s.lanes(self.generation)
                .remove(self.tenant, self.id)
                .is_some()
        })
    }
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        if !self.done && !self.give_up() {
            self.share.release(self.generation);
        }
    }
}

/// A job's place at the LLM, held until its answer is read; on release the time it held the slot is passed
/// to `on_release` (the tenant's LLM budget) and the slot goes to the next job.
pub(crate) struct Slot {
    share: Weak<Share>,
    since: Instant,
    generation: bool,
    on_release: Option<Box<dyn FnOnce(Duration) + Send + Sync>>,
}

impl Slot {
    /// Calls `f` with the time held, at release.
    pub(crate) fn on_release(&mut self, f: impl FnOnce(Duration) + Send + Sync + 'static) {
        self.on_release = Some(Box::new(f));
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        if let Some(f) = self.on_release.take() {
            f(self.since.elapsed());
        }
        if let Some(s) = self.share.upgrade() {
            s.release(self.generation);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn background_work_takes_a_slot_only_while_one_stays_free_and_nobody_waits() {
        let share = Share::new(2, 4);
        let a: Arc<str> = Arc::from("a");
        let bg = share
            .try_spare(1)
            .expect("both slots free: one may go to background work");
        assert_eq!(share.load(), (1, 0));
        assert!(
            share.try_spare(1).is_none(),
            "the last free slot is kept for requests"
        );
        let req = share
            .acquire(&a, 1.0, Duration::from_millis(10), false)
            .await
            .unwrap();
        assert_eq!(share.load(), (2, 0));
        drop(bg);
        let _second = share
            .acquire(&a, 1.0, Duration::from_millis(10), false)
            .await
            .unwrap();
        // A request waits: background work never jumps it.
        let waiting = {
            let share = share.clone();
            let a = a.clone();
            tokio::spawn(async move {
                share
                    .acquire(&a, 1.0, Duration::from_secs(5), false)
                    .await
                    .map(|_| ())
            })
        };
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert_eq!(share.load(), (2, 1));
        assert!(share.try_spare(0).is_none(), "a request is waiting");
        drop(req);
        waiting.await.unwrap().unwrap();
        assert!(
            Share::new(1, 4).try_spare(1).is_none(),
            "one slot: never for background work"
        );
    }

    fn name(s: &str) -> Arc<str> {
        Arc::from(s)
    }

    /// Dispatch order of `n` pops.
    fn order(d: &mut Sfq<u64>, n: usize) -> String {
        (0..n)
            .filter_map(|_| d.pop())
            .map(|(t, _)| t.to_string())
            .collect()
    }

    #[test]
    fn a_flood_does_not_starve_a_trickle() {
        let (a, b) = (name("a"), name("b"));
        let mut d = Sfq::new(100);
        // A's job is running (dispatched at once), 50 more of A's wait; then B's one job comes.
        d.dispatched(&a, 1.0);
        for i in 0..50 {
            d.push(&a, 1.0, i, i).unwrap();
        }
        d.push(&b, 1.0, 100, 100).unwrap();
        // A has had its turn: B's job goes first, though 50 of A's were queued before it.
        assert_eq!(order(&mut d, 3), "baa");
        // A later job of B's again goes at the next free slot.
        d.push(&b, 1.0, 101, 101).unwrap();
        assert_eq!(order(&mut d, 2), "ba");
        assert_eq!(d.len(), 47);
        assert_eq!(d.waiting("b"), 0);
    }

    #[test]
    fn slots_follow_the_weights_while_both_wait() {
        let (a, b) = (name("a"), name("b"));
        let mut d = Sfq::new(1000);
        for i in 0..300 {
            d.push(&a, 3.0, i, i).unwrap();
            d.push(&b, 1.0, 1000 + i, i).unwrap();
        }
        let first = order(&mut d, 200);
        let share_a = first.matches('a').count();
        assert_eq!(share_a, 150, "{first}");
        // Half weights accumulate over rounds: 0.5 : 1 is one job in three.
        let mut d = Sfq::new(1000);
        for i in 0..90 {
            d.push(&a, 0.5, i, i).unwrap();
            d.push(&b, 1.0, 1000 + i, i).unwrap();
        }
        assert_eq!(order(&mut d, 90).matches('a').count(), 30);
    }

    #[test]
    fn an_idle_tenant_banks_no_credit_and_its_share_is_lent() {
        let (a, b) = (name("a"), name("b"));
        let mut d = Sfq::new(100);
        // B alone: every slot is B's (A's share lent).
        for i in 0..5 {
            d.push(&b, 1.0, i, i).unwrap();
        }
        assert_eq!(order(&mut d, 5), "bbbbb");
        assert!(d.pop().is_none());
        // A, idle while B took every slot, gets no burst to catch up: one turn first (B's last job was just
        // dispatched), then they alternate.
        for i in 0..3 {
            d.push(&a, 1.0, 10 + i, i).unwrap();
            d.push(&b, 1.0, 20 + i, i).unwrap();
        }
        assert_eq!(order(&mut d, 6), "aababb");
    }

    #[test]
    fn lanes_are_bounded_and_a_waiter_can_leave() {
        let (a, b) = (name("a"), name("b"));
        let mut d = Sfq::new(2);
        d.push(&a, 1.0, 1, 1).unwrap();
        d.push(&a, 1.0, 2, 2).unwrap();
        assert_eq!(d.push(&a, 1.0, 3, 3), Err(3));
        // Another tenant's lane is its own.
        d.push(&b, 1.0, 4, 4).unwrap();
        assert_eq!(d.remove("a", 1), Some(1));
        assert_eq!(d.remove("a", 1), None);
        // A's next job would start after its own waiting one and B's...
        assert_eq!(d.ahead("a"), 2);
        // ... a new tenant's at the clock, after B's job tagged at it.
        assert_eq!(d.ahead("c"), 1);
        assert_eq!(d.remove("a", 2), Some(2));
        assert_eq!(d.waiting("a"), 0);
        assert_eq!(order(&mut d, 3), "b");
        assert!(d.is_empty());
        assert!(d.pop().is_none());
    }

    #[tokio::test]
    async fn a_freed_slot_goes_to_the_next_tenant_in_turn() {
        let share = Share::new(1, 8);
        let (a, b) = (name("a"), name("b"));
        let held = share.acquire(&a, 1.0, Duration::ZERO, false).await.unwrap();
        let log = Arc::new(Mutex::new(String::new()));
        let mut tasks = Vec::new();
        for t in [&a, &a, &a, &b] {
            let (share, t, log) = (share.clone(), t.clone(), log.clone());
            tasks.push(tokio::spawn(async move {
                let slot = share
                    .acquire(&t, 1.0, Duration::from_secs(5), false)
                    .await
                    .unwrap();
                log.lock().unwrap().push_str(&t);
                tokio::time::sleep(Duration::from_millis(5)).await;
                drop(slot);
            }));
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        assert_eq!(share.load(), (1, 4));
        drop(held);
        for t in tasks {
            t.await.unwrap();
        }
        // The held slot was A's, so B's job (queued last) goes first.
        assert_eq!(&*log.lock().unwrap(), "baaa");
        assert_eq!(share.load(), (0, 0));
    }

    #[tokio::test]
    async fn a_waiter_that_times_out_or_goes_away_leaves_no_slot_taken() {
        let share = Share::new(1, 1);
        let a = name("a");
        let held = share.acquire(&a, 1.0, Duration::ZERO, false).await.unwrap();
        let e = share
            .acquire(&a, 1.0, Duration::from_millis(20), false)
            .await;
        assert_eq!(e.err(), Some(NoSlot::Timeout));
        // A waiter dropped (its client went away) leaves its lane.
        let waiter = {
            let share = share.clone();
            let a = a.clone();
            tokio::spawn(async move {
                share
                    .acquire(&a, 1.0, Duration::from_secs(10), false)
                    .await
                    .is_ok()
            })
        };
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert_eq!(share.load(), (1, 1));
        // The lane of one is full.
        let full = share.acquire(&a, 1.0, Duration::from_secs(1), false).await;
        assert_eq!(full.err(), Some(NoSlot::Full));
        waiter.abort();
        let _ = waiter.await;
        assert_eq!(share.load(), (1, 0));
        drop(held);
        assert_eq!(share.load(), (0, 0));
        // The budget callback sees the time held.
        let mut slot = share.acquire(&a, 1.0, Duration::ZERO, false).await.unwrap();
        let seen = Arc::new(Mutex::new(None));
        let s2 = seen.clone();
        slot.on_release(move |d| *s2.lock().unwrap() = Some(d));
        tokio::time::sleep(Duration::from_millis(15)).await;
        drop(slot);
        assert!(seen.lock().unwrap().unwrap() >= Duration::from_millis(15));
    }

    #[tokio::test]
    async fn a_rerank_never_waits_for_generations_to_end() {
        // Three slots, two of them for generations (as a worker of max_concurrent 3 keeps one for reranks).
        let share = Share::with_generations(3, 2, 8);
        let a: Arc<str> = Arc::from("a");
        let g1 = share.acquire(&a, 1.0, Duration::ZERO, true).await.unwrap();
        let g2 = share.acquire(&a, 1.0, Duration::ZERO, true).await.unwrap();
        // A third generation waits, though a slot is free: it is the reranks'.
        let third = share
            .acquire(&a, 1.0, Duration::from_millis(20), true)
            .await;
        assert!(matches!(third, Err(NoSlot::Timeout)));
        let r = share.acquire(&a, 1.0, Duration::ZERO, false).await.unwrap();
        assert_eq!(share.load(), (3, 0));
        // With every slot held, a waiting rerank goes before a waiting generation when a slot frees.
        let s2 = share.clone();
        let a2 = a.clone();
        let generation =
            tokio::spawn(async move { s2.acquire(&a2, 1.0, Duration::from_secs(5), true).await });
        tokio::time::sleep(Duration::from_millis(20)).await;
        let s3 = share.clone();
        let a3 = a.clone();
        let rerank =
            tokio::spawn(async move { s3.acquire(&a3, 1.0, Duration::from_secs(5), false).await });
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert_eq!(share.load(), (3, 2));
        drop(r);
        let r2 = rerank.await.unwrap().unwrap();
        assert_eq!(share.load(), (3, 1), "the generation still waits");
        // A generation's slot, freed, goes to the waiting generation.
        drop(g1);
        let g3 = generation.await.unwrap().unwrap();
        assert_eq!(share.load(), (3, 0));
        drop((g2, g3, r2));
        assert_eq!(share.load(), (0, 0));
    }
}
