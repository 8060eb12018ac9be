//! Tests on a tiny random BERT written to a temp folder (no download): loading, the three head kinds, packed
//! forward parity with candle-transformers, the batching runtime, and errors that name the bad file.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code: failing loudly is the point

use std::path::Path;

use candle_core::{DType, Device, Tensor};
use candle_nn::VarBuilder;
use candle_transformers::models::bert;
use tiergate_config::{FewShotLabel, HeadConfig, PoolingConfig, Precision, TrainedHeadConfig};
use tiergate_prefilter::bert::{Packed, PackedBert};
use tiergate_prefilter::testing::TinyModel;
use tiergate_prefilter::{Classifier, PrefilterError, PrefilterHandle};

use tiergate_prefilter::testing::tiny_config as cfg_for;

#[test]
fn packed_forward_matches_candle_transformers_bert() {
    let tiny = TinyModel::create(3).unwrap();
    let dir = tiny.dir.path();
    let cfg: bert::Config =
        serde_json::from_str(&std::fs::read_to_string(dir.join("config.json")).unwrap()).unwrap();
    let vb = unsafe {
        VarBuilder::from_mmaped_safetensors(
            &[dir.join("model.safetensors")],
            DType::F32,
            &Device::Cpu,
        )
        .unwrap()
    };
    let reference = bert::BertModel::load(vb.pp("bert"), &cfg).unwrap();
    let packed_model = PackedBert::load(vb.clone(), &cfg, false).unwrap();
    let trainable = PackedBert::load(vb, &cfg, true).unwrap();
    // Three sequences of different lengths: the reference pads, the packed model does not.
    let seqs: Vec<Vec<u32>> = vec![vec![2, 4, 5, 3], vec![2, 6, 7, 8, 9, 10, 3], vec![2, 11, 3]];
    let types: Vec<Vec<u32>> = seqs.iter().map(|s| vec![0; s.len()]).collect();
    let longest = 7;
    let mut ids = Vec::new();
    let mut mask = Vec::new();
    for s in &seqs {
        for j in 0..longest {
            ids.push(*s.get(j).unwrap_or(&0));
            mask.push(u32::from(j < s.len()));
        }
    }
    let ids = Tensor::from_vec(ids, (3, longest), &Device::Cpu).unwrap();
    let mask = Tensor::from_vec(mask, (3, longest), &Device::Cpu).unwrap();
    let want = reference
        .forward(&ids, &ids.zeros_like().unwrap(), Some(&mask))
        .unwrap();
    let pairs: Vec<(&[u32], &[u32])> = seqs
        .iter()
        .zip(&types)
        .map(|(a, b)| (a.as_slice(), b.as_slice()))
        .collect();
    let packed = Packed::new(&pairs, &Device::Cpu).unwrap();
    for model in [&packed_model, &trainable] {
        let got = model.forward(&packed).unwrap();
        let mut off = 0;
        for (row, s) in seqs.iter().enumerate() {
            let g = got.narrow(0, off, s.len()).unwrap();
            let w = want.get(row).unwrap().narrow(0, 0, s.len()).unwrap();
            let diff = (g - w)
                .unwrap()
                .abs()
                .unwrap()
                .max_all()
                .unwrap()
                .to_scalar::<f32>()
                .unwrap();
            assert!(diff < 1e-4, "row {row}: max abs diff {diff}");
            off += s.len();
        }
    }
}

#[test]
fn checkpoint_head_uses_id2label_and_returns_distributions() {
    let tiny = TinyModel::create(3).unwrap();
    let c = Classifier::from_dir(tiny.dir.path(), 16, Precision::Auto).unwrap();
    assert_eq!(c.labels(), ["label0", "label1", "label2"]);
    let toks: Vec<_> = ["card lost", "pay my bill please"]
        .iter()
        .map(|t| c.tokenizer.encode(t).unwrap())
        .collect();
    let probs = c.probabilities(&toks.iter().collect::<Vec<_>>()).unwrap();
    assert_eq!(probs.len(), 2);
    for p in probs {
        assert_eq!(p.len(), 3);
        assert!((p.iter().sum::<f32>() - 1.0).abs() < 1e-5);
    }
}

#[test]
fn few_shot_head_maps_its_own_examples_to_their_label() {
    let tiny = TinyModel::create(2).unwrap();
    let labels = vec![
        FewShotLabel {
            label: "lost".into(),
            examples: vec!["card lost".into()],
            reply: Some("r1".into()),
            description: None,
        },
        FewShotLabel {
            label: "pay".into(),
            examples: vec!["pay bill".into()],
            reply: None,
            description: None,
        },
        FewShotLabel {
            label: "greet".into(),
            examples: vec!["hello hi".into()],
            reply: None,
            description: None,
        },
    ];
    let cfg = cfg_for(
        tiny.dir.path(),
        HeadConfig::FewShot {
            labels,
            temperature: 0.05,
        },
    );
    let c = Classifier::from_config(&cfg).unwrap();
    assert_eq!(c.replies[0].as_deref(), Some("r1"));
    let handle = PrefilterHandle::start(c, &cfg).unwrap();
    for (text, want) in [("card lost", 0), ("pay bill", 1), ("hello hi", 2)] {
        let p = handle.classify_blocking(text).unwrap();
        assert_eq!(p.label, want, "{text}: {:?}", p.probs);
        assert_eq!(p.top[0].0, want);
        assert!(p.timings.infer.as_nanos() > 0);
    }
}

#[test]
fn full_queue_is_a_typed_overload_and_nothing_is_lost() {
    let tiny = TinyModel::create(2).unwrap();
    let mut cfg = cfg_for(tiny.dir.path(), HeadConfig::Checkpoint);
    cfg.queue_capacity = 2;
    cfg.workers = 1;
    let c = Classifier::from_config(&cfg).unwrap();
    let handle = PrefilterHandle::start(c, &cfg).unwrap();
    let mut accepted = Vec::new();
    let mut overloaded = 0;
    for _ in 0..2000 {
        match handle.submit("card lost card lost") {
            Ok(rx) => accepted.push(rx),
            Err(PrefilterError::Overloaded { capacity }) => {
                assert_eq!(capacity, 2);
                overloaded += 1;
            }
            Err(e) => panic!("unexpected {e}"),
        }
    }
    assert!(
        overloaded > 0,
        "a 2-slot queue took 2000 instant submissions"
    );
    for rx in accepted {
        assert!(
            rx.blocking_recv().unwrap().is_ok(),
            "every accepted request is answered"
        );
    }
    assert!(matches!(
        handle.submit("   "),
        Err(PrefilterError::InvalidInput(_))
    ));
}

#[test]
fn missing_and_corrupt_files_are_named() {
    let tiny = TinyModel::create(2).unwrap();
    let dir = tiny.dir.path();
    std::fs::write(dir.join("model.safetensors"), b"not a safetensors file").unwrap();
    let err = Classifier::from_dir(dir, 16, Precision::Auto)
        .err()
        .unwrap()
        .to_string();
    assert!(err.contains("model.safetensors"), "{err}");
    std::fs::remove_file(dir.join("model.safetensors")).unwrap();
    let err = Classifier::from_dir(dir, 16, Precision::Auto)
        .err()
        .unwrap()
        .to_string();
    assert!(
        err.contains("model.safetensors") && err.contains("not found"),
        "{err}"
    );
    let tiny = TinyModel::create(2).unwrap();
    let dir = tiny.dir.path();
    std::fs::write(dir.join("config.json"), "{ broken").unwrap();
    let err = Classifier::from_dir(dir, 16, Precision::Auto)
        .err()
        .unwrap()
        .to_string();
    assert!(err.contains("config.json"), "{err}");
    let err = Classifier::from_dir(Path::new("/nonexistent-model"), 16, Precision::Auto)
        .err()
        .unwrap()
        .to_string();
    assert!(err.contains("/nonexistent-model"), "{err}");
    let cfg = cfg_for(
        dir,
        HeadConfig::Trained(TrainedHeadConfig {
            dir: dir.join("nohead"),
        }),
    );
    let err = Classifier::from_config(&cfg).err().unwrap().to_string();
    assert!(err.contains("head.json"), "{err}");
    let _ = PoolingConfig::Auto;
}

/// Writes a tiny random checkpoint of another family (built with candle-transformers' own loader, so the
/// weight names are the ones it expects), with a sequence-classification head and `id2label`.
fn tiny_family(model_type: &str) -> tempfile::TempDir {
    use candle_nn::VarMap;
    use candle_transformers::models::{distilbert, xlm_roberta};
    let dir = tempfile::tempdir().unwrap();
    let vocab = 4 + tiergate_prefilter::testing::TINY_WORDS.len();
    let id2label = serde_json::json!({"0": "neg", "1": "pos"});
    let config = match model_type {
        "distilbert" => serde_json::json!({
            "model_type": "distilbert", "vocab_size": vocab, "dim": 32, "n_layers": 2, "n_heads": 4,
            "hidden_dim": 64, "activation": "gelu", "max_position_embeddings": 64, "initializer_range": 0.02,
            "pad_token_id": 0, "id2label": id2label,
        }),
        _ => serde_json::json!({
            "model_type": "xlm-roberta", "vocab_size": vocab, "hidden_size": 32, "num_hidden_layers": 2,
            "num_attention_heads": 4, "intermediate_size": 64, "hidden_act": "gelu",
            "hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0, "max_position_embeddings": 64,
            "type_vocab_size": 1, "layer_norm_eps": 1e-5, "pad_token_id": 0,
            "position_embedding_type": "absolute", "id2label": id2label,
        }),
    };
    std::fs::write(dir.path().join("config.json"), config.to_string()).unwrap();
    std::fs::write(
        dir.path().join("tokenizer.json"),
        tiergate_prefilter::testing::tokenizer_json().to_string(),
    )
    .unwrap();
    let varmap = VarMap::new();
    let vb = VarBuilder::from_varmap(&varmap, DType::F32, &Device::Cpu);
    if model_type == "distilbert" {
        let cfg: distilbert::Config = serde_json::from_value(config).unwrap();
        distilbert::DistilBertModel::load(vb.clone(), &cfg).unwrap();
        candle_nn::linear(32, 32, vb.pp("pre_classifier")).unwrap();
        candle_nn::linear(32, 2, vb.pp("classifier")).unwrap();
    } else {
        let cfg: xlm_roberta::Config = serde_json::from_value(config).unwrap();
        xlm_roberta::XLMRobertaModel::new(&cfg, vb.pp("roberta")).unwrap();
        candle_nn::linear(32, 32, vb.pp("classifier.dense")).unwrap();
        candle_nn::linear(32, 2, vb.pp("classifier.out_proj")).unwrap();
    }
    varmap.save(dir.path().join("model.safetensors")).unwrap();
    dir
}

#[test]
fn distilbert_and_xlm_roberta_checkpoints_load_with_their_heads() {
    for family in ["distilbert", "xlm-roberta"] {
        let dir = tiny_family(family);
        let c = Classifier::from_dir(dir.path(), 16, Precision::Auto)
            .unwrap_or_else(|e| panic!("{family}: {e}"));
        assert_eq!(c.labels(), ["neg", "pos"], "{family}");
        let toks: Vec<_> = ["card lost", "pay my bill please now"]
            .iter()
            .map(|t| c.tokenizer.encode(t).unwrap())
            .collect();
        let probs = c.probabilities(&toks.iter().collect::<Vec<_>>()).unwrap();
        assert_eq!(probs.len(), 2);
        for p in &probs {
            assert!(
                (p.iter().sum::<f32>() - 1.0).abs() < 1e-5,
                "{family}: {p:?}"
            );
        }
        // Padding must not change a sequence's answer: alone vs batched with a longer one.
        let alone = c.probabilities(&[&toks[0]]).unwrap();
        for (a, b) in alone[0].iter().zip(&probs[0]) {
            assert!((a - b).abs() < 1e-4, "{family}: padded {b} vs alone {a}");
        }
    }
}

#[test]
fn int8_precision_is_refused_where_it_cannot_run() {
    let dir = tiny_family("distilbert");
    let err = Classifier::from_dir(dir.path(), 16, Precision::Int8)
        .err()
        .unwrap()
        .to_string();
    assert!(
        err.contains("int8") && (err.contains("BERT-family") || err.contains("VNNI")),
        "{err}"
    );
    // `auto` falls back to f32 there.
    assert!(Classifier::from_dir(dir.path(), 16, Precision::Auto).is_ok());
}

/// A trained head is known by its weights' fingerprint; a `fusion.json` (or a stage's fit) fitted for another
/// head is not used with this one, and the classifier says why; one fitted for it, or one from before fits
/// named their head, is used.
#[test]
fn a_fusion_fitted_for_another_head_is_not_used() {
    use tiergate_prefilter::heads::{
        fingerprint, save_trained, DevReport, FittedFusion, TrainedHeadMeta, HEAD_FORMAT,
    };
    let tiny = TinyModel::create(2).unwrap();
    let work = tempfile::tempdir().unwrap();
    let write = |dir: &Path, scale: f32| {
        let w = (Tensor::ones((2, tiny.hidden), DType::F32, &Device::Cpu).unwrap()
            * f64::from(scale))
        .unwrap();
        let b = Tensor::zeros(2, DType::F32, &Device::Cpu).unwrap();
        let meta = TrainedHeadMeta {
            format: HEAD_FORMAT,
            labels: vec!["a".into(), "b".into()],
            temperature: 1.0,
            encoder: tiny.dir.path().to_path_buf(),
            hidden_size: tiny.hidden,
            fine_tuned: false,
            dev: DevReport {
                n: 1,
                accuracy: 1.0,
                ece_uncalibrated: 0.0,
                ece: 0.0,
                temperature_rows: 0,
                calibration_flaw: None,
            },
            examples: Vec::new(),
            descriptions: Vec::new(),
            split: None,
        };
        save_trained(dir, &meta, &w, &b).unwrap();
    };
    let (one, two) = (work.path().join("one"), work.path().join("two"));
    write(&one, 1.0);
    write(&two, 2.0);
    let (f1, f2) = (fingerprint(&one).unwrap(), fingerprint(&two).unwrap());
    assert_ne!(f1, f2, "same labels, other weights: another head");
    let fit = |head: Option<String>| FittedFusion {
        llm_weight: 0.3,
        llm_temperature: 1.0,
        llm: "stub (channel)".into(),
        rows: 10,
        tier0_accuracy: 0.5,
        fused_accuracy: 0.6,
        best_weight: 0.3,
        best_temperature: 1.0,
        rows_fixed: 2,
        rows_broken: 0,
        p_value: 0.25,
        chosen_on: None,
        after: Vec::new(),
        head,
    };
    let load = |dir: &Path| {
        Classifier::from_config(&cfg_for(
            tiny.dir.path(),
            HeadConfig::Trained(TrainedHeadConfig {
                dir: dir.to_path_buf(),
            }),
        ))
        .unwrap()
    };
    // Fitted on head one, copied next to head two.
    fit(Some(f1.clone())).save(&one, None).unwrap();
    fit(Some(f1.clone())).save(&two, None).unwrap();
    fit(Some(f1.clone())).save(&two, Some("big")).unwrap();
    let c1 = load(&one);
    assert!(c1.fusion.is_some(), "its own fit is used");
    assert_eq!(c1.trained.as_ref().unwrap().fingerprint, f1);
    let c2 = load(&two);
    assert!(
        c2.fusion.is_none() && c2.stage_fusions.is_empty(),
        "another head's fits are not"
    );
    let notes = &c2.trained.as_ref().unwrap().notes;
    assert_eq!(notes.len(), 2, "{notes:?}");
    assert!(
        notes[0].contains(&f1) && notes[0].contains(&f2),
        "{notes:?}"
    );
    // A fit that names no head (written before fits named theirs) holds for any.
    fit(None).save(&two, None).unwrap();
    assert!(load(&two).fusion.is_some());
}
