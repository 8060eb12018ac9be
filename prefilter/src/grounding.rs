//! Examples nearest the query: each label's representative utterances (stored with a trained head) with their
//! embeddings in Tier-0's own space, ranked by cosine to the query's embedding, so a judge that is shown K
//! examples per candidate sees the K that look most like the message (not the same K for every query).
//!
//! The embeddings are computed when a route asks for grounding (`Classifier::ground`), with the encoder and
//! precision that serve, so query and examples go through the same arithmetic.

use crate::encoder::embed_texts;
use crate::encoder::Encoder;
use crate::error::Result;
use crate::tokenize::TextTokenizer;

/// Representative utterances per label with their unit-length embeddings.
#[derive(Debug, Clone, Default)]
pub struct Representatives {
    texts: Vec<Vec<String>>,
    unit: Vec<Vec<Vec<f32>>>,
}

/// `v / |v|` (a zero vector stays zero).
pub fn unit(v: &[f32]) -> Vec<f32> {
    let n = v.iter().map(|a| a * a).sum::<f32>().sqrt();
    if n == 0.0 {
        return v.to_vec();
    }
    v.iter().map(|a| a / n).collect()
}

fn dot(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

impl Representatives {
    /// Embeds every label's examples (empty labels stay empty).
    pub fn embed(
        tokenizer: &TextTokenizer,
        encoder: &Encoder,
        examples: &[Vec<String>],
    ) -> Result<Self> {
        let mut texts = Vec::with_capacity(examples.len());
        let mut unit_rows = Vec::with_capacity(examples.len());
        for ex in examples {
            let kept: Vec<String> = ex
                .iter()
                .map(|s| s.trim().to_string())
                .filter(|s| !s.is_empty())
                .collect();
            let rows = if kept.is_empty() {
                Vec::new()
            } else {
                let refs: Vec<&str> = kept.iter().map(String::as_str).collect();
                embed_texts(tokenizer, encoder, &refs, 32)?
                    .to_vec2::<f32>()?
                    .iter()
                    .map(|r| unit(r))
                    .collect()
            };
            texts.push(kept);
            unit_rows.push(rows);
        }
        Ok(Self {
            texts,
            unit: unit_rows,
        })
    }

    /// Built from texts and embeddings already at hand (tests, tools).
    pub fn from_parts(texts: Vec<Vec<String>>, embeddings: Vec<Vec<Vec<f32>>>) -> Self {
        let unit_rows = embeddings
            .iter()
            .map(|l| l.iter().map(|e| unit(e)).collect())
            .collect();
        Self {
            texts,
            unit: unit_rows,
        }
    }

    /// The label's examples, nearest the query first (the stored order when `query` is empty).
    pub fn nearest(&self, label: usize, query: &[f32]) -> Vec<String> {
        let (Some(texts), Some(rows)) = (self.texts.get(label), self.unit.get(label)) else {
            return Vec::new();
        };
        if query.is_empty() || rows.len() != texts.len() {
            return texts.clone();
        }
        let q = unit(query);
        let mut order: Vec<(f32, usize)> = rows.iter().map(|r| dot(r, &q)).zip(0..).collect();
        // Stable on ties: equal similarity keeps the stored (nearest-the-label-mean) order.
        order.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
        order.into_iter().map(|(_, i)| texts[i].clone()).collect()
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn nearest_examples_come_first() {
        let r = Representatives::from_parts(
            vec![vec!["north".into(), "east".into(), "north-east".into()]],
            vec![vec![vec![0.0, 1.0], vec![2.0, 0.0], vec![1.0, 1.0]]],
        );
        assert_eq!(
            r.nearest(0, &[1.0, 0.1]),
            vec!["east", "north-east", "north"]
        );
        assert_eq!(
            r.nearest(0, &[0.0, 5.0]),
            vec!["north", "north-east", "east"]
        );
        assert_eq!(r.nearest(0, &[]), vec!["north", "east", "north-east"]);
        assert!(r.nearest(3, &[1.0, 0.0]).is_empty());
    }
}
