//! The HTTP API: the part of the Confluent Schema Registry REST API that
//! clients use, with the same JSON shapes, content type and error codes.

use std::sync::Arc;

use apache_avro::Schema;
use axum::body::Bytes;
use axum::extract::{MatchedPath, Path, Query, Request, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use serde::Deserialize;
use serde_json::{json, Value};
use tokio::sync::Mutex;

use super::compat::{self, Level};
use super::store::{fingerprint, RegistryStore, SubjectVersion};

/// Content type of every registry response.
pub const CONTENT_TYPE: &str = "application/vnd.schemaregistry.v1+json";

#[derive(Clone)]
pub struct AppState {
    store: RegistryStore,
    /// Serialises writes so compatibility is checked against a stable history.
    write_lock: Arc<Mutex<()>>,
    /// Bearer token every change needs (`registry.write_token`); `None`
    /// leaves the registry open (development only).
    write_token: Option<Arc<str>>,
}

impl AppState {
    pub fn new(store: RegistryStore, write_token: &str) -> Self {
        Self {
            store,
            write_lock: Arc::new(Mutex::new(())),
            write_token: (!write_token.is_empty()).then(|| Arc::from(write_token)),
        }
    }

    /// Changes (a new schema version, deletes, compatibility settings)
    /// need the write token. Looking up an id, even through a register call
    /// of a schema the subject already has, does not.
    fn authorize(&self, headers: &HeaderMap) -> Result<(), ApiError> {
        let Some(token) = &self.write_token else {
            return Ok(());
        };
        if crate::bearer::presented(headers, token) {
            Ok(())
        } else {
            Err(ApiError::new(
                40101,
                "Unauthorized: this change needs the registry write token",
            ))
        }
    }
}

pub fn router(state: AppState) -> Router {
    Router::new()
        .route("/", get(|| async { reply(json!({})) }))
        .route("/subjects", get(list_subjects))
        .route("/subjects/{subject}", post(lookup).delete(delete_subject))
        .route(
            "/subjects/{subject}/versions",
            get(list_versions).post(register),
        )
        .route(
            "/subjects/{subject}/versions/{version}",
            get(get_version).delete(delete_version),
        )
        .route(
            "/subjects/{subject}/versions/{version}/schema",
            get(get_version_schema),
        )
        .route("/schemas/types", get(|| async { reply(json!(["AVRO"])) }))
        .route("/schemas/ids/{id}", get(get_schema_by_id))
        .route("/schemas/ids/{id}/schema", get(get_raw_schema_by_id))
        .route("/schemas/ids/{id}/versions", get(get_schema_versions))
        .route(
            "/compatibility/subjects/{subject}/versions",
            post(check_all),
        )
        .route(
            "/compatibility/subjects/{subject}/versions/{version}",
            post(check_version),
        )
        .route("/config", get(get_global_config).put(put_global_config))
        .route(
            "/config/{subject}",
            get(get_subject_config)
                .put(put_subject_config)
                .delete(delete_subject_config),
        )
        .layer(axum::middleware::from_fn(count_requests))
        .with_state(state)
}

async fn count_requests(path: Option<MatchedPath>, req: Request, next: Next) -> Response {
    let method = req.method().to_string();
    let route = path
        .map(|p| p.as_str().to_string())
        .unwrap_or_else(|| "unmatched".into());
    let response = next.run(req).await;
    metrics::counter!(crate::metrics::REGISTRY_REQUESTS_TOTAL,
        "method" => method, "route" => route, "status" => response.status().as_u16().to_string())
    .increment(1);
    response
}

/// A Confluent-style error: `{"error_code": 40401, "message": "…"}`.
#[derive(Debug)]
pub struct ApiError {
    code: u32,
    message: String,
}

impl ApiError {
    fn new(code: u32, message: impl Into<String>) -> Self {
        Self {
            code,
            message: message.into(),
        }
    }
    fn subject_not_found(subject: &str) -> Self {
        Self::new(40401, format!("Subject '{subject}' not found."))
    }
    fn version_not_found(version: &str) -> Self {
        Self::new(40402, format!("Version {version} not found."))
    }
    fn schema_not_found() -> Self {
        Self::new(40403, "Schema not found")
    }
    fn invalid_schema(why: impl std::fmt::Display) -> Self {
        Self::new(42201, format!("Invalid schema: {why}"))
    }
    fn invalid_version(v: &str) -> Self {
        Self::new(
            42202,
            format!("The specified version '{v}' is not a valid version id. Allowed values are between [1, 2^31-1] and the string \"latest\""),
        )
    }
    fn invalid_level(level: &str) -> Self {
        Self::new(42203, format!("Invalid compatibility level: {level}. Valid values are none, backward, forward, full, backward_transitive, forward_transitive, and full_transitive"))
    }
    fn http_status(&self) -> StatusCode {
        let status = if self.code >= 10_000 {
            self.code / 100
        } else {
            self.code
        };
        StatusCode::from_u16(status as u16).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR)
    }
}

impl From<sqlx::Error> for ApiError {
    fn from(e: sqlx::Error) -> Self {
        tracing::error!(error = %e, "registry store error");
        Self::new(50001, format!("Error in the backend data store: {e}"))
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut resp = (
            self.http_status(),
            json!({"error_code": self.code, "message": self.message}).to_string(),
        )
            .into_response();
        resp.headers_mut()
            .insert(header::CONTENT_TYPE, HeaderValue::from_static(CONTENT_TYPE));
        resp
    }
}

type ApiResult = Result<Response, ApiError>;

fn reply(body: Value) -> Response {
    let mut resp = body.to_string().into_response();
    resp.headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static(CONTENT_TYPE));
    resp
}

/// Body of register / lookup / compatibility requests.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct SchemaRequest {
    schema: String,
    #[serde(default)]
    schema_type: Option<String>,
    #[serde(default)]
    references: Vec<Value>,
}

/// A schema parsed and normalized (parsed-then-serialized JSON, keeping
/// defaults, docs and logical types), so identical schemas share one id.
struct ParsedSchema {
    schema: Schema,
    normalized: String,
}

fn parse_request(body: &Bytes) -> Result<ParsedSchema, ApiError> {
    let req: SchemaRequest = serde_json::from_slice(body)
        .map_err(|e| ApiError::new(42201, format!("Invalid schema request body: {e}")))?;
    if let Some(t) = &req.schema_type {
        if !t.eq_ignore_ascii_case("AVRO") {
            return Err(ApiError::invalid_schema(format!(
                "schemaType {t} is not supported by this registry (AVRO only)"
            )));
        }
    }
    if !req.references.is_empty() {
        return Err(ApiError::invalid_schema(
            "schema references are not supported by this registry",
        ));
    }
    parse_schema(&req.schema).map_err(ApiError::invalid_schema)
}

fn parse_schema(text: &str) -> Result<ParsedSchema, String> {
    let schema = Schema::parse_str(text).map_err(|e| e.to_string())?;
    let normalized = serde_json::to_string(&schema).map_err(|e| e.to_string())?;
    Ok(ParsedSchema { schema, normalized })
}

/// `latest`, `-1`, or a version number ≥ 1.
enum VersionRef {
    Latest,
    Number(i32),
}

fn parse_version(v: &str) -> Result<VersionRef, ApiError> {
    if v == "latest" || v == "-1" {
        return Ok(VersionRef::Latest);
    }
    match v.parse::<i32>() {
        Ok(n) if n >= 1 => Ok(VersionRef::Number(n)),
        _ => Err(ApiError::invalid_version(v)),
    }
}

async fn live_versions(state: &AppState, subject: &str) -> Result<Vec<SubjectVersion>, ApiError> {
    let versions = state.store.versions(subject).await?;
    if versions.is_empty() {
        return Err(ApiError::subject_not_found(subject));
    }
    Ok(versions)
}

async fn find_version(
    state: &AppState,
    subject: &str,
    version: &str,
) -> Result<SubjectVersion, ApiError> {
    let wanted = parse_version(version)?;
    let versions = live_versions(state, subject).await?;
    let found = match wanted {
        VersionRef::Latest => versions.last().cloned(),
        VersionRef::Number(n) => versions.into_iter().find(|v| v.version == n),
    };
    found.ok_or_else(|| ApiError::version_not_found(version))
}

fn version_json(v: &SubjectVersion) -> Value {
    json!({"subject": v.subject, "version": v.version, "id": v.id, "schema": v.schema})
}

async fn list_subjects(State(state): State<AppState>) -> ApiResult {
    Ok(reply(json!(state.store.subjects().await?)))
}

async fn list_versions(State(state): State<AppState>, Path(subject): Path<String>) -> ApiResult {
    let versions = live_versions(&state, &subject).await?;
    Ok(reply(json!(versions
        .iter()
        .map(|v| v.version)
        .collect::<Vec<_>>())))
}

async fn get_version(
    State(state): State<AppState>,
    Path((subject, version)): Path<(String, String)>,
) -> ApiResult {
    Ok(reply(version_json(
        &find_version(&state, &subject, &version).await?,
    )))
}

async fn get_version_schema(
    State(state): State<AppState>,
    Path((subject, version)): Path<(String, String)>,
) -> ApiResult {
    let v = find_version(&state, &subject, &version).await?;
    Ok(reply_raw(v.schema))
}

fn reply_raw(schema: String) -> Response {
    let mut resp = schema.into_response();
    resp.headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static(CONTENT_TYPE));
    resp
}

async fn register(
    State(state): State<AppState>,
    Path(subject): Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> ApiResult {
    let parsed = parse_request(&body)?;
    let _guard = state.write_lock.lock().await;
    let versions = state.store.versions(&subject).await?;
    let fp = fingerprint(&parsed.normalized);
    if let Some(existing) = versions.iter().find(|v| fingerprint(&v.schema) == fp) {
        return Ok(reply(json!({"id": existing.id})));
    }
    state.authorize(&headers)?;
    let level = state.store.effective_level(&subject).await?;
    let problems = incompatibilities(level, &parsed.schema, &versions);
    if !problems.is_empty() {
        return Err(ApiError::new(
            409,
            format!(
                "Schema being registered is incompatible with an earlier schema for subject \"{subject}\", details: [{}]",
                problems.join(", ")
            ),
        ));
    }
    let (id, version) = state
        .store
        .insert_version(&subject, &parsed.normalized)
        .await?;
    tracing::info!(%subject, id, version, "schema registered");
    Ok(reply(json!({"id": id})))
}

fn incompatibilities(level: Level, new: &Schema, versions: &[SubjectVersion]) -> Vec<String> {
    let earlier: Vec<(i32, Schema)> = versions
        .iter()
        .filter_map(|v| Schema::parse_str(&v.schema).ok().map(|s| (v.version, s)))
        .collect();
    compat::check(level, new, &earlier)
}

async fn lookup(
    State(state): State<AppState>,
    Path(subject): Path<String>,
    body: Bytes,
) -> ApiResult {
    let parsed = parse_request(&body)?;
    let versions = live_versions(&state, &subject).await?;
    let fp = fingerprint(&parsed.normalized);
    versions
        .iter()
        .find(|v| fingerprint(&v.schema) == fp)
        .map(|v| reply(version_json(v)))
        .ok_or_else(ApiError::schema_not_found)
}

#[derive(Deserialize, Default)]
struct DeleteParams {
    #[serde(default)]
    permanent: bool,
}

async fn delete_subject(
    State(state): State<AppState>,
    Path(subject): Path<String>,
    Query(params): Query<DeleteParams>,
    headers: HeaderMap,
) -> ApiResult {
    state.authorize(&headers)?;
    let _guard = state.write_lock.lock().await;
    let deleted = state
        .store
        .delete_subject(&subject, params.permanent)
        .await?;
    if deleted.is_empty() {
        return Err(ApiError::subject_not_found(&subject));
    }
    Ok(reply(json!(deleted)))
}

async fn delete_version(
    State(state): State<AppState>,
    Path((subject, version)): Path<(String, String)>,
    headers: HeaderMap,
) -> ApiResult {
    state.authorize(&headers)?;
    let _guard = state.write_lock.lock().await;
    let v = find_version(&state, &subject, &version).await?;
    state.store.delete_version(&subject, v.version).await?;
    Ok(reply(json!(v.version)))
}

async fn get_schema_by_id(State(state): State<AppState>, Path(id): Path<String>) -> ApiResult {
    let id: i32 = id.parse().map_err(|_| ApiError::schema_not_found())?;
    let (kind, text) = state
        .store
        .schema_by_id(id)
        .await?
        .ok_or_else(ApiError::schema_not_found)?;
    let mut body = json!({"schema": text});
    if kind != "AVRO" {
        body["schemaType"] = json!(kind);
    }
    Ok(reply(body))
}

async fn get_raw_schema_by_id(State(state): State<AppState>, Path(id): Path<String>) -> ApiResult {
    let id: i32 = id.parse().map_err(|_| ApiError::schema_not_found())?;
    let (_, text) = state
        .store
        .schema_by_id(id)
        .await?
        .ok_or_else(ApiError::schema_not_found)?;
    Ok(reply_raw(text))
}

async fn get_schema_versions(State(state): State<AppState>, Path(id): Path<String>) -> ApiResult {
    let id: i32 = id.parse().map_err(|_| ApiError::schema_not_found())?;
    if state.store.schema_by_id(id).await?.is_none() {
        return Err(ApiError::schema_not_found());
    }
    let list: Vec<Value> = state
        .store
        .versions_of_schema(id)
        .await?
        .into_iter()
        .map(|(subject, version)| json!({"subject": subject, "version": version}))
        .collect();
    Ok(reply(json!(list)))
}

#[derive(Deserialize, Default)]
struct CompatParams {
    #[serde(default)]
    verbose: bool,
}

fn compat_reply(problems: Vec<String>, verbose: bool) -> Response {
    let mut body = json!({"is_compatible": problems.is_empty()});
    if verbose {
        body["messages"] = json!(problems);
    }
    reply(body)
}

async fn check_version(
    State(state): State<AppState>,
    Path((subject, version)): Path<(String, String)>,
    Query(params): Query<CompatParams>,
    body: Bytes,
) -> ApiResult {
    let parsed = parse_request(&body)?;
    let wanted = parse_version(&version)?;
    let versions = state.store.versions(&subject).await?;
    if versions.is_empty() {
        return match wanted {
            // A new subject accepts any first schema.
            VersionRef::Latest => Ok(compat_reply(Vec::new(), params.verbose)),
            VersionRef::Number(_) => Err(ApiError::subject_not_found(&subject)),
        };
    }
    let target = match wanted {
        VersionRef::Latest => versions.last(),
        VersionRef::Number(n) => versions.iter().find(|v| v.version == n),
    }
    .ok_or_else(|| ApiError::version_not_found(&version))?;
    // Against one version: the level's direction, without transitivity.
    let level = match state.store.effective_level(&subject).await? {
        Level::BackwardTransitive => Level::Backward,
        Level::ForwardTransitive => Level::Forward,
        Level::FullTransitive => Level::Full,
        other => other,
    };
    let problems = incompatibilities(level, &parsed.schema, std::slice::from_ref(target));
    Ok(compat_reply(problems, params.verbose))
}

async fn check_all(
    State(state): State<AppState>,
    Path(subject): Path<String>,
    Query(params): Query<CompatParams>,
    body: Bytes,
) -> ApiResult {
    let parsed = parse_request(&body)?;
    let versions = state.store.versions(&subject).await?;
    let level = state.store.effective_level(&subject).await?;
    let problems = incompatibilities(level, &parsed.schema, &versions);
    Ok(compat_reply(problems, params.verbose))
}

#[derive(Deserialize)]
struct ConfigBody {
    compatibility: String,
}

fn parse_config_body(body: &Bytes) -> Result<Level, ApiError> {
    let req: ConfigBody = serde_json::from_slice(body)
        .map_err(|e| ApiError::new(42203, format!("Invalid config request body: {e}")))?;
    req.compatibility
        .parse()
        .map_err(|_| ApiError::invalid_level(&req.compatibility))
}

async fn get_global_config(State(state): State<AppState>) -> ApiResult {
    let level = state.store.global_level().await?;
    Ok(reply(json!({"compatibilityLevel": level.as_str()})))
}

async fn put_global_config(
    State(state): State<AppState>,
    headers: HeaderMap,
    body: Bytes,
) -> ApiResult {
    state.authorize(&headers)?;
    let level = parse_config_body(&body)?;
    state.store.set_level(None, level).await?;
    Ok(reply(json!({"compatibility": level.as_str()})))
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase")]
struct ConfigParams {
    #[serde(default)]
    default_to_global: bool,
}

async fn get_subject_config(
    State(state): State<AppState>,
    Path(subject): Path<String>,
    Query(params): Query<ConfigParams>,
) -> ApiResult {
    let level = match state.store.subject_level(&subject).await? {
        Some(l) => l,
        None if params.default_to_global => state.store.global_level().await?,
        None => {
            return Err(ApiError::new(
                40408,
                format!("Subject '{subject}' does not have subject-level compatibility configured"),
            ))
        }
    };
    Ok(reply(json!({"compatibilityLevel": level.as_str()})))
}

async fn put_subject_config(
    State(state): State<AppState>,
    Path(subject): Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> ApiResult {
    state.authorize(&headers)?;
    let level = parse_config_body(&body)?;
    state.store.set_level(Some(&subject), level).await?;
    Ok(reply(json!({"compatibility": level.as_str()})))
}

async fn delete_subject_config(
    State(state): State<AppState>,
    Path(subject): Path<String>,
    headers: HeaderMap,
) -> ApiResult {
    state.authorize(&headers)?;
    match state.store.clear_level(&subject).await? {
        Some(old) => Ok(reply(json!({"compatibilityLevel": old.as_str()}))),
        None => Err(ApiError::subject_not_found(&subject)),
    }
}
