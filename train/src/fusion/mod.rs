//! Fitting the fusion offline (`tiergate fit-fusion`, `eval --hybrid`): the weight and temperature on a dev
//! split with a sign test on the rows the choice never saw ([`fit`]), and the cascade replayed on recorded rows
//! ([`stages`]).

pub mod fit;
pub mod stages;
