//! The small concepts several tiergate crates use, each implemented once: the statistics (`stats`) and the
//! latency bands (`bands`). No dependencies: everything else may build on it.

pub mod bands;
pub mod fnv;
pub mod fusion;
pub mod outcome;
pub mod risk;
pub mod stats;
