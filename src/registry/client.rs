//! `imstream schemas register|check`: every envelope schema this build
//! carries, registered under TopicNameStrategy (`<topic>-value`).

use apache_avro::Schema;
use serde_json::json;

use crate::kafka::topics::{TopicKind, TopicNames};

use crate::events::{
    AdminCommand, AdminResult, Event, GroupEvent, PushTask, ReceiptEvent, SessionControlEvent,
    UserEvent,
};

/// The schema text each topic carries.
pub fn schema_for(kind: TopicKind) -> &'static str {
    match kind {
        TopicKind::GroupEvents => GroupEvent::SCHEMA,
        TopicKind::Receipts => ReceiptEvent::SCHEMA,
        TopicKind::SessionControl => SessionControlEvent::SCHEMA,
        TopicKind::AdminCommands => AdminCommand::SCHEMA,
        TopicKind::AdminResults => AdminResult::SCHEMA,
        TopicKind::UserEvents => UserEvent::SCHEMA,
        TopicKind::PushTasks => PushTask::SCHEMA,
    }
}

#[derive(Debug, thiserror::Error)]
pub enum CatalogError {
    #[error("schema registry at {url} unreachable: {source}")]
    Unreachable { url: String, source: reqwest::Error },
    #[error("subject {subject}: registry answered {status}: {message}")]
    Refused {
        subject: String,
        status: u16,
        message: String,
    },
    #[error("subject {subject}: schema does not parse: {message}")]
    Invalid { subject: String, message: String },
}

/// One subject's outcome.
#[derive(Debug, Clone)]
pub struct SubjectReport {
    pub subject: String,
    pub id: Option<i64>,
    pub compatible: bool,
    pub messages: Vec<String>,
}

/// Minimal Confluent REST client for registration and checks (the codec
/// uses schema_registry_converter; this adds verbose compatibility answers).
pub struct RegistryClient {
    base: String,
    http: reqwest::Client,
    /// Bearer token for changes (the embedded registry's `registry.write_token`).
    token: Option<String>,
}

impl RegistryClient {
    pub fn new(base: &str) -> Self {
        Self {
            base: base.trim_end_matches('/').to_string(),
            http: reqwest::Client::new(),
            token: None,
        }
    }

    /// Sends `token` (when not empty) as the bearer of every request.
    pub fn with_token(mut self, token: &str) -> Self {
        self.token = (!token.is_empty()).then(|| token.to_string());
        self
    }

    async fn post(
        &self,
        path: &str,
        subject: &str,
        schema: &str,
    ) -> Result<serde_json::Value, CatalogError> {
        let url = format!("{}{}", self.base, path);
        let mut request = self
            .http
            .post(&url)
            .header("content-type", "application/vnd.schemaregistry.v1+json")
            .body(json!({"schema": schema}).to_string());
        if let Some(token) = &self.token {
            request = request.bearer_auth(token);
        }
        let resp = request
            .send()
            .await
            .map_err(|source| CatalogError::Unreachable {
                url: self.base.clone(),
                source,
            })?;
        let status = resp.status().as_u16();
        let body: serde_json::Value = resp.json().await.unwrap_or(serde_json::Value::Null);
        if status >= 300 {
            return Err(CatalogError::Refused {
                subject: subject.to_string(),
                status,
                message: body["message"].as_str().unwrap_or("").to_string(),
            });
        }
        Ok(body)
    }

    /// Registers `schema` under `subject`; returns its global id.
    pub async fn register(&self, subject: &str, schema: &str) -> Result<i64, CatalogError> {
        let body = self
            .post(
                &format!("/subjects/{}/versions", encode(subject)),
                subject,
                schema,
            )
            .await?;
        Ok(body["id"].as_i64().unwrap_or_default())
    }

    /// Checks `schema` against the subject's history at its configured level.
    pub async fn check(
        &self,
        subject: &str,
        schema: &str,
    ) -> Result<(bool, Vec<String>), CatalogError> {
        let body = self
            .post(
                &format!(
                    "/compatibility/subjects/{}/versions?verbose=true",
                    encode(subject)
                ),
                subject,
                schema,
            )
            .await?;
        let messages = body["messages"]
            .as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|m| m.as_str().map(String::from))
                    .collect()
            })
            .unwrap_or_default();
        Ok((body["is_compatible"].as_bool().unwrap_or(false), messages))
    }
}

fn encode(subject: &str) -> String {
    subject.replace('/', "%2F")
}

fn subjects(names: &TopicNames) -> Vec<(String, &'static str)> {
    TopicKind::ALL
        .iter()
        .map(|k| (format!("{}-value", names.name(*k)), schema_for(*k)))
        .collect()
}

fn validate(subject: &str, schema: &str) -> Result<(), CatalogError> {
    Schema::parse_str(schema)
        .map(|_| ())
        .map_err(|e| CatalogError::Invalid {
            subject: subject.to_string(),
            message: e.to_string(),
        })
}

/// Registers every schema. Stops at the first refusal (e.g. 409).
pub async fn register_all(
    registry_url: &str,
    names: &TopicNames,
) -> Result<Vec<SubjectReport>, CatalogError> {
    register_all_with(RegistryClient::new(registry_url), names).await
}

/// [`register_all`] through `client` (e.g. one that carries the write token).
pub async fn register_all_with(
    client: RegistryClient,
    names: &TopicNames,
) -> Result<Vec<SubjectReport>, CatalogError> {
    let mut out = Vec::new();
    for (subject, schema) in subjects(names) {
        validate(&subject, schema)?;
        let id = client.register(&subject, schema).await?;
        out.push(SubjectReport {
            subject,
            id: Some(id),
            compatible: true,
            messages: Vec::new(),
        });
    }
    Ok(out)
}

/// Checks every schema against what is registered, without registering.
pub async fn check_all(
    registry_url: &str,
    names: &TopicNames,
) -> Result<Vec<SubjectReport>, CatalogError> {
    let client = RegistryClient::new(registry_url);
    let mut out = Vec::new();
    for (subject, schema) in subjects(names) {
        validate(&subject, schema)?;
        let (compatible, messages) = client.check(&subject, schema).await?;
        out.push(SubjectReport {
            subject,
            id: None,
            compatible,
            messages,
        });
    }
    Ok(out)
}
