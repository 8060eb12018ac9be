//! The segment: a `#[repr(C)]` header, per-worker records, then fixed-size slots addressed by offsets.
//! Every length read from the segment is bounds-checked by the reader: the peer is untrusted.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use shared_memory::{Shmem, ShmemConf, ShmemError};

use crate::error::{QueueError, Result};
use crate::futex::{now_ns, Waiters};

/// "TIERGATE" in ASCII.
pub const MAGIC: u64 = 0x5449_4552_4741_5445;
/// Bumped on any change of the layout below or of the job encoding (2: per-slot wake-ups, counted waiters,
/// postcard-encoded jobs and replies; 3: jobs carry the submitter's trace context; 4: a rerank carries no fusion
/// weights and its reply only the LLM's scores: the server fuses; 7: a generation's usage says its cached
/// prompt tokens).
pub const LAYOUT_VERSION: u32 = 7;
/// Worker records in the header.
pub const MAX_WORKERS: usize = 16;

/// Slot states (low 32 bits of [`SlotHeader::word`]; the high 32 bits are the slot's generation).
pub mod state {
    /// Nobody owns the slot.
    pub const FREE: u32 = 0;
    /// A producer is writing the request.
    pub const WRITING: u32 = 1;
    /// The request is complete and waits for a worker.
    pub const READY: u32 = 2;
    /// A worker took it and is answering.
    pub const TAKEN: u32 = 3;
    /// The worker finished (the response area holds a final frame).
    pub const DONE: u32 = 4;
    /// The supervisor gave up on the job (its worker died); the producer reports `WorkerDown`.
    pub const ABORTED: u32 = 5;
}

/// Job kinds in [`SlotHeader::kind`].
pub mod job_kind {
    /// A rerank (or anything not a generation).
    pub const RERANK: u32 = 0;
    /// A generation.
    pub const GENERATE: u32 = 1;
}

/// Packs generation and state into one word, so a transition on a stale generation fails its CAS.
pub fn pack(gen: u32, st: u32) -> u64 {
    (u64::from(gen) << 32) | u64::from(st)
}

/// Splits a slot word into (generation, state).
pub fn unpack(word: u64) -> (u32, u32) {
    ((word >> 32) as u32, word as u32)
}

/// A worker's record in the header.
#[repr(C)]
pub struct WorkerRecord {
    /// OS pid of the worker holding this record (0: unused).
    pub pid: AtomicU32,
    /// 1 while the worker is ready to take jobs.
    pub ready: AtomicU32,
    /// Last heartbeat, monotonic nanoseconds.
    pub heartbeat_ns: AtomicU64,
    /// Nanoseconds during which at least one job was running (the utilisation signal without a GPU).
    pub busy_ns: AtomicU64,
    /// Jobs finished.
    pub jobs_done: AtomicU64,
    /// Units of work the worker's engine has finished (forward passes, tokens; [`crate::worker::note_progress`]),
    /// published with each heartbeat: the supervisor spares a worker past a job's deadline while it advances.
    pub progress: AtomicU64,
}

/// The segment header.
#[repr(C)]
pub struct Header {
    /// [`MAGIC`].
    pub magic: u64,
    /// [`LAYOUT_VERSION`].
    pub version: u32,
    /// pid of the creating (server) process.
    pub creator_pid: u32,
    /// Total segment size in bytes.
    pub size: u64,
    /// Creation time, monotonic ns: tells instances apart.
    pub epoch: u64,
    /// Number of slots.
    pub n_slots: u32,
    /// Bytes per slot, header included.
    pub slot_size: u32,
    /// Request capacity per slot.
    pub req_cap: u32,
    /// Response capacity per slot.
    pub resp_cap: u32,
    /// Set to 1 when the server shuts down: workers exit.
    pub shutdown: AtomicU32,
    /// Bumped on every job posted (workers sleep on it).
    pub jobs_posted: AtomicU32,
    /// Bumped on every response write (the producer's dispatcher sleeps on it).
    pub replies_posted: AtomicU32,
    /// Worker threads asleep on `jobs_posted` (a post wakes only when there is one).
    pub job_sleepers: AtomicU32,
    /// Dispatchers asleep on `replies_posted`.
    pub reply_sleepers: AtomicU32,
    /// Worker threads polling for jobs (a post needs no wake-up while one polls).
    pub job_spinners: AtomicU32,
    /// Per-worker records.
    pub workers: [WorkerRecord; MAX_WORKERS],
}

/// Per-slot header, followed by `req_cap` request bytes then `resp_cap` response bytes.
#[repr(C)]
pub struct SlotHeader {
    /// `generation << 32 | state`.
    pub word: AtomicU64,
    /// Unused since layout 2 (the worker holding a job is part of `word`, set in the same CAS as TAKEN).
    pub worker: AtomicU32,
    /// Set to 1 by the producer to ask the worker to stop.
    pub cancel: AtomicU32,
    /// Request length in bytes.
    pub req_len: AtomicU32,
    /// Response bytes committed so far (frames; see `protocol`).
    pub resp_len: AtomicU32,
    /// Deadline, monotonic ns (0: none).
    pub deadline_ns: AtomicU64,
    /// 1 once the job was retried after a worker death (a job is retried at most once).
    pub retried: AtomicU32,
    /// Bumped on every response write and state change made for the submitter (a caller waiting on its own
    /// slot sleeps on it).
    pub resp_seq: AtomicU32,
    /// Callers asleep on `resp_seq`.
    pub resp_sleepers: AtomicU32,
    /// What the job is ([`job_kind`]), written by the producer so that a worker can choose jobs before
    /// decoding them (untrusted: the worker checks it against the decoded job).
    pub kind: AtomicU32,
    _pad: [u32; 4],
}

const HEADER_BYTES: usize = 4096;
const SLOT_HEADER_BYTES: usize = 64;

/// A mapped segment. The mapping is shared with other processes; all shared fields are atomics, and the bytes
/// areas are written only by the single owner the slot state grants.
pub struct Segment {
    shm: Shmem,
    base: *mut u8,
    /// The geometry, copied out of the header once (at create, or validated at open): a peer can write the
    /// header, so addressing never re-reads it.
    geo: Geometry,
    slot_size: usize,
}

// SAFETY: the mapping lives as long as `Segment`; concurrent access goes through atomics, and request/response
// byte areas are only written by the party that the slot's state machine makes their single owner.
unsafe impl Send for Segment {}
// SAFETY: as above.
unsafe impl Sync for Segment {}

/// Segment geometry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Geometry {
    /// Number of slots (the most jobs in flight).
    pub slots: usize,
    /// Request bytes per slot.
    pub req_cap: usize,
    /// Response bytes per slot.
    pub resp_cap: usize,
}

const _: () = assert!(std::mem::size_of::<Header>() <= HEADER_BYTES);
const _: () = assert!(std::mem::size_of::<SlotHeader>() == SLOT_HEADER_BYTES);

fn seg_err(e: impl std::fmt::Display) -> QueueError {
    QueueError::Segment(e.to_string())
}

/// True when a process with this pid exists (signal 0 probes without delivering anything).
pub fn pid_alive(pid: u32) -> bool {
    if pid == 0 {
        return false;
    }
    // SAFETY: kill with signal 0 performs only the permission/existence check.
    let rc = unsafe { libc::kill(pid as libc::pid_t, 0) };
    rc == 0 || std::io::Error::last_os_error().raw_os_error() == Some(libc::EPERM)
}

impl Header {
    /// Who waits for jobs.
    pub fn job_waiters(&self) -> Waiters<'_> {
        Waiters {
            word: &self.jobs_posted,
            sleepers: &self.job_sleepers,
            spinners: Some(&self.job_spinners),
        }
    }

    /// Who waits for replies in the dispatcher.
    pub fn reply_waiters(&self) -> Waiters<'_> {
        Waiters {
            word: &self.replies_posted,
            sleepers: &self.reply_sleepers,
            spinners: None,
        }
    }
}

impl SlotHeader {
    /// Who waits on this slot: a blocking caller.
    pub fn waiters(&self) -> Waiters<'_> {
        Waiters {
            word: &self.resp_seq,
            sleepers: &self.resp_sleepers,
            spinners: None,
        }
    }
}

impl Segment {
    /// Creates the named segment. A segment of the same name left by a dead creator is removed first; one
    /// whose creator is alive is never touched (an error says so).
    pub fn create(name: &str, geo: Geometry) -> Result<Self> {
        if geo.slots == 0 || geo.slots > 65_536 || geo.req_cap < 64 || geo.resp_cap < 64 {
            return Err(QueueError::Invalid(format!("bad geometry {geo:?}")));
        }
        let slot_size = (SLOT_HEADER_BYTES + geo.req_cap + geo.resp_cap).next_multiple_of(64);
        let len = HEADER_BYTES + geo.slots * slot_size;
        let shm = match ShmemConf::new().os_id(name).size(len).create() {
            Ok(s) => s,
            Err(ShmemError::MappingIdExists) => {
                remove_if_stale(name)?;
                ShmemConf::new()
                    .os_id(name)
                    .size(len)
                    .create()
                    .map_err(seg_err)?
            }
            Err(e) => return Err(seg_err(e)),
        };
        let base = shm.as_ptr();
        let seg = Self {
            shm,
            base,
            geo,
            slot_size,
        };
        // SAFETY: we created the mapping (zero-filled by the OS) and nobody else knows the epoch yet; the header
        // is written before any peer can validate it.
        unsafe {
            let h = base as *mut Header;
            (*h).version = LAYOUT_VERSION;
            (*h).creator_pid = std::process::id();
            (*h).size = len as u64;
            (*h).epoch = now_ns();
            (*h).n_slots = geo.slots as u32;
            (*h).slot_size = slot_size as u32;
            (*h).req_cap = geo.req_cap as u32;
            (*h).resp_cap = geo.resp_cap as u32;
            std::sync::atomic::fence(Ordering::Release);
            std::ptr::write_volatile(&mut (*h).magic, MAGIC);
        }
        Ok(seg)
    }

    /// Opens an existing segment (a worker's side) and validates its header against the mapping.
    pub fn open(name: &str) -> Result<Self> {
        let mut shm = ShmemConf::new().os_id(name).open().map_err(seg_err)?;
        shm.set_owner(false);
        let base = shm.as_ptr();
        let len = shm.len();
        let (geo, slot_size) = read_geometry(base, len)?;
        Ok(Self {
            shm,
            base,
            geo,
            slot_size,
        })
    }

    /// Marks this handle as the owner (unlinks the name on drop) or not.
    pub fn set_owner(&mut self, owner: bool) {
        self.shm.set_owner(owner);
    }

    /// The header.
    pub fn header(&self) -> &Header {
        // SAFETY: HEADER_BYTES >= size_of::<Header>() and the mapping is at least that long (create/validate);
        // page alignment satisfies Header's alignment.
        unsafe { &*(self.base as *const Header) }
    }

    /// Number of slots.
    pub fn slots(&self) -> usize {
        self.geo.slots
    }

    /// A slot's header. Panics never: indices are taken modulo-checked by callers; out of range is `None`.
    pub fn slot(&self, i: usize) -> Option<&SlotHeader> {
        if i >= self.slots() {
            return None;
        }
        let off = HEADER_BYTES + i * self.slot_size;
        // SAFETY: validate/create guarantee HEADER_BYTES + n_slots * slot_size <= len; slot_size is a multiple of
        // 64 so the SlotHeader is aligned.
        Some(unsafe { &*(self.base.add(off) as *const SlotHeader) })
    }

    fn area(&self, i: usize, request: bool) -> Option<(*mut u8, usize)> {
        self.slot(i)?;
        let off = HEADER_BYTES + i * self.slot_size + SLOT_HEADER_BYTES;
        let (off, cap) = if request {
            (off, self.geo.req_cap)
        } else {
            (off + self.geo.req_cap, self.geo.resp_cap)
        };
        // SAFETY: within the slot, which is within the mapping (see `slot`).
        Some((unsafe { self.base.add(off) }, cap))
    }

    /// Copies `len` bytes of slot `i`'s request (len checked against the capacity).
    pub fn read_request(&self, i: usize, len: usize) -> Result<Vec<u8>> {
        let (p, cap) = self
            .area(i, true)
            .ok_or_else(|| QueueError::Protocol("slot index".into()))?;
        if len > cap {
            return Err(QueueError::Protocol(format!(
                "request length {len} > capacity {cap}"
            )));
        }
        // SAFETY: [p, p+len) lies in the request area; the slot's state makes the producer done writing.
        Ok(unsafe { std::slice::from_raw_parts(p, len) }.to_vec())
    }

    /// Writes slot `i`'s request bytes (the caller owns the slot in state WRITING).
    pub fn write_request(&self, i: usize, bytes: &[u8]) -> Result<()> {
        let (p, cap) = self
            .area(i, true)
            .ok_or_else(|| QueueError::Protocol("slot index".into()))?;
        if bytes.len() > cap {
            return Err(QueueError::Invalid(format!(
                "job of {} bytes > slot capacity {cap}",
                bytes.len()
            )));
        }
        // SAFETY: in bounds; the WRITING state gives this caller exclusive use of the area.
        unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), p, bytes.len()) };
        Ok(())
    }

    /// Copies response bytes `[from, to)` of slot `i` (bounds-checked).
    pub fn read_response(&self, i: usize, from: usize, to: usize) -> Result<Vec<u8>> {
        let (p, cap) = self
            .area(i, false)
            .ok_or_else(|| QueueError::Protocol("slot index".into()))?;
        if from > to || to > cap {
            return Err(QueueError::Protocol(format!(
                "response range {from}..{to} outside 0..{cap}"
            )));
        }
        // SAFETY: in bounds; bytes below the committed length are no longer written by the worker.
        Ok(unsafe { std::slice::from_raw_parts(p.add(from), to - from) }.to_vec())
    }

    /// Writes response bytes at `at` (the worker owns the slot in state TAKEN). Returns false when they do not
    /// fit.
    pub fn write_response(&self, i: usize, at: usize, bytes: &[u8]) -> bool {
        let Some((p, cap)) = self.area(i, false) else {
            return false;
        };
        if at.checked_add(bytes.len()).is_none_or(|end| end > cap) {
            return false;
        }
        // SAFETY: in bounds; TAKEN gives the worker exclusive write access above the committed length.
        unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), p.add(at), bytes.len()) };
        true
    }

    /// Response capacity per slot.
    pub fn resp_cap(&self) -> usize {
        self.geo.resp_cap
    }

    /// Request capacity per slot.
    pub fn req_cap(&self) -> usize {
        self.geo.req_cap
    }
}

/// Reads a peer-created header once (each field a single volatile read) and checks its geometry against the
/// mapping of `len` bytes at `base`.
fn read_geometry(base: *mut u8, len: usize) -> Result<(Geometry, usize)> {
    if len < HEADER_BYTES {
        return Err(QueueError::Protocol(
            "segment smaller than its header".into(),
        ));
    }
    let h = base as *const Header;
    // SAFETY: the header lies inside the mapping (checked above); plain integer fields are read once each,
    // volatile, so a peer writing them concurrently cannot make one check see two values.
    let (magic, version, size, n_slots, slot_size, req_cap, resp_cap) = unsafe {
        (
            std::ptr::read_volatile(std::ptr::addr_of!((*h).magic)),
            std::ptr::read_volatile(std::ptr::addr_of!((*h).version)),
            std::ptr::read_volatile(std::ptr::addr_of!((*h).size)),
            std::ptr::read_volatile(std::ptr::addr_of!((*h).n_slots)) as usize,
            std::ptr::read_volatile(std::ptr::addr_of!((*h).slot_size)) as usize,
            std::ptr::read_volatile(std::ptr::addr_of!((*h).req_cap)) as usize,
            std::ptr::read_volatile(std::ptr::addr_of!((*h).resp_cap)) as usize,
        )
    };
    if magic != MAGIC || version != LAYOUT_VERSION {
        return Err(QueueError::Protocol(format!(
            "not a tiergate segment of layout {LAYOUT_VERSION} (magic {magic:#x}, version {version})"
        )));
    }
    let need = HEADER_BYTES as u128 + n_slots as u128 * slot_size as u128;
    if size != len as u64
        || need > len as u128
        || slot_size < SLOT_HEADER_BYTES + req_cap + resp_cap
        || !slot_size.is_multiple_of(64)
    {
        return Err(QueueError::Protocol(
            "segment geometry does not fit the mapping".into(),
        ));
    }
    let geo = Geometry {
        slots: n_slots,
        req_cap,
        resp_cap,
    };
    Ok((geo, slot_size))
}

/// Removes every segment named `{prefix}…` whose creator process is dead (segments of killed servers whose
/// names a new instance would never reuse). Returns how many were removed. Linux: lists `/dev/shm`.
pub fn sweep_stale(prefix: &str) -> usize {
    let Ok(entries) = std::fs::read_dir("/dev/shm") else {
        return 0;
    };
    let mut removed = 0;
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if name.starts_with(prefix) && remove_if_stale(&name).is_ok() {
            removed += 1;
        }
    }
    removed
}

/// How old a segment without a header must be before it counts as left over (a creator writes the header
/// microseconds after creating the segment).
const HEADERLESS_GRACE: std::time::Duration = std::time::Duration::from_secs(60);

/// True when `/dev/shm/{name}` was last modified more than `age` ago (false when that cannot be told).
fn older_than(name: &str, age: std::time::Duration) -> bool {
    std::fs::metadata(std::path::Path::new("/dev/shm").join(name))
        .and_then(|m| m.modified())
        .ok()
        .and_then(|t| t.elapsed().ok())
        .is_some_and(|e| e > age)
}

/// Removes a segment whose creator is dead (or that never got a header and is old). A segment with a live creator is an error.
fn remove_if_stale(name: &str) -> Result<()> {
    let mut shm = ShmemConf::new().os_id(name).open().map_err(seg_err)?;
    let len = shm.len();
    let pid = if len >= HEADER_BYTES {
        // SAFETY: the mapping is at least a header long; we only read plain integers.
        let h = unsafe { &*(shm.as_ptr() as *const Header) };
        (h.magic == MAGIC).then_some(h.creator_pid)
    } else {
        None
    };
    match pid {
        Some(pid) if pid_alive(pid) => {
            shm.set_owner(false);
            Err(QueueError::Segment(format!(
                "segment `{name}` belongs to a running instance (pid {pid}); choose another name"
            )))
        }
        // No header yet: its creator may be writing it right now. Only an old one is left over.
        None if !older_than(name, HEADERLESS_GRACE) => {
            shm.set_owner(false);
            Err(QueueError::Segment(format!(
                "segment `{name}` has no header yet (another process may be creating it); not removed"
            )))
        }
        _ => {
            tracing::warn!(
                segment = name,
                ?pid,
                "removing stale segment left by a dead process"
            );
            shm.set_owner(true); // unlinked on drop
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A peer that rewrites the header's geometry cannot steer this side's addressing: the geometry was
    /// copied at create.
    #[test]
    fn a_corrupted_header_does_not_move_the_slots() {
        let name = format!("tiergate-unit-geo-{}", std::process::id());
        let geo = Geometry {
            slots: 2,
            req_cap: 64,
            resp_cap: 64,
        };
        let seg = Segment::create(&name, geo).unwrap();
        let peer = Segment::open(&name).unwrap();
        let h = peer.header() as *const Header as *mut Header;
        // SAFETY: test code playing a hostile peer: plain integer writes into the mapped header.
        unsafe {
            std::ptr::write_volatile(std::ptr::addr_of_mut!((*h).n_slots), 1_000_000);
            std::ptr::write_volatile(std::ptr::addr_of_mut!((*h).slot_size), 1 << 30);
            std::ptr::write_volatile(std::ptr::addr_of_mut!((*h).resp_cap), u32::MAX);
        }
        assert_eq!(seg.slots(), 2);
        assert!(seg.slot(2).is_none() && seg.slot(999_999).is_none());
        assert_eq!(seg.resp_cap(), 64);
        assert!(seg.read_response(1, 0, 65).is_err());
        assert!(!seg.write_response(1, 60, &[0; 8]));
        // A fresh open sees the corrupted geometry and refuses it.
        assert!(Segment::open(&name).is_err());
    }

    /// The stale sweep leaves a young segment without a header alone (its creator may be writing it) and
    /// removes an old one.
    #[test]
    fn a_young_headerless_segment_is_not_swept() {
        let name = format!("tiergate-unit-hdrless-{}", std::process::id());
        let path = std::path::Path::new("/dev/shm").join(&name);
        std::fs::write(&path, vec![0u8; 2 * HEADER_BYTES]).unwrap();
        assert_eq!(sweep_stale(&name), 0);
        assert!(path.exists(), "a young header-less segment was removed");
        let old = std::time::SystemTime::now() - 2 * HEADERLESS_GRACE;
        std::fs::File::options()
            .write(true)
            .open(&path)
            .unwrap()
            .set_modified(old)
            .unwrap();
        assert_eq!(sweep_stale(&name), 1);
        assert!(!path.exists());
    }
}
