//! Name variants an attacker tries instead of a target's real name: every
//! letter-case variant (a seeded sample for long names), Unicode
//! look-alikes, invisible and trailing characters, and percent-encodings;
//! for one-to-one topics, the uid pairs whose topic names differ from the
//! victims' only in letter case (the same base64 rule as
//! `imstream::tinode::p2p_topic`, searched over small flips).

use std::collections::BTreeSet;

use super::rng::Rng;

/// One way of naming a target.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Variant {
    /// What kind of variant (`exact`, `case`, `cyrillic`, `percent`, ...).
    pub kind: &'static str,
    /// The name as a client puts it in JSON or a WebSocket message.
    pub name: String,
    /// The name as it goes into one URL path segment.
    pub path: String,
}

impl Variant {
    pub fn raw(kind: &'static str, name: String) -> Variant {
        let path = encode_segment(&name);
        Variant { kind, name, path }
    }

    /// A variant that is only a way of writing the path (its JSON form is
    /// the literal text, another name again).
    pub fn encoded(kind: &'static str, path: String) -> Variant {
        Variant {
            kind,
            name: path.clone(),
            path,
        }
    }

    pub fn is_exact(&self) -> bool {
        self.kind == "exact"
    }
}

/// Percent-encodes every byte of `s` that is not unreserved (RFC 3986).
pub fn encode_segment(s: &str) -> String {
    let mut out = String::new();
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// Every name that differs from `name` only in the case of ASCII letters,
/// `name` excluded: all of them when there are at most `2^max_bits`, else
/// a seeded sample of `sample` (always with the all-lower and all-upper
/// forms).
pub fn case_variants(name: &str, rng: &mut Rng, max_bits: u32, sample: usize) -> Vec<String> {
    let letters: Vec<usize> = name
        .char_indices()
        .filter(|(_, c)| c.is_ascii_alphabetic())
        .map(|(i, _)| i)
        .collect();
    let flip = |mask: u64| -> String {
        let mut bytes = name.as_bytes().to_vec();
        for (bit, &i) in letters.iter().enumerate() {
            if mask >> bit & 1 == 1 {
                bytes[i] = if bytes[i].is_ascii_uppercase() {
                    bytes[i].to_ascii_lowercase()
                } else {
                    bytes[i].to_ascii_uppercase()
                };
            }
        }
        String::from_utf8(bytes).expect("ASCII flips keep UTF-8")
    };
    let mut out = BTreeSet::new();
    if letters.len() as u32 <= max_bits {
        for mask in 1..(1u64 << letters.len()) {
            out.insert(flip(mask));
        }
    } else {
        out.insert(name.to_ascii_lowercase());
        out.insert(name.to_ascii_uppercase());
        let full = if letters.len() >= 64 {
            u64::MAX
        } else {
            (1u64 << letters.len()) - 1
        };
        let mut tries = 0;
        while out.len() < sample + 2 && tries < sample * 20 {
            tries += 1;
            let mask = rng.next_u64() & full;
            if mask != 0 {
                out.insert(flip(mask));
            }
        }
    }
    out.remove(name);
    out.into_iter().collect()
}

/// Latin letters and digits with a look-alike elsewhere in Unicode.
fn lookalikes(c: char) -> Vec<(&'static str, char)> {
    let cyrillic = match c {
        'a' => Some('а'),
        'c' => Some('с'),
        'e' => Some('е'),
        'o' => Some('о'),
        'p' => Some('р'),
        'r' => Some('г'),
        'x' => Some('х'),
        'y' => Some('у'),
        'i' => Some('і'),
        'A' => Some('А'),
        'B' => Some('В'),
        'C' => Some('С'),
        'E' => Some('Е'),
        'H' => Some('Н'),
        'K' => Some('К'),
        'M' => Some('М'),
        'O' => Some('О'),
        'P' => Some('Р'),
        'T' => Some('Т'),
        'X' => Some('Х'),
        _ => None,
    };
    let accented = match c {
        'a' => Some('á'),
        'e' => Some('é'),
        'i' => Some('í'),
        'o' => Some('ö'),
        'u' => Some('ü'),
        'n' => Some('ñ'),
        'c' => Some('ç'),
        'A' => Some('Á'),
        'E' => Some('É'),
        'O' => Some('Ö'),
        'U' => Some('Ü'),
        _ => None,
    };
    // Letters whose Unicode case folding is an ASCII letter.
    let folding = match c {
        'K' | 'k' => Some('\u{212A}'), // KELVIN SIGN
        's' | 'S' => Some('\u{017F}'), // LATIN SMALL LETTER LONG S
        'i' => Some('\u{0131}'),       // dotless i
        'I' => Some('\u{0130}'),       // I with dot above
        _ => None,
    };
    let fullwidth = c
        .is_ascii_graphic()
        .then(|| char::from_u32(c as u32 - 0x21 + 0xFF01))
        .flatten();
    [
        ("cyrillic", cyrillic),
        ("accent", accented),
        ("case-folding", folding),
        ("fullwidth", fullwidth),
    ]
    .into_iter()
    .filter_map(|(k, l)| l.map(|l| (k, l)))
    .collect()
}

/// Unicode look-alikes, invisible characters, padding and encodings of
/// `name` (one or two of each kind, positions seeded).
pub fn spelling_variants(name: &str, rng: &mut Rng) -> Vec<Variant> {
    let chars: Vec<char> = name.chars().collect();
    let mut out: Vec<Variant> = Vec::new();
    // One look-alike per kind at a seeded position, and one in the first
    // three letters (`grp`, `p2p`, `usr`: the prefix that decides the kind).
    let mut by_kind: std::collections::BTreeMap<&'static str, Vec<usize>> = Default::default();
    for (i, c) in chars.iter().enumerate() {
        for (kind, _) in lookalikes(*c) {
            by_kind.entry(kind).or_default().push(i);
        }
    }
    for (kind, positions) in &by_kind {
        let mut chosen: BTreeSet<usize> = BTreeSet::new();
        chosen.insert(*rng.pick(positions));
        if let Some(p) = positions.iter().find(|p| **p < 3) {
            chosen.insert(*p);
        }
        for p in chosen {
            let mut v = chars.clone();
            let (_, l) = lookalikes(v[p])
                .into_iter()
                .find(|(k, _)| k == kind)
                .expect("listed");
            v[p] = l;
            out.push(Variant::raw(kind, v.into_iter().collect()));
        }
    }
    // The whole name in fullwidth forms (NFKC maps it back to ASCII).
    let wide: String = chars
        .iter()
        .map(|c| {
            c.is_ascii_graphic()
                .then(|| char::from_u32(*c as u32 - 0x21 + 0xFF01))
                .flatten()
                .unwrap_or(*c)
        })
        .collect();
    out.push(Variant::raw("fullwidth", wide));
    // A combining accent, invisible characters (ignorable in Unicode
    // collations) and padding.
    let at = 1 + rng.below(chars.len().saturating_sub(1).max(1));
    for (kind, insert) in [
        ("combining", "\u{0301}"),
        ("zero-width", "\u{200B}"),
        ("soft-hyphen", "\u{00AD}"),
        ("bom", "\u{FEFF}"),
    ] {
        let mut v: String = chars[..at].iter().collect();
        v.push_str(insert);
        v.extend(&chars[at..]);
        out.push(Variant::raw(kind, v));
    }
    for (kind, v) in [
        ("trailing-space", format!("{name} ")),
        ("trailing-spaces", format!("{name}   ")),
        ("leading-space", format!(" {name}")),
        ("trailing-tab", format!("{name}\t")),
        ("trailing-newline", format!("{name}\n")),
        ("trailing-nbsp", format!("{name}\u{00A0}")),
        ("trailing-nul", format!("{name}\0")),
    ] {
        out.push(Variant::raw(kind, v));
    }
    // Encodings of the same bytes, which a path decodes back to the name
    // (the server must see the real name then, no other), and encodings
    // that smuggle a separator or double-encode.
    let first = chars[0];
    let rest: String = chars[1..].iter().collect();
    out.push(Variant::encoded(
        "percent-first",
        format!("%{:02X}{}", first as u32, encode_segment(&rest)),
    ));
    out.push(Variant::encoded(
        "percent-first-lowerhex",
        format!("%{:02x}{}", first as u32, encode_segment(&rest)),
    ));
    out.push(Variant::encoded(
        "percent-all",
        name.bytes().map(|b| format!("%{b:02X}")).collect(),
    ));
    out.push(Variant::encoded(
        "double-encoded",
        format!("%25{:02X}{}", first as u32, encode_segment(&rest)),
    ));
    out.push(Variant::encoded(
        "encoded-slash",
        format!("{}%2F..%2F{}", encode_segment(name), encode_segment(name)),
    ));
    out.push(Variant::encoded(
        "encoded-dot-segment",
        format!("%2E%2E%2F{}", encode_segment(name)),
    ));
    out.push(Variant::encoded(
        "encoded-nul",
        format!("{}%00", encode_segment(name)),
    ));
    out
}

/// The variants of a topic name: exact, every case variant (a sample of
/// `case_sample` when there are more than 2^`max_bits`), and the spelling
/// variants.
pub fn topic_variants(
    name: &str,
    rng: &mut Rng,
    max_bits: u32,
    case_sample: usize,
) -> Vec<Variant> {
    let mut out = vec![Variant::raw("exact", name.to_string())];
    out.extend(
        case_variants(name, rng, max_bits, case_sample)
            .into_iter()
            .map(|n| Variant::raw("case", n)),
    );
    out.extend(spelling_variants(name, rng));
    out
}

/// Ways of writing user `uid` in a path (`{peer}`, `{uid}`): the number,
/// `usr<uid>` and spellings of both.
pub fn uid_variants(uid: i64, rng: &mut Rng) -> Vec<Variant> {
    let n = uid.to_string();
    let mut out = vec![
        Variant::raw("exact", n.clone()),
        Variant::raw("usr", format!("usr{n}")),
        Variant::raw("case", format!("USR{n}")),
        Variant::raw("case", format!("Usr{n}")),
        Variant::raw("leading-zero", format!("0{n}")),
        Variant::raw("leading-zero", format!("usr00{n}")),
        Variant::raw("plus-sign", format!("+{n}")),
        Variant::raw("negative", format!("-{n}")),
        Variant::raw("decimal", format!("{n}.0")),
        Variant::raw("exponent", format!("{}e{}", &n[..1], n.len() - 1)),
        Variant::raw(
            "fullwidth",
            n.chars()
                .map(|c| char::from_u32(c as u32 - 0x30 + 0xFF10).unwrap())
                .collect(),
        ),
        Variant::raw(
            "arabic-indic",
            n.chars()
                .map(|c| char::from_u32(c as u32 - 0x30 + 0x0660).unwrap())
                .collect(),
        ),
        Variant::raw("wraps-u64", (uid as i128 + (1i128 << 64)).to_string()),
        Variant::raw("wraps-u32", (uid + (1i64 << 32)).to_string()),
        Variant::raw("trailing-space", format!("{n} ")),
        Variant::raw("leading-space", format!(" {n}")),
        Variant::raw("trailing-nul", format!("{n}\0")),
        Variant::encoded(
            "percent-all",
            n.bytes().map(|b| format!("%{b:02X}")).collect(),
        ),
        Variant::encoded("encoded-slash", format!("{n}%2F..%2F{n}")),
    ];
    out.extend(
        spelling_variants(&format!("usr{n}"), rng)
            .into_iter()
            .filter(|v| v.kind != "fullwidth"),
    );
    out
}

/// The p2p topic name of two uids (Tinode's rule, as the server computes it).
pub fn p2p_topic(a: i64, b: i64) -> String {
    imstream::tinode::p2p_topic(a, b)
}

/// Pairs of users whose one-to-one topic name differs from `topic` only in
/// letter case: every way of flipping up to `max_flips` letters that is
/// still a canonical p2p name, with both uids at most `max_uid`.
pub fn p2p_case_pairs(topic: &str, max_flips: usize, max_uid: i64) -> Vec<(i64, i64)> {
    let body = topic.strip_prefix("p2p").expect("a p2p topic");
    let letters: Vec<usize> = body
        .char_indices()
        .filter(|(_, c)| c.is_ascii_alphabetic())
        .map(|(i, _)| i)
        .collect();
    let mut found = BTreeSet::new();
    // Every set of at most `max_flips` letters, as ascending index lists.
    let mut stack: Vec<Vec<usize>> = (0..letters.len()).map(|k| vec![k]).collect();
    while let Some(chosen) = stack.pop() {
        let mut bytes = body.as_bytes().to_vec();
        for &k in &chosen {
            bytes[letters[k]] ^= 0x20;
        }
        let candidate = format!("p2p{}", String::from_utf8(bytes).expect("ASCII"));
        if let Some((lo, hi)) = imstream::tinode::parse_p2p_topic(&candidate) {
            if hi <= max_uid && candidate != topic {
                found.insert((lo, hi));
            }
        }
        if chosen.len() < max_flips {
            let last = *chosen.last().expect("not empty");
            for k in last + 1..letters.len() {
                let mut next = chosen.clone();
                next.push(k);
                stack.push(next);
            }
        }
    }
    found.into_iter().collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_issue_pair_is_found_by_search() {
        let victims = p2p_topic(1105, 1200);
        assert_eq!(victims, "p2pUQQAAAAAAACwBAAAAAAAAA");
        let pairs = p2p_case_pairs(&victims, 3, 1 << 31);
        assert!(pairs.contains(&(1105, 1174)), "{pairs:?}");
        for (lo, hi) in pairs {
            let t = p2p_topic(lo, hi);
            assert_ne!(t, victims);
            assert!(t.eq_ignore_ascii_case(&victims), "{t}");
        }
    }

    #[test]
    fn case_variants_are_every_other_casing() {
        let mut rng = Rng::new(1);
        let v = case_variants("gAb1", &mut rng, 8, 4);
        assert_eq!(v.len(), 7);
        assert!(v
            .iter()
            .all(|n| n.eq_ignore_ascii_case("gAb1") && n != "gAb1"));
        let long = "p2pUQQAAAAAAACwBAAAAAAAAA";
        let v = case_variants(long, &mut rng, 8, 10);
        assert!(v.len() >= 10 && v.len() <= 12, "{}", v.len());
        assert!(v.contains(&long.to_ascii_lowercase()));
    }

    #[test]
    fn spellings_differ_from_the_name() {
        let mut rng = Rng::new(7);
        for v in spelling_variants("grpKa1e", &mut rng) {
            assert_ne!(v.name, "grpKa1e", "{v:?}");
        }
        assert_eq!(encode_segment("a b/é"), "a%20b%2F%C3%A9");
    }
}
