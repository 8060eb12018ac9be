//! The ledger in Redis, under the policy store's key (`{key}:ledger:…`), so that every replica joins feedback
//! that reaches any of them. Every key it writes expires: records, feedback, audits (labelled or not) and their
//! labels at the end of their own window (`SET … EX`, or `PXAT` the audit's time plus the window when it is
//! labelled later); the per-route sets and counters (`decisions:`, `pending:`, `labelled:`, `trusted:`,
//! `heads:`, `stats:`, `routes`) are trimmed by score where they are sorted and get the window as their TTL
//! again with each write, so a route that goes quiet for a window leaves nothing behind. Feedback and labels
//! are first-write-wins (`SET … NX`). Feedback counts for the
//! summary are hashes updated with each feedback; labelled audits are counted from the labelled items in the
//! window (a set an operator's labelling bounds), pending ones from a sorted set of ids per head that answered.
//! Synchronous to its callers (the writer thread and `spawn_blocking`), async inside, each call within the
//! `ledger` dependency's deadline ([`crate::deps`]): with Redis gone or stalled, the writer spools records until
//! it answers and lookups answer 503 at once while its breaker is open.

use std::sync::Arc;

use redis::AsyncCommands;

use crate::deps::Dependency;

use super::{AuditItem, Entry, Feedback, First, Record, Store, StoreError, Summary};

/// One route's summary read: three trims, the heads with pending audits, the decisions kept, the feedback
/// counts and the labelled audit items in the window.
type SummaryRead = (
    (),
    (),
    (),
    Vec<String>,
    u64,
    std::collections::HashMap<String, i64>,
    Vec<String>,
);

/// The store. Its calls are async on a runtime of its own (one thread), each within the `ledger` dependency's
/// deadline as a whole: a blocking Redis client reads every reply of a pipeline even after one timed out (a
/// batch of 512 records against a paused Redis would block its caller for minutes), an async one is simply
/// dropped at the deadline.
pub(crate) struct RedisLedger {
    client: redis::Client,
    conn: crate::deps::Kept,
    dep: Arc<Dependency>,
    rt: Option<tokio::runtime::Runtime>,
    prefix: String,
    window_s: u64,
    /// The most decision records one tenant keeps (`feedback.max_per_tenant`).
    per_tenant: usize,
}

impl RedisLedger {
    /// A ledger at `url` under `{key}:ledger:`, its calls within `dep`'s deadline; connects on first use.
    pub(crate) fn new(
        url: &str,
        key: &str,
        window_s: u64,
        dep: Arc<Dependency>,
    ) -> anyhow::Result<Self> {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("tiergate-ledger-redis")
            .enable_all()
            .build()?;
        Ok(Self {
            client: redis::Client::open(url)?,
            conn: crate::deps::Kept::default(),
            dep,
            rt: Some(rt),
            prefix: format!("{key}:ledger:"),
            window_s,
            per_tenant: usize::MAX,
        })
    }

    /// At most `n` decision records of one tenant.
    pub(crate) fn per_tenant(mut self, n: usize) -> Self {
        self.per_tenant = n;
        self
    }

    /// Drops `tenant`'s oldest records past its share (`dt:{tenant}` holds `route/id` by time): the records,
    /// their owner's marks and their places in their routes' sets, in one script.
    async fn trim_tenant(
        &self,
        c: &mut redis::aio::MultiplexedConnection,
        tenant: &str,
    ) -> redis::RedisResult<()> {
        const TRIM: &str = r"
local over = redis.call('ZCARD', KEYS[1]) - tonumber(ARGV[1])
if over <= 0 then return 0 end
local p = ARGV[2]
for _, m in ipairs(redis.call('ZRANGE', KEYS[1], 0, over - 1)) do
  local route, id = string.match(m, '^(.*)/([^/]*)$')
  if id then
    redis.call('DEL', p .. 'd:' .. id, p .. 'own:' .. ARGV[3] .. ':' .. id)
    redis.call('ZREM', p .. 'decisions:' .. route, id)
  end
end
redis.call('ZREMRANGEBYRANK', KEYS[1], 0, over - 1)
return over";
        redis::Script::new(TRIM)
            .key(self.k(&format!("dt:{tenant}")))
            .arg(self.per_tenant)
            .arg(&self.prefix)
            .arg(tenant)
            .invoke_async(c)
            .await
    }

    fn k(&self, rest: &str) -> String {
        format!("{}{rest}", self.prefix)
    }

    /// Where `tenant`'s mark of owning record `id` is.
    fn own_key(&self, tenant: &str, id: &str) -> String {
        self.k(&format!("own:{tenant}:{id}"))
    }

    /// The pending audit ids of `route` answered by head `head`.
    fn pending_of_head(&self, route: &str, head: &str) -> String {
        self.k(&format!("pending:{route}:head:{head}"))
    }

    /// Runs `f` on the kept connection (made again after a failure) within the dependency's deadline, when
    /// its breaker lets it. Called off any async runtime (the writer thread, `spawn_blocking`).
    fn with<T>(
        &self,
        f: impl AsyncFnOnce(&mut redis::aio::MultiplexedConnection) -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        let Some(rt) = &self.rt else {
            return Err(StoreError("redis: the ledger is shutting down".into()));
        };
        let call = async {
            let mut c = self.conn.get(&self.client).await?;
            f(&mut c).await
        };
        let r = rt.handle().block_on(self.dep.call(call));
        if r.is_err() {
            self.conn.forget();
        }
        r.map_err(|e| StoreError(format!("redis: {e}")))
    }
}

impl Drop for RedisLedger {
    /// Its runtime goes without waiting (a drop may happen on an async runtime's thread).
    fn drop(&mut self) {
        if let Some(rt) = self.rt.take() {
            rt.shutdown_background();
        }
    }
}

fn parse<T: serde::de::DeserializeOwned>(v: Option<String>) -> Result<Option<T>, StoreError> {
    Ok(match v {
        Some(t) => Some(serde_json::from_str(&t)?),
        None => None,
    })
}

impl Store for RedisLedger {
    fn trusted_feedback(
        &self,
        route: &str,
        head: &str,
        since_ms: u64,
    ) -> Result<Vec<tiergate_core::risk::Audited>, StoreError> {
        self.with(async |c| {
            let key = self.k(&format!("trusted:{route}"));
            let _: () = c.zrembyscore(&key, 0.0, since_ms as f64 - 1.0).await?;
            let members: Vec<String> = c.zrange(&key, 0, -1).await?;
            let mut out = Vec::new();
            for m in members {
                let Some((_, json)) = m.split_once(':') else {
                    continue;
                };
                // [ambiguity, wrong, θ, head] (rows written before the head was recorded have none).
                let v: (f64, bool, f64, Option<String>) = serde_json::from_str(json)?;
                if v.3.as_deref().unwrap_or("") != head {
                    continue;
                }
                out.push(tiergate_core::risk::Audited {
                    row: tiergate_core::risk::Row {
                        ambiguity: v.0,
                        wrong: v.1,
                    },
                    drawn_at: v.2,
                });
            }
            Ok(out)
        })
    }

    fn labelled(
        &self,
        route: &str,
        head: &str,
        since_ms: u64,
    ) -> Result<Vec<tiergate_core::risk::Audited>, StoreError> {
        self.with(async |c| {
            let key = self.k(&format!("labelled:{route}"));
            let _: () = c.zrembyscore(&key, 0.0, since_ms as f64 - 1.0).await?;
            let items: Vec<String> = c.zrange(&key, 0, -1).await?;
            let mut out = Vec::new();
            for t in items {
                let item: AuditItem = serde_json::from_str(&t)?;
                out.extend(item.audited(head));
            }
            Ok(out)
        })
    }

    fn put(&self, entries: &[Entry], now_ms: u64) -> Result<(), StoreError> {
        let ttl = self.window_s;
        let expired = now_ms.saturating_sub(ttl * 1000) as f64;
        self.with(async |c| {
            let mut p = redis::pipe();
            // The per-route sets get the window as their TTL once per batch, however many entries touch them.
            let mut sets = std::collections::BTreeSet::new();
            let mut tenants = std::collections::BTreeSet::new();
            for e in entries {
                match e {
                    Entry::Decision(r) => {
                        p.set_ex(
                            self.k(&format!("d:{}", r.id)),
                            serde_json::to_string(r)?,
                            ttl,
                        )
                        .ignore();
                        if let Some(a) = &r.alias {
                            p.set_ex(self.k(&format!("alias:{a}")), &r.id, ttl).ignore();
                            // The alias as its owner looks it up (another tenant's reads as absent).
                            p.set_ex(self.own_key(&r.tenant, a), &r.id, ttl).ignore();
                        }
                        // Its owner's mark, which a feedback lookup checks before reading the record.
                        p.set_ex(self.own_key(&r.tenant, &r.id), "", ttl).ignore();
                        // Its place among its tenant's records, which are bounded per tenant.
                        let of_tenant = self.k(&format!("dt:{}", r.tenant));
                        let member = format!("{}/{}", r.route, r.id);
                        p.zadd(&of_tenant, member, r.at_ms as f64).ignore();
                        p.zrembyscore(&of_tenant, 0.0, expired).ignore();
                        tenants.insert(r.tenant.as_str());
                        sets.insert(of_tenant);
                        let seen = self.k(&format!("decisions:{}", r.route));
                        p.zadd(&seen, &r.id, r.at_ms as f64).ignore();
                        p.zrembyscore(&seen, 0.0, expired).ignore();
                        p.sadd(self.k("routes"), &r.route).ignore();
                        sets.extend([seen, self.k("routes")]);
                    }
                    Entry::Audit(a) => {
                        p.set_ex(
                            self.k(&format!("audit:{}", a.id)),
                            serde_json::to_string(a)?,
                            ttl,
                        )
                        .ignore();
                        let pending = self.k(&format!("pending:{}", a.route));
                        p.zadd(&pending, &a.id, a.at_ms as f64).ignore();
                        p.zrembyscore(&pending, 0.0, expired).ignore();
                        // The same ids by the head that answered (counted and listed per head).
                        let of_head = self.pending_of_head(&a.route, &a.head);
                        p.zadd(&of_head, &a.id, a.at_ms as f64).ignore();
                        p.zrembyscore(&of_head, 0.0, expired).ignore();
                        let heads = self.k(&format!("heads:{}", a.route));
                        p.sadd(&heads, &a.head).ignore();
                        p.sadd(self.k("routes"), &a.route).ignore();
                        sets.extend([pending, of_head, heads, self.k("routes")]);
                    }
                }
            }
            for k in &sets {
                p.expire(k, ttl as i64).ignore();
            }
            p.query_async::<()>(c).await?;
            if self.per_tenant != usize::MAX {
                for t in tenants {
                    self.trim_tenant(c, t).await?;
                }
            }
            Ok(())
        })
    }

    /// The record of `id`, with the same reads whether it exists or not, and whoever's it is (feedback is no
    /// existence oracle): a completion id is one read; a batch line's alias (`batch_id/custom_id`, the only
    /// ids with a `/`) two — the alias, then its record, or a key no record has.
    fn decision(&self, id: &str, _now_ms: u64) -> Result<Option<Record>, StoreError> {
        self.with(async |c| {
            if !id.contains('/') {
                return parse(c.get(self.k(&format!("d:{id}"))).await?);
            }
            let via: Option<String> = c.get(self.k(&format!("alias:{id}"))).await?;
            let real = via.unwrap_or_else(|| format!("/{id}"));
            parse(c.get(self.k(&format!("d:{real}"))).await?)
        })
    }

    /// The record of `id` when `tenant` owns it, decided inside Redis (one script): the script asks whether
    /// `tenant`'s mark for the id exists (`own:{tenant}:{id}`, written with the record) and reads the record only
    /// when it does; a batch line's alias is first resolved through the tenant's own alias key
    /// (`own:{tenant}:{alias}`). For an unknown id and for another tenant's every key read is equally absent:
    /// the same commands, the same keyspace misses, the same reply (none). Records written before the marks
    /// existed answer as unknown.
    fn decision_of(
        &self,
        id: &str,
        tenant: &str,
        _now_ms: u64,
    ) -> Result<Option<Record>, StoreError> {
        const OWN: &str = r"
local id = ARGV[2]
if ARGV[1] == '1' then
  id = redis.call('GET', KEYS[1]) or ('/' .. id)
end
local p = ARGV[3]
if redis.call('EXISTS', p .. 'own:' .. ARGV[4] .. ':' .. id) == 1 then
  return redis.call('GET', p .. 'd:' .. id)
end
return false";
        let alias = id.contains('/');
        let raw: Option<String> = self.with(async |c| {
            Ok(redis::Script::new(OWN)
                .key(self.own_key(tenant, id))
                .arg(if alias { "1" } else { "0" })
                .arg(id)
                .arg(&self.prefix)
                .arg(tenant)
                .invoke_async(c)
                .await?)
        })?;
        parse(raw)
    }

    fn feedback(&self, id: &str, fb: &Feedback) -> Result<First<Feedback>, StoreError> {
        let Some(rec) = self.decision(id, 0)? else {
            return Ok(First::Gone);
        };
        self.with(async |c| {
            let key = self.k(&format!("fb:{}", rec.id));
            let set: bool = redis::cmd("SET")
                .arg(&key)
                .arg(serde_json::to_string(fb)?)
                .arg("NX")
                .arg("EX")
                .arg(self.window_s)
                .query_async::<Option<String>>(c)
                .await?
                .is_some();
            if !set {
                let first: Option<Feedback> = parse(c.get(&key).await?)?;
                return first
                    .map(First::Already)
                    .ok_or_else(|| StoreError("feedback vanished".into()));
            }
            let ttl = self.window_s as i64;
            if let Some(row) = rec.as_evidence(fb) {
                let evidence =
                    serde_json::json!([row.row.ambiguity, row.row.wrong, row.drawn_at, rec.head])
                        .to_string();
                let trusted = self.k(&format!("trusted:{}", rec.route));
                let _: () = redis::pipe()
                    .zadd(&trusted, format!("{}:{evidence}", rec.id), rec.at_ms as f64)
                    .expire(&trusted, ttl)
                    .query_async(c)
                    .await?;
            }
            let stats = self.k(&format!("stats:{}", rec.route));
            let who = if fb.trusted { "t" } else { "u" };
            let channel = rec.feedback_channel();
            let _: () = redis::pipe()
                .hincr(&stats, format!("fb:{channel}:{who}:n"), 1)
                .hincr(
                    &stats,
                    format!("fb:{channel}:{who}:correct"),
                    i64::from(fb.correct),
                )
                .expire(&stats, ttl)
                .query_async(c)
                .await?;
            Ok(First::Written(fb.clone()))
        })
    }

    fn pending(
        &self,
        route: Option<&str>,
        heads: Option<&super::Heads>,
        limit: usize,
    ) -> Result<Vec<AuditItem>, StoreError> {
        self.with(async |c| {
            let routes: Vec<String> = match route {
                Some(r) => vec![r.to_string()],
                None => c.smembers(self.k("routes")).await?,
            };
            let mut out: Vec<AuditItem> = Vec::new();
            for r in routes {
                // With a head filter, the ids of that head's answers only.
                let list = match heads {
                    None => self.k(&format!("pending:{r}")),
                    Some(h) => match h.get(&r) {
                        Some(head) => self.pending_of_head(&r, head),
                        None => continue,
                    },
                };
                let ids: Vec<String> = c.zrange(&list, 0, limit as isize).await?;
                for id in ids {
                    let item: Option<AuditItem> =
                        parse(c.get(self.k(&format!("audit:{id}"))).await?)?;
                    match item {
                        Some(a) if a.label.is_none() && a.of_heads(heads) => out.push(a),
                        _ => {
                            let _: () = c.zrem(&list, &id).await?;
                        }
                    }
                }
            }
            out.sort_by_key(|a| a.at_ms);
            out.truncate(limit);
            Ok(out)
        })
    }

    fn audit(&self, id: &str) -> Result<Option<AuditItem>, StoreError> {
        self.with(async |c| parse(c.get(self.k(&format!("audit:{id}"))).await?))
    }

    fn label(&self, id: &str, label: &str) -> Result<First<String>, StoreError> {
        self.with(async |c| {
            let key = self.k(&format!("audit:{id}"));
            let item: Option<AuditItem> = parse(c.get(&key).await?)?;
            let Some(mut a) = item else {
                return Ok(First::Gone);
            };
            // The label and the labelled item end with the audit's own window, not later.
            let until_ms = a.at_ms + self.window_s * 1000;
            let set: bool = redis::cmd("SET")
                .arg(self.k(&format!("label:{id}")))
                .arg(label)
                .arg("NX")
                .arg("PXAT")
                .arg(until_ms)
                .query_async::<Option<String>>(c)
                .await?
                .is_some();
            if !set {
                let first: String = c.get(self.k(&format!("label:{id}"))).await?;
                return Ok(First::Already(first));
            }
            a.label = Some(label.to_string());
            a.text = None;
            let labelled = serde_json::to_string(&a)?;
            let labelled_of_route = self.k(&format!("labelled:{}", a.route));
            let _: () = redis::pipe()
                .cmd("SET")
                .arg(&key)
                .arg(&labelled)
                .arg("PXAT")
                .arg(until_ms)
                .zadd(&labelled_of_route, &labelled, a.at_ms as f64)
                .expire(&labelled_of_route, self.window_s as i64)
                .zrem(self.k(&format!("pending:{}", a.route)), id)
                .zrem(self.pending_of_head(&a.route, &a.head), id)
                .query_async(c)
                .await?;
            Ok(First::Written(label.to_string()))
        })
    }

    fn summary(&self, now_ms: u64) -> Result<Summary, StoreError> {
        let expired = now_ms.saturating_sub(self.window_s * 1000) as f64;
        self.with(async |c| {
            let mut s = Summary::default();
            let routes: Vec<String> = c.smembers(self.k("routes")).await?;
            for r in routes {
                let pending = self.k(&format!("pending:{r}"));
                let decisions = self.k(&format!("decisions:{r}"));
                let labelled = self.k(&format!("labelled:{r}"));
                let (_, _, _, heads, n_decisions, stats, items): SummaryRead = redis::pipe()
                    .zrembyscore(&pending, 0.0, expired)
                    .zrembyscore(&decisions, 0.0, expired)
                    .zrembyscore(&labelled, 0.0, expired)
                    .smembers(self.k(&format!("heads:{r}")))
                    .zcard(&decisions)
                    .hgetall(self.k(&format!("stats:{r}")))
                    .zrange(&labelled, 0, -1)
                    .query_async(c)
                    .await?;
                let e = s.route(&r);
                e.decisions = n_decisions;
                for t in items {
                    let a: AuditItem = serde_json::from_str(&t)?;
                    if let Some(l) = &a.label {
                        e.add_audit(&a.head, &a.channel, a.probability, *l != a.answered);
                    }
                }
                // Pending audits by head: each head's id set, its expired ids trimmed, counted.
                for head in heads {
                    let of_head = self.pending_of_head(&r, &head);
                    let (_, n): ((), u64) = redis::pipe()
                        .zrembyscore(&of_head, 0.0, expired)
                        .zcard(&of_head)
                        .query_async(c)
                        .await?;
                    e.add_pending(&head, n);
                }
                let get = |f: &str| stats.get(f).copied().unwrap_or(0).max(0) as u64;
                for field in stats.keys().filter(|f| f.ends_with(":n")) {
                    let mut parts = field.split(':');
                    let (Some("fb"), Some(ch), Some(who)) =
                        (parts.next(), parts.next(), parts.next())
                    else {
                        continue;
                    };
                    let n = get(field);
                    let correct = get(&format!("fb:{ch}:{who}:correct"));
                    e.add_feedback(ch, who == "t", n, correct);
                }
            }
            Ok(s)
        })
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    /// Commands the server has processed so far (`INFO stats`).
    /// Redis's counters of commands processed, keyspace hits and keyspace misses.
    fn counters(c: &mut redis::Connection) -> [u64; 3] {
        let info: String = redis::cmd("INFO").arg("stats").query(c).unwrap();
        let get = |name: &str| -> u64 {
            info.lines()
                .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
                .unwrap()
                .trim()
                .parse()
                .unwrap()
        };
        [
            get("total_commands_processed"),
            get("keyspace_hits"),
            get("keyspace_misses"),
        ]
    }

    /// A lookup's work: another tenant's record and none at all cost the same commands, keyspace hits and
    /// misses (the owner's mark missing either way; the record is read only for its owner), for a completion
    /// id and for a batch line's alias alike (on a real `redis-server`).
    #[test]
    fn unknown_and_foreign_ids_cost_the_same_reads() {
        let port = crate::testing::free_port();
        let mut server = crate::testing::redis_server(port);
        let url = format!("redis://127.0.0.1:{port}/0");
        let ledger = RedisLedger::new(
            &url,
            "t",
            3600,
            Dependency::new("ledger", std::time::Duration::from_secs(1)),
        )
        .unwrap();
        let now = crate::model::request::unix_ms();
        let rec = |id: &str, tenant: &str, alias: Option<&str>| Record {
            alias: alias.map(str::to_string),
            ..super::super::tests::record(id, tenant, now)
        };
        let entries = [
            Entry::Decision(Box::new(rec("chatcmpl-a", "a", Some("batch_1/x")))),
            Entry::Decision(Box::new(rec("chatcmpl-b", "b", Some("batch_2/y")))),
        ];
        ledger.put(&entries, now).unwrap();
        let mut c = redis::Client::open(url.as_str())
            .unwrap()
            .get_connection()
            .unwrap();
        let mut cost = |id: &str| {
            // Warm the ledger's connection first, so that no connect is counted.
            let _ = ledger.decision_of("chatcmpl-none", "a", now);
            let before = counters(&mut c);
            let found = ledger.decision_of(id, "a", now).unwrap().is_some();
            let after = counters(&mut c);
            // `INFO` itself is one command.
            let work = [
                after[0] - before[0] - 1,
                after[1] - before[1],
                after[2] - before[2],
            ];
            (work, found)
        };
        for (own, foreign, unknown) in [
            ("chatcmpl-a", "chatcmpl-b", "chatcmpl-c"),
            ("batch_1/x", "batch_2/y", "batch_3/z"),
        ] {
            let (own, foreign, unknown) = (cost(own), cost(foreign), cost(unknown));
            assert!(own.1 && !foreign.1 && !unknown.1);
            assert_eq!(foreign.0, unknown.0, "commands, hits, misses");
        }
        let _ = server.kill();
        let _ = server.wait();
    }

    /// Audits drawn at rates below 1 and unequal to each other, labelled through a real `redis-server`: the
    /// silent error is weighted by 1/p (the traffic's error, not the sample's share), as on SQLite.
    #[test]
    fn the_silent_error_is_weighted_by_each_audits_rate() {
        let port = crate::testing::free_port();
        let mut server = crate::testing::redis_server(port);
        let url = format!("redis://127.0.0.1:{port}/0");
        let dep = Dependency::new("ledger", std::time::Duration::from_secs(1));
        let ledger = RedisLedger::new(&url, "w", 3600, dep).unwrap();
        let now = crate::model::request::unix_ms();
        let item = |id: &str, p: f64| AuditItem {
            id: id.into(),
            route: "classify".into(),
            at_ms: now,
            probability: p,
            theta: 0.4,
            ambiguity: 0.1,
            answered: "card_lost".into(),
            channel: "tier0".into(),
            text: Some("my card".into()),
            head: "h1".into(),
            label: None,
        };
        // Ten drawn at 0.5, two of them wrong; ten at 0.05, one wrong.
        let mut entries = Vec::new();
        for i in 0..10 {
            entries.push(Entry::Audit(Box::new(item(&format!("hi{i}"), 0.5))));
            entries.push(Entry::Audit(Box::new(item(&format!("lo{i}"), 0.05))));
        }
        ledger.put(&entries, now).unwrap();
        for i in 0..10 {
            let wrong = |yes: bool| if yes { "card_stolen" } else { "card_lost" };
            ledger.label(&format!("hi{i}"), wrong(i < 2)).unwrap();
            ledger.label(&format!("lo{i}"), wrong(i < 1)).unwrap();
        }
        let sum = ledger.summary(now).unwrap();
        let e = sum.routes["classify"].silent_error(Some("h1")).unwrap();
        assert_eq!((e.n, e.wrong), (20, 3));
        // (2 × 2 + 1 × 20) / (10 × 2 + 10 × 20) = 24 / 220; the unweighted share would be 3 / 20.
        assert!((e.estimate - 24.0 / 220.0).abs() < 1e-12, "{e:?}");
        // Kish's effective n: (Σw)² / Σw² = 220² / (10 × 4 + 10 × 400).
        assert!(
            (e.effective_n - 220.0 * 220.0 / 4040.0).abs() < 1e-9,
            "{e:?}"
        );
        let _ = server.kill();
        let _ = server.wait();
    }

    /// A tenant past `max_per_tenant` loses its own oldest records in Redis — the records, their owner's marks
    /// and their places in the route's set — and another tenant's stay (a real `redis-server`).
    #[test]
    fn a_tenants_records_are_bounded_by_its_share() {
        let port = crate::testing::free_port();
        let mut server = crate::testing::redis_server(port);
        let url = format!("redis://127.0.0.1:{port}/0");
        let dep = Dependency::new("ledger", std::time::Duration::from_secs(1));
        let ledger = RedisLedger::new(&url, "q", 3600, dep)
            .unwrap()
            .per_tenant(10);
        let now = crate::model::request::unix_ms();
        let rec = |id: String, t: &str, i: u64| super::super::tests::record(&id, t, now + i);
        let b: Vec<Entry> = (0..3)
            .map(|i| Entry::Decision(Box::new(rec(format!("b-{i}"), "b", i))))
            .collect();
        ledger.put(&b, now).unwrap();
        for chunk in 0..4u64 {
            let a: Vec<Entry> = (0..10)
                .map(|i| {
                    let n = 10 + chunk * 10 + i;
                    Entry::Decision(Box::new(rec(format!("a-{n}"), "a", n)))
                })
                .collect();
            ledger.put(&a, now).unwrap();
        }
        let mut c = redis::Client::open(url.as_str())
            .unwrap()
            .get_connection()
            .unwrap();
        let mut keys = |pattern: &str| -> usize {
            let k: Vec<String> = redis::cmd("KEYS").arg(pattern).query(&mut c).unwrap();
            k.len()
        };
        assert_eq!(keys("q:ledger:d:a-*"), 10);
        assert_eq!(keys("q:ledger:own:a:*"), 10);
        assert_eq!(keys("q:ledger:d:b-*"), 3);
        for i in 0..3 {
            assert!(ledger
                .decision_of(&format!("b-{i}"), "b", now)
                .unwrap()
                .is_some());
        }
        assert!(ledger.decision_of("a-49", "a", now).unwrap().is_some());
        assert!(ledger.decision_of("a-39", "a", now).unwrap().is_none());
        assert_eq!(
            ledger.summary(now).unwrap().routes["classify"].decisions,
            13
        );
        let _ = server.kill();
        let _ = server.wait();
    }
}
