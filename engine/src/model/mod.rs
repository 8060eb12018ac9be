//! The engine's vocabulary, below every other wing: the request as a door validated it ([`request`]), what
//! became of it ([`outcome`]), what an LLM judges and how its candidates are written ([`judge`]), the
//! out-of-scope verdict ([`out_of_scope`]), and the trace steps a request and its jobs carry ([`trace`]). It
//! names no other wing: each wing above takes the words it uses from here.

pub mod judge;
pub mod out_of_scope;
pub mod outcome;
pub mod request;
pub(crate) mod trace;
