//! The ledger in this process's memory: what a server built without a durable store keeps (the in-process
//! tests; `tiergate serve` mounts the SQLite one, `tiergate-feedback`). Same rules as the durable stores —
//! the window, the first feedback and label standing — bounded per tenant (`max_per_tenant` records, its oldest
//! first) and by `max_bytes` in all (the tenant holding the most gives way, its oldest first), and gone at
//! exit.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::Mutex;

use super::{AuditItem, Entry, Feedback, First, Record, Store, StoreError, Summary};

#[derive(Default)]
struct Held {
    /// Decisions by id with their feedback, each tenant's oldest first in `order`, its bytes in `bytes_of`.
    decisions: HashMap<String, (Record, u64, Option<Feedback>)>,
    order: HashMap<String, VecDeque<String>>,
    bytes_of: HashMap<String, u64>,
    aliases: HashMap<String, String>,
    bytes: u64,
    audits: BTreeMap<String, AuditItem>,
}

/// The store.
pub(crate) struct MemoryStore {
    held: Mutex<Held>,
    max_bytes: u64,
    per_tenant: usize,
    window_ms: u64,
}

impl MemoryStore {
    /// An empty ledger holding at most `max_bytes` of decisions for `window_s`.
    pub(crate) fn new(max_bytes: u64, window_s: u64) -> Self {
        Self {
            held: Mutex::new(Held::default()),
            max_bytes,
            per_tenant: usize::MAX,
            window_ms: window_s.saturating_mul(1000),
        }
    }

    /// At most `n` decisions of one tenant.
    pub(crate) fn per_tenant(mut self, n: usize) -> Self {
        self.per_tenant = n;
        self
    }

    fn held(&self) -> std::sync::MutexGuard<'_, Held> {
        self.held.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl Held {
    /// Drops `tenant`'s oldest decision; whether there was one.
    fn evict_oldest(&mut self, tenant: &str) -> bool {
        let Some(old) = self.order.get_mut(tenant).and_then(VecDeque::pop_front) else {
            return false;
        };
        if self.order.get(tenant).is_some_and(VecDeque::is_empty) {
            self.order.remove(tenant);
        }
        if let Some((rec, n, _)) = self.decisions.remove(&old) {
            self.bytes -= n;
            if let Some(b) = self.bytes_of.get_mut(tenant) {
                *b -= n;
                if *b == 0 {
                    self.bytes_of.remove(tenant);
                }
            }
            if let Some(a) = rec.alias {
                self.aliases.remove(&a);
            }
        }
        true
    }

    /// Drops the oldest decision of the tenant holding the most bytes (a tie goes against `writing`).
    fn evict_oldest_of_heaviest(&mut self, writing: &str) -> bool {
        let heaviest = self
            .bytes_of
            .iter()
            .max_by_key(|(t, b)| (**b, t.as_str() == writing))
            .map(|(t, _)| t.clone());
        heaviest.is_some_and(|t| self.evict_oldest(&t))
    }
}

fn size(r: &Record) -> u64 {
    serde_json::to_string(r).map_or(256, |s| s.len() as u64)
}

impl Store for MemoryStore {
    fn put(&self, entries: &[Entry], _now_ms: u64) -> Result<(), StoreError> {
        let mut h = self.held();
        for e in entries {
            match e {
                Entry::Decision(r) => {
                    if h.decisions.contains_key(&r.id) {
                        continue;
                    }
                    let n = size(r);
                    if let Some(a) = &r.alias {
                        h.aliases.insert(a.clone(), r.id.clone());
                    }
                    h.bytes += n;
                    *h.bytes_of.entry(r.tenant.clone()).or_default() += n;
                    let mine = h.order.entry(r.tenant.clone()).or_default();
                    mine.push_back(r.id.clone());
                    let over = mine.len() > self.per_tenant;
                    h.decisions.insert(r.id.clone(), ((**r).clone(), n, None));
                    if over {
                        h.evict_oldest(&r.tenant);
                    }
                    while h.bytes > self.max_bytes && h.evict_oldest_of_heaviest(&r.tenant) {}
                }
                Entry::Audit(a) => {
                    h.audits
                        .entry(a.id.clone())
                        .or_insert_with(|| (**a).clone());
                }
            }
        }
        Ok(())
    }

    fn decision(&self, id: &str, now_ms: u64) -> Result<Option<Record>, StoreError> {
        let h = self.held();
        let id = h.aliases.get(id).map_or(id, String::as_str);
        Ok(h.decisions
            .get(id)
            .filter(|(r, _, _)| r.at_ms + self.window_ms > now_ms)
            .map(|(r, _, _)| r.clone()))
    }

    fn decision_of(
        &self,
        id: &str,
        tenant: &str,
        now_ms: u64,
    ) -> Result<Option<Record>, StoreError> {
        let h = self.held();
        let id = h.aliases.get(id).map_or(id, String::as_str);
        Ok(h.decisions
            .get(id)
            .filter(|(r, _, _)| r.at_ms + self.window_ms > now_ms && &*r.tenant == tenant)
            .map(|(r, _, _)| r.clone()))
    }

    fn feedback(&self, id: &str, fb: &Feedback) -> Result<First<Feedback>, StoreError> {
        let mut h = self.held();
        let id = h.aliases.get(id).cloned().unwrap_or_else(|| id.to_string());
        let Some((_, _, given)) = h.decisions.get_mut(&id) else {
            return Ok(First::Gone);
        };
        match given {
            Some(first) => Ok(First::Already(first.clone())),
            None => {
                *given = Some(fb.clone());
                Ok(First::Written(fb.clone()))
            }
        }
    }

    fn pending(
        &self,
        route: Option<&str>,
        heads: Option<&super::Heads>,
        limit: usize,
    ) -> Result<Vec<AuditItem>, StoreError> {
        let mut out: Vec<AuditItem> = self
            .held()
            .audits
            .values()
            .filter(|a| a.label.is_none() && route.is_none_or(|r| a.route == r))
            .filter(|a| a.of_heads(heads))
            .cloned()
            .collect();
        out.sort_by_key(|a| a.at_ms);
        out.truncate(limit);
        Ok(out)
    }

    fn audit(&self, id: &str) -> Result<Option<AuditItem>, StoreError> {
        Ok(self.held().audits.get(id).cloned())
    }

    fn label(&self, id: &str, label: &str) -> Result<First<String>, StoreError> {
        let mut h = self.held();
        let Some(a) = h.audits.get_mut(id) else {
            return Ok(First::Gone);
        };
        if let Some(l) = &a.label {
            return Ok(First::Already(l.clone()));
        }
        a.label = Some(label.to_string());
        a.text = None;
        Ok(First::Written(label.to_string()))
    }

    fn summary(&self, now_ms: u64) -> Result<Summary, StoreError> {
        let h = self.held();
        let mut s = Summary::default();
        for (r, _, fb) in h.decisions.values() {
            if r.at_ms + self.window_ms <= now_ms {
                continue;
            }
            let e = s.route(&r.route);
            e.decisions += 1;
            if let Some(f) = fb {
                e.add_feedback(r.feedback_channel(), f.trusted, 1, u64::from(f.correct));
            }
        }
        for a in h.audits.values() {
            if a.at_ms + self.window_ms <= now_ms {
                continue;
            }
            let e = s.route(&a.route);
            match &a.label {
                None => e.add_pending(&a.head, 1),
                Some(l) => e.add_audit(&a.head, &a.channel, a.probability, *l != a.answered),
            }
        }
        Ok(s)
    }

    fn trusted_feedback(
        &self,
        route: &str,
        head: &str,
        since_ms: u64,
    ) -> Result<Vec<tiergate_core::risk::Audited>, StoreError> {
        Ok(self
            .held()
            .decisions
            .values()
            .filter(|(r, _, _)| r.route == route && r.head == head && r.at_ms >= since_ms)
            .filter_map(|(r, _, fb)| r.as_evidence(fb.as_ref()?))
            .collect())
    }

    fn labelled(
        &self,
        route: &str,
        head: &str,
        since_ms: u64,
    ) -> Result<Vec<tiergate_core::risk::Audited>, StoreError> {
        Ok(self
            .held()
            .audits
            .values()
            .filter(|a| a.route == route && a.at_ms >= since_ms)
            .filter_map(|a| a.audited(head))
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn item(id: &str, head: &str, channel: &str, at_ms: u64) -> AuditItem {
        AuditItem {
            id: id.into(),
            route: "classify".into(),
            at_ms,
            probability: 0.5,
            theta: 0.6,
            ambiguity: 0.1,
            answered: "card_lost".into(),
            channel: channel.into(),
            text: Some("t".into()),
            head: head.into(),
            label: None,
        }
    }

    /// Evidence belongs to a head: the bound's audits, the pending list and the summary read one head's
    /// items; degraded answers' audits are not the bound's evidence and are counted apart.
    #[test]
    fn audits_are_read_by_the_head_that_answered() {
        let s = MemoryStore::new(1 << 20, 60);
        let now = 10_000;
        let items = [
            item("a", "h1", "tier0", now),
            item("b", "h2", "tier0", now),
            item("c", "h1", "degraded", now),
            item("d", "h1", "tier0", now),
        ];
        let entries: Vec<Entry> = items
            .iter()
            .map(|i| Entry::Audit(Box::new(i.clone())))
            .collect();
        s.put(&entries, now).unwrap();
        for id in ["a", "b", "c"] {
            s.label(id, "card_stolen").unwrap();
        }
        let live = s.labelled("classify", "h1", 0).unwrap();
        assert_eq!(
            live.len(),
            1,
            "h1's lone answer only (not h2's, not the degraded one)"
        );
        assert_eq!(s.labelled("classify", "h2", 0).unwrap().len(), 1);
        let heads: super::super::Heads = [("classify".to_string(), "h2".to_string())].into();
        assert!(s.pending(None, Some(&heads), 10).unwrap().is_empty());
        let heads: super::super::Heads = [("classify".to_string(), "h1".to_string())].into();
        let p = s.pending(None, Some(&heads), 10).unwrap();
        assert_eq!(p.iter().map(|a| a.id.as_str()).collect::<Vec<_>>(), ["d"]);
        let sum = s.summary(now).unwrap();
        let r = &sum.routes["classify"];
        assert_eq!(r.silent_error(Some("h1")).unwrap().n, 1);
        assert_eq!(r.degraded_error(Some("h1")).unwrap().n, 1);
        assert_eq!(r.silent_error(Some("h2")).unwrap().n, 1);
        assert_eq!(r.pending_of(Some("h1")), 1);
        // What is not there (expired, swept, never written) is gone, not a store failure (a 503).
        assert_eq!(s.label("never", "card_stolen").unwrap(), First::Gone);
        let fb = Feedback {
            label: None,
            correct: true,
            trusted: false,
            at_ms: now,
        };
        assert_eq!(s.feedback("never", &fb).unwrap(), First::Gone);
    }

    /// One tenant's flood: past `max_per_tenant` it loses its own oldest; past `max_bytes` the tenant holding
    /// the most gives way — another tenant's records stay.
    #[test]
    fn one_tenants_flood_evicts_no_other_tenants_records() {
        let rec = |id: String, t: &str| super::super::tests::record(&id, t, 1_000);
        let one = size(&rec("a-000".into(), "a"));
        for (max_bytes, per_tenant) in [(1 << 20, 50), (20 * one, usize::MAX)] {
            let s = MemoryStore::new(max_bytes, 60).per_tenant(per_tenant);
            for i in 0..5 {
                s.put(
                    &[Entry::Decision(Box::new(rec(format!("b-{i}"), "b")))],
                    1_000,
                )
                .unwrap();
            }
            for i in 100..300 {
                s.put(
                    &[Entry::Decision(Box::new(rec(format!("a-{i}"), "a")))],
                    1_000,
                )
                .unwrap();
            }
            for i in 0..5 {
                assert!(s
                    .decision_of(&format!("b-{i}"), "b", 1_001)
                    .unwrap()
                    .is_some());
            }
            assert!(s.decision_of("a-299", "a", 1_001).unwrap().is_some());
            assert!(s.decision_of("a-100", "a", 1_001).unwrap().is_none());
            let h = s.held();
            assert!(h.bytes <= max_bytes && h.order["a"].len() <= per_tenant);
        }
    }
}
