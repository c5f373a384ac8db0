//! A real third-party client, @kafkajs/confluent-schema-registry from npm,
//! registers, fetches, encodes/decodes and checks compatibility through the
//! embedded registry: the proof that it speaks the real API.

mod common;

use common::{repo_root, World};

#[tokio::test]
async fn kafkajs_schema_registry_client_works_against_the_registry() {
    let world = World::with_registry().await;
    let node_dir = repo_root().join("tests/node");
    assert!(
        node_dir
            .join("node_modules/@kafkajs/confluent-schema-registry")
            .exists(),
        "npm packages missing: run `npm ci --prefix tests/node` (the README's test command does)"
    );
    let output = tokio::process::Command::new("node")
        .arg("registry_client.js")
        .current_dir(&node_dir)
        .env("REGISTRY_URL", world.registry_url())
        .env("SUBJECT", format!("thirdparty{}-value", world.id))
        .output()
        .await
        .expect("run node");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success() && stdout.trim_end().ends_with("ok"),
        "node client failed ({}):\nstdout: {stdout}\nstderr: {stderr}",
        output.status
    );
}
