//! The slot state machine. Every transition is one compare-and-swap on `generation << 32 | state`, so a party
//! holding a stale generation (a late worker, a duplicate reply) always fails and its write is dropped.
//!
//! ```text
//!   FREE(g) --claim--> WRITING(g) --publish--> READY(g) --take--> TAKEN(g) --finish--> DONE(g)
//!   READY(g) --withdraw--> FREE(g+1)            TAKEN(g) --abort--> ABORTED(g)   (worker died)
//!   TAKEN(g) --requeue--> READY(g)  (retry once) DONE(g) | ABORTED(g) --release--> FREE(g+1)
//! ```

use std::sync::atomic::Ordering::{AcqRel, Acquire};

use crate::layout::{pack, state, unpack, SlotHeader};

fn cas(slot: &SlotHeader, from: u64, to: u64) -> bool {
    slot.word
        .compare_exchange(from, to, AcqRel, Acquire)
        .is_ok()
}

/// Current (generation, state).
pub fn load(slot: &SlotHeader) -> (u32, u32) {
    unpack(slot.word.load(Acquire))
}

/// Producer: FREE → WRITING. Returns the generation now owned.
pub fn claim(slot: &SlotHeader) -> Option<u32> {
    let (gen, st) = load(slot);
    (st == state::FREE && cas(slot, pack(gen, st), pack(gen, state::WRITING))).then_some(gen)
}

/// Producer: WRITING → READY.
pub fn publish(slot: &SlotHeader, gen: u32) -> bool {
    cas(slot, pack(gen, state::WRITING), pack(gen, state::READY))
}

/// Producer: READY → FREE(g+1), taking back a job no worker has started.
pub fn withdraw(slot: &SlotHeader, gen: u32) -> bool {
    cas(
        slot,
        pack(gen, state::READY),
        pack(gen.wrapping_add(1), state::FREE),
    )
}

/// Worker: READY → TAKEN. Returns the generation taken.
pub fn take(slot: &SlotHeader) -> Option<u32> {
    let (gen, st) = load(slot);
    (st == state::READY && cas(slot, pack(gen, st), pack(gen, state::TAKEN))).then_some(gen)
}

/// Worker: TAKEN → DONE (false: the job is no longer this worker's; drop the reply).
pub fn finish(slot: &SlotHeader, gen: u32) -> bool {
    cas(slot, pack(gen, state::TAKEN), pack(gen, state::DONE))
}

/// Supervisor: TAKEN → ABORTED, after the worker was killed and reaped.
pub fn abort(slot: &SlotHeader, gen: u32) -> bool {
    cas(slot, pack(gen, state::TAKEN), pack(gen, state::ABORTED))
}

/// Supervisor: TAKEN → READY, to retry a dead worker's job on another worker.
pub fn requeue(slot: &SlotHeader, gen: u32) -> bool {
    cas(slot, pack(gen, state::TAKEN), pack(gen, state::READY))
}

/// Producer: DONE/ABORTED → FREE(g+1), after reading the outcome.
pub fn release(slot: &SlotHeader, gen: u32) -> bool {
    cas(
        slot,
        pack(gen, state::DONE),
        pack(gen.wrapping_add(1), state::FREE),
    ) || cas(
        slot,
        pack(gen, state::ABORTED),
        pack(gen.wrapping_add(1), state::FREE),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// The reference model: a plain (generation, state) pair and the same transition table.
    #[derive(Debug, Clone, Copy, PartialEq)]
    struct Model {
        gen: u32,
        st: u32,
    }

    impl Model {
        fn apply(&mut self, op: Op) -> bool {
            use state::*;
            let (g, s) = (self.gen, self.st);
            let (ok, next) = match op {
                Op::Claim => (s == FREE, (g, WRITING)),
                Op::Publish(d) => (s == WRITING && d == 0, (g, READY)),
                Op::Withdraw(d) => (s == READY && d == 0, (g.wrapping_add(1), FREE)),
                Op::Take => (s == READY, (g, TAKEN)),
                Op::Finish(d) => (s == TAKEN && d == 0, (g, DONE)),
                Op::Abort(d) => (s == TAKEN && d == 0, (g, ABORTED)),
                Op::Requeue(d) => (s == TAKEN && d == 0, (g, READY)),
                Op::Release(d) => (
                    (s == DONE || s == ABORTED) && d == 0,
                    (g.wrapping_add(1), FREE),
                ),
            };
            if ok {
                (self.gen, self.st) = next;
            }
            ok
        }
    }

    /// An operation; the `u32` is how many generations stale the actor's view is (0: current).
    #[derive(Debug, Clone, Copy)]
    enum Op {
        Claim,
        Publish(u32),
        Withdraw(u32),
        Take,
        Finish(u32),
        Abort(u32),
        Requeue(u32),
        Release(u32),
    }

    fn op() -> impl Strategy<Value = Op> {
        let stale = prop_oneof![3 => Just(0u32), 1 => 1u32..3];
        prop_oneof![
            Just(Op::Claim),
            stale.clone().prop_map(Op::Publish),
            stale.clone().prop_map(Op::Withdraw),
            Just(Op::Take),
            stale.clone().prop_map(Op::Finish),
            stale.clone().prop_map(Op::Abort),
            stale.clone().prop_map(Op::Requeue),
            stale.prop_map(Op::Release),
        ]
    }

    proptest! {
        /// Any sequence of operations, with current or stale generations, moves the real slot exactly as the
        /// model says: a stale actor never changes anything.
        #[test]
        fn slot_matches_the_model(ops in proptest::collection::vec(op(), 0..200)) {
            let slot: SlotHeader = unsafe { std::mem::zeroed() };
            let mut model = Model { gen: 0, st: state::FREE };
            for op in ops {
                let (gen, _) = load(&slot);
                let at = |d: u32| gen.wrapping_sub(d);
                let real = match op {
                    Op::Claim => claim(&slot).is_some(),
                    Op::Publish(d) => publish(&slot, at(d)),
                    Op::Withdraw(d) => withdraw(&slot, at(d)),
                    Op::Take => take(&slot).is_some(),
                    Op::Finish(d) => finish(&slot, at(d)),
                    Op::Abort(d) => abort(&slot, at(d)),
                    Op::Requeue(d) => requeue(&slot, at(d)),
                    Op::Release(d) => release(&slot, at(d)),
                };
                let expected = model.apply(op);
                prop_assert_eq!(real, expected, "{:?}", op);
                prop_assert_eq!(load(&slot), (model.gen, model.st));
            }
        }
    }
}
