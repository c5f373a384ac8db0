//! What each subcommand does: load config, start telemetry, call into the
//! parts of the crate, and shut down cleanly.

use anyhow::{bail, Context};

use crate::cli::{Cli, Command, DevArgs, SchemasCommand, TopicsCommand};
use crate::config::Config;
use crate::events::catalog;
use crate::kafka::topics::{self, TopicNames};
use crate::shutdown::Shutdown;
use crate::telemetry::{self, Readiness};

/// Runs one parsed command line to completion.
pub async fn run(cli: Cli) -> anyhow::Result<()> {
    let config = Config::load(cli.config.as_deref())?;
    telemetry::init_tracing(&config.telemetry);
    match cli.command {
        Command::Registry(args) => {
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
            let n = crate::tenant::migrate(&config, args.tenant.as_deref()).await?;
            println!("migrated {n} tenant database(s)");
            Ok(())
        }
        Command::Dev(args) => dev(&config, args).await,
    }
}

async fn schemas_register(config: &Config) -> anyhow::Result<()> {
    let names = TopicNames::new(&config.kafka);
    let reports = catalog::register_all(&config.registry.url, &names).await?;
    for r in reports {
        println!("{}\tid={}", r.subject, r.id.unwrap_or_default());
    }
    Ok(())
}

async fn schemas_check(config: &Config) -> anyhow::Result<()> {
    let names = TopicNames::new(&config.kafka);
    let reports = catalog::check_all(&config.registry.url, &names).await?;
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

/// `imstream dev`: the registry in-process, tenant databases migrated,
/// schemas registered and topics created, then serve until Ctrl-C.
async fn dev(config: &Config, args: DevArgs) -> anyhow::Result<()> {
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
    }
    if !args.no_setup {
        topics_ensure(config).await?;
        schemas_register(config).await?;
    }
    println!("imstream dev is up:");
    println!("  schema registry   http://{}", registry.addr);
    println!(
        "  metrics, health   http://{}/metrics  /healthz  /readyz",
        registry.addr
    );
    println!(
        "  tenants           {}",
        config
            .tenants
            .iter()
            .map(|t| t.id.as_str())
            .collect::<Vec<_>>()
            .join(", ")
    );
    println!("Ctrl-C stops it.");
    shutdown.cancelled().await;
    let _ = registry.task.await;
    Ok(())
}
