//! The escalation channel between the tiergate server and its reranker worker processes: a named
//! shared-memory segment with fixed request/response slots, lock-free slot states with generations,
//! cross-process futex wake-ups with timeouts, streaming response frames, and worker supervision.
//!
//! Both the server and the worker depend on this crate; it must not depend on tokio, axum or mistralrs (the
//! server never compiles the LLM engine). Async callers use the flume receivers' `recv_async`.

pub mod client;
pub mod error;
pub mod futex;
pub mod layout;
pub mod protocol;
pub mod slot;
pub mod supervise;
pub mod worker;

pub use client::{Client, Event, JobHandle};
pub use error::{QueueError, Result};
pub use layout::{Geometry, Segment};
pub use protocol::{
    decode_job, decode_job_traced, decode_reply, encode_job, encode_job_traced, encode_reply,
    Candidate, Job, Message, Reply, RerankReply, Sampling, Tool, ToolCall, ToolChoice, Tools,
    TraceParent, Usage,
};
pub use supervise::{Supervisor, SupervisorConfig, SupervisorStats};
pub use worker::{QueueWorker, Taken, TakenJob};
