//! Shared-memory escalation queue between the server and reranker workers. Issue 3 builds it; empty until then.
