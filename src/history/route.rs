//! Which months hold a topic's seqs: the Redis route (`route_meta`), else
//! the MySQL mirror (backfilled into Redis, counted as a route miss), else
//! — when even the mirror has nothing — only the active and the two
//! previous months, counted as a repair. Never every month.
//!
//! A route rebuilt from the mirror carries the field `COMPLETE_FIELD`.
//! Without it the route may be partial: after the keys were lost, the store
//! pipeline re-creates them with only the months it is writing, and older
//! months would silently vanish from reads. An unmarked route is therefore
//! completed once from the mirror (fields missing only: what the store
//! pipeline wrote is at least as fresh) and marked.

use crate::redis_util::Redis;
use sqlx::mysql::MySqlPool;

use crate::keys::TopicKeys;
use crate::metrics as m;
use crate::store::catalog;
use crate::store::clock;
use crate::store::month::ShardMonth;
use crate::store::routes::{self, COMPLETE_FIELD};

use super::HistoryError;

/// One month segment of a topic: seqs `min_seq..=max_seq` live in `month`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Segment {
    pub month: ShardMonth,
    pub min_seq: i64,
    pub max_seq: i64,
}

/// Segments oldest month first.
pub async fn segments(
    pool: &MySqlPool,
    redis: &mut Redis,
    tenant: &str,
    topic: &str,
) -> Result<Vec<Segment>, HistoryError> {
    let keys = TopicKeys::new(tenant, topic);
    let meta: Vec<(String, String)> = redis::cmd("HGETALL")
        .arg(keys.route_meta())
        .query_async(redis)
        .await?;
    let complete = meta.iter().any(|(field, _)| field == COMPLETE_FIELD);
    let mut out: Vec<Segment> = meta
        .iter()
        .filter_map(|(month, v)| parse_meta(month, v))
        .collect();
    if !complete {
        if out.is_empty() {
            metrics::counter!(m::ROUTE_MISS_TOTAL).increment(1);
        }
        let rows = routes::mirror_rows(pool, topic).await?;
        if rows.is_empty() {
            if out.is_empty() {
                // No mirror either: look only at recent months, and say so.
                metrics::counter!(m::ROUTE_REBUILD_TOTAL, "status" => "scan_recent").increment(1);
                let active = clock::active_month(redis, tenant)
                    .await?
                    .unwrap_or_else(|| ShardMonth::of(chrono::Utc::now()));
                let recent = [active.prev().prev(), active.prev(), active];
                for entry in catalog::list(pool).await? {
                    if recent.contains(&entry.month) {
                        out.push(Segment {
                            month: entry.month,
                            min_seq: 0,
                            max_seq: i64::MAX,
                        });
                    }
                }
            }
        } else {
            metrics::counter!(m::ROUTE_REBUILD_TOTAL, "status" => "ok").increment(1);
            let mut pipe = redis::pipe();
            for r in &rows {
                let month = r.month.to_string();
                pipe.cmd("ZADD")
                    .arg(keys.route())
                    .arg("NX")
                    .arg(r.min_seq)
                    .arg(&month)
                    .ignore();
                pipe.cmd("HSETNX")
                    .arg(keys.route_meta())
                    .arg(&month)
                    .arg(format!(
                        "min_seq={},max_seq={},count={}",
                        r.min_seq, r.max_seq, r.count
                    ))
                    .ignore();
                match out.iter_mut().find(|s| s.month == r.month) {
                    Some(s) => {
                        s.min_seq = s.min_seq.min(r.min_seq);
                        s.max_seq = s.max_seq.max(r.max_seq);
                    }
                    None => out.push(Segment {
                        month: r.month,
                        min_seq: r.min_seq,
                        max_seq: r.max_seq,
                    }),
                }
            }
            pipe.hset(keys.route_meta(), COMPLETE_FIELD, crate::events::now_ms())
                .ignore();
            pipe.query_async::<()>(redis).await?;
        }
    }
    out.sort_by_key(|s| s.month);
    Ok(out)
}

/// The segments of a route read elsewhere (`hot::read`), oldest month
/// first, when it is marked complete; `None` sends the caller to
/// [`segments`] (which completes it from the mirror).
pub fn complete_segments(meta: &[(String, String)]) -> Option<Vec<Segment>> {
    if !meta.iter().any(|(field, _)| field == COMPLETE_FIELD) {
        return None;
    }
    let mut out: Vec<Segment> = meta
        .iter()
        .filter_map(|(month, v)| parse_meta(month, v))
        .collect();
    out.sort_by_key(|s| s.month);
    Some(out)
}

fn parse_meta(month: &str, value: &str) -> Option<Segment> {
    let month = ShardMonth::parse(month).ok()?;
    let mut min_seq = None;
    let mut max_seq = None;
    for part in value.split(',') {
        match part.split_once('=') {
            Some(("min_seq", v)) => min_seq = v.parse().ok(),
            Some(("max_seq", v)) => max_seq = v.parse().ok(),
            _ => {}
        }
    }
    Some(Segment {
        month,
        min_seq: min_seq?,
        max_seq: max_seq?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn route_meta_values_parse() {
        let s = parse_meta("202609", "min_seq=1,max_seq=10086,count=10086").unwrap();
        assert_eq!(
            (s.month.to_string(), s.min_seq, s.max_seq),
            ("202609".into(), 1, 10086)
        );
        assert!(parse_meta("202613", "min_seq=1,max_seq=2").is_none());
        assert!(parse_meta("202609", "garbage").is_none());
    }
}
