//! How message text becomes index terms: jieba segments Chinese (search
//! mode, so a long word is also indexed by its parts: 中华人民共和国 →
//! 中华, 华人, 人民, 共和国, …); Latin words and numbers come out whole;
//! terms are lower-cased; spaces and punctuation are dropped. The same
//! tokenizer cuts the query, so a query term matches the terms a message
//! was indexed with.

use tantivy::tokenizer::{Token, TokenStream, Tokenizer};
use tantivy_jieba::JiebaTokenizer;

/// The name the index registers the tokenizer under (kept in the index's
/// schema, so it must never change for an existing index).
pub const NAME: &str = "imstream_chat";

/// Longest term kept, in bytes (a pasted blob is not a word).
const MAX_TERM_BYTES: usize = 64;

/// jieba, then lower case, without terms that hold no letter or digit.
#[derive(Clone)]
pub struct ChatTokenizer {
    jieba: JiebaTokenizer,
}

impl Default for ChatTokenizer {
    fn default() -> Self {
        Self {
            jieba: JiebaTokenizer::new(),
        }
    }
}

impl Tokenizer for ChatTokenizer {
    type TokenStream<'a> = Tokens;

    fn token_stream<'a>(&'a mut self, text: &'a str) -> Tokens {
        let mut tokens = Vec::new();
        let mut stream = self.jieba.token_stream(text);
        while let Some(t) = stream.next() {
            if t.text.len() > MAX_TERM_BYTES || !t.text.chars().any(char::is_alphanumeric) {
                continue;
            }
            tokens.push(Token {
                offset_from: t.offset_from,
                offset_to: t.offset_to,
                position: tokens.len(),
                text: t.text.to_lowercase(),
                position_length: 1,
            });
        }
        Tokens {
            tokens,
            next: 0,
            empty: Token::default(),
        }
    }
}

/// The terms of one text, already cut.
pub struct Tokens {
    tokens: Vec<Token>,
    /// Index of the token the next `advance` moves to.
    next: usize,
    /// What `token()` returns before the first `advance`.
    empty: Token,
}

impl TokenStream for Tokens {
    fn advance(&mut self) -> bool {
        if self.next < self.tokens.len() {
            self.next += 1;
            true
        } else {
            false
        }
    }

    fn token(&self) -> &Token {
        match self.next {
            0 => &self.empty,
            n => &self.tokens[n - 1],
        }
    }

    fn token_mut(&mut self) -> &mut Token {
        match self.next {
            0 => &mut self.empty,
            n => &mut self.tokens[n - 1],
        }
    }
}

/// The distinct terms of `text`, in order of first appearance.
pub fn terms(text: &str) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    let mut tokenizer = ChatTokenizer::default();
    let mut stream = tokenizer.token_stream(text);
    while let Some(t) = stream.next() {
        if !out.contains(&t.text) {
            out.push(t.text.clone());
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chinese_is_segmented_and_latin_words_and_numbers_stay_whole() {
        let t = terms("明天下午三点开会，讨论 Release 2024 计划!");
        for want in ["明天", "下午", "开会", "讨论", "release", "2024", "计划"] {
            assert!(t.contains(&want.to_string()), "{want} in {t:?}");
        }
        assert!(
            t.iter()
                .all(|w| w.chars().any(char::is_alphanumeric) && !w.contains(' ')),
            "no punctuation or spaces: {t:?}"
        );
    }

    #[test]
    fn a_long_word_is_also_indexed_by_its_parts() {
        let t = terms("中华人民共和国");
        assert!(t.contains(&"中华人民共和国".to_string()), "{t:?}");
        assert!(t.contains(&"人民".to_string()), "{t:?}");
    }

    #[test]
    fn offsets_point_into_the_original_text() {
        let text = "Hello 世界";
        let mut tokenizer = ChatTokenizer::default();
        let mut stream = tokenizer.token_stream(text);
        let mut seen = Vec::new();
        while let Some(t) = stream.next() {
            seen.push(text[t.offset_from..t.offset_to].to_string());
        }
        assert_eq!(seen, ["Hello", "世界"]);
    }
}
