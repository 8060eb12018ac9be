//! The slot state machine. Every transition is one compare-and-swap on `generation << 32 | taker << 8 | state`,
//! so a party holding a stale generation (a late worker, a duplicate reply) always fails and its write is
//! dropped. The worker that takes a job is recorded in the same CAS (`taker` = worker index + 1), so a worker
//! killed right after taking a job can never leave a TAKEN slot that names nobody.
//!
//! ```text
//!   FREE(g) --claim--> WRITING(g) --publish--> READY(g) --take(w)--> TAKEN(g,w) --finish--> DONE(g)
//!   READY(g) --withdraw--> FREE(g+1)            TAKEN(g,w) --abort--> ABORTED(g)   (worker died)
//!   TAKEN(g,w) --requeue--> READY(g)  (retry once) DONE(g) | ABORTED(g) --release--> FREE(g+1)
//! ```

use std::sync::atomic::Ordering::{AcqRel, Acquire};

use crate::layout::{pack, state, unpack, SlotHeader};

fn cas(slot: &SlotHeader, from: u64, to: u64) -> bool {
    slot.word
        .compare_exchange(from, to, AcqRel, Acquire)
        .is_ok()
}

/// The low word of a TAKEN slot held by `taker` (worker index + 1).
fn taken_by(taker: u32) -> u32 {
    state::TAKEN | (taker & 0xff) << 8
}

/// Current (generation, state).
pub fn load(slot: &SlotHeader) -> (u32, u32) {
    let (gen, low) = unpack(slot.word.load(Acquire));
    (gen, low & 0xff)
}

/// The worker (index + 1) holding a TAKEN slot, from the slot word itself; `None` in any other state.
pub fn taker(slot: &SlotHeader) -> Option<u32> {
    let (_, low) = unpack(slot.word.load(Acquire));
    (low & 0xff == state::TAKEN).then_some(low >> 8 & 0xff)
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

/// Worker `taker` (index + 1): READY → TAKEN. Returns the generation taken.
pub fn take(slot: &SlotHeader, taker: u32) -> Option<u32> {
    let (gen, st) = load(slot);
    (st == state::READY && cas(slot, pack(gen, st), pack(gen, taken_by(taker)))).then_some(gen)
}

/// Worker: TAKEN → DONE (false: the job is no longer this worker's; drop the reply).
pub fn finish(slot: &SlotHeader, gen: u32, taker: u32) -> bool {
    cas(slot, pack(gen, taken_by(taker)), pack(gen, state::DONE))
}

/// Supervisor: TAKEN → ABORTED, after the worker was killed and reaped.
pub fn abort(slot: &SlotHeader, gen: u32, taker: u32) -> bool {
    cas(slot, pack(gen, taken_by(taker)), pack(gen, state::ABORTED))
}

/// Supervisor: TAKEN → READY, to retry a dead worker's job on another worker.
pub fn requeue(slot: &SlotHeader, gen: u32, taker: u32) -> bool {
    cas(slot, pack(gen, taken_by(taker)), pack(gen, state::READY))
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
        /// Who holds a TAKEN slot (worker index + 1).
        taker: u32,
    }

    impl Model {
        fn apply(&mut self, op: Op) -> bool {
            use state::*;
            let (g, s, t) = (self.gen, self.st, self.taker);
            let held = |d: u32, w: u32| s == TAKEN && d == 0 && w == t;
            let (ok, next) = match op {
                Op::Claim => (s == FREE, (g, WRITING, 0)),
                Op::Publish(d) => (s == WRITING && d == 0, (g, READY, 0)),
                Op::Withdraw(d) => (s == READY && d == 0, (g.wrapping_add(1), FREE, 0)),
                Op::Take(w) => (s == READY, (g, TAKEN, w)),
                Op::Finish(d, w) => (held(d, w), (g, DONE, 0)),
                Op::Abort(d, w) => (held(d, w), (g, ABORTED, 0)),
                Op::Requeue(d, w) => (held(d, w), (g, READY, 0)),
                Op::Release(d) => (
                    (s == DONE || s == ABORTED) && d == 0,
                    (g.wrapping_add(1), FREE, 0),
                ),
            };
            if ok {
                (self.gen, self.st, self.taker) = next;
            }
            ok
        }
    }

    /// An operation; the first `u32` is how many generations stale the actor's view is (0: current), the
    /// second the worker (index + 1) acting or named.
    #[derive(Debug, Clone, Copy)]
    enum Op {
        Claim,
        Publish(u32),
        Withdraw(u32),
        Take(u32),
        Finish(u32, u32),
        Abort(u32, u32),
        Requeue(u32, u32),
        Release(u32),
    }

    fn op() -> impl Strategy<Value = Op> {
        let stale = prop_oneof![3 => Just(0u32), 1 => 1u32..3];
        let worker = 1u32..4;
        prop_oneof![
            Just(Op::Claim),
            stale.clone().prop_map(Op::Publish),
            stale.clone().prop_map(Op::Withdraw),
            worker.clone().prop_map(Op::Take),
            (stale.clone(), worker.clone()).prop_map(|(d, w)| Op::Finish(d, w)),
            (stale.clone(), worker.clone()).prop_map(|(d, w)| Op::Abort(d, w)),
            (stale.clone(), worker).prop_map(|(d, w)| Op::Requeue(d, w)),
            stale.prop_map(Op::Release),
        ]
    }

    proptest! {
        /// Any sequence of operations, with current or stale generations, moves the real slot exactly as the
        /// model says: a stale actor never changes anything.
        #[test]
        fn slot_matches_the_model(ops in proptest::collection::vec(op(), 0..200)) {
            let slot: SlotHeader = unsafe { std::mem::zeroed() };
            let mut model = Model { gen: 0, st: state::FREE, taker: 0 };
            for op in ops {
                let (gen, _) = load(&slot);
                let at = |d: u32| gen.wrapping_sub(d);
                let real = match op {
                    Op::Claim => claim(&slot).is_some(),
                    Op::Publish(d) => publish(&slot, at(d)),
                    Op::Withdraw(d) => withdraw(&slot, at(d)),
                    Op::Take(w) => take(&slot, w).is_some(),
                    Op::Finish(d, w) => finish(&slot, at(d), w),
                    Op::Abort(d, w) => abort(&slot, at(d), w),
                    Op::Requeue(d, w) => requeue(&slot, at(d), w),
                    Op::Release(d) => release(&slot, at(d)),
                };
                let expected = model.apply(op);
                prop_assert_eq!(real, expected, "{:?}", op);
                prop_assert_eq!(load(&slot), (model.gen, model.st));
                prop_assert_eq!(taker(&slot), (model.st == state::TAKEN).then_some(model.taker));
            }
        }
    }
}
