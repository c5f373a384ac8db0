//! A tenant's first setup, as far as the store decides it: a database that
//! holds no messages yet has no earlier Redis data to lose, so its Redis
//! dataset is marked established (`crate::redis_util::generation`).

use crate::redis_util::generation::establish_generation;

/// `establish_generation` for every tenant whose database holds no
/// messages yet (run by `migrate`): a tenant with data keeps whatever
/// generation Redis has, so a lost Redis is still detected as a loss.
pub async fn establish_generations(config: &crate::config::Config) -> anyhow::Result<()> {
    let mut redis = crate::redis_util::connect(&config.redis.url).await?;
    for t in &config.tenants {
        let pool = crate::tenant::pool_of(config, t)?;
        let stored: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM im_group_message_topic_shards")
            .fetch_one(&pool)
            .await?;
        if stored == 0 {
            establish_generation(&mut redis, &t.id).await?;
        }
        pool.close().await;
    }
    Ok(())
}
