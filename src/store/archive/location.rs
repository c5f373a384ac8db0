//! Where month archives live: an object store and a prefix, through the
//! `object_store` crate. A plain path (`archive`, `/srv/im-archive`) or a
//! `file://` URL is the local filesystem; `s3://bucket/prefix`,
//! `gs://bucket/prefix` and `az://container/prefix` (and the https forms
//! `object_store` knows) are S3-compatible, GCS and Azure stores, configured
//! from the usual environment (`AWS_*`, `GOOGLE_*`, `AZURE_*`) and then from
//! `shards.archive_options` (e.g. `aws_endpoint`, `aws_allow_http`).

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;

use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreScheme};

use crate::store::month::ShardMonth;

#[derive(Debug, thiserror::Error)]
pub enum LocationError {
    #[error("archive location {0:?}: {1}")]
    Invalid(String, String),
    #[error("archive location {0:?}: {1}")]
    Store(String, object_store::Error),
}

/// An archive root: every tenant's months are below it.
#[derive(Clone)]
pub struct ArchiveLocation {
    store: Arc<dyn ObjectStore>,
    prefix: Path,
    /// The root as configured, for messages.
    shown: String,
    /// The local filesystem: an object's path is `/<its key>`.
    local: bool,
}

impl fmt::Debug for ArchiveLocation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ArchiveLocation({})", self.shown)
    }
}

impl fmt::Display for ArchiveLocation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.shown)
    }
}

impl ArchiveLocation {
    /// Parses a path or URL (no I/O: a store is reached on first use).
    pub fn parse(
        root: &str,
        options: &BTreeMap<String, String>,
    ) -> Result<ArchiveLocation, LocationError> {
        let invalid = |why: String| LocationError::Invalid(root.to_string(), why);
        if root.is_empty() {
            return Err(invalid("empty".into()));
        }
        if !root.contains("://") {
            return Self::local(root, std::path::Path::new(root));
        }
        let url = url::Url::parse(root).map_err(|e| invalid(e.to_string()))?;
        let (scheme, path) = ObjectStoreScheme::parse(&url).map_err(|e| invalid(e.to_string()))?;
        let store_err = |e| LocationError::Store(root.to_string(), e);
        let store: Arc<dyn ObjectStore> = match scheme {
            ObjectStoreScheme::Local => {
                let dir = url
                    .to_file_path()
                    .map_err(|()| invalid("not a local path".into()))?;
                return Self::local(root, &dir);
            }
            ObjectStoreScheme::Memory => Arc::new(object_store::memory::InMemory::new()),
            ObjectStoreScheme::AmazonS3 => {
                let mut b = object_store::aws::AmazonS3Builder::from_env().with_url(root);
                for (k, v) in options {
                    let key = k.parse().map_err(|e| invalid(format!("option {k}: {e}")))?;
                    b = b.with_config(key, v);
                }
                Arc::new(b.build().map_err(store_err)?)
            }
            ObjectStoreScheme::GoogleCloudStorage => {
                let mut b = object_store::gcp::GoogleCloudStorageBuilder::from_env().with_url(root);
                for (k, v) in options {
                    let key = k.parse().map_err(|e| invalid(format!("option {k}: {e}")))?;
                    b = b.with_config(key, v);
                }
                Arc::new(b.build().map_err(store_err)?)
            }
            ObjectStoreScheme::MicrosoftAzure => {
                let mut b = object_store::azure::MicrosoftAzureBuilder::from_env().with_url(root);
                for (k, v) in options {
                    let key = k.parse().map_err(|e| invalid(format!("option {k}: {e}")))?;
                    b = b.with_config(key, v);
                }
                Arc::new(b.build().map_err(store_err)?)
            }
            other => return Err(invalid(format!("unsupported scheme {other:?}"))),
        };
        Ok(ArchiveLocation {
            store,
            prefix: path,
            shown: root.to_string(),
            local: false,
        })
    }

    /// The local filesystem under `dir` (made absolute; not touched until
    /// an object is written, which creates the folders).
    fn local(root: &str, dir: &std::path::Path) -> Result<ArchiveLocation, LocationError> {
        let invalid = |why: String| LocationError::Invalid(root.to_string(), why);
        let dir = std::path::absolute(dir).map_err(|e| invalid(e.to_string()))?;
        let prefix = Path::from_absolute_path(&dir).map_err(|e| invalid(e.to_string()))?;
        Ok(ArchiveLocation {
            store: Arc::new(object_store::local::LocalFileSystem::new()),
            prefix,
            shown: root.to_string(),
            local: true,
        })
    }

    /// The file an object of the local filesystem is (`None` elsewhere).
    pub fn local_file(&self, key: &Path) -> Option<std::path::PathBuf> {
        self.local
            .then(|| std::path::PathBuf::from(format!("/{}", key.as_ref())))
    }

    /// The location `shards.archive_url` (or the older `archive_dir`) names.
    pub fn from_config(
        shards: &crate::config::ShardsConfig,
    ) -> Result<ArchiveLocation, LocationError> {
        Self::parse(shards.archive_root(), &shards.archive_options)
    }

    pub fn store(&self) -> &Arc<dyn ObjectStore> {
        &self.store
    }

    /// `<prefix>/<tenant>/<YYYYMM>/<name>`.
    pub fn object(&self, tenant: &str, month: ShardMonth, name: &str) -> Path {
        let mut parts: Vec<object_store::path::PathPart<'_>> = self.prefix.parts().collect();
        parts.push(tenant.into());
        parts.push(month.to_string().into());
        parts.push(name.into());
        Path::from_iter(parts)
    }

    /// `<prefix>/<part>/<part>/…` (a files store's object).
    pub fn path(&self, parts: &[&str]) -> Path {
        let mut all: Vec<object_store::path::PathPart<'_>> = self.prefix.parts().collect();
        all.extend(parts.iter().map(|p| object_store::path::PathPart::from(*p)));
        Path::from_iter(all)
    }

    /// How a month's folder is shown: the root, tenant and month.
    pub fn month_shown(&self, tenant: &str, month: ShardMonth) -> String {
        format!("{}/{tenant}/{month}", self.shown.trim_end_matches('/'))
    }
}
