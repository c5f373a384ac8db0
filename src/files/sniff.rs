//! The content type of an upload, from its first bytes (never the
//! client's word): a small table of the formats people send, as browsers
//! and Tinode's server sniff them. Anything else is text when it is UTF-8
//! without control characters, else opaque bytes.

/// How many leading bytes [`content_type`] looks at.
pub const SNIFF_BYTES: usize = 512;

const OCTET_STREAM: &str = "application/octet-stream";

/// Signatures: (offset, bytes, type). Checked in order.
const SIGNATURES: &[(usize, &[u8], &str)] = &[
    (0, b"\x89PNG\r\n\x1a\n", "image/png"),
    (0, b"\xff\xd8\xff", "image/jpeg"),
    (0, b"GIF87a", "image/gif"),
    (0, b"GIF89a", "image/gif"),
    (0, b"%PDF-", "application/pdf"),
    (0, b"PK\x03\x04", "application/zip"),
    (0, b"OggS", "audio/ogg"),
    (0, b"ID3", "audio/mpeg"),
    (0, b"fLaC", "audio/flac"),
    (0, b"\x1a\x45\xdf\xa3", "video/webm"),
    (0, b"BM", "image/bmp"),
];

/// The content type `head` (the upload's first [`SNIFF_BYTES`]) shows.
pub fn content_type(head: &[u8]) -> &'static str {
    for (offset, magic, kind) in SIGNATURES {
        if head.len() >= offset + magic.len() && &head[*offset..offset + magic.len()] == *magic {
            return kind;
        }
    }
    // RIFF containers: WEBP images, WAVE sound.
    if head.len() >= 12 && &head[..4] == b"RIFF" {
        match &head[8..12] {
            b"WEBP" => return "image/webp",
            b"WAVE" => return "audio/wav",
            _ => return OCTET_STREAM,
        }
    }
    // ISO media (`ftyp` box at 4): MP4 and its kin.
    if head.len() >= 12 && &head[4..8] == b"ftyp" {
        return match &head[8..12] {
            b"M4A " => "audio/mp4",
            b"qt  " => "video/quicktime",
            _ => "video/mp4",
        };
    }
    if is_text(head) {
        return "text/plain; charset=utf-8";
    }
    OCTET_STREAM
}

/// UTF-8 (a character cut at the end of `head` allowed) without control
/// characters other than whitespace.
fn is_text(head: &[u8]) -> bool {
    if head.is_empty() {
        return false;
    }
    let valid = match std::str::from_utf8(head) {
        Ok(s) => s,
        Err(e) if e.error_len().is_none() => {
            std::str::from_utf8(&head[..e.valid_up_to()]).unwrap_or_default()
        }
        Err(_) => return false,
    };
    !valid
        .chars()
        .any(|c| c.is_control() && !matches!(c, '\n' | '\r' | '\t' | '\x0c'))
}

/// Whether a browser may show this type inline (pictures, sound, video):
/// everything else is served as an attachment.
pub fn shown_inline(content_type: &str) -> bool {
    ["image/", "audio/", "video/"]
        .iter()
        .any(|p| content_type.starts_with(p))
        && content_type != "image/svg+xml"
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_are_told_by_their_bytes() {
        assert_eq!(content_type(b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR"), "image/png");
        assert_eq!(content_type(b"\xff\xd8\xff\xe0\0\x10JFIF"), "image/jpeg");
        assert_eq!(content_type(b"%PDF-1.7\n"), "application/pdf");
        assert_eq!(content_type(b"RIFF\0\0\0\0WEBPVP8 "), "image/webp");
        assert_eq!(content_type(b"\0\0\0\x18ftypmp42\0\0\0\0"), "video/mp4");
        assert_eq!(content_type(b"GIF89a\x01\0"), "image/gif");
    }

    #[test]
    fn a_lying_name_or_type_changes_nothing_and_html_is_text() {
        // HTML (or SVG) never becomes a type a browser would run.
        assert_eq!(
            content_type(b"<html><script>alert(1)</script>"),
            "text/plain; charset=utf-8"
        );
        assert_eq!(
            content_type(b"<svg onload=alert(1)>"),
            "text/plain; charset=utf-8"
        );
        assert_eq!(
            content_type(b"\0\x01\x02binary"),
            "application/octet-stream"
        );
        assert_eq!(content_type(b""), "application/octet-stream");
        // A multi-byte character cut by the sniff window is still text.
        let mut t = "aé".repeat(200).into_bytes();
        t.truncate(SNIFF_BYTES.min(t.len()) - 1);
        assert_eq!(content_type(&t), "text/plain; charset=utf-8");
    }

    #[test]
    fn only_media_is_shown_inline() {
        assert!(shown_inline("image/png"));
        assert!(shown_inline("video/mp4"));
        assert!(!shown_inline("image/svg+xml"));
        assert!(!shown_inline("application/pdf"));
        assert!(!shown_inline("text/plain; charset=utf-8"));
    }
}
