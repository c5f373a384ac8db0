//! `imstream legacy plan|copy|verify|cutover|status|dual-read`: moves the
//! legacy single table `im_group_messages` into the monthly tables without
//! stopping service (seed 000 §9).
//!
//! 1. `plan` — cursor index, month tables and catalog rows for every month
//!    with legacy rows, seq allocators raised above the legacy seqs, the
//!    state row; **dual read on** for the tenant.
//! 2. `copy` — batches along each month's `(created_at, id)` cursor,
//!    `--jobs` months at once ([`copy`]), past months bulk-loaded with
//!    their indexes built after ([`bulk`], catalog `loading`); stop and
//!    resume at will, re-run safely; Redis routes written at the end.
//! 3. `verify` — full comparison ([`verify`]).
//! 4. `cutover` — verifies again, turns dual read off and renames the
//!    legacy table to `im_group_messages_legacy` (kept read-only).
//!
//! Dual read is a per-tenant switch in the tenant database
//! (`im_legacy_migration.dual_read`, see `history::legacy`): while it is
//! on, history reads also read the legacy table and merge by topic+seq, so
//! seqs not yet copied are never missing and copied ones never doubled.
//! `imstream legacy dual-read on|off` flips it by hand.

pub mod bulk;
pub mod copy;
pub mod plan;
pub mod state;
pub mod verify;

use anyhow::bail;
use clap::Subcommand;
use sqlx::mysql::MySqlPool;

use crate::config::Config;
use crate::shutdown::Shutdown;
use crate::store::legacy::table;

#[derive(Debug, Clone, Subcommand)]
pub enum LegacyCommand {
    /// Prepare the copy (cursor index, month tables, allocators) and turn dual read on.
    Plan(TenantArg),
    /// Copy legacy rows into month tables from the persisted cursor.
    Copy(CopyArgs),
    /// Compare legacy rows with the copied rows, the mirror and the Redis routes.
    Verify(TenantArg),
    /// Verify, turn dual read off and rename the legacy table to im_group_messages_legacy.
    Cutover(TenantArg),
    /// Show the migration's state, cursor and recent batches.
    Status(TenantArg),
    /// Turn the tenant's dual read (legacy + monthly) on or off.
    DualRead {
        /// on or off
        #[arg(value_parser = ["on", "off"])]
        switch: String,
        #[command(flatten)]
        tenant: TenantArg,
    },
}

#[derive(Debug, Clone, clap::Args)]
pub struct TenantArg {
    /// Only this tenant (default: every configured tenant).
    #[arg(long)]
    pub tenant: Option<String>,
}

#[derive(Debug, Clone, clap::Args)]
pub struct CopyArgs {
    #[command(flatten)]
    pub tenant: TenantArg,
    /// Rows per batch transaction (1000-5000).
    #[arg(long, default_value_t = copy::BATCH_MAX)]
    pub batch_size: usize,
    /// Stop after this many batches (resume with another `copy`).
    #[arg(long)]
    pub max_batches: Option<u64>,
    /// Start again from the first legacy row (rows already copied are left as they are).
    #[arg(long)]
    pub restart: bool,
    /// Months copied at once (1-8).
    #[arg(long, default_value_t = copy::JOBS_DEFAULT)]
    pub jobs: usize,
    /// Keep the secondary indexes of past months during their copy
    /// (default: a past month whose table is empty is bulk-loaded, status
    /// `loading`, and its indexes are built after its last row).
    #[arg(long)]
    pub keep_indexes: bool,
}

fn tenants<'a>(config: &'a Config, only: &TenantArg) -> anyhow::Result<Vec<(&'a str, MySqlPool)>> {
    if let Some(t) = &only.tenant {
        if config.tenant(t).is_none() {
            bail!("unknown tenant {t:?}");
        }
    }
    config
        .tenants
        .iter()
        .filter(|t| only.tenant.as_deref().is_none_or(|x| x == t.id))
        .map(|t| Ok((t.id.as_str(), crate::tenant::pool_of(config, t)?)))
        .collect()
}

/// Verifies, then switches the tenant to the month tables only.
pub async fn cutover(
    pool: &MySqlPool,
    redis: &mut crate::redis_util::Redis,
    tenant: &str,
) -> anyhow::Result<verify::VerifyReport> {
    let report = verify::verify(pool, redis, tenant).await?;
    if !report.ok() {
        bail!("tenant {tenant}: verification failed; not cutting over (run `imstream legacy verify` for details)");
    }
    state::set_dual_read(pool, false).await?;
    sqlx::query(&format!(
        "RENAME TABLE {} TO {}",
        table::TABLE,
        table::RENAMED
    ))
    .execute(pool)
    .await?;
    state::set_status(pool, state::CUT_OVER).await?;
    Ok(report)
}

pub async fn run_cli(config: &Config, command: LegacyCommand) -> anyhow::Result<()> {
    let mut redis = crate::redis_util::connect(&config.redis.url).await?;
    match command {
        LegacyCommand::Plan(t) => {
            for (tenant, pool) in tenants(config, &t)? {
                let p = plan::plan(&pool, &mut redis, tenant).await?;
                for (month, rows) in &p.months {
                    println!("{tenant}\tmonth {month}\t{rows} row(s)\ttable ready");
                }
                println!(
                    "{tenant}\tplanned: {} row(s), {} topic(s), {} allocator(s) raised; dual read ON",
                    p.rows, p.topics, p.allocators_raised
                );
            }
        }
        LegacyCommand::Copy(args) => {
            let shutdown = Shutdown::new();
            shutdown.trigger_on_signals();
            let options = copy::CopyOptions {
                batch_size: args.batch_size,
                max_batches: args.max_batches,
                restart: args.restart,
                progress: true,
                jobs: args.jobs,
                keep_indexes: args.keep_indexes,
            };
            for (tenant, pool) in tenants(config, &args.tenant)? {
                let out = copy::copy(&pool, &mut redis, tenant, &options, &shutdown).await?;
                println!(
                    "{tenant}\t{} batch(es), {} row(s) read, {} inserted in {:.2}s ({:.0} rows/s), {} month(s) indexed after bulk load ({:.2}s); {}",
                    out.batches,
                    out.rows_read,
                    out.rows_inserted,
                    out.elapsed.as_secs_f64(),
                    out.rows_per_sec(),
                    out.months_indexed,
                    out.index_time.as_secs_f64(),
                    if out.finished { "copy complete, routes written" } else { "paused; run copy again to resume" }
                );
            }
        }
        LegacyCommand::Verify(t) => {
            let mut failed = 0;
            for (tenant, pool) in tenants(config, &t)? {
                let r = verify::verify(&pool, &mut redis, tenant).await?;
                print_verify(tenant, &r);
                if !r.ok() {
                    failed += 1;
                }
            }
            if failed > 0 {
                bail!("{failed} tenant(s) failed verification");
            }
        }
        LegacyCommand::Cutover(t) => {
            for (tenant, pool) in tenants(config, &t)? {
                let r = cutover(&pool, &mut redis, tenant).await?;
                println!(
                    "{tenant}\tcut over: {} row(s) verified; dual read OFF; {} renamed to {}",
                    r.copied_rows(),
                    table::TABLE,
                    table::RENAMED
                );
            }
        }
        LegacyCommand::Status(t) => {
            for (tenant, pool) in tenants(config, &t)? {
                match state::load(&pool).await? {
                    None => println!("{tenant}\tnot planned"),
                    Some(s) => {
                        println!(
                            "{tenant}\tstatus {}\tdual read {}\tcopied {}/{} row(s) ({} inserted) in {} batch(es)\tcursor {:?}\tlegacy table {}",
                            s.status,
                            if s.dual_read { "ON" } else { "off" },
                            s.rows_copied,
                            s.rows_total,
                            s.rows_inserted,
                            s.batches,
                            s.cursor,
                            if table::exists(&pool).await? { "present" } else { "renamed" }
                        );
                        let statuses: std::collections::BTreeMap<_, _> =
                            crate::store::catalog::list(&pool)
                                .await?
                                .into_iter()
                                .map(|e| (e.month, e.status))
                                .collect();
                        for m in state::months(&pool).await? {
                            println!(
                                "{tenant}\tmonth {}\t{}\tcopied {} row(s) in {} batch(es)\tcursor {:?}\tcatalog {}",
                                m.month,
                                if m.done { "done" } else { "copying" },
                                m.rows_copied,
                                m.batches,
                                m.cursor,
                                statuses.get(&m.month).map_or("-", |s| s.as_str())
                            );
                        }
                        for (no, read, inserted, status, error) in
                            state::recent_batches(&pool, 5).await?
                        {
                            println!("{tenant}\tbatch {no}\t{status}\tread {read}\tinserted {inserted}\t{}", error.unwrap_or_default());
                        }
                    }
                }
            }
        }
        LegacyCommand::DualRead { switch, tenant } => {
            for (t, pool) in tenants(config, &tenant)? {
                if !state::set_dual_read(&pool, switch == "on").await? {
                    bail!("tenant {t}: run `imstream legacy plan` first");
                }
                println!("{t}\tdual read {switch}");
            }
        }
    }
    Ok(())
}

fn print_verify(tenant: &str, r: &verify::VerifyReport) {
    for c in r
        .topics
        .iter()
        .filter(|c| c.verdict != crate::digest::Verdict::Identical)
    {
        let show = |s: &Option<crate::digest::Summary>| {
            s.as_ref().map_or("-".to_string(), |s| s.to_string())
        };
        println!(
            "{tenant}\t{}\t{}\tlegacy {}\tcopied {}",
            c.topic,
            c.verdict.as_str(),
            show(&c.before),
            show(&c.after)
        );
    }
    for m in r.mirror.iter().chain(&r.routes) {
        println!("{tenant}\t{m}");
    }
    for m in &r.loading {
        println!(
            "{tenant}\tmonth {m} still loading (indexes not built; run `imstream legacy copy`)"
        );
    }
    println!(
        "{tenant}\t{}: {} topic(s), legacy {} row(s), copied {}, not yet copied {}, foreign rows in legacy seqs {}, mirror diffs {}, route diffs {}, months loading {}",
        if r.ok() { "VERIFIED" } else { "FAILED" },
        r.topics.len(),
        r.legacy_rows(),
        r.copied_rows(),
        r.remaining,
        r.foreign_rows,
        r.mirror.len(),
        r.routes.len(),
        r.loading.len()
    );
}
