//! The SMMUv3 event queue: fault records written by the SMMU, read by software.
//!
//! Records are 32 bytes (four little-endian `u64` words). Bit positions follow the SMMUv3
//! architecture specification (IHI 0070) as Linux's `arm-smmu-v3.h` uses them (`EVTQ_*`):
//!
//! | word | bits | field |
//! |---|---|---|
//! | 0 | `[7:0]` | event id |
//! | 0 | `[11]` | SSV (substream id valid) |
//! | 0 | `[31:12]` | SSID |
//! | 0 | `[63:32]` | StreamID |
//! | 1 | `[33]` | PnU (privileged) |
//! | 1 | `[34]` | InD (instruction) |
//! | 1 | `[35]` | RnW (1: read) |
//! | 2 | `[63:0]` | input address (the IOVA) |
//!
//! The queue is bounded: when it is full, a new record is lost, the overflow flag is raised
//! (as the hardware toggles `SMMU_EVTQ_PROD.OVFLG`) and a lost-record counter goes up. The
//! queue never grows; software acknowledges the overflow with [`EventQueue::ack_overflow`].
//!
//! Whatever happens to the records, the queue counts every event the SMMU raised, by id
//! ([`EventQueue::raised`], written or lost), and every overflow episode
//! ([`EventQueue::overflows`]: each time OVFLG toggled), in fixed-size counters: a storm of
//! faults costs no memory.

use std::collections::VecDeque;
use std::fmt;

use crate::addr::{Access, Iova};

/// Smallest event queue: two records.
pub const MIN_EVTQ_LOG2SIZE: u32 = 1;
/// Largest event queue this model allows: 2^16 records (2 MiB). The cap keeps a scenario
/// from allocating unbounded memory.
pub const MAX_EVTQ_LOG2SIZE: u32 = 16;

/// An SMMUv3 event id (word 0 bits `[7:0]`).
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub enum EventId {
    /// `C_BAD_STREAMID` (0x02): the StreamID is beyond the stream table.
    BadStreamId,
    /// `C_BAD_STE` (0x04): the stream table entry is invalid or malformed.
    BadSte,
    /// `C_BAD_CD` (0x0a): the context descriptor is invalid or malformed.
    BadCd,
    /// `F_TRANSLATION` (0x10): no valid translation for the input address.
    Translation,
    /// `F_ADDR_SIZE` (0x11): an address beyond the configured size.
    AddrSize,
    /// `F_ACCESS` (0x12): access flag fault.
    Access,
    /// `F_PERMISSION` (0x13): the translation does not allow the access.
    Permission,
    /// Any other id.
    Other(u8),
}

impl EventId {
    /// The id's raw value.
    pub const fn raw(self) -> u8 {
        match self {
            EventId::BadStreamId => 0x02,
            EventId::BadSte => 0x04,
            EventId::BadCd => 0x0a,
            EventId::Translation => 0x10,
            EventId::AddrSize => 0x11,
            EventId::Access => 0x12,
            EventId::Permission => 0x13,
            EventId::Other(v) => v,
        }
    }

    /// The id with raw value `raw`.
    pub const fn from_raw(raw: u8) -> Self {
        match raw {
            0x02 => EventId::BadStreamId,
            0x04 => EventId::BadSte,
            0x0a => EventId::BadCd,
            0x10 => EventId::Translation,
            0x11 => EventId::AddrSize,
            0x12 => EventId::Access,
            0x13 => EventId::Permission,
            v => EventId::Other(v),
        }
    }

    /// The architecture's name of the event.
    pub const fn name(self) -> &'static str {
        match self {
            EventId::BadStreamId => "C_BAD_STREAMID",
            EventId::BadSte => "C_BAD_STE",
            EventId::BadCd => "C_BAD_CD",
            EventId::Translation => "F_TRANSLATION",
            EventId::AddrSize => "F_ADDR_SIZE",
            EventId::Access => "F_ACCESS",
            EventId::Permission => "F_PERMISSION",
            EventId::Other(_) => "OTHER",
        }
    }
}

impl fmt::Display for EventId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({:#04x})", self.name(), self.raw())
    }
}

/// One encoded event record.
pub type RawEvent = [u64; 4];

const EVT_0_ID_MASK: u64 = 0xff;
const EVT_0_SSV: u64 = 1 << 11;
const EVT_0_SSID_SHIFT: u32 = 12;
const EVT_0_SSID_MASK: u64 = 0xf_ffff << EVT_0_SSID_SHIFT;
const EVT_0_SID_SHIFT: u32 = 32;
const EVT_1_PNU: u64 = 1 << 33;
const EVT_1_IND: u64 = 1 << 34;
const EVT_1_RNW: u64 = 1 << 35;

/// One fault record, decoded.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub struct EventRecord {
    /// What happened.
    pub id: EventId,
    /// The StreamID of the transaction.
    pub stream_id: u32,
    /// The SubstreamID, when the transaction had one (20 bits).
    pub ssid: Option<u32>,
    /// The input address of the transaction.
    pub iova: Iova,
    /// Read or write, from the device's side (`RnW`).
    pub access: Access,
    /// A privileged transaction (`PnU`).
    pub privileged: bool,
    /// An instruction fetch (`InD`).
    pub instruction: bool,
}

impl EventRecord {
    /// A record of a data access by `stream_id` at `iova`, without substream.
    pub const fn new(id: EventId, stream_id: u32, iova: Iova, access: Access) -> Self {
        EventRecord {
            id,
            stream_id,
            ssid: None,
            iova,
            access,
            privileged: false,
            instruction: false,
        }
    }

    /// Encodes the record into its four words (an SSID is truncated to its 20 bits).
    pub fn encode(&self) -> RawEvent {
        let mut w0 = u64::from(self.id.raw()) | (u64::from(self.stream_id) << EVT_0_SID_SHIFT);
        if let Some(ssid) = self.ssid {
            w0 |= EVT_0_SSV | ((u64::from(ssid) << EVT_0_SSID_SHIFT) & EVT_0_SSID_MASK);
        }
        let mut w1 = 0;
        if self.privileged {
            w1 |= EVT_1_PNU;
        }
        if self.instruction {
            w1 |= EVT_1_IND;
        }
        if self.access == Access::Read {
            w1 |= EVT_1_RNW;
        }
        [w0, w1, self.iova.get(), 0]
    }

    /// Decodes four words (the fields this model writes; other bits are ignored).
    pub fn decode(raw: RawEvent) -> Self {
        let [w0, w1, w2, _] = raw;
        EventRecord {
            id: EventId::from_raw((w0 & EVT_0_ID_MASK) as u8),
            stream_id: (w0 >> EVT_0_SID_SHIFT) as u32,
            ssid: (w0 & EVT_0_SSV != 0)
                .then_some(((w0 & EVT_0_SSID_MASK) >> EVT_0_SSID_SHIFT) as u32),
            iova: Iova::new(w2),
            access: if w1 & EVT_1_RNW != 0 {
                Access::Read
            } else {
                Access::Write
            },
            privileged: w1 & EVT_1_PNU != 0,
            instruction: w1 & EVT_1_IND != 0,
        }
    }
}

/// A bounded event queue of `2^log2size` records. See the module docs.
#[derive(Debug)]
pub struct EventQueue {
    records: VecDeque<RawEvent>,
    capacity: usize,
    /// `SMMU_EVTQ_PROD.OVFLG`, toggled by the SMMU on each overflow episode.
    prod_ovflg: bool,
    /// `SMMU_EVTQ_CONS.OVACKFLG`, set equal to OVFLG by software to acknowledge.
    cons_ovackflg: bool,
    written: u64,
    lost: u64,
    /// Events raised, by raw id (written or lost).
    raised: [u64; 256],
    /// Overflow episodes (OVFLG toggles).
    overflows: u64,
}

impl EventQueue {
    /// An empty queue of `2^log2size` records; `log2size` is clamped to
    /// `MIN_EVTQ_LOG2SIZE..=MAX_EVTQ_LOG2SIZE`.
    pub fn new(log2size: u32) -> Self {
        let capacity = 1usize << log2size.clamp(MIN_EVTQ_LOG2SIZE, MAX_EVTQ_LOG2SIZE);
        EventQueue {
            records: VecDeque::with_capacity(capacity),
            capacity,
            prod_ovflg: false,
            cons_ovackflg: false,
            written: 0,
            lost: 0,
            raised: [0; 256],
            overflows: 0,
        }
    }

    /// Writes a record, or loses it and raises the overflow flag if the queue is full.
    /// Returns whether the record was written.
    pub fn push(&mut self, record: &EventRecord) -> bool {
        self.raised[usize::from(record.id.raw())] += 1;
        if self.records.len() == self.capacity {
            // The hardware toggles OVFLG when an overflow starts; while it is not yet
            // acknowledged, further losses leave it as it is.
            if !self.overflow_pending() {
                self.prod_ovflg = !self.prod_ovflg;
                self.overflows += 1;
            }
            self.lost += 1;
            return false;
        }
        self.records.push_back(record.encode());
        self.written += 1;
        true
    }

    /// Reads (and removes) the oldest record.
    pub fn pop(&mut self) -> Option<EventRecord> {
        self.records.pop_front().map(EventRecord::decode)
    }

    /// Reads (and removes) every record, oldest first.
    pub fn drain(&mut self) -> Vec<EventRecord> {
        self.records.drain(..).map(EventRecord::decode).collect()
    }

    /// The records waiting, oldest first, without removing them.
    pub fn peek_all(&self) -> Vec<EventRecord> {
        self.records
            .iter()
            .copied()
            .map(EventRecord::decode)
            .collect()
    }

    /// Records waiting.
    pub fn len(&self) -> usize {
        self.records.len()
    }

    /// Whether no record is waiting.
    pub fn is_empty(&self) -> bool {
        self.records.is_empty()
    }

    /// Records the queue holds.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Whether records were lost since software last acknowledged (OVFLG != OVACKFLG).
    pub fn overflow_pending(&self) -> bool {
        self.prod_ovflg != self.cons_ovackflg
    }

    /// Acknowledges an overflow (software copies OVFLG into OVACKFLG).
    pub fn ack_overflow(&mut self) {
        self.cons_ovackflg = self.prod_ovflg;
    }

    /// Records written since creation.
    pub fn written(&self) -> u64 {
        self.written
    }

    /// Records lost to overflow since creation.
    pub fn lost(&self) -> u64 {
        self.lost
    }

    /// Events of kind `id` raised since creation, written or lost.
    pub fn raised(&self, id: EventId) -> u64 {
        self.raised[usize::from(id.raw())]
    }

    /// Overflow episodes since creation: how many times the SMMU toggled OVFLG.
    pub fn overflows(&self) -> u64 {
        self.overflows
    }

    /// The register value of `SMMU_EVTQ_PROD.OVFLG`.
    pub fn prod_ovflg(&self) -> bool {
        self.prod_ovflg
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn event_ids_round_trip() {
        for raw in 0..=255u8 {
            assert_eq!(EventId::from_raw(raw).raw(), raw);
        }
        assert_eq!(EventId::Translation.raw(), 0x10);
        assert_eq!(EventId::Permission.raw(), 0x13);
        assert_eq!(EventId::BadSte.raw(), 0x04);
    }

    #[test]
    fn record_layout_matches_hand_encoding() {
        let mut r = EventRecord::new(
            EventId::Permission,
            0x42,
            Iova::new(0xdead_b000),
            Access::Read,
        );
        r.ssid = Some(5);
        let raw = r.encode();
        // id 0x13, SSV bit 11, SSID 5 at bit 12, SID 0x42 at bit 32.
        assert_eq!(raw[0], 0x13 | (1 << 11) | (5 << 12) | (0x42 << 32));
        assert_eq!(raw[1], 1 << 35, "RnW set for a read");
        assert_eq!(raw[2], 0xdead_b000);
        assert_eq!(EventRecord::decode(raw), r);
        let w = EventRecord::new(EventId::Translation, 7, Iova::new(0x1000), Access::Write);
        assert_eq!(w.encode(), [0x10 | (7 << 32), 0, 0x1000, 0]);
        assert_eq!(EventRecord::decode(w.encode()), w);
    }

    #[test]
    fn overflow_loses_records_without_growing() {
        let mut q = EventQueue::new(1);
        let r = |n| EventRecord::new(EventId::Translation, n, Iova::new(0), Access::Read);
        assert!(q.push(&r(0)) && q.push(&r(1)));
        assert!(!q.overflow_pending());
        assert!(!q.push(&r(2)));
        assert!(!q.push(&r(3)));
        assert!(q.overflow_pending());
        assert_eq!((q.len(), q.capacity(), q.written(), q.lost()), (2, 2, 2, 2));
        assert_eq!((q.raised(EventId::Translation), q.overflows()), (4, 1));
        assert!(q.prod_ovflg());
        q.ack_overflow();
        assert!(!q.overflow_pending());
        assert_eq!(q.pop().unwrap().stream_id, 0);
        assert!(q.push(&r(4)));
        let ids: Vec<u32> = q.drain().iter().map(|e| e.stream_id).collect();
        assert_eq!(ids, [1, 4]);
        // A second episode toggles OVFLG back.
        for n in 5..8 {
            q.push(&r(n));
        }
        assert_eq!((q.overflows(), q.prod_ovflg(), q.lost()), (2, false, 3));
        assert!(q.overflow_pending());
    }
}
