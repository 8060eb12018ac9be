//! Training on a tiny random BERT written to a temp folder (no download): a trained head round-trips through
//! disk and classifies its training texts; fine-tuning writes an encoder that loads.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code: failing loudly is the point

use candle_core::Device;
use tiergate_config::{HeadConfig, Precision, TrainedHeadConfig};
use tiergate_prefilter::testing::TinyModel;
use tiergate_prefilter::{Classifier, PrefilterHandle};
use tiergate_train::data::DataSpec;
use tiergate_train::train::{train, TrainOptions};

use tiergate_prefilter::testing::tiny_config as cfg_for;

#[test]
fn trained_head_round_trips_through_disk_and_classifies_training_texts() {
    let tiny = TinyModel::create(2).unwrap();
    let work = tempfile::tempdir().unwrap();
    let data = work.path().join("d.csv");
    let mut csv = String::from("text,category\n");
    let groups = [
        ("card lost", "lost"),
        ("pay bill", "pay"),
        ("hello hi", "greet"),
        ("account balance", "balance"),
    ];
    for (i, (text, label)) in groups.iter().cycle().take(80).enumerate() {
        // Vary each row a little with a filler word so rows are not identical.
        let filler = ["the", "a", "please", "my", "i"][i % 5];
        csv.push_str(&format!("{filler} {text},{label}\n"));
    }
    // Out-of-scope examples: never a label of the head, their dev share scored against the threshold.
    for i in 0..8 {
        csv.push_str(&format!("weather forecast {i},oos\n"));
    }
    std::fs::write(&data, csv).unwrap();
    let out = work.path().join("head");
    let report = train(
        &TrainOptions {
            encoder: tiny.dir.path().to_path_buf(),
            data: DataSpec::new(&data),
            dev_fraction: 0.25,
            seed: 1,
            fine_tune: false,
            fine_tune_epochs: 1,
            max_tokens: 16,
            out: out.clone(),
            precision: Precision::Auto,
            oos_recall: 0.95,
            oos_label: Some("oos".into()),
            per_label: None,
            labels: None,
            rows_out: None,
        },
        &mut |_| {},
    )
    .unwrap();
    assert_eq!(report.labels, 4);
    // The out-of-scope fit: k-NN over the training rows of the likely labels, threshold on the 20 in-scope dev rows, 2 of the 8
    // out-of-scope rows in the dev split.
    assert_eq!(report.oos.method.name(), "knn_top_labels");
    assert_eq!((report.oos.dev_rows, report.oos.dev_oos_rows), (20, 2));
    assert!(report.oos.threshold.is_finite() && report.oos.dev_oos_recall.is_some());
    // The 20 dev rows (5 a label) in two halves of each label: 12 fit the temperature, the other 8 are measured
    // and stored as the calibration rows of the error bound.
    assert_eq!((report.dev.n, report.dev.temperature_rows), (8, 12));
    let cal = tiergate_prefilter::risk_rows::CalibrationRows::load(&out)
        .unwrap()
        .unwrap();
    assert_eq!((cal.rows.len(), cal.ordering.len()), (8, 12));
    assert!((cal.temperature - report.temperature).abs() < 1e-12);
    assert!(
        report.dev.accuracy >= 0.9,
        "dev accuracy {}",
        report.dev.accuracy
    );
    assert!(report.temperature > 0.0);
    let cfg = cfg_for(
        tiny.dir.path(),
        HeadConfig::Trained(TrainedHeadConfig { dir: out.clone() }),
    );
    let c = Classifier::from_config(&cfg).unwrap();
    assert_eq!(c.labels(), ["balance", "greet", "lost", "pay"]);
    let handle = PrefilterHandle::start(c, &cfg).unwrap();
    assert_eq!(
        handle.classify_blocking("please card lost").unwrap().label,
        2
    );
    let p = handle.classify_blocking("my pay bill").unwrap();
    assert_eq!(p.label, 3);
    // Predictions carry the served score; a training text sits among its neighbours, below the threshold.
    let (method, threshold) = handle.out_of_scope().unwrap();
    assert_eq!(method, tiergate_prefilter::oos::OosMethod::KnnTopLabels);
    assert_eq!(threshold, report.oos.threshold);
    let score = p.oos_score.unwrap();
    assert!(score <= threshold, "{score} > {threshold}");
}

#[test]
fn fine_tuning_writes_a_loadable_encoder() {
    let tiny = TinyModel::create(2).unwrap();
    let work = tempfile::tempdir().unwrap();
    let data = work.path().join("d.jsonl");
    let rows: String = (0..40)
        .map(|i| {
            let (t, l) = if i % 2 == 0 {
                ("card lost", "a")
            } else {
                ("send money", "b")
            };
            format!(
                "{{\"text\":\"{t} {}\",\"label\":\"{l}\"}}\n",
                ["the", "my", "a", "i"][i % 4]
            )
        })
        .collect();
    std::fs::write(&data, rows).unwrap();
    let out = work.path().join("ft");
    let report = train(
        &TrainOptions {
            encoder: tiny.dir.path().to_path_buf(),
            data: DataSpec::new(&data),
            dev_fraction: 0.2,
            seed: 3,
            fine_tune: true,
            fine_tune_epochs: 1,
            max_tokens: 16,
            out: out.clone(),
            precision: Precision::Auto,
            oos_recall: 0.9,
            oos_label: None,
            per_label: None,
            labels: None,
            rows_out: None,
        },
        &mut |_| {},
    )
    .unwrap();
    assert!(report.dev.accuracy >= 0.9, "{}", report.dev.accuracy);
    // Fine-tuned: the reference embeddings come from the tuned encoder, which is what serves.
    assert!(out.join("oos.safetensors").is_file() && report.oos.dev_oos_recall.is_none());
    assert!(out.join("encoder/model.safetensors").is_file());
    let meta: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("head.json")).unwrap()).unwrap();
    assert_eq!(
        meta["examples"].as_array().map(Vec::len),
        Some(2),
        "representatives per label"
    );
    let c = Classifier::from_dir(&out, 16, Precision::Auto).unwrap();
    let t = c.tokenizer.encode("card lost the").unwrap();
    let p = c.probabilities(&[&t]).unwrap();
    assert_eq!(tiergate_prefilter::calibrate::argmax(&p[0]).0, 0);
    // The tuned encoder differs from the original: fine-tuning really changed weights.
    let a = candle_core::safetensors::load(tiny.dir.path().join("model.safetensors"), &Device::Cpu)
        .unwrap();
    let b = candle_core::safetensors::load(out.join("encoder/model.safetensors"), &Device::Cpu)
        .unwrap();
    let name = "bert.encoder.layer.0.attention.self.query.weight";
    let key = if b.contains_key(name) {
        name
    } else {
        "encoder.layer.0.attention.self.query.weight"
    };
    let diff = (a[name].clone() - b[key].clone())
        .unwrap()
        .abs()
        .unwrap()
        .max_all()
        .unwrap();
    assert!(diff.to_scalar::<f32>().unwrap() > 0.0);
}

/// A frozen-encoder training of `data` into `out` on the tiny encoder: a quarter to dev, seed 5.
fn frozen(
    encoder: &std::path::Path,
    data: &std::path::Path,
    out: &std::path::Path,
) -> TrainOptions {
    TrainOptions {
        encoder: encoder.to_path_buf(),
        data: DataSpec::new(data),
        dev_fraction: 0.25,
        seed: 5,
        fine_tune: false,
        fine_tune_epochs: 1,
        max_tokens: 16,
        out: out.to_path_buf(),
        precision: Precision::Auto,
        oos_recall: 0.95,
        oos_label: None,
        per_label: None,
        labels: None,
        rows_out: None,
    }
}

/// `--per-label K`: a few-shot head from at most K rows of each label (the dev share included), drawn by the
/// seed; the head it writes loads as any trained head does.
#[test]
fn per_label_trains_a_few_shot_head_from_at_most_k_rows_a_label() {
    let tiny = TinyModel::create(2).unwrap();
    let work = tempfile::tempdir().unwrap();
    let data = work.path().join("d.csv");
    let mut csv = String::from("text,category\n");
    let groups = [
        ("card lost", "lost"),
        ("pay bill", "pay"),
        ("hello hi", "greet"),
    ];
    for (i, (text, label)) in groups.iter().cycle().take(60).enumerate() {
        csv.push_str(&format!("{text} {i},{label}\n"));
    }
    std::fs::write(&data, csv).unwrap();
    let rows_out = work.path().join("drawn.csv");
    let run = |k: Option<usize>, out: &str| {
        train(
            &TrainOptions {
                per_label: k,
                rows_out: Some(rows_out.clone()),
                ..frozen(tiny.dir.path(), &data, &work.path().join(out))
            },
            &mut |_| {},
        )
    };
    // 20 rows a label; K = 6: 2 of each to dev (a quarter, rounded), 4 to train.
    let few = run(Some(6), "few").unwrap();
    assert_eq!((few.labels, few.train_n), (3, 12));
    // The rows drawn are written: 12 train, 6 dev, each a row of the data.
    let drawn = std::fs::read_to_string(&rows_out).unwrap();
    let data_text = std::fs::read_to_string(&data).unwrap();
    let lines: Vec<&str> = drawn.lines().skip(1).collect();
    assert_eq!(lines.iter().filter(|l| l.ends_with(",train")).count(), 12);
    assert_eq!(lines.iter().filter(|l| l.ends_with(",dev")).count(), 6);
    for l in &lines {
        let row = l.rsplit_once(',').unwrap().0;
        assert!(data_text.lines().any(|d| d == row), "{l}");
    }
    let all = run(None, "all").unwrap();
    assert_eq!(all.train_n, 45);
    assert!(run(Some(0), "none").is_err());
    let head = HeadConfig::Trained(TrainedHeadConfig {
        dir: work.path().join("few"),
    });
    let c = Classifier::from_config(&cfg_for(tiny.dir.path(), head)).unwrap();
    assert_eq!(c.labels(), ["greet", "lost", "pay"]);
    // The draw is recorded, so `distill` finds the same dev rows without being told.
    let (meta, _) = tiergate_prefilter::heads::load_trained(&work.path().join("few")).unwrap();
    assert_eq!(
        meta.split,
        Some(tiergate_prefilter::heads::TrainSplit {
            dev_fraction: 0.25,
            seed: 5,
            per_label: Some(6)
        })
    );
}

/// `--labels FILE`: the head's labels are the file's, in the file's order, with their descriptions; a label
/// of the file with no row trains on its description; a row the file does not name is refused; and where
/// every label has rows the head is the one trained without the file (only the descriptions differ).
#[test]
fn a_labels_file_names_the_heads_labels_and_their_descriptions() {
    let tiny = TinyModel::create(2).unwrap();
    let work = tempfile::tempdir().unwrap();
    let data = work.path().join("d.csv");
    let mut csv = String::from("text,category\n");
    for (i, (text, label)) in [("card lost", "lost"), ("pay bill", "pay")]
        .iter()
        .cycle()
        .take(24)
        .enumerate()
    {
        csv.push_str(&format!("{text} {i},{label}\n"));
    }
    std::fs::write(&data, csv).unwrap();
    let file = |name: &str, text: &str| {
        let p = work.path().join(name);
        std::fs::write(&p, text).unwrap();
        p
    };
    let run = |labels: Option<std::path::PathBuf>, out: &str| {
        train(
            &TrainOptions {
                labels,
                ..frozen(tiny.dir.path(), &data, &work.path().join(out))
            },
            &mut |_| {},
        )
    };
    let three = file(
        "three.tsv",
        "# labels\npay\nlost\tThe card is lost.\n\ngreet\tThe customer says hello.\n",
    );
    let r = run(Some(three), "three").unwrap();
    // 12 rows a label, a quarter to dev: 9 + 9 training rows and greet's description.
    assert_eq!((r.labels, r.train_n), (3, 19));
    let load = |out: &str| {
        let head = HeadConfig::Trained(TrainedHeadConfig {
            dir: work.path().join(out),
        });
        Classifier::from_config(&cfg_for(tiny.dir.path(), head)).unwrap()
    };
    let c = load("three");
    // The file's order, not sorted: the user's list is theirs.
    assert_eq!(c.labels(), ["pay", "lost", "greet"]);
    assert_eq!(
        c.descriptions,
        [
            None,
            Some("The card is lost.".to_string()),
            Some("The customer says hello.".to_string()),
        ]
    );
    // The head answers in that order: its probabilities name training rows' labels through the file's order
    // (names in one order over weights in another would name most of them wrongly).
    let right = (0..24)
        .filter(|i| {
            let (text, label) = if i % 2 == 0 {
                ("card lost", "lost")
            } else {
                ("pay bill", "pay")
            };
            let t = c.tokenizer.encode(&format!("{text} {i}")).unwrap();
            let p = c.probabilities(&[&t]).unwrap();
            c.labels()[tiergate_prefilter::calibrate::argmax(&p[0]).0] == label
        })
        .count();
    assert!(right >= 20, "{right} of 24 training rows named right");
    let missing = file("one.tsv", "lost\nother\n");
    let err = run(Some(missing), "one").unwrap_err().to_string();
    assert!(err.contains("`pay`") && err.contains("one.tsv"), "{err}");
    for bad in ["lost\nlost\tagain\n", "lost\n", "\tno name\npay\n"] {
        assert!(run(Some(file("bad.tsv", bad)), "bad").is_err(), "{bad:?}");
    }
    // Both labels have rows: the same weights as without the file.
    run(
        Some(file("two.tsv", "lost\tThe card is lost.\npay\n")),
        "two",
    )
    .unwrap();
    run(None, "plain").unwrap();
    let weights =
        |out: &str| std::fs::read(work.path().join(out).join("head.safetensors")).unwrap();
    assert_eq!(weights("two"), weights("plain"));
    assert!(load("plain").descriptions.iter().all(Option::is_none));
}
