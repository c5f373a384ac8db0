//! The embedded schema registry speaks the Confluent REST API: shapes,
//! content type and error codes, checked over HTTP against MariaDB.

mod common;

use serde_json::{json, Value};

use common::World;

struct Http {
    base: String,
    client: reqwest::Client,
}

impl Http {
    fn new(world: &World) -> Self {
        Self {
            base: world.registry_url().to_string(),
            client: reqwest::Client::new(),
        }
    }

    async fn call(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<Value>,
    ) -> (u16, Value, String) {
        let mut req = self
            .client
            .request(method, format!("{}{}", self.base, path));
        if let Some(b) = body {
            req = req
                .header("content-type", "application/vnd.schemaregistry.v1+json")
                .body(b.to_string());
        }
        let resp = req.send().await.expect("request");
        let status = resp.status().as_u16();
        let ctype = resp
            .headers()
            .get("content-type")
            .map(|v| v.to_str().unwrap().to_string())
            .unwrap_or_default();
        let text = resp.text().await.unwrap();
        let json = serde_json::from_str(&text).unwrap_or(Value::String(text));
        (status, json, ctype)
    }

    async fn get(&self, path: &str) -> (u16, Value) {
        let (s, v, _) = self.call(reqwest::Method::GET, path, None).await;
        (s, v)
    }
    async fn post(&self, path: &str, body: Value) -> (u16, Value) {
        let (s, v, _) = self.call(reqwest::Method::POST, path, Some(body)).await;
        (s, v)
    }
    async fn put(&self, path: &str, body: Value) -> (u16, Value) {
        let (s, v, _) = self.call(reqwest::Method::PUT, path, Some(body)).await;
        (s, v)
    }
    async fn delete(&self, path: &str) -> (u16, Value) {
        let (s, v, _) = self.call(reqwest::Method::DELETE, path, None).await;
        (s, v)
    }
}

fn record(fields: Value) -> String {
    json!({"type": "record", "name": "Thing", "namespace": "t", "fields": fields}).to_string()
}

#[tokio::test]
async fn register_fetch_and_lookup_follow_confluent_shapes() {
    let world = World::with_registry().await;
    let http = Http::new(&world);
    let subject = format!("s{}-value", world.id);
    let v1 = record(json!([{"name": "a", "type": "long"}]));

    let (status, body, ctype) = http
        .call(
            reqwest::Method::POST,
            &format!("/subjects/{subject}/versions"),
            Some(json!({"schema": v1})),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(ctype, "application/vnd.schemaregistry.v1+json");
    let id = body["id"].as_i64().expect("id");

    // The same schema again, even with different whitespace: same id.
    let spaced = v1.replace(',', " ,  ");
    let (_, again) = http
        .post(
            &format!("/subjects/{subject}/versions"),
            json!({"schema": spaced}),
        )
        .await;
    assert_eq!(again["id"].as_i64(), Some(id));
    // Under another subject: the same global id.
    let (_, other) = http
        .post(
            &format!("/subjects/o{}-value/versions", world.id),
            json!({"schema": v1}),
        )
        .await;
    assert_eq!(other["id"].as_i64(), Some(id));

    let (status, versions) = http.get(&format!("/subjects/{subject}/versions")).await;
    assert_eq!((status, versions), (200, json!([1])));

    let (_, latest) = http
        .get(&format!("/subjects/{subject}/versions/latest"))
        .await;
    assert_eq!(latest["subject"], json!(subject));
    assert_eq!(latest["version"], json!(1));
    assert_eq!(latest["id"].as_i64(), Some(id));
    let stored: Value = serde_json::from_str(latest["schema"].as_str().unwrap()).unwrap();
    assert_eq!(stored["name"], json!("Thing"));

    let (_, raw) = http
        .get(&format!("/subjects/{subject}/versions/1/schema"))
        .await;
    assert_eq!(raw["fields"][0]["name"], json!("a"));

    let (status, by_id) = http.get(&format!("/schemas/ids/{id}")).await;
    assert_eq!(status, 200);
    assert_eq!(by_id["schema"], latest["schema"]);

    let (status, found) = http
        .post(&format!("/subjects/{subject}"), json!({"schema": v1}))
        .await;
    assert_eq!(status, 200);
    assert_eq!(found["version"], json!(1));
    assert_eq!(found["id"].as_i64(), Some(id));

    let (_, subjects) = http.get("/subjects").await;
    assert!(subjects.as_array().unwrap().contains(&json!(subject)));
}

#[tokio::test]
async fn errors_carry_confluent_codes() {
    let world = World::with_registry().await;
    let http = Http::new(&world);
    let subject = format!("e{}-value", world.id);

    let (status, body) = http.get(&format!("/subjects/{subject}/versions")).await;
    assert_eq!(
        (status, body["error_code"].as_i64()),
        (404, Some(40401)),
        "{body}"
    );

    let v1 = record(json!([{"name": "a", "type": "long"}]));
    http.post(
        &format!("/subjects/{subject}/versions"),
        json!({"schema": v1}),
    )
    .await;

    let (status, body) = http.get(&format!("/subjects/{subject}/versions/7")).await;
    assert_eq!(
        (status, body["error_code"].as_i64()),
        (404, Some(40402)),
        "{body}"
    );

    let (status, body) = http
        .get(&format!("/subjects/{subject}/versions/zero"))
        .await;
    assert_eq!(
        (status, body["error_code"].as_i64()),
        (422, Some(42202)),
        "{body}"
    );

    let (status, body) = http.get("/schemas/ids/999999").await;
    assert_eq!(
        (status, body["error_code"].as_i64()),
        (404, Some(40403)),
        "{body}"
    );

    let other = record(json!([{"name": "zzz", "type": "string"}]));
    let (status, body) = http
        .post(&format!("/subjects/{subject}"), json!({"schema": other}))
        .await;
    assert_eq!(
        (status, body["error_code"].as_i64()),
        (404, Some(40403)),
        "{body}"
    );

    let (status, body) = http
        .post(
            &format!("/subjects/{subject}/versions"),
            json!({"schema": "{\"type\": \"recrod\"}"}),
        )
        .await;
    assert_eq!(
        (status, body["error_code"].as_i64()),
        (422, Some(42201)),
        "{body}"
    );

    let (status, body) = http
        .put("/config", json!({"compatibility": "SIDEWAYS"}))
        .await;
    assert_eq!(
        (status, body["error_code"].as_i64()),
        (422, Some(42203)),
        "{body}"
    );
}

#[tokio::test]
async fn incompatible_schema_is_refused_with_409_naming_the_field() {
    let world = World::with_registry().await;
    let http = Http::new(&world);
    let subject = format!("c{}-value", world.id);

    let (_, cfg) = http.get("/config").await;
    assert_eq!(cfg["compatibilityLevel"], json!("BACKWARD_TRANSITIVE"));

    let v1 = record(json!([{"name": "a", "type": "long"}]));
    let (_, first) = http
        .post(
            &format!("/subjects/{subject}/versions"),
            json!({"schema": v1}),
        )
        .await;

    // Adding a field without a default: refused.
    let added =
        record(json!([{"name": "a", "type": "long"}, {"name": "needs_default", "type": "string"}]));
    let (status, body) = http
        .post(
            &format!("/subjects/{subject}/versions"),
            json!({"schema": added}),
        )
        .await;
    assert_eq!(status, 409, "{body}");
    assert_eq!(body["error_code"].as_i64(), Some(409));
    assert!(
        body["message"].as_str().unwrap().contains("needs_default"),
        "{body}"
    );

    let (_, verdict) = http
        .post(
            &format!("/compatibility/subjects/{subject}/versions/latest?verbose=true"),
            json!({"schema": added}),
        )
        .await;
    assert_eq!(verdict["is_compatible"], json!(false));
    assert!(
        verdict["messages"].to_string().contains("needs_default"),
        "{verdict}"
    );

    // With a default: accepted as version 2.
    let ok = record(
        json!([{"name": "a", "type": "long"}, {"name": "b", "type": "string", "default": ""}]),
    );
    let (_, verdict) = http
        .post(
            &format!("/compatibility/subjects/{subject}/versions/latest"),
            json!({"schema": ok}),
        )
        .await;
    assert_eq!(verdict, json!({"is_compatible": true}));
    let (status, second) = http
        .post(
            &format!("/subjects/{subject}/versions"),
            json!({"schema": ok}),
        )
        .await;
    assert_eq!(status, 200);
    assert_ne!(second["id"], first["id"]);

    // Removing field `a` (no default) breaks FORWARD: refused once the
    // subject asks for FULL_TRANSITIVE, allowed under NONE.
    let (status, _) = http
        .put(
            &format!("/config/{subject}"),
            json!({"compatibility": "FULL_TRANSITIVE"}),
        )
        .await;
    assert_eq!(status, 200);
    let (_, level) = http.get(&format!("/config/{subject}")).await;
    assert_eq!(level["compatibilityLevel"], json!("FULL_TRANSITIVE"));
    let removed = record(json!([{"name": "b", "type": "string", "default": ""}]));
    let (status, body) = http
        .post(
            &format!("/subjects/{subject}/versions"),
            json!({"schema": removed}),
        )
        .await;
    assert_eq!(status, 409, "{body}");
    assert!(
        body["message"].as_str().unwrap().contains("\"a\""),
        "{body}"
    );
    http.put(
        &format!("/config/{subject}"),
        json!({"compatibility": "NONE"}),
    )
    .await;
    let (status, _) = http
        .post(
            &format!("/subjects/{subject}/versions"),
            json!({"schema": removed}),
        )
        .await;
    assert_eq!(status, 200);
    let (_, versions) = http.get(&format!("/subjects/{subject}/versions")).await;
    assert_eq!(versions, json!([1, 2, 3]));
}

#[tokio::test]
async fn config_and_delete() {
    let world = World::with_registry().await;
    let http = Http::new(&world);
    let subject = format!("d{}-value", world.id);

    let (status, body) = http.get(&format!("/config/{subject}")).await;
    assert_eq!(
        (status, body["error_code"].as_i64()),
        (404, Some(40408)),
        "{body}"
    );
    let (_, body) = http
        .get(&format!("/config/{subject}?defaultToGlobal=true"))
        .await;
    assert_eq!(body["compatibilityLevel"], json!("BACKWARD_TRANSITIVE"));
    let (status, body) = http.put("/config", json!({"compatibility": "full"})).await;
    assert_eq!((status, body), (200, json!({"compatibility": "FULL"})));
    let (_, body) = http.get("/config").await;
    assert_eq!(body["compatibilityLevel"], json!("FULL"));

    let v1 = record(json!([{"name": "a", "type": "long"}]));
    http.post(
        &format!("/subjects/{subject}/versions"),
        json!({"schema": v1}),
    )
    .await;
    let (status, deleted) = http.delete(&format!("/subjects/{subject}")).await;
    assert_eq!((status, deleted), (200, json!([1])));
    let (status, body) = http.get(&format!("/subjects/{subject}/versions")).await;
    assert_eq!((status, body["error_code"].as_i64()), (404, Some(40401)));
    let (status, body) = http.delete(&format!("/subjects/{subject}")).await;
    assert_eq!((status, body["error_code"].as_i64()), (404, Some(40401)));
    // Versions keep counting after a soft delete, as Confluent's do.
    http.post(
        &format!("/subjects/{subject}/versions"),
        json!({"schema": v1}),
    )
    .await;
    let (_, versions) = http.get(&format!("/subjects/{subject}/versions")).await;
    assert_eq!(versions, json!([2]));
}
