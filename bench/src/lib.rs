//! Load generator for tiergate. Issue 5 builds it; empty until then.
