//! Where uploaded files' bytes live: an object store (the local
//! filesystem, S3, GCS or Azure, as month archives are configured:
//! [`crate::store::archive::location::ArchiveLocation`]), one folder per
//! tenant and user: `<root>/<tenant>/<uid>/<file id>`. Uploads stream in
//! parts, never held whole in memory; downloads stream out, by range.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use bytes::BytesMut;
use futures::StreamExt;
use object_store::path::Path;
use object_store::{GetOptions, GetRange, MultipartUpload, ObjectStore, PutPayload};

use crate::config::FilesConfig;
use crate::store::archive::location::{ArchiveLocation, LocationError};

use super::FileId;

/// Bytes each uploaded part carries (S3's smallest part is 5 MiB).
const PART_BYTES: usize = 5 * 1024 * 1024;

/// The files' object store.
#[derive(Clone, Debug)]
pub struct FileStore {
    location: ArchiveLocation,
    /// Longest one call to the store may take (`files.store_timeout_secs`):
    /// a store that is down is answered as such, not waited for.
    timeout: Duration,
}

/// `op`, or a timeout error once `limit` has passed.
async fn bounded<T>(
    limit: Duration,
    op: impl std::future::Future<Output = Result<T, object_store::Error>>,
) -> Result<T, object_store::Error> {
    tokio::time::timeout(limit, op).await.unwrap_or_else(|_| {
        Err(object_store::Error::Generic {
            store: "files",
            source: format!("no answer within {} s", limit.as_secs()).into(),
        })
    })
}

/// A download's bytes.
pub type ByteStream = futures::stream::BoxStream<'static, Result<Bytes, object_store::Error>>;

impl FileStore {
    pub fn from_config(files: &FilesConfig) -> Result<FileStore, LocationError> {
        Ok(FileStore {
            location: ArchiveLocation::parse(&files.store_url, &files.store_options)?,
            timeout: Duration::from_secs(files.store_timeout_secs.max(1)),
        })
    }

    /// The object of `uploader`'s file `id` in `tenant`.
    pub fn key(&self, tenant: &str, uploader: i64, id: &FileId) -> Path {
        self.location
            .path(&[tenant, &uploader.to_string(), id.as_str()])
    }

    /// Where the scanner's check sample is written for a webhook to read
    /// ([`super::scan::Scanner::check`]): beside the tenants' folders.
    pub fn check_key(&self) -> Path {
        self.location.path(&["_scanner", "check.txt"])
    }

    /// Writes a small object whole.
    pub async fn put_small(
        &self,
        key: &Path,
        bytes: &'static [u8],
    ) -> Result<(), object_store::Error> {
        bounded(
            self.timeout,
            self.store().put(key, PutPayload::from_static(bytes)),
        )
        .await
        .map(|_| ())
    }

    fn store(&self) -> &Arc<dyn ObjectStore> {
        self.location.store()
    }

    /// Starts writing `key`: parts go out as they fill.
    pub async fn writer(&self, key: &Path) -> Result<Upload, object_store::Error> {
        let upload = bounded(self.timeout, self.store().put_multipart(key)).await?;
        Ok(Upload {
            upload,
            part: BytesMut::new(),
            written: 0,
            timeout: self.timeout,
        })
    }

    /// Bytes `start..end` of `key` (the whole object when `None`).
    pub async fn read(
        &self,
        key: &Path,
        range: Option<(u64, u64)>,
    ) -> Result<ByteStream, object_store::Error> {
        let options = GetOptions {
            range: range.map(|(start, end)| GetRange::Bounded(start..end)),
            ..Default::default()
        };
        let got = bounded(self.timeout, self.store().get_opts(key, options)).await?;
        Ok(got.into_stream().boxed())
    }

    /// Removes `key` (gone already is fine).
    pub async fn delete(&self, key: &Path) -> Result<(), object_store::Error> {
        match bounded(self.timeout, self.store().delete(key)).await {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
            Err(e) => Err(e),
        }
    }
}

impl FileStore {
    /// Removes what an upload cut short (its gateway killed) may have left
    /// beside `key`: the local filesystem stages parts as `<key>#<n>`
    /// files. (An S3 store's incomplete multipart uploads are for the
    /// bucket's lifecycle rule: no record names them.)
    pub fn discard_staged(&self, key: &Path) {
        let Some(file) = self.location.local_file(key) else {
            return;
        };
        let (Some(dir), Some(name)) = (file.parent(), file.file_name().and_then(|n| n.to_str()))
        else {
            return;
        };
        let staged = format!("{name}#");
        for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
            if entry
                .file_name()
                .to_str()
                .is_some_and(|n| n.starts_with(&staged))
            {
                if let Err(e) = std::fs::remove_file(entry.path()) {
                    tracing::warn!(path = %entry.path().display(), error = %e, "a staged part was not removed");
                }
            }
        }
    }
}

/// An upload being written. It holds one part's buffer, allocated once
/// and reused for every part (the client waits while a full part is sent):
/// a large upload costs the gateway one part, not the file, and not a
/// fresh allocation per part for the allocator to keep.
pub struct Upload {
    upload: Box<dyn MultipartUpload>,
    part: BytesMut,
    written: u64,
    timeout: Duration,
}

impl Upload {
    /// Adds `chunk`, sending each part as it fills.
    pub async fn write(&mut self, mut chunk: &[u8]) -> Result<(), object_store::Error> {
        while !chunk.is_empty() {
            if self.part.capacity() == 0 {
                self.part.reserve(PART_BYTES);
            }
            let take = (PART_BYTES - self.part.len()).min(chunk.len());
            self.part.extend_from_slice(&chunk[..take]);
            self.written += take as u64;
            chunk = &chunk[take..];
            if self.part.len() == PART_BYTES {
                self.send_part().await?;
            }
        }
        Ok(())
    }

    /// Sends the buffered bytes as the next part, then takes the buffer
    /// back for the next one (a store still holding it costs a new one).
    async fn send_part(&mut self) -> Result<(), object_store::Error> {
        let sent = std::mem::take(&mut self.part).freeze();
        let put = self.upload.put_part(PutPayload::from_bytes(sent.clone()));
        bounded(self.timeout, put).await?;
        if let Ok(mut buffer) = sent.try_into_mut() {
            buffer.clear();
            self.part = buffer;
        }
        Ok(())
    }

    /// Bytes written so far.
    pub fn written(&self) -> u64 {
        self.written
    }

    /// Sends what is left and completes the object.
    pub async fn finish(mut self) -> Result<(), object_store::Error> {
        if !self.part.is_empty() {
            if let Err(e) = self.send_part().await {
                self.abort().await;
                return Err(e);
            }
        }
        bounded(self.timeout, self.upload.complete())
            .await
            .map(|_| ())
    }

    /// Gives the object up (parts already sent are discarded by the store).
    pub async fn abort(mut self) {
        if let Err(e) = bounded(self.timeout, self.upload.abort()).await {
            tracing::warn!(error = %e, "an abandoned upload's parts were not discarded");
        }
    }
}
