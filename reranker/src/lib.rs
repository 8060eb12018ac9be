//! The LLM reranker worker. Issue 3 builds it; empty until then.
