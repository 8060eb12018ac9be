//! CPU kernels shared by both tiers: the int8 dense layer (`vpdpbusd` on AVX-512 VNNI, portable loops
//! elsewhere) that Tier-0's encoder and the LLM worker's scoring forward run on, and the fused f32 ops
//! candle lacks in a fast form (GELU).
//!
//! Owns no model code and depends on no other tiergate crate: the prefilter and the worker build on it.

pub mod fastops;
pub mod int8;
