//! Test fixtures that are real code: a tiny random BERT checkpoint (config, WordPiece tokenizer, weights with
//! a sequence-classification head) written to a temporary folder, so tests need no download.

use candle_core::{DType, Device, Tensor};
use candle_nn::{VarBuilder, VarMap};
use candle_transformers::models::bert;
use rand::{Rng, SeedableRng};

use crate::error::{PrefilterError, Result};

/// Words of the tiny vocabulary (after the four special tokens).
pub const TINY_WORDS: &[&str] = &[
    "card", "lost", "stolen", "my", "i", "want", "to", "pay", "bill", "money", "transfer", "hello",
    "hi", "bye", "the", "a", "is", "was", "please", "help", "account", "balance", "what", "how",
    "send",
];

const SEED: u64 = 0x7469_6572;

/// A prefilter config for a tiny encoder in `dir` with `head` (16-token inputs, the rest default).
pub fn tiny_config(
    dir: &std::path::Path,
    head: tiergate_config::HeadConfig,
) -> tiergate_config::PrefilterConfig {
    tiergate_config::PrefilterConfig {
        encoder: dir.to_path_buf(),
        head,
        max_tokens: 16,
        ..tiergate_config::PrefilterConfig::default()
    }
}

/// A tiny BERT sequence-classification checkpoint in a temporary folder.
pub struct TinyModel {
    /// The folder (deleted on drop).
    pub dir: tempfile::TempDir,
    /// Hidden width.
    pub hidden: usize,
}

impl TinyModel {
    /// Writes a random 2-layer, 32-wide BERT with a `num_labels`-way head (`id2label`: `label0`, …).
    pub fn create(num_labels: usize) -> Result<Self> {
        let dir = tempfile::tempdir().map_err(|e| PrefilterError::file("tempdir", e))?;
        let hidden = 32;
        let id2label: serde_json::Map<String, serde_json::Value> = (0..num_labels)
            .map(|i| {
                (
                    i.to_string(),
                    serde_json::Value::String(format!("label{i}")),
                )
            })
            .collect();
        let config = serde_json::json!({
            "architectures": ["BertForSequenceClassification"],
            "model_type": "bert",
            "vocab_size": 4 + TINY_WORDS.len(),
            "hidden_size": hidden,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "intermediate_size": 64,
            "hidden_act": "gelu",
            "hidden_dropout_prob": 0.0,
            "attention_probs_dropout_prob": 0.0,
            "max_position_embeddings": 64,
            "type_vocab_size": 2,
            "initializer_range": 0.02,
            "layer_norm_eps": 1e-12,
            "pad_token_id": 0,
            "id2label": id2label,
        });
        write(&dir.path().join("config.json"), &config.to_string())?;
        write(
            &dir.path().join("tokenizer.json"),
            &tokenizer_json().to_string(),
        )?;
        let cfg: bert::Config = serde_json::from_value(config)
            .map_err(|e| PrefilterError::corrupt("tiny config", e))?;
        let varmap = VarMap::new();
        let vb = VarBuilder::from_varmap(&varmap, DType::F32, &Device::Cpu);
        bert::BertModel::load(vb.pp("bert"), &cfg)?;
        candle_nn::linear(hidden, hidden, vb.pp("bert.pooler.dense"))?;
        candle_nn::linear(hidden, num_labels, vb.pp("classifier"))?;
        // Replace candle's unseeded initialisation with seeded values so every run sees the same model
        // (layer norms keep their unit scale and zero shift).
        let mut rng = rand::rngs::StdRng::seed_from_u64(SEED);
        let vars = varmap
            .data()
            .lock()
            .map_err(|_| PrefilterError::Training("variable map lock poisoned".into()))?;
        let mut names: Vec<&String> = vars.keys().collect();
        names.sort();
        for name in names {
            if name.contains("LayerNorm") {
                continue;
            }
            let var = &vars[name];
            let values: Vec<f32> = (0..var.elem_count())
                .map(|_| rng.gen_range(-0.3f32..0.3))
                .collect();
            var.set(&Tensor::from_vec(values, var.shape(), &Device::Cpu)?)?;
        }
        drop(vars);
        varmap.save(dir.path().join("model.safetensors"))?;
        Ok(Self { dir, hidden })
    }
}

fn write(path: &std::path::Path, text: &str) -> Result<()> {
    std::fs::write(path, text).map_err(|e| PrefilterError::file(path, e))
}

/// A BERT WordPiece `tokenizer.json` over [`TINY_WORDS`].
pub fn tokenizer_json() -> serde_json::Value {
    let specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]"];
    let mut vocab = serde_json::Map::new();
    for (i, w) in specials.iter().chain(TINY_WORDS.iter()).enumerate() {
        vocab.insert((*w).to_string(), serde_json::json!(i));
    }
    let added: Vec<serde_json::Value> = specials
        .iter()
        .enumerate()
        .map(|(i, t)| {
            serde_json::json!({"id": i, "content": t, "single_word": false, "lstrip": false,
                               "rstrip": false, "normalized": false, "special": true})
        })
        .collect();
    serde_json::json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": added,
        "normalizer": {"type": "BertNormalizer", "clean_text": true, "handle_chinese_chars": true,
                       "strip_accents": null, "lowercase": true},
        "pre_tokenizer": {"type": "BertPreTokenizer"},
        "post_processor": {"type": "BertProcessing", "sep": ["[SEP]", 3], "cls": ["[CLS]", 2]},
        "decoder": null,
        "model": {"type": "WordPiece", "unk_token": "[UNK]", "continuing_subword_prefix": "##",
                  "max_input_chars_per_word": 100, "vocab": vocab}
    })
}
