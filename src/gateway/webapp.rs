//! The Tinode web app (npm `tinode-webapp`) served at `/` when
//! `gateway.webapp_dir` names the folder `npm ci --prefix webapp` installed
//! into. Its `index.html` loads React, ReactDOM, react-intl, qrcodejs and
//! fonts from public CDNs; the copy served here points each of those at the
//! same npm package installed next to it (`/vendor/<name>@<version>/…`), so
//! the page makes no request off this origin. A small script injected into
//! the page points the app at the gateway that served it.
//!
//! Caching: `/vendor/<name>@<version>/…` never changes under its URL
//! (immutable for a year); the app's own files (`umd/*.prod.js` and the rest
//! keep their names across versions) and the page revalidate every time
//! (`no-cache` with an `ETag`).

use std::collections::HashMap;
use std::path::{Component, Path, PathBuf};
use std::sync::Arc;

use anyhow::{bail, Context};
use axum::body::Body;
use axum::extract::State;
use axum::http::{header, HeaderMap, HeaderValue, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};

/// The npm package of the app itself.
const APP_PACKAGE: &str = "tinode-webapp";

/// Packages the page may load from `/vendor/` (what its index.html names
/// on CDNs), each installed by webapp/package.json.
const VENDORED: &[&str] = &[
    "react",
    "react-dom",
    "react-intl",
    "qrcodejs",
    "@fontsource/roboto",
    "material-icons",
];

/// Points the app at the gateway that served the page: the app takes its
/// server from `settings.serverAddress` in localStorage, else from the
/// page's host (but `localhost` means `localhost:6060` to it).
const CONFIG_SCRIPT: &str = r#"// imstream: the web app talks to the gateway that served this page.
(function () {
  try {
    var s = JSON.parse(localStorage.getItem('settings') || 'null') || {};
    if (s.serverAddress !== location.host) {
      s.serverAddress = location.host;
      localStorage.setItem('settings', JSON.stringify(s));
    }
  } catch (e) { /* no storage: the app falls back to the page's host */ }
})();
"#;

const CONFIG_SCRIPT_PATH: &str = "/imstream-config.js";

/// What the app's pages may load and do: everything from this origin only
/// (its own files, `/vendor/…`, the gateway's WebSocket: CSP 3's `'self'`
/// covers `ws:`/`wss:` of the same host), images and media also from
/// `data:` and `blob:` URLs the app makes itself (avatars, previews), no
/// inline or `eval`'d script, no plugins, no framing by another origin.
pub const CONTENT_SECURITY_POLICY: &str = "default-src 'self'; script-src 'self'; \
style-src 'self'; img-src 'self' data: blob:; media-src 'self' data: blob:; \
font-src 'self' data:; connect-src 'self'; worker-src 'self'; manifest-src 'self'; \
object-src 'none'; base-uri 'self'; form-action 'self'; frame-ancestors 'self'";

/// Adds the browser hardening headers to every answer of the web app
/// (pages, files, and their 404s): the policy above, no framing by another
/// origin for browsers without `frame-ancestors`, no referrer sent off the
/// page, and no content-type sniffing.
pub async fn harden(mut response: Response) -> Response {
    let headers = response.headers_mut();
    for (name, value) in [
        (
            header::CONTENT_SECURITY_POLICY,
            HeaderValue::from_static(CONTENT_SECURITY_POLICY),
        ),
        (
            header::X_FRAME_OPTIONS,
            HeaderValue::from_static("SAMEORIGIN"),
        ),
        (
            header::REFERRER_POLICY,
            HeaderValue::from_static("no-referrer"),
        ),
        (
            header::X_CONTENT_TYPE_OPTIONS,
            HeaderValue::from_static("nosniff"),
        ),
    ] {
        headers.insert(name, value);
    }
    response
}

const IMMUTABLE: &str = "public, max-age=31536000, immutable";
const REVALIDATE: &str = "no-cache";

/// The loaded app: its folder, the vendored packages' folders by
/// `name@version`, and the rewritten page.
pub struct WebApp {
    app_dir: PathBuf,
    vendor: HashMap<String, PathBuf>,
    index: Arc<str>,
    index_etag: String,
}

impl WebApp {
    /// Loads the app installed under `dir` (`<dir>/node_modules/…`) and
    /// rewrites its page. Fails, naming what is missing, when the install is
    /// incomplete or the page loads something from another origin that is
    /// not mapped here.
    pub fn load(dir: &Path) -> anyhow::Result<WebApp> {
        let modules = dir.join("node_modules");
        let app_dir = modules.join(APP_PACKAGE);
        let index_path = app_dir.join("index.html");
        let page = std::fs::read_to_string(&index_path).with_context(|| {
            format!(
                "gateway.webapp_dir = {:?}: cannot read {} (install the web app: npm ci --prefix webapp)",
                dir.display(),
                index_path.display()
            )
        })?;
        let mut vendor = HashMap::new();
        let mut versions = HashMap::new();
        for name in VENDORED {
            let pkg = modules.join(name);
            let version = package_version(&pkg).with_context(|| {
                format!(
                    "gateway.webapp_dir = {:?}: package {name} is not installed (npm ci --prefix webapp)",
                    dir.display()
                )
            })?;
            vendor.insert(format!("{name}@{version}"), pkg);
            versions.insert(name.to_string(), version);
        }
        let index = rewrite_index(&page, &versions, |name, version, path| {
            vendor
                .get(&format!("{name}@{version}"))
                .map(|d| d.join(path).is_file())
                .unwrap_or(false)
        })?;
        let index_etag = format!("\"{:x}\"", fnv1a(index.as_bytes()));
        Ok(WebApp {
            app_dir,
            vendor,
            index: Arc::from(index),
            index_etag,
        })
    }
}

/// The `version` of an installed npm package.
fn package_version(dir: &Path) -> anyhow::Result<String> {
    let text = std::fs::read_to_string(dir.join("package.json"))?;
    let json: serde_json::Value = serde_json::from_str(&text)?;
    json.get("version")
        .and_then(|v| v.as_str())
        .map(str::to_string)
        .context("package.json has no version")
}

/// The page with every CDN reference replaced by its local copy.
/// `has_file(name, version, path)` says whether a vendored file exists; a
/// CDN file name ending in `.min.js` that the package ships only
/// unminified (react-intl's iife, qrcodejs) is served unminified.
fn rewrite_index(
    page: &str,
    versions: &HashMap<String, String>,
    has_file: impl Fn(&str, &str, &str) -> bool,
) -> anyhow::Result<String> {
    let mut out = String::with_capacity(page.len() + 1024);
    for line in page.lines() {
        let trimmed = line.trim();
        let Some(url) = external_url(trimmed) else {
            if trimmed == r#"<script src="firebase-init.js"></script>"# {
                // Push needs a Firebase project imstream does not have; the
                // app checks `typeof FIREBASE_INIT` and does without.
                out.push_str(&format!("<script src=\"{CONFIG_SCRIPT_PATH}\"></script>\n"));
            } else {
                out.push_str(line);
                out.push('\n');
            }
            continue;
        };
        if trimmed.starts_with("<meta") || trimmed.contains(r#"rel="canonical""#) {
            // Not fetched (metadata); the canonical link names tinode.co.
            if trimmed.starts_with("<meta") {
                out.push_str(line);
                out.push('\n');
            }
            continue;
        }
        if url.contains("polyfill") {
            // Intl.Segmenter, built into every current browser.
            continue;
        }
        if let Some(weights) = url.strip_prefix("https://fonts.googleapis.com/css?family=Roboto:") {
            let version = &versions["@fontsource/roboto"];
            for w in weights.split(',') {
                let file = match w.strip_suffix('i') {
                    Some(w) => format!("{w}-italic.css"),
                    None => format!("{w}.css"),
                };
                if !has_file("@fontsource/roboto", version, &file) {
                    bail!("index.html asks for Roboto {w}, which @fontsource/roboto@{version} lacks ({file})");
                }
                out.push_str(&format!(
                    "<link rel=\"stylesheet\" href=\"/vendor/@fontsource/roboto@{version}/{file}\" />\n"
                ));
            }
            continue;
        }
        if url == "https://fonts.googleapis.com/icon?family=Material+Icons" {
            let version = &versions["material-icons"];
            out.push_str(&format!(
                "<link rel=\"stylesheet\" href=\"/vendor/material-icons@{version}/iconfont/material-icons.css\" />\n"
            ));
            continue;
        }
        if let Some(rest) = url.strip_prefix("https://cdn.jsdelivr.net/npm/") {
            let (spec, path) = rest
                .split_once('/')
                .with_context(|| format!("index.html loads {url}: no file in the URL"))?;
            let (name, version) = spec
                .rsplit_once('@')
                .with_context(|| format!("index.html loads {url}: no version in the URL"))?;
            let installed = versions.get(name).with_context(|| {
                format!("index.html loads {url}; {name} is not one of the vendored packages")
            })?;
            if installed != version {
                bail!("index.html loads {name}@{version}, but {name}@{installed} is installed (fix webapp/package.json)");
            }
            let path = if has_file(name, version, path) {
                path.to_string()
            } else {
                let unminified = path.replace(".min.js", ".js");
                if !has_file(name, version, &unminified) {
                    bail!("index.html loads {url}; {name}@{version} ships neither {path} nor {unminified}");
                }
                unminified
            };
            let local = format!("/vendor/{name}@{version}/{path}");
            out.push_str(
                &line
                    .replace(url, &local)
                    .replace(r#"crossorigin="anonymous" "#, ""),
            );
            out.push('\n');
            continue;
        }
        bail!("index.html loads {url}, which imstream does not serve locally");
    }
    Ok(out)
}

/// The off-origin URL a `src`/`href` attribute of this line names, if any.
fn external_url(line: &str) -> Option<&str> {
    for attr in ["src=\"", "href=\"", "content=\""] {
        if let Some(start) = line.find(attr) {
            let rest = &line[start + attr.len()..];
            let end = rest.find('"')?;
            let url = &rest[..end];
            if url.starts_with("http://") || url.starts_with("https://") || url.starts_with("//") {
                return Some(url);
            }
        }
    }
    None
}

/// Serves a GET or HEAD below `/`: the page, the config script, a vendored
/// file or one of the app's files. Anything else is 404.
pub async fn serve(
    State(app): State<Arc<WebApp>>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
) -> Response {
    if method != Method::GET && method != Method::HEAD {
        return (StatusCode::NOT_FOUND, "not found").into_response();
    }
    let path = uri.path();
    if path == "/" || path == "/index.html" {
        return respond(
            &headers,
            &method,
            app.index.as_bytes().to_vec(),
            "text/html; charset=utf-8",
            REVALIDATE,
            &app.index_etag,
        );
    }
    if path == CONFIG_SCRIPT_PATH {
        let etag = format!("\"{:x}\"", fnv1a(CONFIG_SCRIPT.as_bytes()));
        return respond(
            &headers,
            &method,
            CONFIG_SCRIPT.as_bytes().to_vec(),
            "text/javascript; charset=utf-8",
            REVALIDATE,
            &etag,
        );
    }
    let (file, cache) = match path.strip_prefix("/vendor/") {
        Some(rest) => match vendored_file(&app, rest) {
            Some(f) => (f, IMMUTABLE),
            None => return (StatusCode::NOT_FOUND, "not found").into_response(),
        },
        None => match safe_join(&app.app_dir, path.trim_start_matches('/')) {
            Some(f) => (f, REVALIDATE),
            None => return (StatusCode::NOT_FOUND, "not found").into_response(),
        },
    };
    let Ok(meta) = tokio::fs::metadata(&file).await else {
        return (StatusCode::NOT_FOUND, "not found").into_response();
    };
    if !meta.is_file() {
        return (StatusCode::NOT_FOUND, "not found").into_response();
    }
    let modified = meta
        .modified()
        .ok()
        .and_then(|m| m.duration_since(std::time::UNIX_EPOCH).ok())
        .map_or(0, |d| d.as_nanos());
    let etag = format!("\"{:x}-{:x}\"", meta.len(), modified);
    match tokio::fs::read(&file).await {
        Ok(body) => respond(&headers, &method, body, content_type(&file), cache, &etag),
        Err(e) => {
            tracing::warn!(file = %file.display(), error = %e, "web app file unreadable");
            (StatusCode::INTERNAL_SERVER_ERROR, "file unreadable").into_response()
        }
    }
}

/// `/vendor/<name>@<version>/<path>` (scoped names have one more segment).
fn vendored_file(app: &WebApp, rest: &str) -> Option<PathBuf> {
    let (spec, path) = if rest.starts_with('@') {
        let slash = rest.find('/')?;
        let second = rest[slash + 1..].find('/')? + slash + 1;
        (&rest[..second], &rest[second + 1..])
    } else {
        rest.split_once('/')?
    };
    safe_join(app.vendor.get(spec)?, path)
}

/// `root/path` when `path` is a plain relative path (no `..`, no absolute
/// or odd components): nothing outside `root` is ever served.
fn safe_join(root: &Path, path: &str) -> Option<PathBuf> {
    if path.is_empty() || path.contains('\\') || path.contains('\0') {
        return None;
    }
    let rel = Path::new(path);
    if !rel.components().all(|c| matches!(c, Component::Normal(_))) {
        return None;
    }
    Some(root.join(rel))
}

fn respond(
    headers: &HeaderMap,
    method: &Method,
    body: Vec<u8>,
    content_type: &str,
    cache: &'static str,
    etag: &str,
) -> Response {
    let fresh = headers
        .get(header::IF_NONE_MATCH)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.split(',').any(|t| t.trim() == etag || t.trim() == "*"));
    let mut builder = Response::builder()
        .header(header::CACHE_CONTROL, cache)
        .header(header::ETAG, etag)
        .header("x-content-type-options", "nosniff");
    if fresh {
        return builder
            .status(StatusCode::NOT_MODIFIED)
            .body(Body::empty())
            .expect("static response");
    }
    builder = builder
        .status(StatusCode::OK)
        .header(header::CONTENT_TYPE, content_type)
        .header(header::CONTENT_LENGTH, body.len());
    let body = if method == Method::HEAD {
        Body::empty()
    } else {
        Body::from(body)
    };
    builder.body(body).expect("static response")
}

/// The content type of a served file, by extension.
fn content_type(path: &Path) -> &'static str {
    match path.extension().and_then(|e| e.to_str()).unwrap_or("") {
        "html" => "text/html; charset=utf-8",
        "js" => "text/javascript; charset=utf-8",
        "css" => "text/css; charset=utf-8",
        "json" | "map" => "application/json",
        "webmanifest" => "application/manifest+json",
        "png" => "image/png",
        "jpg" | "jpeg" => "image/jpeg",
        "svg" => "image/svg+xml",
        "ico" => "image/x-icon",
        "woff2" => "font/woff2",
        "woff" => "font/woff",
        "ttf" => "font/ttf",
        "m4a" => "audio/mp4",
        "txt" => "text/plain; charset=utf-8",
        _ => "application/octet-stream",
    }
}

/// FNV-1a, for the page's ETag (not a security boundary).
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const PAGE: &str = r#"<head>
<meta name="og:url" content="https://web.tinode.co/">
<link rel="canonical" href="https://web.tinode.co/" />
<link rel="stylesheet" href="https://fonts.googleapis.com/css?family=Roboto:300,400i" />
<link rel="stylesheet" href="https://fonts.googleapis.com/icon?family=Material+Icons" />
<link rel="stylesheet" href="css/base.min.css" />
<script crossorigin="anonymous" src="https://polyfill-fastly.io/v3/polyfill.min.js?features=Intl.Segmenter"></script>
<script crossorigin="anonymous" src="https://cdn.jsdelivr.net/npm/react@18.3.1/umd/react.production.min.js"></script>
<script crossorigin="anonymous" src="https://cdn.jsdelivr.net/npm/react-intl@7.1.6/react-intl.iife.min.js"></script>
<script src="firebase-init.js"></script>
</head>"#;

    fn versions() -> HashMap<String, String> {
        [
            ("react", "18.3.1"),
            ("react-intl", "7.1.6"),
            ("@fontsource/roboto", "5.3.0"),
            ("material-icons", "1.13.14"),
        ]
        .into_iter()
        .map(|(a, b)| (a.to_string(), b.to_string()))
        .collect()
    }

    #[test]
    fn every_cdn_reference_becomes_local() {
        let page =
            rewrite_index(PAGE, &versions(), |_, _, path| !path.contains("iife.min")).unwrap();
        for line in page.lines().filter(|l| !l.starts_with("<meta")) {
            assert!(external_url(line).is_none(), "{line}");
        }
        assert!(page.contains(r#"href="/vendor/@fontsource/roboto@5.3.0/300.css""#));
        assert!(page.contains(r#"href="/vendor/@fontsource/roboto@5.3.0/400-italic.css""#));
        assert!(page.contains("/vendor/material-icons@1.13.14/iconfont/material-icons.css"));
        assert!(page.contains(r#"src="/vendor/react@18.3.1/umd/react.production.min.js""#));
        assert!(page.contains(r#"src="/vendor/react-intl@7.1.6/react-intl.iife.js""#));
        assert!(page.contains(r#"<script src="/imstream-config.js"></script>"#));
        assert!(!page.contains("polyfill") && !page.contains("canonical"));
    }

    #[test]
    fn unknown_or_mismatched_cdn_packages_are_refused() {
        let other = PAGE.replace("react@18.3.1", "react@19.0.0");
        let err = rewrite_index(&other, &versions(), |_, _, _| true).unwrap_err();
        assert!(err.to_string().contains("react@19.0.0"), "{err}");
        let unknown = format!("{PAGE}\n<script src=\"https://example.com/x.js\"></script>");
        let err = rewrite_index(&unknown, &versions(), |_, _, _| true).unwrap_err();
        assert!(err.to_string().contains("example.com"), "{err}");
    }

    #[test]
    fn paths_stay_inside_their_folder() {
        let root = Path::new("/srv/app");
        assert_eq!(
            safe_join(root, "umd/index.prod.js"),
            Some(PathBuf::from("/srv/app/umd/index.prod.js"))
        );
        for bad in ["../secret", "umd/../../x", "/etc/passwd", "a\\b", ""] {
            assert_eq!(safe_join(root, bad), None, "{bad}");
        }
    }
}
