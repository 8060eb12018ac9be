//! The LLM side: [`llm`] (submitting a job: the batch gate, the deadline, the breaker, the fair share), the
//! fair share of the workers between tenants ([`fair`]), the circuit breaker ([`crate::deps::breaker`]), service times and
//! the deadline prediction ([`deadline`]), the gate between interactive and batch work ([`priority`]) and the
//! checks of the worker's model made before any worker starts ([`preflight`]).

pub(crate) mod deadline;
pub(crate) mod fair;
pub(crate) mod llm;
pub(crate) mod preflight;
pub(crate) mod priority;
pub(crate) mod warmup;
