//! Tier-0 of tiergate: a BERT-family encoder (candle) with a classification head that answers the requests it
//! is sure about in milliseconds.
//!
//! Owns: the tokenizer wrapper (the only module that uses `tokenizers`), the encoder, the three kinds of head
//! (checkpoint, trained, few-shot), calibration and the batching thread. Training and evaluation live in
//! `tiergate-train`, which builds on this crate.
//! Must not depend on axum or mistralrs: the server and the worker build on top of it, not the other way round.

pub mod bert;
pub mod bert_int8;
pub mod calibrate;
pub mod classifier;
pub mod encoder;
pub mod error;
pub mod grounding;
pub mod heads;
pub mod oos;
pub mod out_of_scope;
pub mod risk_rows;
pub mod runtime;
pub mod testing;
pub mod tokenize;

pub use classifier::Classifier;
pub use error::{PrefilterError, Result};
pub use runtime::{Prediction, PrefilterHandle, Timings};
