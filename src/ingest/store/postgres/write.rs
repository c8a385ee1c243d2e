//! The PostgreSQL store's write path: group commit of concurrent batches.
//!
//! Owns the queue between [`Store::write_batch`](super::Store::write_batch) and the database,
//! and the committers that drain it. Batches that arrive while a commit is in flight wait in the
//! queue; the next committer takes every one queued (up to [`MAX_GROUP_BATCHES`] /
//! [`MAX_GROUP_EVENTS`]) into one transaction: one key check, one multi-row insert of the
//! group's new events, one upsert per aggregate table, one commit (one WAL flush) for all.
//!
//! What it must never do: acknowledge a batch before the transaction holding it has committed,
//! or let one batch's failure take another batch's events with it. A group that fails is rolled
//! back whole and each of its batches is then written alone, so only the batch that caused the
//! failure fails (a deadlock with another replica is retried, see [`RETRIES_ALONE`]).
//!
//! De-duplication inside a group follows arrival order: the first occurrence of an `(org, id)`
//! in the group is the candidate, a later one (same batch or a later batch) counts as a
//! duplicate, exactly as if the batches had committed one after the other. The unique index on
//! `(org, id)` decides against what other transactions (other replicas) stored. Measurements and
//! rejected variants: bench/README.md, "Ingest on PostgreSQL".

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex};

use tokio::sync::{mpsc, oneshot};

use super::super::{BatchOutcome, BatchWrite, EventRow, StoreError};

/// Most batches committed together: bounds the work lost and redone when a group fails.
pub const MAX_GROUP_BATCHES: usize = 32;
/// Most events in one group (a sensor's batch holds at most 500).
pub const MAX_GROUP_EVENTS: usize = 8_000;
/// Committers per replica. One keeps the group forming while its commit waits on the WAL
/// flush; a second lets a group's statements run while the other group's flush waits.
pub const COMMITTERS: usize = 2;
/// Batches waiting for a committer; beyond this, handlers wait (back-pressure, as SQLite's
/// writer queue).
const QUEUE: usize = 256;
/// Attempts of a batch written alone that fail on a deadlock or serialisation conflict with
/// another transaction: the conflict is the other's timing, not the batch's fault.
const RETRIES_ALONE: usize = 3;

type Reply = oneshot::Sender<Result<BatchOutcome, StoreError>>;

struct Job {
    batch: BatchWrite,
    reply: Reply,
}

/// The queue and its committers. Dropping the sender (at [`GroupWriter::close`]) lets the
/// committers finish what is queued and stop.
pub struct GroupWriter {
    tx: Mutex<Option<mpsc::Sender<Job>>>,
    committers: Mutex<Vec<tokio::task::JoinHandle<()>>>,
}

impl GroupWriter {
    /// Starts the committers on the current runtime.
    pub fn start(pool: deadpool_postgres::Pool) -> GroupWriter {
        let (tx, rx) = mpsc::channel(QUEUE);
        let rx = Arc::new(tokio::sync::Mutex::new(rx));
        let committers = (0..COMMITTERS)
            .map(|_| tokio::spawn(commit_loop(pool.clone(), rx.clone())))
            .collect();
        GroupWriter {
            tx: Mutex::new(Some(tx)),
            committers: Mutex::new(committers),
        }
    }

    /// Queues `batch` and resolves once the group holding it has committed (or failed).
    pub async fn write(&self, batch: BatchWrite) -> Result<BatchOutcome, StoreError> {
        let tx = crate::lock::lock(&self.tx).clone();
        let Some(tx) = tx else {
            return Err(StoreError::Closed);
        };
        let (reply, answer) = oneshot::channel();
        tx.send(Job { batch, reply })
            .await
            .map_err(|_| StoreError::Closed)?;
        answer.await.map_err(|_| StoreError::Closed)?
    }

    /// Stops taking batches and waits until every queued one has been written.
    pub async fn close(&self) {
        crate::lock::lock(&self.tx).take();
        let committers = std::mem::take(&mut *crate::lock::lock(&self.committers));
        for c in committers {
            let _ = c.await;
        }
    }
}

async fn commit_loop(
    pool: deadpool_postgres::Pool,
    rx: Arc<tokio::sync::Mutex<mpsc::Receiver<Job>>>,
) {
    loop {
        let jobs = {
            let mut rx = rx.lock().await;
            let Some(first) = rx.recv().await else {
                return;
            };
            let mut events = first.batch.rows.len();
            let mut jobs = vec![first];
            while jobs.len() < MAX_GROUP_BATCHES && events < MAX_GROUP_EVENTS {
                match rx.try_recv() {
                    Ok(j) => {
                        events += j.batch.rows.len();
                        jobs.push(j);
                    }
                    Err(_) => break,
                }
            }
            jobs
        };
        write_jobs(&pool, jobs).await;
    }
}

/// Writes `jobs` as one group; if the group fails, each alone. Answers every job.
async fn write_jobs(pool: &deadpool_postgres::Pool, jobs: Vec<Job>) {
    if jobs.len() > 1 {
        let batches: Vec<&BatchWrite> = jobs.iter().map(|j| &j.batch).collect();
        match write_group(pool, &batches).await {
            Ok(outcomes) => {
                for (job, outcome) in jobs.into_iter().zip(outcomes) {
                    let _ = job.reply.send(Ok(outcome));
                }
                return;
            }
            Err(e) => {
                tracing::debug!(batches = jobs.len(), error = %e, "Group failed; writing its batches alone");
            }
        }
    }
    for job in jobs {
        let mut attempt = 1;
        let result = loop {
            match write_group(pool, &[&job.batch]).await {
                Ok(mut o) => break Ok(o.remove(0)),
                Err(e) if attempt < RETRIES_ALONE && conflict(&e) => attempt += 1,
                Err(e) => break Err(e),
            }
        };
        let _ = job.reply.send(result);
    }
}

/// A deadlock or serialisation failure: another transaction's timing, worth another attempt.
fn conflict(e: &StoreError) -> bool {
    use tokio_postgres::error::SqlState;
    match e {
        StoreError::Postgres(e) => matches!(
            e.code(),
            Some(c) if *c == SqlState::T_R_DEADLOCK_DETECTED
                || *c == SqlState::T_R_SERIALIZATION_FAILURE
        ),
        _ => false,
    }
}

/// One column of the candidates, as the array parameter `unnest` takes.
fn column<'a>(
    cand: &[(&'a BatchWrite, &'a EventRow)],
    f: impl Fn(&'a BatchWrite, &'a EventRow) -> &'a String,
) -> Vec<&'a str> {
    cand.iter().map(|(b, r)| f(b, r).as_str()).collect()
}

/// Saturating conversion for counters (a sensor may report any count).
fn sat(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

/// One transaction for `batches`; an outcome per batch, in order, once it has committed.
async fn write_group(
    pool: &deadpool_postgres::Pool,
    batches: &[&BatchWrite],
) -> Result<Vec<BatchOutcome>, StoreError> {
    let mut c = pool
        .get()
        .await
        .map_err(|e| StoreError::Pool(e.to_string()))?;
    let tx = c.transaction().await?;

    // FOR SHARE: a revocation committing first is seen; one arriving now waits for us.
    let key_ids: Vec<&str> = {
        let mut k: Vec<&str> = batches.iter().map(|b| b.key_id.as_str()).collect();
        k.sort_unstable();
        k.dedup();
        k
    };
    let live: HashSet<String> = tx
        .query(
            "SELECT key_id FROM keys WHERE key_id = ANY($1) AND revoked_at IS NULL
             ORDER BY key_id FOR SHARE",
            &[&key_ids],
        )
        .await?
        .iter()
        .map(|r| r.get(0))
        .collect();

    // The candidates: first occurrence of each (org, id) among the live batches, in order.
    let mut seen: HashSet<(&str, &str)> = HashSet::new();
    let mut owner: Vec<usize> = Vec::new();
    let mut cand: Vec<(&BatchWrite, &EventRow)> = Vec::new();
    for (i, b) in batches.iter().enumerate() {
        if !live.contains(&b.key_id) {
            continue;
        }
        for r in &b.rows {
            if seen.insert((b.org.as_str(), r.id.as_str())) {
                owner.push(i);
                cand.push((b, r));
            }
        }
    }
    let (ids, orgs, sensors, actors, actions, classes, received, bodies) = (
        column(&cand, |_, r| &r.id),
        column(&cand, |b, _| &b.org),
        column(&cand, |b, _| &b.key_id),
        column(&cand, |_, r| &r.actor),
        column(&cand, |_, r| &r.action),
        column(&cand, |_, r| &r.class),
        column(&cand, |b, _| &b.received_at),
        column(&cand, |_, r| &r.body),
    );
    // One statement for the group; the unique index decides what is new, across replicas (a
    // concurrent insert of the same id waits for the other's commit). Arrival order is kept,
    // so the store's sequence orders events as they came.
    let mut inserted: HashMap<String, HashSet<String>> = HashMap::new();
    if !cand.is_empty() {
        for r in tx
            .query(
                "INSERT INTO events (id, org, sensor, actor, action, class, received_at, body)
             SELECT u.id, u.org, u.sensor, u.actor, u.action, u.class, u.received_at, u.body
             FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[],
                         $6::text[], $7::text[], $8::text[])
                  WITH ORDINALITY AS u(id, org, sensor, actor, action, class, received_at, body, n)
             ORDER BY u.n
             ON CONFLICT (org, id) DO NOTHING RETURNING org, id",
                &[
                    &ids, &orgs, &sensors, &actors, &actions, &classes, &received, &bodies,
                ],
            )
            .await?
        {
            inserted.entry(r.get(0)).or_default().insert(r.get(1));
        }
    }

    let mut accepted = vec![0u64; batches.len()];
    let mut evidence = GroupEvidence::default();
    for ((b, r), i) in cand.iter().zip(&owner) {
        if inserted
            .get(b.org.as_str())
            .is_some_and(|ids| ids.contains(r.id.as_str()))
        {
            accepted[*i] += 1;
            evidence.add(b, r);
        }
    }
    evidence.apply(&tx).await?;

    let mut sensors: BTreeMap<&str, SensorFold> = BTreeMap::new();
    for (i, b) in batches.iter().enumerate() {
        if live.contains(&b.key_id) {
            sensors
                .entry(b.key_id.as_str())
                .or_default()
                .add(b, accepted[i]);
        }
    }
    write_sensors(&tx, &sensors).await?;
    tx.commit().await?;

    Ok(batches
        .iter()
        .enumerate()
        .map(|(i, b)| {
            if live.contains(&b.key_id) {
                BatchOutcome::Stored {
                    accepted: accepted[i],
                    duplicates: b.rows.len() as u64 - accepted[i],
                }
            } else {
                BatchOutcome::KeyRevoked
            }
        })
        .collect())
}

/// One sensor's counters over the group's batches, folded as consecutive upserts would.
#[derive(Default)]
struct SensorFold {
    batches: u64,
    accepted: u64,
    dropped: u64,
    version: Option<String>,
    transport: Option<String>,
    last_seen: String,
    health: [u64; 5],
}

impl SensorFold {
    fn add(&mut self, b: &BatchWrite, accepted: u64) {
        self.batches = self.batches.saturating_add(1);
        self.accepted = self.accepted.saturating_add(accepted);
        self.dropped = self.dropped.saturating_add(b.dropped);
        // Each upsert keeps the stored value when the batch sent none: the last one sent wins.
        if b.sensor_version.is_some() {
            self.version.clone_from(&b.sensor_version);
        }
        if b.sensor_transport.is_some() {
            self.transport.clone_from(&b.sensor_transport);
        }
        self.last_seen.clone_from(&b.received_at);
        let h = &b.health;
        for (sum, n) in self.health.iter_mut().zip([
            h.stdout_non_json,
            h.oversize_frames,
            h.orphan_responses,
            h.unobserved,
            h.tap_dropped_bytes,
        ]) {
            *sum = sum.saturating_add(n);
        }
    }
}

async fn write_sensors(
    tx: &deadpool_postgres::Transaction<'_>,
    sensors: &BTreeMap<&str, SensorFold>,
) -> Result<(), tokio_postgres::Error> {
    if sensors.is_empty() {
        return Ok(());
    }
    let keys: Vec<&str> = sensors.keys().copied().collect();
    let n =
        |f: fn(&SensorFold) -> u64| -> Vec<i64> { sensors.values().map(|s| sat(f(s))).collect() };
    let version: Vec<Option<&str>> = sensors.values().map(|s| s.version.as_deref()).collect();
    let transport: Vec<Option<&str>> = sensors.values().map(|s| s.transport.as_deref()).collect();
    let last_seen: Vec<&str> = sensors.values().map(|s| s.last_seen.as_str()).collect();
    // In key order: concurrent groups lock the sensor rows in one order.
    tx.execute(
        "INSERT INTO sensors (key_id, batches, accepted, dropped, version, transport, last_seen,
                              stdout_non_json, oversize_frames, orphan_responses, unobserved,
                              tap_dropped_bytes)
         SELECT * FROM unnest($1::text[], $2::int8[], $3::int8[], $4::int8[], $5::text[],
                              $6::text[], $7::text[], $8::int8[], $9::int8[], $10::int8[],
                              $11::int8[], $12::int8[])
         ORDER BY 1
         ON CONFLICT (key_id) DO UPDATE SET
           batches = sat_add(sensors.batches, excluded.batches),
           accepted = sat_add(sensors.accepted, excluded.accepted),
           dropped = sat_add(sensors.dropped, excluded.dropped),
           version = coalesce(excluded.version, sensors.version),
           transport = coalesce(excluded.transport, sensors.transport),
           last_seen = excluded.last_seen,
           stdout_non_json = sat_add(sensors.stdout_non_json, excluded.stdout_non_json),
           oversize_frames = sat_add(sensors.oversize_frames, excluded.oversize_frames),
           orphan_responses = sat_add(sensors.orphan_responses, excluded.orphan_responses),
           unobserved = sat_add(sensors.unobserved, excluded.unobserved),
           tap_dropped_bytes = sat_add(sensors.tap_dropped_bytes, excluded.tap_dropped_bytes)",
        &[
            &keys,
            &n(|s| s.batches),
            &n(|s| s.accepted),
            &n(|s| s.dropped),
            &version,
            &transport,
            &last_seen,
            &n(|s| s.health[0]),
            &n(|s| s.health[1]),
            &n(|s| s.health[2]),
            &n(|s| s.health[3]),
            &n(|s| s.health[4]),
        ],
    )
    .await?;
    Ok(())
}

/// A `tool_defs` row: org, host, tool, def, sensor, hour.
type ToolDefKey = (String, String, String, String, String, String);

/// One error group within a group of batches: kind and code of its first event, count, first
/// and last seen.
type ErrorFold = (String, Option<i64>, i64, String, String);

/// The aggregates of a group's new events, folded per row key and written in key order.
///
/// Folded: one row per distinct key in one statement per table, instead of one upsert per
/// event. In key order: concurrent groups (other committers, other replicas) lock the shared
/// aggregate rows in one order, so they queue instead of deadlocking.
#[derive(Default)]
struct GroupEvidence {
    /// (first seen, last seen) per definition seen.
    tool_defs: BTreeMap<ToolDefKey, (String, String)>,
    /// (org, fp, tool) → the group's figures in this batch.
    errors: BTreeMap<(String, String, String), ErrorFold>,
    /// (org, host) → (tools, bytes, last seen), folded as the upsert folds them.
    catalogs: BTreeMap<(String, String), (Option<i64>, i64, String)>,
}

impl GroupEvidence {
    fn add(&mut self, b: &BatchWrite, row: &EventRow) {
        let e = &row.evidence;
        let hour = e.seen.get(..13).unwrap_or(&e.seen).to_owned();
        for def in &e.tool_defs {
            let k = (
                b.org.clone(),
                e.host.clone(),
                row.action.clone(),
                def.clone(),
                b.key_id.clone(),
                hour.clone(),
            );
            let span = self
                .tool_defs
                .entry(k)
                .or_insert_with(|| (e.seen.clone(), e.seen.clone()));
            if e.seen < span.0 {
                span.0 = e.seen.clone();
            }
            if e.seen > span.1 {
                span.1 = e.seen.clone();
            }
        }
        if let Some((fp, kind, code)) = &e.error {
            let g = self
                .errors
                .entry((b.org.clone(), fp.clone(), row.action.clone()))
                .or_insert_with(|| (kind.clone(), *code, 0, e.seen.clone(), e.seen.clone()));
            g.2 = g.2.saturating_add(1);
            if e.seen < g.3 {
                g.3 = e.seen.clone();
            }
            if e.seen > g.4 {
                g.4 = e.seen.clone();
            }
        }
        if let Some((tools, bytes)) = e.catalog {
            let tools = tools.map(|t| i64::try_from(t).unwrap_or(i64::MAX));
            let bytes = i64::try_from(bytes).unwrap_or(i64::MAX);
            match self.catalogs.get_mut(&(b.org.clone(), e.host.clone())) {
                None => {
                    self.catalogs.insert(
                        (b.org.clone(), e.host.clone()),
                        (tools, bytes, e.seen.clone()),
                    );
                }
                Some(c) => {
                    if bytes >= c.1 {
                        c.0 = tools;
                        c.1 = bytes;
                    }
                    if e.seen > c.2 {
                        c.2 = e.seen.clone();
                    }
                }
            }
        }
    }

    async fn apply(
        &self,
        tx: &deadpool_postgres::Transaction<'_>,
    ) -> Result<(), tokio_postgres::Error> {
        if !self.tool_defs.is_empty() {
            let k = self.tool_defs.keys();
            let org: Vec<&str> = k.clone().map(|k| k.0.as_str()).collect();
            let host: Vec<&str> = k.clone().map(|k| k.1.as_str()).collect();
            let tool: Vec<&str> = k.clone().map(|k| k.2.as_str()).collect();
            let def: Vec<&str> = k.clone().map(|k| k.3.as_str()).collect();
            let sensor: Vec<&str> = k.clone().map(|k| k.4.as_str()).collect();
            let hour: Vec<&str> = k.map(|k| k.5.as_str()).collect();
            let first: Vec<&str> = self.tool_defs.values().map(|v| v.0.as_str()).collect();
            let last: Vec<&str> = self.tool_defs.values().map(|v| v.1.as_str()).collect();
            tx.execute(
                "INSERT INTO tool_defs (org, host, tool, def, sensor, hour, first_seen, last_seen)
                 SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[],
                                      $6::text[], $7::text[], $8::text[])
                 ORDER BY 1, 2, 3, 4, 5, 6
                 ON CONFLICT (org, host, tool, def, sensor, hour) DO UPDATE SET
                    first_seen = least(tool_defs.first_seen, excluded.first_seen),
                    last_seen = greatest(tool_defs.last_seen, excluded.last_seen)",
                &[&org, &host, &tool, &def, &sensor, &hour, &first, &last],
            )
            .await?;
        }
        if !self.errors.is_empty() {
            let k = self.errors.keys();
            let org: Vec<&str> = k.clone().map(|k| k.0.as_str()).collect();
            let fp: Vec<&str> = k.clone().map(|k| k.1.as_str()).collect();
            let tool: Vec<&str> = k.map(|k| k.2.as_str()).collect();
            let v = self.errors.values();
            let kind: Vec<&str> = v.clone().map(|v| v.0.as_str()).collect();
            let code: Vec<Option<i64>> = v.clone().map(|v| v.1).collect();
            let count: Vec<i64> = v.clone().map(|v| v.2).collect();
            let first: Vec<&str> = v.clone().map(|v| v.3.as_str()).collect();
            let last: Vec<&str> = v.map(|v| v.4.as_str()).collect();
            tx.execute(
                "INSERT INTO error_groups (org, fp, tool, kind, code, count, first_seen, last_seen)
                 SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::int8[],
                                      $6::int8[], $7::text[], $8::text[])
                 ORDER BY 1, 2, 3
                 ON CONFLICT (org, fp, tool) DO UPDATE SET
                    count = sat_add(error_groups.count, excluded.count),
                    first_seen = least(error_groups.first_seen, excluded.first_seen),
                    last_seen = greatest(error_groups.last_seen, excluded.last_seen)",
                &[&org, &fp, &tool, &kind, &code, &count, &first, &last],
            )
            .await?;
        }
        if !self.catalogs.is_empty() {
            let k = self.catalogs.keys();
            let org: Vec<&str> = k.clone().map(|k| k.0.as_str()).collect();
            let host: Vec<&str> = k.map(|k| k.1.as_str()).collect();
            let v = self.catalogs.values();
            let tools: Vec<Option<i64>> = v.clone().map(|v| v.0).collect();
            let bytes: Vec<i64> = v.clone().map(|v| v.1).collect();
            let last: Vec<&str> = v.map(|v| v.2.as_str()).collect();
            tx.execute(
                "INSERT INTO catalogs (org, host, tools, bytes, last_seen)
                 SELECT * FROM unnest($1::text[], $2::text[], $3::int8[], $4::int8[], $5::text[])
                 ORDER BY 1, 2
                 ON CONFLICT (org, host) DO UPDATE SET
                    tools = CASE WHEN excluded.bytes >= catalogs.bytes THEN excluded.tools
                                 ELSE catalogs.tools END,
                    bytes = greatest(catalogs.bytes, excluded.bytes),
                    last_seen = greatest(catalogs.last_seen, excluded.last_seen)",
                &[&org, &host, &tools, &bytes, &last],
            )
            .await?;
        }
        Ok(())
    }
}
