//! The only module that touches the `tokenizers` crate (its API churns; keep it behind one wall).

use std::path::Path;

use tokenizers::{Tokenizer, TruncationDirection, TruncationParams, TruncationStrategy};

use crate::error::{PrefilterError, Result};

/// Token ids of one input, special tokens included, already truncated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tokens {
    /// Vocabulary ids.
    pub ids: Vec<u32>,
    /// Segment ids (all zero for single sentences).
    pub type_ids: Vec<u32>,
    /// True when the input was cut to fit `max_tokens`.
    pub truncated: bool,
}

/// A Hugging Face `tokenizer.json` with our truncation and no padding (the batcher pads).
pub struct TextTokenizer {
    inner: Tokenizer,
    /// Longest text (bytes) worth tokenising: see [`BYTES_PER_TOKEN`].
    max_bytes: usize,
}

/// Text beyond `max_tokens × BYTES_PER_TOKEN` bytes cannot reach the encoder (a word-piece token covers far
/// fewer bytes), so it is cut before tokenising instead of tokenising up to the request limit (32 K
/// characters) on a server thread and throwing the rest away.
pub const BYTES_PER_TOKEN: usize = 32;

impl TextTokenizer {
    /// Loads `tokenizer.json`; inputs will be truncated to `max_tokens` (special tokens included).
    pub fn from_file(path: &Path, max_tokens: usize) -> Result<Self> {
        if !path.is_file() {
            return Err(PrefilterError::file(path, "file not found"));
        }
        let mut inner = Tokenizer::from_file(path).map_err(|e| PrefilterError::corrupt(path, e))?;
        inner.with_padding(None);
        inner
            .with_truncation(Some(TruncationParams {
                direction: TruncationDirection::Right,
                max_length: max_tokens,
                strategy: TruncationStrategy::LongestFirst,
                stride: 0,
            }))
            .map_err(|e| PrefilterError::corrupt(path, e))?;
        Ok(Self {
            inner,
            max_bytes: max_tokens.saturating_mul(BYTES_PER_TOKEN),
        })
    }

    /// Tokenises one input (with the model's special tokens).
    pub fn encode(&self, text: &str) -> Result<Tokens> {
        let head = cut_text(text, self.max_bytes);
        let enc = self
            .inner
            .encode_fast(head, true)
            .map_err(|e| PrefilterError::Tokenizer(e.to_string()))?;
        Ok(Tokens {
            ids: enc.get_ids().to_vec(),
            type_ids: enc.get_type_ids().to_vec(),
            truncated: head.len() < text.len() || !enc.get_overflowing().is_empty(),
        })
    }

    /// The id used to pad batches: the tokenizer's `[PAD]`/`<pad>` token, else 0.
    pub fn pad_id(&self) -> u32 {
        ["[PAD]", "<pad>"]
            .iter()
            .find_map(|t| self.inner.token_to_id(t))
            .unwrap_or(0)
    }
}

/// `text` cut to at most `max` bytes, at the last whitespace before the limit when there is one (so no word is
/// split into pieces it does not have), else at a character boundary.
fn cut_text(text: &str, max: usize) -> &str {
    if text.len() <= max {
        return text;
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    let head = &text[..end];
    if text[end..].starts_with(char::is_whitespace) {
        return head;
    }
    head.rfind(char::is_whitespace).map_or(head, |i| &head[..i])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::TinyModel;

    #[test]
    fn long_text_is_cut_before_tokenising_with_the_same_tokens() {
        assert_eq!(cut_text("card lost card", 9), "card lost");
        assert_eq!(cut_text("éééé", 3), "é");
        assert_eq!(cut_text("short", 100), "short");
        let tiny = TinyModel::create(2).unwrap();
        let tok = TextTokenizer::from_file(&tiny.dir.path().join("tokenizer.json"), 6).unwrap();
        let huge = "card lost ".repeat(3_000);
        let a = tok.encode(&huge).unwrap();
        let b = tok.encode("card lost card lost card lost").unwrap();
        assert_eq!(
            a, b,
            "the first tokens are the same, and both say truncated"
        );
    }

    #[test]
    fn truncates_to_the_limit_and_keeps_special_tokens() {
        let tiny = TinyModel::create(2).unwrap();
        let tok = TextTokenizer::from_file(&tiny.dir.path().join("tokenizer.json"), 6).unwrap();
        let short = tok.encode("card lost").unwrap();
        assert_eq!(short.ids.len(), 4, "[CLS] card lost [SEP]");
        assert!(!short.truncated);
        let long = tok
            .encode("card lost card lost card lost card lost")
            .unwrap();
        assert_eq!(long.ids.len(), 6);
        assert!(long.truncated);
        assert_eq!(long.ids.first(), short.ids.first(), "starts with [CLS]");
        assert_eq!(long.ids.last(), short.ids.last(), "still ends with [SEP]");
        assert_eq!(tok.pad_id(), 0);
    }

    #[test]
    fn missing_tokenizer_names_the_file() {
        let err = TextTokenizer::from_file(Path::new("/nope/tokenizer.json"), 8)
            .err()
            .unwrap();
        assert!(err.to_string().contains("/nope/tokenizer.json"), "{err}");
    }
}
