//! HTTP `Range` of a download (RFC 9110 §14): one byte range, served as
//! `206`; a range past the end is `416`; several ranges or a malformed
//! header are ignored and the whole file is served (`200`), as the RFC
//! allows.

/// What a `Range` header asks of a file of `len` bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ranged {
    /// The whole file.
    Whole,
    /// Bytes `start..end` (end exclusive).
    Part { start: u64, end: u64 },
    /// Nothing satisfiable (`416`).
    Unsatisfiable,
}

/// `header` (absent: the whole file) against a file of `len` bytes.
pub fn parse(header: Option<&str>, len: u64) -> Ranged {
    let Some(spec) = header.and_then(|h| h.trim().strip_prefix("bytes=")) else {
        return Ranged::Whole;
    };
    if spec.contains(',') {
        return Ranged::Whole;
    }
    let Some((first, last)) = spec.trim().split_once('-') else {
        return Ranged::Whole;
    };
    let number = |s: &str| -> Option<u64> {
        (!s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()))
            .then(|| s.parse().ok())
            .flatten()
    };
    match (first.trim(), last.trim()) {
        ("", suffix) => match number(suffix) {
            Some(0) => Ranged::Unsatisfiable,
            Some(_) if len == 0 => Ranged::Unsatisfiable,
            Some(n) => Ranged::Part {
                start: len.saturating_sub(n),
                end: len,
            },
            None => Ranged::Whole,
        },
        (start, "") => match number(start) {
            Some(s) if s < len => Ranged::Part { start: s, end: len },
            Some(_) => Ranged::Unsatisfiable,
            None => Ranged::Whole,
        },
        (start, end) => match (number(start), number(end)) {
            (Some(s), Some(e)) if s <= e => {
                if s >= len {
                    Ranged::Unsatisfiable
                } else {
                    Ranged::Part {
                        start: s,
                        end: e.saturating_add(1).min(len),
                    }
                }
            }
            _ => Ranged::Whole,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_range_is_served_and_the_rest_is_the_whole_file() {
        assert_eq!(parse(None, 10), Ranged::Whole);
        assert_eq!(
            parse(Some("bytes=0-3"), 10),
            Ranged::Part { start: 0, end: 4 }
        );
        assert_eq!(
            parse(Some("bytes=5-"), 10),
            Ranged::Part { start: 5, end: 10 }
        );
        assert_eq!(
            parse(Some("bytes=-3"), 10),
            Ranged::Part { start: 7, end: 10 }
        );
        assert_eq!(
            parse(Some("bytes=-30"), 10),
            Ranged::Part { start: 0, end: 10 }
        );
        assert_eq!(
            parse(Some("bytes=8-100"), 10),
            Ranged::Part { start: 8, end: 10 }
        );
        assert_eq!(parse(Some("bytes=10-"), 10), Ranged::Unsatisfiable);
        assert_eq!(parse(Some("bytes=10-12"), 10), Ranged::Unsatisfiable);
        assert_eq!(parse(Some("bytes=-0"), 10), Ranged::Unsatisfiable);
        assert_eq!(parse(Some("bytes=0-1,3-4"), 10), Ranged::Whole);
        assert_eq!(parse(Some("bytes=4-2"), 10), Ranged::Whole);
        assert_eq!(parse(Some("bytes=a-b"), 10), Ranged::Whole);
        assert_eq!(parse(Some("items=0-1"), 10), Ranged::Whole);
        assert_eq!(
            parse(Some("bytes=18446744073709551615-"), 10),
            Ranged::Unsatisfiable
        );
        assert_eq!(
            parse(Some("bytes=99999999999999999999999-"), 10),
            Ranged::Whole
        );
    }
}
