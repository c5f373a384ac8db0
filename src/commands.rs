//! What each subcommand does: load config, start telemetry, call into the
//! parts of the crate, and shut down cleanly.

use anyhow::{bail, Context};

use crate::cli::{Cli, Command, DevArgs, SchemasCommand, ShardsArgs, TokenCommand, TopicsCommand};
use crate::config::Config;
use crate::kafka::topics::{self, TopicNames};
use crate::shutdown::Shutdown;
use crate::telemetry::{self, Readiness};

/// Runs one parsed command line to completion.
pub async fn run(cli: Cli) -> anyhow::Result<()> {
    let config = Config::load(cli.config.as_deref())?;
    telemetry::init_tracing(&config.telemetry);
    match cli.command {
        Command::Registry(args) => {
            refuse_open_registry(&config, args.insecure_dev_secrets)?;
            let shutdown = Shutdown::new();
            shutdown.trigger_on_signals();
            let addr = args.listen.unwrap_or(config.registry.listen);
            let running =
                crate::registry::start(&config, addr, Readiness::default(), shutdown).await?;
            println!("schema registry listening on http://{}", running.addr);
            running.task.await?;
            Ok(())
        }
        Command::Schemas(SchemasCommand::Register) => schemas_register(&config).await,
        Command::Schemas(SchemasCommand::Check) => schemas_check(&config).await,
        Command::Topics(TopicsCommand::Ensure) => topics_ensure(&config).await,
        Command::Topics(TopicsCommand::List) => {
            for (name, spec) in topics::desired_topics(&config.kafka) {
                println!(
                    "{name}\tpartitions={}\tretention.ms={}",
                    spec.partitions, spec.retention_ms
                );
            }
            Ok(())
        }
        Command::Migrate(args) => {
            if config.tenants.is_empty() {
                bail!("no tenants configured: add [[tenants]] entries to the config");
            }
            let done = crate::tenant::migrate(&config, args.tenant.as_deref()).await?;
            crate::store::setup::establish_generations(&config).await?;
            first_checkpoints(&config, args.tenant.as_deref()).await?;
            for (tenant, report) in &done {
                for (version, description) in &report.applied {
                    println!("{tenant}: applied migration {version} ({description})");
                }
                for (table, column, was) in &report.converted {
                    println!(
                        "{tenant}: {table}.{column} converted from {was} to VARBINARY (exact)"
                    );
                }
                if report.logins_normalized > 0 {
                    println!(
                        "{tenant}: {} stored login(s) normalized (NFKC + case folding)",
                        report.logins_normalized
                    );
                }
            }
            println!("migrated {} tenant database(s)", done.len());
            Ok(())
        }
        Command::Gateway(args) => {
            refuse_weak_secrets(&config, args.insecure_dev_secrets)?;
            let shutdown = Shutdown::new();
            shutdown.trigger_on_signals();
            let addr = args.listen.unwrap_or(config.gateway.listen);
            let readiness = Readiness::default();
            // Metrics on the telemetry port, off the public one.
            crate::telemetry::serve_ops(
                config.telemetry.listen,
                readiness.clone(),
                shutdown.clone(),
            )
            .await?;
            let running = crate::gateway::start(&config, addr, readiness, shutdown).await?;
            println!("gateway listening on ws://{}/v0/channels", running.addr);
            println!(
                "operator endpoints (/v1/admin/...) on http://{}",
                running.admin_addr
            );
            running.task.await?;
            Ok(())
        }
        Command::Project(args) => {
            let shutdown = serving_ops(&config).await?;
            crate::pipeline::run_named(&config, &args.pipeline, shutdown).await
        }
        Command::Unit(args) => {
            let shutdown = serving_ops(&config).await?;
            crate::pipeline::unit::run_named(&config, &args.unit, shutdown).await
        }
        Command::Shards(args) => shards(&config, args).await,
        Command::Routes(crate::cli::RoutesCommand::Rebuild { tenant, topic }) => {
            let mut redis = crate::redis_util::connect(&config.redis.url).await?;
            let mut total = 0;
            for t in &config.tenants {
                if tenant.as_deref().is_some_and(|x| x != t.id) {
                    continue;
                }
                let pool = crate::tenant::pool_of(&config, t)?;
                let topics: Vec<String> = match &topic {
                    Some(x) => vec![x.clone()],
                    None => {
                        let topics: Vec<crate::exact::Exact> = sqlx::query_scalar(
                            "SELECT DISTINCT topic FROM im_group_message_topic_shards",
                        )
                        .fetch_all(&pool)
                        .await?;
                        topics.into_iter().map(String::from).collect()
                    }
                };
                for x in topics {
                    let rows =
                        crate::store::routes::rebuild_topic(&pool, &mut redis, &t.id, &x).await?;
                    println!("{}\t{x}\t{} month(s)", t.id, rows.len());
                    total += 1;
                }
            }
            println!("rebuilt {total} route(s)");
            Ok(())
        }
        Command::Dlq(crate::cli::DlqCommand::Replay { pipeline, follow }) => {
            dlq_replay(&config, &pipeline, follow).await
        }
        Command::Token(TokenCommand::Issue {
            tenant,
            uid,
            device,
        }) => {
            if uid <= 0 {
                bail!("--uid must be a positive integer");
            }
            if config.tenant(&tenant).is_none() {
                bail!("unknown tenant {tenant:?}");
            }
            let issued = crate::auth::Tokens::new(&config).issue(&tenant, uid, &device, 0, 0);
            println!("{}", issued.token);
            Ok(())
        }
        Command::Users(crate::cli::UsersCommand::Add { tenant, uid, login }) => {
            users_add(&config, &tenant, uid, &login).await
        }
        Command::Users(crate::cli::UsersCommand::List { tenant }) => {
            users_list(&config, &tenant).await
        }
        Command::Users(crate::cli::UsersCommand::Remove { tenant, login }) => {
            users_remove_or_reset(&config, &tenant, &login, false).await
        }
        Command::Users(crate::cli::UsersCommand::Reset { tenant, login }) => {
            users_remove_or_reset(&config, &tenant, &login, true).await
        }
        Command::Replay(args) => crate::replay::run_cli(&config, args).await,
        Command::Legacy(cmd) => crate::legacy::run_cli(&config, cmd).await,
        Command::Dev(args) => dev(&config, args).await,
        Command::Bench(crate::cli::BenchCommand::Send(args)) => {
            crate::bench::send::run(&config, args).await
        }
        Command::Bench(crate::cli::BenchCommand::Fanout(args)) => {
            crate::bench::fanout::run(&config, args).await
        }
        Command::Bench(crate::cli::BenchCommand::History(args)) => {
            crate::bench::history::run(&config, args).await
        }
        Command::Bench(crate::cli::BenchCommand::Files(args)) => {
            crate::bench::files::run(&config, args).await
        }
        Command::Bench(crate::cli::BenchCommand::Conversations(args)) => {
            crate::bench::conversations::run(&config, args).await
        }
        Command::Bench(crate::cli::BenchCommand::Search(args)) => {
            crate::bench::search::run(&config, args).await
        }
        Command::Bench(crate::cli::BenchCommand::LegacyCopy(args)) => {
            crate::bench::legacy::run(&config, args).await
        }
        Command::Bench(crate::cli::BenchCommand::Recovery(args)) => {
            crate::bench::recovery::run(&config, args).await
        }
    }
}

/// `imstream users add`: the password from `IMSTREAM_PASSWORD` or the
/// first line of stdin. A login another tenant of `auth.basic.tenants`
/// already has is refused: a basic login must name one person.
async fn users_add(config: &Config, tenant: &str, uid: i64, login: &str) -> anyhow::Result<()> {
    let Some(t) = config.tenant(tenant) else {
        bail!("unknown tenant {tenant:?}");
    };
    crate::users::check_login(login)?;
    let password = read_password()?;
    for other in config.auth.basic.tenants.iter().filter(|o| *o != tenant) {
        let Some(o) = config.tenant(other) else {
            continue;
        };
        let pool = crate::tenant::pool_of(config, o)?;
        if crate::users::lookup(&pool, login).await?.is_some() {
            bail!("login {login:?} already exists in tenant {other} (auth.basic.tenants share one login namespace)");
        }
    }
    let pool = crate::tenant::pool_of(config, t)?;
    crate::users::add(&pool, tenant, uid, login, &password).await?;
    if !config.auth.basic.tenants.iter().any(|x| x == tenant) {
        eprintln!("note: tenant {tenant} is not in auth.basic.tenants; the gateway will not accept this login until it is");
    }
    println!("added login {login:?} for uid {uid} in tenant {tenant}");
    Ok(())
}

/// Where `imstream users add|reset` reads the password when set.
const PASSWORD_ENV: &str = "IMSTREAM_PASSWORD";

/// The password from `IMSTREAM_PASSWORD` or the first line of stdin.
fn read_password() -> anyhow::Result<String> {
    let password = match std::env::var(PASSWORD_ENV) {
        Ok(p) => p,
        Err(_) => {
            let mut line = String::new();
            std::io::stdin()
                .read_line(&mut line)
                .context("reading the password from stdin")?;
            line.trim_end_matches(['\r', '\n']).to_string()
        }
    };
    if password.is_empty() {
        bail!("no password: set {PASSWORD_ENV} or pipe it on stdin");
    }
    Ok(password)
}

/// `imstream users list`: one line per login, tab-separated.
async fn users_list(config: &Config, tenant: &str) -> anyhow::Result<()> {
    let Some(t) = config.tenant(tenant) else {
        bail!("unknown tenant {tenant:?}");
    };
    let pool = crate::tenant::pool_of(config, t)?;
    let rows = crate::users::list(&pool).await?;
    println!("login\tuid\tpassword\tcreated_at\tupdated_at");
    for r in &rows {
        println!(
            "{}\t{}\t{}\t{}\t{}",
            r.login,
            r.uid,
            if r.has_password { "set" } else { "reset" },
            r.created_at.and_utc().to_rfc3339(),
            r.updated_at.and_utc().to_rfc3339()
        );
    }
    eprintln!("{} login(s) in tenant {tenant}", rows.len());
    Ok(())
}

/// `imstream users remove|reset`: the login's row removed, or its password
/// replaced; then the user is signed out everywhere (a session-control
/// event, auth version past the current one), so no token issued under
/// the old password stays valid.
async fn users_remove_or_reset(
    config: &Config,
    tenant: &str,
    login: &str,
    reset: bool,
) -> anyhow::Result<()> {
    let Some(t) = config.tenant(tenant) else {
        bail!("unknown tenant {tenant:?}");
    };
    let pool = crate::tenant::pool_of(config, t)?;
    let password = if reset { Some(read_password()?) } else { None };
    let uid = match &password {
        Some(p) => crate::users::reset(&pool, tenant, login, p).await?,
        None => crate::users::remove(&pool, tenant, login).await?,
    };
    let codec = crate::events::EventCodec::new(&config.registry.url)?;
    let producer = crate::kafka::producer::EventProducer::new(&config.kafka, codec)?;
    let auth_version = crate::events::AuthVersion {
        auth_version: crate::session_control::next_auth_version(&pool, uid).await?,
    };
    let event = crate::events::SessionControlEvent {
        event_id: crate::events::new_event_id(),
        tenant_id: tenant.to_string(),
        uid,
        occurred_at: crate::events::now_ms(),
        actor_uid: 0,
        reason: format!("imstream users {}", if reset { "reset" } else { "remove" }),
        body: if reset {
            crate::events::SessionControlBody::PasswordReset(auth_version)
        } else {
            crate::events::SessionControlBody::SignedOutEverywhere(auth_version)
        },
    };
    producer
        .send(
            crate::kafka::topics::TopicKind::SessionControl,
            &format!("{tenant}:{uid}"),
            &event,
            None,
        )
        .await
        .context("the login changed, but signing the user out failed: run `imstream users reset` again or sign them out from the admin API")?;
    let normalized = crate::users::normalize_login(login)?;
    if reset {
        println!("new password for login {normalized:?} (uid {uid}) in tenant {tenant}; uid {uid} signed out everywhere");
    } else {
        println!("removed login {normalized:?} (uid {uid}) from tenant {tenant}; uid {uid} signed out everywhere");
    }
    Ok(())
}

/// `imstream shards`: one pass per tenant every `shards.interval_secs`.
async fn shards(config: &Config, args: ShardsArgs) -> anyhow::Result<()> {
    if let Some(action) = args.action {
        return shards_action(config, action).await;
    }
    let shutdown = Shutdown::new();
    shutdown.trigger_on_signals();
    let clock = crate::redis_util::Clock::from_override(
        args.now.as_deref().unwrap_or(&config.shards.clock_override),
    );
    let manager = crate::store::shards::ShardManager::connect(
        config,
        clock,
        crate::pipeline::store_topics(config)?,
    )
    .await?;
    if args.once {
        for (tenant, pass) in manager.pass().await? {
            for (month, holds) in &pass.held {
                let why: Vec<String> = holds.iter().map(ToString::to_string).collect();
                println!("{tenant}\t{month}\tsealing: {}", why.join("; "));
            }
            for month in &pass.sealed {
                println!("{tenant}\t{month}\tsealed");
            }
            println!(
                "{tenant}\ttables={}\tactive_month={}",
                pass.tables
                    .iter()
                    .map(|m| m.to_string())
                    .collect::<Vec<_>>()
                    .join(","),
                pass.active_month
                    .map(|m| m.to_string())
                    .unwrap_or_else(|| "(locked elsewhere)".into())
            );
        }
        return Ok(());
    }
    let readiness = Readiness::default();
    crate::telemetry::serve_ops(config.telemetry.listen, readiness.clone(), shutdown.clone())
        .await?;
    readiness.set_ready(true);
    manager.run(shutdown).await;
    Ok(())
}

/// `imstream shards archive|drop <tenant> <YYYYMM>`.
async fn shards_action(config: &Config, action: crate::cli::ShardsAction) -> anyhow::Result<()> {
    use crate::cli::ShardsAction;
    use crate::store::archive;
    let (tenant, month, root, drop_confirmed) = match action {
        ShardsAction::Archive { tenant, month, to } => (tenant, month, to, None),
        ShardsAction::Drop {
            tenant,
            month,
            from,
            confirm,
        } => (tenant, month, from, Some(confirm)),
        ShardsAction::Reopen { tenant, month } => {
            let Some(t) = config.tenant(&tenant) else {
                bail!("unknown tenant {tenant:?}");
            };
            let month = crate::store::month::ShardMonth::parse(&month)?;
            let pool = crate::tenant::pool_of(config, t)?;
            crate::store::consistency::reopen(&pool, month)
                .await
                .map_err(|e| anyhow::anyhow!("{tenant}: {e}"))?;
            println!("{tenant}\t{month}\treopened (sealing): run `imstream dlq replay store` for its late events; the shard manager seals it again once nothing holds it");
            return Ok(());
        }
        ShardsAction::Check { tenant } => return shards_check(config, tenant.as_deref()).await,
    };
    let tenant = tenant.as_str();
    let Some(t) = config.tenant(tenant) else {
        bail!("unknown tenant {tenant:?}");
    };
    let month = crate::store::month::ShardMonth::parse(&month)?;
    let location = match root {
        Some(root) => archive::ArchiveLocation::parse(&root, &config.shards.archive_options)?,
        None => archive::ArchiveLocation::from_config(&config.shards)?,
    };
    let pool = crate::tenant::pool_of(config, t)?;
    let manifest = match drop_confirmed {
        None => archive::export(&pool, tenant, month, &location).await?,
        Some(confirm) => archive::drop_month(&pool, tenant, month, &location, confirm).await?,
    };
    let data = manifest.object(archive::DATA_OBJECT);
    println!(
        "{tenant}\t{month}\trows={}\tbytes={}\tsha256={}\t{}",
        manifest.row_count,
        data.map_or(0, |d| d.bytes),
        data.map_or("", |d| d.sha256.as_str()),
        location.month_shown(tenant, month)
    );
    Ok(())
}

/// `imstream shards check`: every topic of each tenant (pages of 1,000),
/// then the dedup purge; one line per tenant and kind.
async fn shards_check(config: &Config, only: Option<&str>) -> anyhow::Result<()> {
    if let Some(t) = only {
        if config.tenant(t).is_none() {
            bail!("unknown tenant {t:?}");
        }
    }
    let mut redis = crate::redis_util::connect(&config.redis.url).await?;
    for t in config
        .tenants
        .iter()
        .filter(|t| only.is_none_or(|o| o == t.id))
    {
        let pool = crate::tenant::pool_of(config, t)?;
        let mut total = crate::store::consistency::Report::default();
        let mut after = String::new();
        loop {
            let page =
                crate::store::consistency::check_topics(&t.id, &pool, &mut redis, &after, 1000)
                    .await?;
            let next = page.next_after.clone();
            total.absorb(page);
            match next {
                Some(n) => after = n,
                None => break,
            }
        }
        total.dedup_purged =
            crate::store::consistency::purge_dedup(&pool, config.shards.dedup_purge_per_run)
                .await?;
        println!(
            "{}\ttopics={}\tdedup_purged={}",
            t.id, total.topics, total.dedup_purged
        );
        for (kind, n) in &total.mismatches {
            let fixed = total.repairs.get(kind).copied().unwrap_or(0);
            println!("{}\t{kind}\tfound={n}\trepaired={fixed}", t.id);
        }
    }
    Ok(())
}

/// `imstream dlq replay <pipeline>`.
async fn dlq_replay(config: &Config, pipeline: &str, follow: bool) -> anyhow::Result<()> {
    let shutdown = Shutdown::new();
    shutdown.trigger_on_signals();
    if follow {
        return crate::pipeline::replay_dlq(config, pipeline, shutdown).await;
    }
    let drained = crate::pipeline::replay_until_drained(config, pipeline, shutdown).await?;
    println!("{pipeline}\treplayed {} DLQ record(s)", drained.records);
    Ok(())
}

async fn schemas_register(config: &Config) -> anyhow::Result<()> {
    let names = TopicNames::new(&config.kafka);
    let client = crate::registry::client::RegistryClient::new(&config.registry.url)
        .with_token(&config.registry.write_token);
    let reports = crate::registry::client::register_all_with(client, &names).await?;
    for r in reports {
        println!("{}\tid={}", r.subject, r.id.unwrap_or_default());
    }
    Ok(())
}

async fn schemas_check(config: &Config) -> anyhow::Result<()> {
    let names = TopicNames::new(&config.kafka);
    let reports = crate::registry::client::check_all(&config.registry.url, &names).await?;
    let mut bad = 0;
    for r in &reports {
        if r.compatible {
            println!("{}\tcompatible", r.subject);
        } else {
            bad += 1;
            println!("{}\tINCOMPATIBLE", r.subject);
            for m in &r.messages {
                println!("  {m}");
            }
        }
    }
    if bad > 0 {
        bail!("{bad} schema(s) incompatible with the registered history");
    }
    Ok(())
}

async fn topics_ensure(config: &Config) -> anyhow::Result<()> {
    let done = topics::ensure(config)
        .await
        .context("creating topics (is Kafka up? see docker/local/stack status)")?;
    for (name, what) in done {
        println!("{name}\t{what:?}");
    }
    Ok(())
}

/// `imstream dev`: everything in one process against the local stack —
/// registry, migrations, topics and schemas, shard manager, the store and
/// members pipelines, the gateway — plus a demo group of the dev users.
async fn dev(config: &Config, args: DevArgs) -> anyhow::Result<()> {
    let config = &dev_webapp(config);
    let shutdown = Shutdown::new();
    shutdown.trigger_on_signals();
    let readiness = Readiness::default();
    let registry = crate::registry::start(
        config,
        config.registry.listen,
        readiness.clone(),
        shutdown.clone(),
    )
    .await?;
    if !config.tenants.is_empty() {
        crate::tenant::migrate(config, None).await?;
        crate::store::setup::establish_generations(config).await?;
    }
    if !args.no_setup {
        topics_ensure(config).await?;
        schemas_register(config).await?;
    }
    first_checkpoints(config, None).await?;
    let manager = crate::store::shards::ShardManager::connect(
        config,
        crate::redis_util::Clock::from_override(&config.shards.clock_override),
        crate::pipeline::store_topics(config)?,
    )
    .await?;
    manager.pass().await?;
    let mut tasks = Vec::new();
    {
        let shutdown = shutdown.clone();
        tasks.push(tokio::spawn(async move { manager.run(shutdown).await }));
    }
    // Each source read by several pipelines is consumed once, by its
    // deployment unit (topologies/units.toml); the rest run alone.
    let units = crate::pipeline::unit::units(config)?;
    for unit in units.clone() {
        let (config, shutdown) = (config.clone(), shutdown.clone());
        tasks.push(tokio::spawn(async move {
            if let Err(e) = crate::pipeline::unit::run(&config, &unit, shutdown).await {
                tracing::error!(unit = %unit.name, error = %e, "unit stopped with an error");
            }
        }));
    }
    for pipeline in crate::pipeline::unit::alone(&units, crate::pipeline::PIPELINES) {
        let (config, shutdown) = (config.clone(), shutdown.clone());
        tasks.push(tokio::spawn(async move {
            if let Err(e) = crate::pipeline::run_named(&config, pipeline, shutdown).await {
                tracing::error!(pipeline, error = %e, "pipeline stopped with an error");
            }
        }));
    }
    let gateway = crate::gateway::start(
        config,
        config.gateway.listen,
        readiness.clone(),
        shutdown.clone(),
    )
    .await?;
    seed_demo(config).await?;
    // The operator's view, where every process serves it (the gateway's
    // public port serves health only): the benchmarks read it.
    crate::telemetry::serve_ops(config.telemetry.listen, readiness.clone(), shutdown.clone())
        .await?;

    let tokens = crate::auth::Tokens::new(&config);
    println!("imstream dev is up:");
    if !config.gateway.webapp_dir.is_empty() {
        println!("  web app             http://{}/", gateway.addr);
        let logins: Vec<String> = config
            .auth
            .dev_users
            .iter()
            .map(|u| format!("{} / {}", u.login, u.password))
            .collect();
        println!("  log in as           {}", logins.join("   or   "));
    }
    println!(
        "  WebSocket (Tinode)  ws://{}/v0/channels?apikey=any",
        gateway.addr
    );
    println!(
        "  HTTP                http://{}/v1/groups/grpDemo/messages",
        gateway.addr
    );
    println!(
        "  operator endpoints  http://{}/v1/admin/... (admin token)",
        gateway.admin_addr
    );
    println!("  schema registry     http://{}", registry.addr);
    println!(
        "  metrics, health     http://{}/metrics  /healthz  /readyz",
        config.telemetry.listen
    );
    for user in &config.auth.dev_users {
        let token = tokens.issue(&user.tenant, user.uid, "dev", 0, 0).token;
        println!(
            "  user {} (tenant {}, uid {}, password {}): token {}",
            user.login, user.tenant, user.uid, user.password, token
        );
    }
    println!("  demo group          grpDemo (every dev user of its tenant is a member)");
    println!("Try: curl -H \"Authorization: Bearer <token>\" -d '{{\"content\":\"hi\"}}' http://{}/v1/groups/grpDemo/messages", gateway.addr);
    println!("Ctrl-C stops it.");
    shutdown.cancelled().await;
    let _ = gateway.task.await;
    let _ = registry.task.await;
    for t in tasks {
        let _ = t.await;
    }
    Ok(())
}

/// The first pipeline checkpoints of each tenant database that has none
/// (see `pipeline::checkpoints::birth`).
async fn first_checkpoints(config: &Config, only: Option<&str>) -> anyhow::Result<()> {
    for t in &config.tenants {
        if only.is_some_and(|o| o != t.id) {
            continue;
        }
        let pool = crate::tenant::pool_of(config, t)?;
        let n = crate::pipeline::checkpoints::birth(config, &pool).await?;
        if n > 0 {
            tracing::info!(tenant = %t.id, checkpoints = n, "first pipeline checkpoints written");
        }
        pool.close().await;
    }
    Ok(())
}

/// `imstream dev` serves the web app from `webapp` when it is installed
/// there and `gateway.webapp_dir` is not set.
fn dev_webapp(config: &Config) -> Config {
    let mut config = config.clone();
    if config.gateway.webapp_dir.is_empty() {
        if std::path::Path::new(DEV_WEBAPP_DIR)
            .join("node_modules/tinode-webapp/index.html")
            .is_file()
        {
            config.gateway.webapp_dir = DEV_WEBAPP_DIR.into();
        } else {
            tracing::warn!(
                "no web app: install it with `npm ci --prefix {DEV_WEBAPP_DIR}` (docker/local/run does)"
            );
        }
    }
    config
}

/// Where webapp/package.json installs the web app, relative to the repo.
const DEV_WEBAPP_DIR: &str = "webapp";

/// Creates `grpDemo` for each tenant that has dev users, once.
async fn seed_demo(config: &Config) -> anyhow::Result<()> {
    use crate::events::{GroupCreated, GroupEvent, GroupEventBody};
    let codec = crate::events::EventCodec::new(&config.registry.url)?;
    let producer = crate::kafka::producer::EventProducer::new(&config.kafka, codec)?;
    for tenant in &config.tenants {
        let users: Vec<i64> = config
            .auth
            .dev_users
            .iter()
            .filter(|u| u.tenant == tenant.id)
            .map(|u| u.uid)
            .collect();
        let Some(owner) = users.first().copied() else {
            continue;
        };
        let pool = crate::tenant::pool_of(config, tenant)?;
        let exists: Option<i64> =
            sqlx::query_scalar("SELECT group_id FROM im_groups WHERE topic = 'grpDemo'")
                .fetch_optional(&pool)
                .await?;
        if exists.is_some() {
            continue;
        }
        let event = GroupEvent {
            actor_device: "dev".into(),
            source_node: config.node.resolved_id(),
            ..GroupEvent::new(
                &tenant.id,
                "grpDemo",
                owner,
                GroupEventBody::GroupCreated(GroupCreated {
                    group_id: 1,
                    name: "Demo".into(),
                    owner_uid: owner,
                    members: users,
                }),
            )
        };
        producer
            .send(
                topics::TopicKind::GroupEvents,
                &format!("{}:grpDemo", tenant.id),
                &event,
                None,
            )
            .await?;
    }
    Ok(())
}

/// A gateway outside `imstream dev` starts only with secrets of its own:
/// a published default or a short secret would let anyone mint tokens or
/// call the admin API.
fn refuse_weak_secrets(config: &Config, insecure_dev_secrets: bool) -> anyhow::Result<()> {
    let problems = config.secret_problems();
    if problems.is_empty() {
        return Ok(());
    }
    if insecure_dev_secrets {
        tracing::warn!(
            ?problems,
            "starting with development secrets (--insecure-dev-secrets)"
        );
        return Ok(());
    }
    bail!(
        "refusing to start with weak secrets: {}. Set them in the config or as IMSTREAM__AUTH__JWT_SECRET / IMSTREAM__AUTH__ADMIN_TOKEN (for a local test only: --insecure-dev-secrets)",
        problems.join("; ")
    )
}

/// `imstream registry` outside dev needs a write token: anyone who can
/// reach an open registry can delete the schemas every event needs.
fn refuse_open_registry(config: &Config, insecure_dev_secrets: bool) -> anyhow::Result<()> {
    let token = &config.registry.write_token;
    if token.len() >= crate::config::MIN_SECRET_BYTES || insecure_dev_secrets {
        return Ok(());
    }
    bail!(
        "refusing to start the registry without registry.write_token of at least {} bytes (set it, or IMSTREAM__REGISTRY__WRITE_TOKEN; for a local test only: --insecure-dev-secrets)",
        crate::config::MIN_SECRET_BYTES
    )
}

/// A projector process's start: stops on SIGINT/SIGTERM, serves metrics
/// and health (`telemetry.listen`), and is ready at once.
async fn serving_ops(config: &Config) -> anyhow::Result<Shutdown> {
    let shutdown = Shutdown::new();
    shutdown.trigger_on_signals();
    let readiness = Readiness::default();
    crate::telemetry::serve_ops(config.telemetry.listen, readiness.clone(), shutdown.clone())
        .await?;
    readiness.set_ready(true);
    Ok(shutdown)
}
