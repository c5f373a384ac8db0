//! A stored file's id and its address: 128 random bits in lowercase
//! base32 (26 characters, nothing to guess from), served at
//! `/v0/file/s/<id>` (Tinode's download path; an extension after the id is
//! allowed and ignored, as Tinode's clients add one). Relative, since the
//! web app authenticates only relative addresses.

use rand::RngCore;

/// The path files are served under.
pub const DOWNLOAD_PREFIX: &str = "/v0/file/s/";

const ALPHABET: &[u8; 32] = b"abcdefghijklmnopqrstuvwxyz234567";
const LEN: usize = 26;

/// A stored file's id.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct FileId(String);

impl FileId {
    /// A new random id.
    pub fn random() -> FileId {
        let mut bytes = [0u8; 16];
        rand::thread_rng().fill_bytes(&mut bytes);
        let mut bits: u32 = 0;
        let mut held = 0;
        let mut out = String::with_capacity(LEN);
        for b in bytes {
            bits = (bits << 8) | b as u32;
            held += 8;
            while held >= 5 {
                held -= 5;
                out.push(ALPHABET[((bits >> held) & 31) as usize] as char);
            }
        }
        if held > 0 {
            out.push(ALPHABET[((bits << (5 - held)) & 31) as usize] as char);
        }
        FileId(out)
    }

    /// An id as written (exactly 26 characters of the alphabet; nothing
    /// else names a file, so no case or encoding variant does).
    pub fn parse(s: &str) -> Option<FileId> {
        (s.len() == LEN && s.bytes().all(|b| ALPHABET.contains(&b))).then(|| FileId(s.to_string()))
    }

    /// The id in the path after [`DOWNLOAD_PREFIX`]: `<id>` or
    /// `<id>.<ext>` (ext: up to 8 ASCII letters or digits).
    pub fn from_path_tail(tail: &str) -> Option<FileId> {
        let (id, ext) = match tail.split_once('.') {
            Some((id, ext)) => (id, Some(ext)),
            None => (tail, None),
        };
        if let Some(ext) = ext {
            if ext.is_empty() || ext.len() > 8 || !ext.bytes().all(|b| b.is_ascii_alphanumeric()) {
                return None;
            }
        }
        FileId::parse(id)
    }

    /// The file a message or profile refers to by `reference`: this
    /// server's relative download address (a query string allowed, as the
    /// app adds its credentials to it); anything else is not ours.
    pub fn from_reference(reference: &str) -> Option<FileId> {
        let path = reference.split(['?', '#']).next()?;
        FileId::from_path_tail(path.strip_prefix(DOWNLOAD_PREFIX)?)
    }

    /// Its download address.
    pub fn url(&self) -> String {
        format!("{DOWNLOAD_PREFIX}{}", self.0)
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Display for FileId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn random_ids_are_26_characters_and_parse_back() {
        let mut seen = std::collections::HashSet::new();
        for _ in 0..1000 {
            let id = FileId::random();
            assert_eq!(id.as_str().len(), LEN);
            assert_eq!(FileId::parse(id.as_str()), Some(id.clone()));
            assert_eq!(FileId::from_reference(&id.url()), Some(id.clone()));
            assert!(seen.insert(id));
        }
    }

    #[test]
    fn only_the_exact_spelling_names_a_file() {
        let id = FileId::random();
        let s = id.as_str();
        assert_eq!(
            FileId::from_path_tail(&format!("{s}.png")),
            Some(id.clone())
        );
        assert_eq!(
            FileId::from_reference(&format!("/v0/file/s/{s}.jpeg?apikey=x&auth=token&secret=y")),
            Some(id.clone())
        );
        for bad in [
            s.to_uppercase(),
            format!("{s}a"),
            s[1..].to_string(),
            format!("{s}."),
            format!("{s}.p/ng"),
            format!("{s}.toolongext"),
            format!("..%2F{s}"),
            format!("{}%61", &s[..25]),
        ] {
            assert_eq!(FileId::from_path_tail(&bad), None, "{bad}");
        }
        assert_eq!(
            FileId::from_reference(&format!("https://evil.example/v0/file/s/{s}")),
            None
        );
        assert_eq!(
            FileId::from_reference(&format!("/v0/file/s/../s/{s}")),
            None
        );
    }
}
