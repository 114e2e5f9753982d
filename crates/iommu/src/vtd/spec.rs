//! Bit-exact VT-d encodings: translation structures, page-table entries, capability
//! registers, fault records and invalidation-queue descriptors.
//!
//! Field positions are those of the VT-d specification as Linux's
//! `drivers/iommu/intel/{iommu.h,pasid.h}` and VirtualBox's `iommu-intel.h` encode them
//! (X86.md §1.1–§1.6, §1.8). Every structure is a plain value with `encode` / `decode`;
//! decoders of structures the hardware reads report reserved bits it checks, descriptor
//! decoders reject unknown types and set reserved bits (what makes the hardware raise an
//! invalidation-queue error).
//!
//! Multi-word structures are arrays of little-endian 64-bit words, word 0 holding bits
//! 63:0; "bit 64" is bit 0 of word 1.

use crate::addr::Prot;

/// Bits 63:12 of a 64-bit word: a 4 KiB-aligned address field.
pub const ADDR_MASK_63_12: u64 = !0xFFF;
/// Bits 51:12: the address field of a page-table entry (X86.md §1.4).
pub const PTE_ADDR_MASK: u64 = ((1u64 << 52) - 1) & !0xFFF;

/// Extracts `width` bits of `word` starting at bit `lo`.
#[inline]
const fn bits(word: u64, lo: u32, width: u32) -> u64 {
    (word >> lo) & ((1u64 << width) - 1)
}

/// Whether bit `n` of `word` is set.
#[inline]
const fn bit(word: u64, n: u32) -> bool {
    word & (1 << n) != 0
}

// ---------------------------------------------------------------------------------------
// Register offsets (X86.md §1.1, VT-d spec ch. 11 via Linux iommu.h).
// ---------------------------------------------------------------------------------------

/// Register offsets from the remapping unit's (DRHD's) base.
pub mod reg {
    /// Version register.
    pub const VER: u64 = 0x00;
    /// Capability register.
    pub const CAP: u64 = 0x08;
    /// Extended capability register.
    pub const ECAP: u64 = 0x10;
    /// Global command register.
    pub const GCMD: u64 = 0x18;
    /// Global status register.
    pub const GSTS: u64 = 0x1C;
    /// Root table address register.
    pub const RTADDR: u64 = 0x20;
    /// Context command register.
    pub const CCMD: u64 = 0x28;
    /// Fault status register.
    pub const FSTS: u64 = 0x34;
    /// Fault event control register.
    pub const FECTL: u64 = 0x38;
    /// Invalidation queue head.
    pub const IQH: u64 = 0x80;
    /// Invalidation queue tail.
    pub const IQT: u64 = 0x88;
    /// Invalidation queue address.
    pub const IQA: u64 = 0x90;
    /// Invalidation completion status.
    pub const ICS: u64 = 0x9C;
    /// Invalidation queue error record.
    pub const IQERCD: u64 = 0xB0;
}

/// Fault status register (FSTS) bits (X86.md §1.1).
pub mod fsts {
    /// Primary fault overflow: a fault arrived with every recording register full.
    pub const PFO: u32 = 1 << 0;
    /// Primary pending fault: at least one fault record is valid.
    pub const PPF: u32 = 1 << 1;
    /// Invalidation queue error.
    pub const IQE: u32 = 1 << 4;
    /// Invalidation completion error (bad ATS completion).
    pub const ICE: u32 = 1 << 5;
    /// Invalidation time-out error (device-TLB).
    pub const ITE: u32 = 1 << 6;
    /// Shift of FRI (fault record index), bits 15:8.
    pub const FRI_SHIFT: u32 = 8;
}

// ---------------------------------------------------------------------------------------
// CAP / ECAP (X86.md §1.2).
// ---------------------------------------------------------------------------------------

/// The capability register (CAP, offset 0x08), decoded field by field.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Cap(pub u64);

impl Cap {
    /// ND, bits 2:0: number-of-domains code.
    pub const fn nd(self) -> u32 {
        bits(self.0, 0, 3) as u32
    }
    /// Number of domain ids: 2^(4 + 2·ND).
    pub const fn domains(self) -> u64 {
        1 << (4 + 2 * self.nd())
    }
    /// AFL, bit 3: advanced fault logging.
    pub const fn afl(self) -> bool {
        bit(self.0, 3)
    }
    /// RWBF, bit 4: required write-buffer flushing.
    pub const fn rwbf(self) -> bool {
        bit(self.0, 4)
    }
    /// CM, bit 7: Caching Mode (not-present and erroneous entries may be cached).
    pub const fn cm(self) -> bool {
        bit(self.0, 7)
    }
    /// SAGAW, bits 12:8: supported adjusted guest address widths (bit 1 = 3-level 39-bit,
    /// bit 2 = 4-level 48-bit, bit 3 = 5-level 57-bit).
    pub const fn sagaw(self) -> u32 {
        bits(self.0, 8, 5) as u32
    }
    /// MGAW, bits 21:16, plus one: the maximum guest address width in bits.
    pub const fn mgaw(self) -> u32 {
        bits(self.0, 16, 6) as u32 + 1
    }
    /// ZLR, bit 22: zero-length reads.
    pub const fn zlr(self) -> bool {
        bit(self.0, 22)
    }
    /// Byte offset of the first fault-recording register: FRO (bits 33:24) × 16.
    pub const fn fault_record_offset(self) -> u64 {
        bits(self.0, 24, 10) * 16
    }
    /// SLLPS, bits 37:34: second-level large pages (bit 0 = 2 MiB, bit 1 = 1 GiB).
    pub const fn sllps(self) -> u32 {
        bits(self.0, 34, 4) as u32
    }
    /// PSI, bit 39: page-selective IOTLB invalidation.
    pub const fn psi(self) -> bool {
        bit(self.0, 39)
    }
    /// Number of fault-recording registers: NFR (bits 47:40) + 1.
    pub const fn nfr(self) -> u32 {
        bits(self.0, 40, 8) as u32 + 1
    }
    /// MAMV, bits 53:48: the largest address mask a PSI may use.
    pub const fn mamv(self) -> u32 {
        bits(self.0, 48, 6) as u32
    }
    /// DWD, bit 54: write draining.
    pub const fn dwd(self) -> bool {
        bit(self.0, 54)
    }
    /// DRD, bit 55: read draining.
    pub const fn drd(self) -> bool {
        bit(self.0, 55)
    }
    /// FL1GP, bit 56: first-level 1 GiB pages.
    pub const fn fl1gp(self) -> bool {
        bit(self.0, 56)
    }
    /// PI, bit 59: posted interrupts.
    pub const fn pi(self) -> bool {
        bit(self.0, 59)
    }
    /// FL5LP, bit 60: first-level 5-level paging.
    pub const fn fl5lp(self) -> bool {
        bit(self.0, 60)
    }
    /// ESIRTPS, bit 62.
    pub const fn esirtps(self) -> bool {
        bit(self.0, 62)
    }
    /// ESRTPS, bit 63: setting the root table pointer also invalidates all caches.
    pub const fn esrtps(self) -> bool {
        bit(self.0, 63)
    }
}

/// The extended capability register (ECAP, offset 0x10), decoded field by field.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Ecap(pub u64);

impl Ecap {
    /// C, bit 0: page walks snoop the CPU caches (coherent).
    pub const fn c(self) -> bool {
        bit(self.0, 0)
    }
    /// QI, bit 1: queued invalidation.
    pub const fn qi(self) -> bool {
        bit(self.0, 1)
    }
    /// DT, bit 2: device-TLBs (ATS).
    pub const fn dt(self) -> bool {
        bit(self.0, 2)
    }
    /// IR, bit 3: interrupt remapping.
    pub const fn ir(self) -> bool {
        bit(self.0, 3)
    }
    /// EIM, bit 4: extended interrupt mode.
    pub const fn eim(self) -> bool {
        bit(self.0, 4)
    }
    /// PT, bit 6: pass-through.
    pub const fn pt(self) -> bool {
        bit(self.0, 6)
    }
    /// SC, bit 7: snoop control.
    pub const fn sc(self) -> bool {
        bit(self.0, 7)
    }
    /// Byte offset of the IOTLB registers: IRO (bits 17:8) × 16.
    pub const fn iotlb_reg_offset(self) -> u64 {
        bits(self.0, 8, 10) * 16
    }
    /// MHMV, bits 23:20.
    pub const fn mhmv(self) -> u32 {
        bits(self.0, 20, 4) as u32
    }
    /// NEST, bit 26.
    pub const fn nest(self) -> bool {
        bit(self.0, 26)
    }
    /// PRS, bit 29: page requests.
    pub const fn prs(self) -> bool {
        bit(self.0, 29)
    }
    /// Supported PASID width in bits: PSS (bits 39:35) + 1.
    pub const fn pasid_bits(self) -> u32 {
        bits(self.0, 35, 5) as u32 + 1
    }
    /// PASID, bit 40.
    pub const fn pasid(self) -> bool {
        bit(self.0, 40)
    }
    /// SMTS, bit 43: scalable-mode translation.
    pub const fn smts(self) -> bool {
        bit(self.0, 43)
    }
    /// SLTS, bit 46: second-level translation in scalable mode.
    pub const fn slts(self) -> bool {
        bit(self.0, 46)
    }
    /// FLTS, bit 47: first-level translation in scalable mode.
    pub const fn flts(self) -> bool {
        bit(self.0, 47)
    }
    /// SMPWC, bit 48: scalable-mode page walks are coherent.
    pub const fn smpwc(self) -> bool {
        bit(self.0, 48)
    }
}

/// The CAP of a Skylake/Cascade-Lake-class server unit (X86.md §1.2, from a real dmesg):
/// 65,536 domains, 4-level only, MGAW 48, 2 MiB + 1 GiB pages, PSI with MAMV 18, 8 fault
/// records at 0x100, CM = 0.
pub const CAP_CASCADE_LAKE: Cap = Cap(0x08d2_078c_106f_0466);
/// The ECAP of the same unit: coherent, QI, device-TLB, IR, EIM, PT, SC, IOTLB registers
/// at 0x200, legacy mode only.
pub const ECAP_CASCADE_LAKE: Ecap = Ecap(0xf0_20df);

// ---------------------------------------------------------------------------------------
// Address widths (X86.md §1.4).
// ---------------------------------------------------------------------------------------

/// The AGAW code of a table with `levels` levels (3, 4 or 5 → 1, 2, 3).
pub const fn agaw_of_levels(levels: u32) -> u32 {
    levels - 2
}

/// Levels of a table with AGAW code `agaw`.
pub const fn levels_of_agaw(agaw: u32) -> u32 {
    agaw + 2
}

/// Input address width of a table with `levels` levels: 30 + 9·(levels − 2).
pub const fn width_of_levels(levels: u32) -> u32 {
    12 + 9 * levels
}

/// RTADDR's translation-table mode, bits 11:10: 0 = legacy root table, 1 = scalable-mode
/// root table (X86.md §1.1, §1.3; Linux `DMA_RTADDR_SMT`, bit 10).
pub const RTADDR_TTM_SHIFT: u32 = 10;

/// RTADDR as software writes it: the root table (4 KiB aligned) and TTM (scalable or not).
pub const fn rtaddr_encode(root: u64, scalable: bool) -> u64 {
    (root & ADDR_MASK_63_12) | ((scalable as u64) << RTADDR_TTM_SHIFT)
}

// ---------------------------------------------------------------------------------------
// Legacy-mode root and context entries (X86.md §1.3).
// ---------------------------------------------------------------------------------------

/// Size of a root or legacy context entry in bytes.
pub const ROOT_ENTRY_BYTES: u64 = 16;
/// Size of a legacy context entry in bytes.
pub const CONTEXT_ENTRY_BYTES: u64 = 16;
/// Size of a scalable-mode context entry in bytes.
pub const SM_CONTEXT_ENTRY_BYTES: u64 = 32;
/// Size of a PASID-table entry in bytes.
pub const PASID_ENTRY_BYTES: u64 = 64;

/// A legacy root entry (128 bits, one per bus): `lo` P bit 0, CTP bits 63:12.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct RootEntry {
    /// P: the context-table pointer is valid.
    pub present: bool,
    /// Physical address of the bus's context table (4 KiB aligned).
    pub context_table: u64,
}

impl RootEntry {
    /// Reserved bits of the low word (11:1).
    pub const RESERVED_LO: u64 = 0xFFE;

    /// The two words of the entry.
    pub const fn encode(&self) -> [u64; 2] {
        [
            (self.context_table & ADDR_MASK_63_12) | self.present as u64,
            0,
        ]
    }

    /// Decodes an entry; `None` if a reserved bit is set (the high word is reserved).
    pub const fn decode(raw: [u64; 2]) -> Option<Self> {
        if raw[0] & Self::RESERVED_LO != 0 || raw[1] != 0 {
            return None;
        }
        Some(Self {
            present: bit(raw[0], 0),
            context_table: raw[0] & ADDR_MASK_63_12,
        })
    }
}

/// Translation type of a legacy context entry, bits 3:2.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum TranslationType {
    /// 0: untranslated requests through the second-level table; translated ones blocked.
    #[default]
    MultiLevel,
    /// 1: as 0, plus ATS translation requests and translated requests (device-TLB).
    MultiLevelDevTlb,
    /// 2: pass-through (the output address is the input address).
    PassThrough,
}

impl TranslationType {
    /// The 2-bit code.
    pub const fn code(self) -> u64 {
        match self {
            Self::MultiLevel => 0,
            Self::MultiLevelDevTlb => 1,
            Self::PassThrough => 2,
        }
    }
}

/// A legacy context entry (128 bits, one per devfn): `lo` P b0, FPD b1, TT b3:2,
/// SLPTPTR b63:12; `hi` AW b2:0, DID b23:8.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct ContextEntry {
    /// P.
    pub present: bool,
    /// FPD: fault processing disable (faults are not recorded).
    pub fpd: bool,
    /// TT.
    pub tt: TranslationType,
    /// Root of the second-level page table (4 KiB aligned).
    pub slptptr: u64,
    /// AW: the AGAW code of the table (1 = 3-level, 2 = 4-level, 3 = 5-level).
    pub aw: u8,
    /// DID: the domain id that tags cached translations.
    pub did: u16,
}

impl ContextEntry {
    /// Reserved bits of the low word (11:4).
    pub const RESERVED_LO: u64 = 0xFF0;
    /// Reserved bits of the high word (7:3 and 63:24; bits 6:3 are "ignored/AVL" for
    /// software in some revisions, but the model's hardware checks them all).
    pub const RESERVED_HI: u64 = !0x00FF_FF07;

    /// The two words of the entry.
    pub const fn encode(&self) -> [u64; 2] {
        let lo = (self.slptptr & ADDR_MASK_63_12)
            | (self.tt.code() << 2)
            | ((self.fpd as u64) << 1)
            | self.present as u64;
        let hi = ((self.did as u64) << 8) | (self.aw as u64 & 0x7);
        [lo, hi]
    }

    /// Decodes an entry; `None` if a reserved bit is set or TT is the reserved code 3.
    pub const fn decode(raw: [u64; 2]) -> Option<Self> {
        if raw[0] & Self::RESERVED_LO != 0 || raw[1] & Self::RESERVED_HI != 0 {
            return None;
        }
        let tt = match bits(raw[0], 2, 2) {
            0 => TranslationType::MultiLevel,
            1 => TranslationType::MultiLevelDevTlb,
            2 => TranslationType::PassThrough,
            _ => return None,
        };
        Some(Self {
            present: bit(raw[0], 0),
            fpd: bit(raw[0], 1),
            tt,
            slptptr: raw[0] & ADDR_MASK_63_12,
            aw: bits(raw[1], 0, 3) as u8,
            did: bits(raw[1], 8, 16) as u16,
        })
    }
}

// ---------------------------------------------------------------------------------------
// Scalable mode (X86.md §1.3).
// ---------------------------------------------------------------------------------------

/// A scalable-mode root entry: the low half points at the context table of devfn
/// 0x00–0x7F (LP b0, LCTP b63:12), the high half at devfn 0x80–0xFF (UP b64, UCTP b127:76).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct SmRootEntry {
    /// LP.
    pub lower_present: bool,
    /// LCTP (4 KiB aligned).
    pub lower_table: u64,
    /// UP.
    pub upper_present: bool,
    /// UCTP (4 KiB aligned).
    pub upper_table: u64,
}

impl SmRootEntry {
    /// The two words of the entry.
    pub const fn encode(&self) -> [u64; 2] {
        [
            (self.lower_table & ADDR_MASK_63_12) | self.lower_present as u64,
            (self.upper_table & ADDR_MASK_63_12) | self.upper_present as u64,
        ]
    }

    /// Decodes an entry; `None` if reserved bits 11:1 of either half are set.
    pub const fn decode(raw: [u64; 2]) -> Option<Self> {
        if raw[0] & 0xFFE != 0 || raw[1] & 0xFFE != 0 {
            return None;
        }
        Some(Self {
            lower_present: bit(raw[0], 0),
            lower_table: raw[0] & ADDR_MASK_63_12,
            upper_present: bit(raw[1], 0),
            upper_table: raw[1] & ADDR_MASK_63_12,
        })
    }

    /// The context table and its presence for `devfn`, and the entry's index in it.
    pub const fn table_for(&self, devfn: u8) -> (bool, u64, u64) {
        if devfn < 0x80 {
            (self.lower_present, self.lower_table, devfn as u64)
        } else {
            (self.upper_present, self.upper_table, devfn as u64 - 0x80)
        }
    }
}

/// A scalable-mode context entry (256 bits; the fields the model uses): P b0, FPD b1,
/// DTE b2, PASIDE b3, PRE b4, PDTS b11:9 (directory of 2^(PDTS+7) entries),
/// PASIDDIRPTR b63:12, RID_PASID b83:64.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct SmContextEntry {
    /// P.
    pub present: bool,
    /// FPD.
    pub fpd: bool,
    /// DTE: device-TLB enable.
    pub dte: bool,
    /// PASIDE: requests with a PASID are allowed.
    pub paside: bool,
    /// PRE: page requests enabled.
    pub pre: bool,
    /// PDTS: PASID directory size code.
    pub pdts: u8,
    /// PASID directory pointer (4 KiB aligned).
    pub pasid_dir: u64,
    /// RID_PASID: the PASID used for requests without one (20 bits).
    pub rid_pasid: u32,
}

impl SmContextEntry {
    /// The four words of the entry.
    pub const fn encode(&self) -> [u64; 4] {
        let w0 = (self.pasid_dir & ADDR_MASK_63_12)
            | ((self.pdts as u64 & 0x7) << 9)
            | ((self.pre as u64) << 4)
            | ((self.paside as u64) << 3)
            | ((self.dte as u64) << 2)
            | ((self.fpd as u64) << 1)
            | self.present as u64;
        [w0, self.rid_pasid as u64 & 0xF_FFFF, 0, 0]
    }

    /// Decodes an entry; `None` if bits 8:5 of word 0 (reserved) are set.
    pub const fn decode(raw: [u64; 4]) -> Option<Self> {
        if raw[0] & 0x1E0 != 0 {
            return None;
        }
        Some(Self {
            present: bit(raw[0], 0),
            fpd: bit(raw[0], 1),
            dte: bit(raw[0], 2),
            paside: bit(raw[0], 3),
            pre: bit(raw[0], 4),
            pdts: bits(raw[0], 9, 3) as u8,
            pasid_dir: raw[0] & ADDR_MASK_63_12,
            rid_pasid: bits(raw[1], 0, 20) as u32,
        })
    }

    /// Entries of the PASID directory: 2^(PDTS + 7).
    pub const fn dir_entries(&self) -> u64 {
        1 << (self.pdts as u32 + 7)
    }
}

/// The PASID Linux puts in RID_PASID (`IOMMU_NO_PASID`, 0): requests without PASID use
/// the PASID-table entry of PASID 0 (X86.md §1.3).
pub const RID_PASID_LINUX: u32 = 0;

/// A PASID directory entry (64 bits): P b0, FPD b1, PASID-table pointer b63:12. Linux
/// indexes the directory with `pasid >> 6`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct PasidDirEntry {
    /// P.
    pub present: bool,
    /// FPD.
    pub fpd: bool,
    /// Physical address of a PASID table (4 KiB aligned, 64 entries).
    pub table: u64,
}

impl PasidDirEntry {
    /// The entry's word.
    pub const fn encode(&self) -> u64 {
        (self.table & ADDR_MASK_63_12) | ((self.fpd as u64) << 1) | self.present as u64
    }

    /// Decodes an entry; `None` if reserved bits 11:2 are set.
    pub const fn decode(raw: u64) -> Option<Self> {
        if raw & 0xFFC != 0 {
            return None;
        }
        Some(Self {
            present: bit(raw, 0),
            fpd: bit(raw, 1),
            table: raw & ADDR_MASK_63_12,
        })
    }
}

/// PASID-granular translation type, bits 8:6 of a PASID-table entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Pgtt {
    /// 1: first-stage only.
    FirstStage,
    /// 2: second-stage only.
    #[default]
    SecondStage,
    /// 3: nested.
    Nested,
    /// 4: pass-through.
    PassThrough,
}

impl Pgtt {
    /// The 3-bit code.
    pub const fn code(self) -> u64 {
        match self {
            Self::FirstStage => 1,
            Self::SecondStage => 2,
            Self::Nested => 3,
            Self::PassThrough => 4,
        }
    }

    /// The type of a 3-bit code; `None` for reserved codes (0, 5–7).
    pub const fn from_code(code: u64) -> Option<Self> {
        match code {
            1 => Some(Self::FirstStage),
            2 => Some(Self::SecondStage),
            3 => Some(Self::Nested),
            4 => Some(Self::PassThrough),
            _ => None,
        }
    }
}

/// A PASID-table entry (512 bits; the fields the model uses). Word 0: P b0, FPD b1, AW b4:2,
/// SLEE b5, PGTT b8:6, SLADE b9, SLPTPTR b63:12. Word 1: DID b79:64, PWSNP b87, PGSNP b88.
/// Word 2: SRE b128, FLPM b131:130 (0 = 4-level, 1 = 5-level), WPE b132, NXE b133,
/// EAFE b135, FLPTPTR b191:140.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct PasidEntry {
    /// P.
    pub present: bool,
    /// FPD.
    pub fpd: bool,
    /// AW: AGAW code of the second-stage table.
    pub aw: u8,
    /// PGTT.
    pub pgtt: Pgtt,
    /// SLADE: second-stage accessed/dirty enable.
    pub slade: bool,
    /// Second-stage table root (4 KiB aligned).
    pub slptptr: u64,
    /// DID.
    pub did: u16,
    /// PGSNP: page snoop.
    pub pgsnp: bool,
    /// SRE: supervisor requests enable.
    pub sre: bool,
    /// FLPM: first-stage paging mode (0 = 4-level, 1 = 5-level).
    pub flpm: u8,
    /// WPE: write-protect enable.
    pub wpe: bool,
    /// NXE: no-execute enable, which lets first-stage entries use XD (bit 63). Linux sets
    /// it for first-stage domains in 6.3 to 6.10 only ([`FlExecControl`]).
    pub nxe: bool,
    /// First-stage table root (4 KiB aligned).
    pub flptptr: u64,
}

impl PasidEntry {
    /// The eight words of the entry.
    pub const fn encode(&self) -> [u64; 8] {
        let w0 = (self.slptptr & ADDR_MASK_63_12)
            | ((self.slade as u64) << 9)
            | (self.pgtt.code() << 6)
            | ((self.aw as u64 & 0x7) << 2)
            | ((self.fpd as u64) << 1)
            | self.present as u64;
        let w1 = (self.did as u64) | ((self.pgsnp as u64) << 24);
        let w2 = (self.flptptr & ADDR_MASK_63_12)
            | ((self.nxe as u64) << 5)
            | ((self.wpe as u64) << 4)
            | ((self.flpm as u64 & 0x3) << 2)
            | self.sre as u64;
        [w0, w1, w2, 0, 0, 0, 0, 0]
    }

    /// Decodes an entry; `None` for a reserved PGTT code in a present entry or FLPM > 1.
    pub const fn decode(raw: [u64; 8]) -> Option<Self> {
        let present = bit(raw[0], 0);
        let pgtt = match Pgtt::from_code(bits(raw[0], 6, 3)) {
            Some(p) => p,
            None if !present => Pgtt::SecondStage,
            None => return None,
        };
        let flpm = bits(raw[2], 2, 2) as u8;
        if flpm > 1 {
            return None;
        }
        Some(Self {
            present,
            fpd: bit(raw[0], 1),
            aw: bits(raw[0], 2, 3) as u8,
            pgtt,
            slade: bit(raw[0], 9),
            slptptr: raw[0] & ADDR_MASK_63_12,
            did: bits(raw[1], 0, 16) as u16,
            pgsnp: bit(raw[1], 24),
            sre: bit(raw[2], 0),
            flpm,
            wpe: bit(raw[2], 4),
            nxe: bit(raw[2], 5),
            flptptr: raw[2] & ADDR_MASK_63_12,
        })
    }
}

// ---------------------------------------------------------------------------------------
// Page-table entries (X86.md §1.4).
// ---------------------------------------------------------------------------------------

/// The address bits of a leaf at `level` (1 = 4 KiB): bits 51:12, less the bits below
/// the page size (ignored by the walk; bit 12 of a first-stage superpage is PAT).
pub const fn leaf_addr_mask(level: u32) -> u64 {
    PTE_ADDR_MASK & !((1u64 << (12 + 9 * (level - 1))) - 1)
}

/// Second-stage PTE bits.
pub mod sl {
    /// R, bit 0: read.
    pub const R: u64 = 1 << 0;
    /// W, bit 1: write.
    pub const W: u64 = 1 << 1;
    /// X, bit 2: execute (only with SLEE).
    pub const X: u64 = 1 << 2;
    /// PS, bit 7: a leaf in a PDPE (1 GiB) or PDE (2 MiB).
    pub const PS: u64 = 1 << 7;
    /// SNP, bit 11: snoop.
    pub const SNP: u64 = 1 << 11;
}

/// A decoded second-stage PTE.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SlPte {
    /// Neither R nor W: the entry is not present (Linux `dma_pte_present`).
    NotPresent,
    /// A pointer to the next-level table.
    Table {
        /// Physical address of the next table.
        next: u64,
    },
    /// A leaf (a 4 KiB page at the last level, a superpage with PS above it).
    Leaf {
        /// Physical address of the page.
        pa: u64,
        /// Permissions.
        prot: Prot,
    },
}

impl SlPte {
    /// Encodes a non-leaf entry. Linux sets R and W on every non-leaf entry, so only the
    /// leaf's permissions matter.
    pub const fn table(next: u64) -> u64 {
        (next & PTE_ADDR_MASK) | sl::R | sl::W
    }

    /// Encodes a leaf; `superpage` sets PS (for a 2 MiB or 1 GiB leaf).
    pub const fn leaf(pa: u64, prot: Prot, superpage: bool) -> u64 {
        (pa & PTE_ADDR_MASK)
            | if prot.read { sl::R } else { 0 }
            | if prot.write { sl::W } else { 0 }
            | if superpage { sl::PS } else { 0 }
    }

    /// Decodes an entry read at `level` (1 = the 4 KiB leaf level). At level 1 every present
    /// entry is a leaf; above it, PS selects a superpage leaf.
    pub const fn decode(raw: u64, level: u32) -> Self {
        if raw & (sl::R | sl::W) == 0 {
            return Self::NotPresent;
        }
        if level == 1 || raw & sl::PS != 0 {
            Self::Leaf {
                pa: raw & leaf_addr_mask(level),
                prot: Prot {
                    read: raw & sl::R != 0,
                    write: raw & sl::W != 0,
                },
            }
        } else {
            Self::Table {
                next: raw & PTE_ADDR_MASK,
            }
        }
    }
}

/// First-stage (x86-64 long-mode) PTE bits.
pub mod fl {
    /// P, bit 0: present.
    pub const P: u64 = 1 << 0;
    /// R/W, bit 1: writable.
    pub const RW: u64 = 1 << 1;
    /// U/S, bit 2: user.
    pub const US: u64 = 1 << 2;
    /// PWT, bit 3.
    pub const PWT: u64 = 1 << 3;
    /// PCD, bit 4.
    pub const PCD: u64 = 1 << 4;
    /// A, bit 5: accessed.
    pub const A: u64 = 1 << 5;
    /// D, bit 6: dirty (leaf).
    pub const D: u64 = 1 << 6;
    /// PS, bit 7: a 1 GiB (PDPE) or 2 MiB (PDE) leaf.
    pub const PS: u64 = 1 << 7;
    /// EA, bit 10: extended accessed.
    pub const EA: u64 = 1 << 10;
    /// XD, bit 63: execute disable (used only with the PASID entry's NXE).
    pub const XD: u64 = 1 << 63;
}

/// The execute-control bits Linux writes for a first-stage DMA domain, which changed
/// between releases (`linux::DmaPathVariants::vtd_first_stage`; docs/model/vtd.md):
///
/// | Linux | XD on first-stage entries | NXE in the PASID entry |
/// |---|---|---|
/// | 5.6 to 6.2 | yes | no |
/// | 6.3 to 6.10 | yes | yes |
/// | 6.11 and later | no | no |
///
/// The default is Linux 6.12's: neither. The model's walk ignores both (no execute
/// requests), so the choice changes the words in memory, not a translation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct FlExecControl {
    /// XD (bit 63) on every first-stage entry, table and leaf (`DMA_FL_PTE_XD` in
    /// `__domain_mapping` and `pfn_to_dma_pte`).
    pub xd: bool,
    /// NXE (bit 133: word 2 bit 5) in the domain's PASID-table entry (`pasid_set_nxe` in
    /// `intel_pasid_setup_first_level`).
    pub nxe: bool,
}

impl FlExecControl {
    /// Linux 5.6 to 6.2: XD on every first-stage entry, NXE clear ("iommu/vt-d: Setup
    /// pasid entries for iova over first level", ddf09b6d43ec).
    pub const LINUX_5_6: Self = Self {
        xd: true,
        nxe: false,
    };
    /// Linux 6.3 to 6.10: XD, and NXE set ("iommu/vt-d: Set No Execute Enable bit in PASID
    /// table entry", e06d24435596).
    pub const LINUX_6_3: Self = Self {
        xd: true,
        nxe: true,
    };
    /// Linux 6.11 and later: neither ("iommu/vt-d: Remove control over Execute-Requested
    /// requests", e995fcde6070). The default.
    pub const LINUX_6_11: Self = Self {
        xd: false,
        nxe: false,
    };

    /// XD when [`FlExecControl::xd`], else 0.
    const fn xd_bit(self) -> u64 {
        if self.xd {
            fl::XD
        } else {
            0
        }
    }
}

/// A decoded first-stage PTE.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FlPte {
    /// P clear.
    NotPresent,
    /// A pointer to the next-level table.
    Table {
        /// Physical address of the next table.
        next: u64,
        /// R/W of the entry (ANDed along the walk).
        write: bool,
    },
    /// A leaf.
    Leaf {
        /// Physical address of the page.
        pa: u64,
        /// R/W: writable (a present first-stage leaf is always readable).
        write: bool,
    },
}

impl FlPte {
    /// Encodes a non-leaf entry as Linux 6.12 does: P, R/W, U/S and A pre-set
    /// ([`FlPte::table_with`] the default [`FlExecControl`]).
    pub const fn table(next: u64) -> u64 {
        Self::table_with(next, FlExecControl::LINUX_6_11)
    }

    /// Encodes a non-leaf entry as Linux does: P, R/W, U/S and A, and XD when `exec` says.
    pub const fn table_with(next: u64, exec: FlExecControl) -> u64 {
        (next & PTE_ADDR_MASK) | fl::P | fl::RW | fl::US | fl::A | exec.xd_bit()
    }

    /// Encodes a leaf as Linux 6.12 does: P, U/S and A always, R/W and D for a writable
    /// one, PS for a superpage, no XD ([`FlPte::leaf_with`] the default [`FlExecControl`]).
    pub const fn leaf(pa: u64, write: bool, superpage: bool) -> u64 {
        Self::leaf_with(pa, write, superpage, FlExecControl::LINUX_6_11)
    }

    /// Encodes a leaf as Linux does: as [`FlPte::leaf`], with XD when `exec` says.
    pub const fn leaf_with(pa: u64, write: bool, superpage: bool, exec: FlExecControl) -> u64 {
        (pa & PTE_ADDR_MASK)
            | fl::P
            | fl::US
            | fl::A
            | exec.xd_bit()
            | if write { fl::RW | fl::D } else { 0 }
            | if superpage { fl::PS } else { 0 }
    }

    /// Decodes an entry read at `level` (1 = the PTE level).
    pub const fn decode(raw: u64, level: u32) -> Self {
        if raw & fl::P == 0 {
            return Self::NotPresent;
        }
        let write = raw & fl::RW != 0;
        if level == 1 || raw & fl::PS != 0 {
            Self::Leaf {
                pa: raw & leaf_addr_mask(level),
                write,
            }
        } else {
            Self::Table {
                next: raw & PTE_ADDR_MASK,
                write,
            }
        }
    }
}

// ---------------------------------------------------------------------------------------
// Fault records (X86.md §1.8).
// ---------------------------------------------------------------------------------------

/// Legacy-mode fault reason codes (X86.md §1.8, the strings of Linux `dmar.c`).
pub mod reason {
    /// 0x1: present bit in root entry is clear.
    pub const ROOT_NOT_PRESENT: u8 = 0x1;
    /// 0x2: present bit in context entry is clear.
    pub const CONTEXT_NOT_PRESENT: u8 = 0x2;
    /// 0x3: invalid context entry.
    pub const CONTEXT_INVALID: u8 = 0x3;
    /// 0x4: access beyond MGAW.
    pub const BEYOND_MGAW: u8 = 0x4;
    /// 0x5: PTE write access is not set.
    pub const PTE_NO_WRITE: u8 = 0x5;
    /// 0x6: PTE read access is not set.
    pub const PTE_NO_READ: u8 = 0x6;
    /// 0x7: next page-table pointer is invalid.
    pub const NEXT_PTR_INVALID: u8 = 0x7;
    /// 0xA: non-zero reserved fields in a root entry.
    pub const ROOT_RESERVED: u8 = 0xA;
    /// 0xB: non-zero reserved fields in a context entry.
    pub const CONTEXT_RESERVED: u8 = 0xB;
    /// 0xC: non-zero reserved fields in a PTE.
    pub const PTE_RESERVED: u8 = 0xC;

    // Scalable-mode reasons: the index of each string in Linux `dmar.c`'s
    // `dma_remap_sm_fault_reasons` (which starts at 0x30) gives its code.

    /// 0x31: SM: TTM 0 (legacy mode) for a request with PASID.
    pub const SM_TTM0_WITH_PASID: u8 = 0x31;
    /// 0x39: SM: present bit in root entry is clear (the half for the devfn).
    pub const SM_ROOT_NOT_PRESENT: u8 = 0x39;
    /// 0x3A: SM: non-zero reserved field set in root entry.
    pub const SM_ROOT_RESERVED: u8 = 0x3A;
    /// 0x41: SM: present bit in context entry is clear.
    pub const SM_CONTEXT_NOT_PRESENT: u8 = 0x41;
    /// 0x42: SM: non-zero reserved field set in the context entry.
    pub const SM_CONTEXT_RESERVED: u8 = 0x42;
    /// 0x45: SM: PASID Enable field in context entry is clear (a request with PASID).
    pub const SM_PASIDE_CLEAR: u8 = 0x45;
    /// 0x46: SM: PASID is larger than the max in context entry (beyond PDTS).
    pub const SM_PASID_TOO_LARGE: u8 = 0x46;
    /// 0x51: SM: present bit in PASID directory entry is clear.
    pub const SM_DIR_NOT_PRESENT: u8 = 0x51;
    /// 0x52: SM: non-zero reserved field set in PASID directory entry.
    pub const SM_DIR_RESERVED: u8 = 0x52;
    /// 0x59: SM: present bit in PASID table entry is clear.
    pub const SM_PASID_NOT_PRESENT: u8 = 0x59;
    /// 0x5A: SM: non-zero reserved field set in PASID table entry.
    pub const SM_PASID_RESERVED: u8 = 0x5A;
    /// 0x5B: SM: invalid scalable-mode PASID table entry (a PGTT, AW or FLPM the unit
    /// does not support).
    pub const SM_PASID_INVALID: u8 = 0x5B;
    /// 0x5D: SM: SRE field is clear in PASID table entry (a supervisor request).
    pub const SM_SRE_CLEAR: u8 = 0x5D;
    /// 0x71: SM: present bit in first-level paging entry is clear.
    pub const SM_FL_NOT_PRESENT: u8 = 0x71;
    /// 0x79: SM: read/write permission error in second-level paging entry (the model
    /// raises it for a second-stage entry with R and W both clear).
    pub const SM_SL_NOT_PRESENT: u8 = 0x79;
    /// 0x80: SM: address in first-level translation is not canonical.
    pub const SM_NOT_CANONICAL: u8 = 0x80;
    /// 0x81: SM: U/S clear for a first-level translation with user privilege (Linux
    /// commit 16ecf10e815d quotes this reason, code 129).
    pub const SM_US_CLEAR: u8 = 0x81;
    /// 0x83: SM: address beyond the DMA hardware max (the second-stage table's width).
    pub const SM_BEYOND_MAX: u8 = 0x83;
    /// 0x85: SM: no write permission for a write request.
    pub const SM_NO_WRITE: u8 = 0x85;
    /// 0x86: SM: no read permission for a read request.
    pub const SM_NO_READ: u8 = 0x86;
}

/// A primary fault record (128 bits): FI b63:12, SID b79:64, FR b103:96, PV b123:104,
/// PP b95, T b126 (1 = read), F b127 (valid).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FaultRecord {
    /// Faulting page address (bits 63:12 of the request address).
    pub addr: u64,
    /// Source id (bus << 8 | devfn).
    pub sid: u16,
    /// Fault reason.
    pub reason: u8,
    /// PASID, if the request carried one.
    pub pasid: Option<u32>,
    /// Whether the faulting request was a read (T = 1) rather than a write.
    pub read: bool,
}

impl FaultRecord {
    /// The two words of a valid record (F set).
    pub const fn encode(&self) -> [u64; 2] {
        let (pp, pv) = match self.pasid {
            Some(p) => (1u64, p as u64 & 0xF_FFFF),
            None => (0, 0),
        };
        let hi = (self.sid as u64)
            | (pp << 31)
            | ((self.reason as u64) << 32)
            | (pv << 40)
            | ((self.read as u64) << 62)
            | (1 << 63);
        [self.addr & ADDR_MASK_63_12, hi]
    }

    /// Decodes a record; `None` if F is clear.
    pub const fn decode(raw: [u64; 2]) -> Option<Self> {
        if !bit(raw[1], 63) {
            return None;
        }
        Some(Self {
            addr: raw[0] & ADDR_MASK_63_12,
            sid: bits(raw[1], 0, 16) as u16,
            reason: bits(raw[1], 32, 8) as u8,
            pasid: if bit(raw[1], 31) {
                Some(bits(raw[1], 40, 20) as u32)
            } else {
                None
            },
            read: bit(raw[1], 62),
        })
    }
}

// ---------------------------------------------------------------------------------------
// Invalidation descriptors (X86.md §1.6).
// ---------------------------------------------------------------------------------------

/// Descriptor type codes, bits 3:0.
pub mod desc_type {
    /// Context-cache invalidation.
    pub const CONTEXT_CACHE: u64 = 1;
    /// IOTLB invalidation.
    pub const IOTLB: u64 = 2;
    /// Device-TLB invalidation.
    pub const DEVICE_TLB: u64 = 3;
    /// Interrupt-entry-cache invalidation.
    pub const IEC: u64 = 4;
    /// Invalidation wait.
    pub const WAIT: u64 = 5;
    /// PASID-based IOTLB invalidation.
    pub const PASID_IOTLB: u64 = 6;
    /// PASID-cache invalidation.
    pub const PASID_CACHE: u64 = 7;
    /// PASID-based device-TLB invalidation.
    pub const PASID_DEVICE_TLB: u64 = 8;
}

/// Granularity of a PASID-cache invalidation (G, bits 5:4; Linux `QI_PC_ALL_PASIDS` 0,
/// `QI_PC_PASID_SEL` 1, `QI_PC_GLOBAL` 3; 2 is reserved).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PcGranularity {
    /// 0: every PASID-cache entry tagged with `did`.
    Domain,
    /// 1: the entry of `did` and `pasid`.
    Pasid {
        /// The PASID (20 bits).
        pasid: u32,
    },
    /// 3: every entry.
    Global,
}

/// Granularity of a context-cache invalidation (G, bits 5:4).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CcGranularity {
    /// 1: every context entry.
    Global,
    /// 2: the entries tagged with `did`.
    Domain {
        /// DID.
        did: u16,
    },
    /// 3: one device's entry.
    Device {
        /// DID.
        did: u16,
        /// Source id.
        sid: u16,
        /// FM, function mask (2 bits).
        fm: u8,
    },
}

/// Granularity of an IOTLB invalidation (G, bits 5:4).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IotlbGranularity {
    /// 1: global, every domain.
    Global,
    /// 2: domain-selective (DSI).
    Domain {
        /// DID.
        did: u16,
    },
    /// 3: page-selective within a domain (PSI): 2^`am` pages from `addr`; hardware ignores
    /// address bits below the mask.
    Page {
        /// DID.
        did: u16,
        /// Page address (bits 63:12).
        addr: u64,
        /// AM: address mask, log2 of the number of 4 KiB pages.
        am: u8,
        /// IH: only leaf entries changed; paging-structure caches may be kept.
        ih: bool,
    },
}

/// Granularity of a PASID-based IOTLB invalidation (Linux's two uses).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PasidIotlbGranularity {
    /// G = 2: every non-global entry of the PASID.
    AllOfPasid,
    /// G = 3: page-selective within the PASID.
    Page {
        /// Page address.
        addr: u64,
        /// Address mask.
        am: u8,
        /// Invalidation hint.
        ih: bool,
    },
}

/// A 128-bit invalidation-queue descriptor.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum InvDesc {
    /// Type 1: G b5:4, DID b31:16, SID b47:32, FM b49:48.
    ContextCache(CcGranularity),
    /// Type 2: G b5:4, DW b6, DR b7, DID b31:16 / AM b5:0 (b69:64), IH b70, ADDR b127:76.
    Iotlb {
        /// What to invalidate.
        granularity: IotlbGranularity,
        /// DR: drain reads.
        drain_reads: bool,
        /// DW: drain writes.
        drain_writes: bool,
    },
    /// Type 3: PFSID b15:12 + b63:52, QDEP b20:16, SID b47:32 / S b64, ADDR b127:76.
    DeviceTlb {
        /// Source id of the device.
        sid: u16,
        /// Physical function source id.
        pfsid: u16,
        /// Invalidation queue depth (5 bits).
        qdep: u8,
        /// Page address; with `size` the low page-number bits encode the size.
        addr: u64,
        /// S: the size is encoded in `addr` ([`devtlb_range`]).
        size: bool,
    },
    /// Type 5: IF b4, SW b5, FN b6, PD b7, STDATA b63:32 / STADDR b127:66.
    Wait {
        /// IF: raise the completion interrupt.
        interrupt: bool,
        /// SW: write `status_data` to `status_addr`.
        status_write: bool,
        /// FN: fence, fetch nothing after it until it completes.
        fence: bool,
        /// PD: drain page requests.
        page_drain: bool,
        /// STDATA.
        status_data: u32,
        /// STADDR (4-byte aligned).
        status_addr: u64,
    },
    /// Type 6: G b5:4, DID b31:16, PASID b51:32 / AM, IH, ADDR as type 2.
    PasidIotlb {
        /// DID.
        did: u16,
        /// PASID (20 bits).
        pasid: u32,
        /// What to invalidate.
        granularity: PasidIotlbGranularity,
    },
    /// Type 7: G b5:4, DID b31:16, PASID b51:32; word 1 reserved.
    PasidCache {
        /// DID (ignored by the global granularity).
        did: u16,
        /// What to invalidate.
        granularity: PcGranularity,
    },
    /// Type 8: QDEP (MIP) b8:4, PFSID b15:12 + b63:52, SID b31:16, PASID b51:32 / G b0,
    /// S b11, ADDR b63:12 (Linux `QI_DEV_EIOTLB_*`).
    PasidDeviceTlb {
        /// Source id of the device.
        sid: u16,
        /// Physical function source id.
        pfsid: u16,
        /// Invalidation queue depth (5 bits).
        qdep: u8,
        /// PASID (20 bits).
        pasid: u32,
        /// G: every PASID of the device (Linux `QI_DEV_IOTLB_GRAN_ALL`), not just `pasid`.
        global: bool,
        /// Page address; with `size` the low page-number bits encode the size.
        addr: u64,
        /// S: the size is encoded in `addr` ([`devtlb_range`]).
        size: bool,
    },
}

/// Why a descriptor could not be encoded.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum DescEncodeError {
    /// A field does not fit its bits.
    #[error("Field {field} = {value:#x} does not fit the descriptor")]
    FieldTooWide {
        /// The field.
        field: &'static str,
        /// Its value.
        value: u64,
    },
}

/// Why a 128-bit descriptor is malformed (the hardware would set FSTS.IQE).
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum DescDecodeError {
    /// A type the model does not implement, or a non-zero type-high field (bits 11:9).
    #[error("Unknown invalidation descriptor type {ty:#x}")]
    UnknownType {
        /// Bits 3:0 | bits 11:9 << 4.
        ty: u64,
    },
    /// A reserved granularity code.
    #[error("Descriptor type {ty} with reserved granularity {g}")]
    BadGranularity {
        /// The type.
        ty: u64,
        /// The G field.
        g: u64,
    },
    /// Reserved bits are set.
    #[error("Descriptor type {ty} has reserved bits {bits:#x} set in word {word}")]
    Reserved {
        /// The type.
        ty: u64,
        /// Word 0 or 1.
        word: usize,
        /// The offending bits.
        bits: u64,
    },
}

/// Checks that `value` fits in `width` bits.
fn fits(field: &'static str, value: u64, width: u32) -> Result<u64, DescEncodeError> {
    if width < 64 && value >> width != 0 {
        Err(DescEncodeError::FieldTooWide { field, value })
    } else {
        Ok(value)
    }
}

/// Encodes the second word of a page-selective IOTLB / PASID-IOTLB descriptor.
fn page_word(addr: u64, am: u8, ih: bool) -> Result<u64, DescEncodeError> {
    if addr & 0xFFF != 0 {
        return Err(DescEncodeError::FieldTooWide {
            field: "addr",
            value: addr,
        });
    }
    Ok(addr | fits("am", u64::from(am), 6)? | ((ih as u64) << 6))
}

impl InvDesc {
    /// The two words of the descriptor.
    pub fn encode(&self) -> Result<[u64; 2], DescEncodeError> {
        use desc_type as t;
        Ok(match *self {
            Self::ContextCache(g) => {
                let (code, did, sid, fm) = match g {
                    CcGranularity::Global => (1, 0, 0, 0),
                    CcGranularity::Domain { did } => (2, did, 0, 0),
                    CcGranularity::Device { did, sid, fm } => (3, did, sid, fm),
                };
                let fm = fits("fm", u64::from(fm), 2)?;
                [
                    t::CONTEXT_CACHE
                        | (code << 4)
                        | (u64::from(did) << 16)
                        | (u64::from(sid) << 32)
                        | (fm << 48),
                    0,
                ]
            }
            Self::Iotlb {
                granularity,
                drain_reads,
                drain_writes,
            } => {
                let (code, did, w1) = match granularity {
                    IotlbGranularity::Global => (1, 0, 0),
                    IotlbGranularity::Domain { did } => (2, did, 0),
                    IotlbGranularity::Page { did, addr, am, ih } => {
                        (3, did, page_word(addr, am, ih)?)
                    }
                };
                [
                    t::IOTLB
                        | (code << 4)
                        | ((drain_writes as u64) << 6)
                        | ((drain_reads as u64) << 7)
                        | (u64::from(did) << 16),
                    w1,
                ]
            }
            Self::DeviceTlb {
                sid,
                pfsid,
                qdep,
                addr,
                size,
            } => {
                if addr & 0xFFF != 0 {
                    return Err(DescEncodeError::FieldTooWide {
                        field: "addr",
                        value: addr,
                    });
                }
                let pfsid = u64::from(pfsid);
                [
                    t::DEVICE_TLB
                        | ((pfsid & 0xF) << 12)
                        | (fits("qdep", u64::from(qdep), 5)? << 16)
                        | (u64::from(sid) << 32)
                        | ((pfsid >> 4) << 52),
                    addr | size as u64,
                ]
            }
            Self::Wait {
                interrupt,
                status_write,
                fence,
                page_drain,
                status_data,
                status_addr,
            } => {
                if status_addr & 0x3 != 0 {
                    return Err(DescEncodeError::FieldTooWide {
                        field: "status_addr",
                        value: status_addr,
                    });
                }
                [
                    t::WAIT
                        | ((interrupt as u64) << 4)
                        | ((status_write as u64) << 5)
                        | ((fence as u64) << 6)
                        | ((page_drain as u64) << 7)
                        | (u64::from(status_data) << 32),
                    status_addr,
                ]
            }
            Self::PasidIotlb {
                did,
                pasid,
                granularity,
            } => {
                let (code, w1) = match granularity {
                    PasidIotlbGranularity::AllOfPasid => (2, 0),
                    PasidIotlbGranularity::Page { addr, am, ih } => (3, page_word(addr, am, ih)?),
                };
                [
                    t::PASID_IOTLB
                        | (code << 4)
                        | (u64::from(did) << 16)
                        | (fits("pasid", u64::from(pasid), 20)? << 32),
                    w1,
                ]
            }
            Self::PasidCache { did, granularity } => {
                let (code, pasid) = match granularity {
                    PcGranularity::Domain => (0, 0),
                    PcGranularity::Pasid { pasid } => (1, fits("pasid", u64::from(pasid), 20)?),
                    PcGranularity::Global => (3, 0),
                };
                [
                    t::PASID_CACHE | (code << 4) | (u64::from(did) << 16) | (pasid << 32),
                    0,
                ]
            }
            Self::PasidDeviceTlb {
                sid,
                pfsid,
                qdep,
                pasid,
                global,
                addr,
                size,
            } => {
                if addr & 0xFFF != 0 {
                    return Err(DescEncodeError::FieldTooWide {
                        field: "addr",
                        value: addr,
                    });
                }
                let pfsid = u64::from(pfsid);
                [
                    t::PASID_DEVICE_TLB
                        | (fits("qdep", u64::from(qdep), 5)? << 4)
                        | ((pfsid & 0xF) << 12)
                        | (u64::from(sid) << 16)
                        | (fits("pasid", u64::from(pasid), 20)? << 32)
                        | ((pfsid >> 4) << 52),
                    addr | ((size as u64) << 11) | global as u64,
                ]
            }
        })
    }

    /// Decodes a descriptor, rejecting unknown types, reserved granularities and set
    /// reserved bits.
    pub fn decode(raw: [u64; 2]) -> Result<Self, DescDecodeError> {
        use desc_type as t;
        let [w0, w1] = raw;
        let ty = bits(w0, 0, 4);
        if bits(w0, 9, 3) != 0 {
            return Err(DescDecodeError::UnknownType {
                ty: ty | (bits(w0, 9, 3) << 4),
            });
        }
        let g = bits(w0, 4, 2);
        let reserved = |word: usize, value: u64, mask: u64| -> Result<(), DescDecodeError> {
            if value & mask != 0 {
                Err(DescDecodeError::Reserved {
                    ty,
                    word,
                    bits: value & mask,
                })
            } else {
                Ok(())
            }
        };
        let did = bits(w0, 16, 16) as u16;
        match ty {
            t::CONTEXT_CACHE => {
                // Used: 3:0, 5:4, 31:16, 47:32, 49:48.
                reserved(0, w0, !0x0003_FFFF_FFFF_003F)?;
                reserved(1, w1, !0)?;
                let sid = bits(w0, 32, 16) as u16;
                let fm = bits(w0, 48, 2) as u8;
                let gran = match g {
                    1 => CcGranularity::Global,
                    2 => CcGranularity::Domain { did },
                    3 => CcGranularity::Device { did, sid, fm },
                    _ => return Err(DescDecodeError::BadGranularity { ty, g }),
                };
                Ok(Self::ContextCache(gran))
            }
            t::IOTLB => {
                // Used: 3:0, 5:4, 6, 7, 31:16.
                reserved(0, w0, !0xFFFF_00FF)?;
                // Used: 5:0 AM, 6 IH, 63:12 ADDR.
                reserved(1, w1, 0xF80)?;
                let gran = match g {
                    1 => IotlbGranularity::Global,
                    2 => IotlbGranularity::Domain { did },
                    3 => IotlbGranularity::Page {
                        did,
                        addr: w1 & ADDR_MASK_63_12,
                        am: bits(w1, 0, 6) as u8,
                        ih: bit(w1, 6),
                    },
                    _ => return Err(DescDecodeError::BadGranularity { ty, g }),
                };
                Ok(Self::Iotlb {
                    granularity: gran,
                    drain_writes: bit(w0, 6),
                    drain_reads: bit(w0, 7),
                })
            }
            t::DEVICE_TLB => {
                // Used: 3:0, 15:12, 20:16, 47:32, 63:52.
                reserved(0, w0, !0xFFF0_FFFF_001F_F00F)?;
                reserved(1, w1, 0xFFE)?;
                Ok(Self::DeviceTlb {
                    sid: bits(w0, 32, 16) as u16,
                    pfsid: (bits(w0, 12, 4) | (bits(w0, 52, 12) << 4)) as u16,
                    qdep: bits(w0, 16, 5) as u8,
                    addr: w1 & ADDR_MASK_63_12,
                    size: bit(w1, 0),
                })
            }
            t::WAIT => {
                // Used: 3:0, 7:4, 63:32.
                reserved(0, w0, 0xFFFF_FF00)?;
                reserved(1, w1, 0x3)?;
                Ok(Self::Wait {
                    interrupt: bit(w0, 4),
                    status_write: bit(w0, 5),
                    fence: bit(w0, 6),
                    page_drain: bit(w0, 7),
                    status_data: (w0 >> 32) as u32,
                    status_addr: w1,
                })
            }
            t::PASID_IOTLB => {
                // Used: 3:0, 5:4, 31:16, 51:32.
                reserved(0, w0, !0x000F_FFFF_FFFF_003F)?;
                reserved(1, w1, 0xF80)?;
                let granularity = match g {
                    2 => {
                        reserved(1, w1, !0)?;
                        PasidIotlbGranularity::AllOfPasid
                    }
                    3 => PasidIotlbGranularity::Page {
                        addr: w1 & ADDR_MASK_63_12,
                        am: bits(w1, 0, 6) as u8,
                        ih: bit(w1, 6),
                    },
                    _ => return Err(DescDecodeError::BadGranularity { ty, g }),
                };
                Ok(Self::PasidIotlb {
                    did,
                    pasid: bits(w0, 32, 20) as u32,
                    granularity,
                })
            }
            t::PASID_CACHE => {
                // Used: 3:0, 5:4, 31:16, 51:32.
                reserved(0, w0, !0x000F_FFFF_FFFF_003F)?;
                reserved(1, w1, !0)?;
                let granularity = match g {
                    0 => PcGranularity::Domain,
                    1 => PcGranularity::Pasid {
                        pasid: bits(w0, 32, 20) as u32,
                    },
                    3 => PcGranularity::Global,
                    _ => return Err(DescDecodeError::BadGranularity { ty, g }),
                };
                Ok(Self::PasidCache { did, granularity })
            }
            t::PASID_DEVICE_TLB => {
                // Word 0 uses every bit but the type-high field; word 1: G b0, S b11,
                // ADDR 63:12.
                reserved(1, w1, 0x7FE)?;
                Ok(Self::PasidDeviceTlb {
                    sid: bits(w0, 16, 16) as u16,
                    pfsid: (bits(w0, 12, 4) | (bits(w0, 52, 12) << 4)) as u16,
                    qdep: bits(w0, 4, 5) as u8,
                    pasid: bits(w0, 32, 20) as u32,
                    global: bit(w1, 0),
                    addr: w1 & ADDR_MASK_63_12,
                    size: bit(w1, 11),
                })
            }
            _ => Err(DescDecodeError::UnknownType { ty }),
        }
    }
}

/// The page-aligned byte range a page-selective invalidation with address mask `am` at
/// `addr` covers: 2^`am` pages, the address bits below the mask ignored (X86.md §1.6).
/// `am` above 52 covers the whole 64-bit space.
pub const fn psi_range(addr: u64, am: u8) -> (u64, u64) {
    if am as u32 >= 52 {
        return (0, u64::MAX);
    }
    let size = 1u64 << (12 + am as u32);
    let start = addr & !(size - 1);
    (start, size)
}

/// The range a device-TLB invalidation covers: one page with `s` clear; with `s` set, the
/// position of the lowest zero bit of `addr[63:12]` gives the size (bit 12 zero → 8 KiB,
/// bit 13 → 16 KiB, ...; all ones → everything). Returns `(start, size)`, size 0 meaning
/// the whole space.
pub const fn devtlb_range(addr: u64, s: bool) -> (u64, u64) {
    let page = addr & ADDR_MASK_63_12;
    if !s {
        return (page, 1 << 12);
    }
    let z = (!(page >> 12)).trailing_zeros();
    if z >= 51 {
        return (0, 0);
    }
    let size = 1u64 << (z + 13);
    (page & !(size - 1), size)
}

/// The address and S bit of a device-TLB invalidation of the 2^`mask` pages from `addr`
/// (the inverse of [`devtlb_range`], Linux `qi_flush_dev_iotlb`): with `mask` > 0 the page
/// number's bits below bit `mask − 1` are set to ones and S = 1; with 0, one page, S = 0.
/// `addr` is aligned down to the block first.
pub const fn devtlb_addr(addr: u64, mask: u32) -> (u64, bool) {
    if mask == 0 {
        return (addr & ADDR_MASK_63_12, false);
    }
    if mask >= 52 {
        return (ADDR_MASK_63_12 & !(1 << 63), true);
    }
    let block = addr & !((1u64 << (12 + mask)) - 1);
    (
        block | (((1u64 << (12 + mask - 1)) - 1) & ADDR_MASK_63_12),
        true,
    )
}

/// Queue geometry in IQA: base bits 63:12, DW bit 11 (256-bit descriptors), QS bits 2:0
/// (2^QS 4 KiB pages).
pub const fn iqa_encode(base: u64, dw256: bool, qs: u8) -> u64 {
    (base & ADDR_MASK_63_12) | ((dw256 as u64) << 11) | (qs as u64 & 0x7)
}

/// IQERCD: the error code IQEI (bits 3:0), ITESID (47:32), ICESID (63:48).
pub const fn iqercd_encode(iqei: u8, itesid: u16, icesid: u16) -> u64 {
    (iqei as u64 & 0xF) | ((itesid as u64) << 32) | ((icesid as u64) << 48)
}

/// IQEI codes (IQERCD bits 3:0), as Intel's register reference for VT-d units gives them
/// (e.g. "IQ Error Info register (IQERCD_REG)", 14th Generation Intel Core processors,
/// CFG and MEM registers): 0 info not available (older hardware), 1 invalid tail pointer,
/// 2 descriptor fetch error, 3 invalid descriptor type, 4 reserved-field violation in a
/// valid descriptor type, 5 invalid descriptor width in IQA. Linux prints the value raw
/// (`qi_dump_fault`: "Invalidation Queue Error: Reason %llx") and defines no names.
pub mod iqei {
    /// 0: no detail (hardware before the field existed).
    pub const INFO_NOT_AVAILABLE: u8 = 0;
    /// 1: the tail pointer is invalid (beyond the queue, or not aligned to a descriptor).
    pub const INVALID_TAIL: u8 = 1;
    /// 2: fetching the descriptor failed.
    pub const FETCH_ERROR: u8 = 2;
    /// 3: the descriptor's type is invalid (here: one the model does not implement).
    pub const INVALID_TYPE: u8 = 3;
    /// 4: a valid descriptor type with a reserved field set (a reserved granularity too).
    pub const RESERVED_FIELD: u8 = 4;
    /// 5: the descriptor width programmed in IQA is invalid.
    pub const INVALID_WIDTH: u8 = 5;

    /// The code for a descriptor that does not decode.
    pub fn of(error: &super::DescDecodeError) -> u8 {
        match error {
            super::DescDecodeError::UnknownType { .. } => INVALID_TYPE,
            super::DescDecodeError::BadGranularity { .. }
            | super::DescDecodeError::Reserved { .. } => RESERVED_FIELD,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cap_ecap_decode_the_cascade_lake_sample() {
        // X86.md §1.2: cap 8d2078c106f0466 ecap f020df.
        let c = CAP_CASCADE_LAKE;
        assert_eq!(c.nd(), 6);
        assert_eq!(c.domains(), 65_536);
        assert!(!c.cm() && !c.rwbf() && !c.afl());
        assert_eq!(c.sagaw(), 0b100);
        assert_eq!(c.mgaw(), 48);
        assert!(c.zlr());
        assert_eq!(c.fault_record_offset(), 0x100);
        assert_eq!(c.sllps(), 0b11);
        assert!(c.psi());
        assert_eq!(c.nfr(), 8);
        assert_eq!(c.mamv(), 18);
        assert!(c.dwd() && c.drd());
        assert!(!c.fl1gp() && !c.fl5lp() && !c.esrtps());
        assert!(c.pi());
        let e = ECAP_CASCADE_LAKE;
        assert!(e.c() && e.qi() && e.dt() && e.ir() && e.eim() && e.pt() && e.sc());
        assert_eq!(e.iotlb_reg_offset(), 0x200);
        assert_eq!(e.mhmv(), 0xF);
        assert!(!e.smts() && !e.flts() && !e.pasid());
        // An SPR-like ECAP with SMTS, FLTS and PASID (bits 43, 47, 40) and PSS = 19.
        let spr = Ecap((1 << 43) | (1 << 47) | (1 << 40) | (19 << 35));
        assert!(spr.smts() && spr.flts() && spr.pasid());
        assert_eq!(spr.pasid_bits(), 20);
    }

    #[test]
    fn widths_follow_agaw() {
        assert_eq!(width_of_levels(3), 39);
        assert_eq!(width_of_levels(4), 48);
        assert_eq!(width_of_levels(5), 57);
        assert_eq!(agaw_of_levels(4), 2);
        assert_eq!(levels_of_agaw(3), 5);
    }

    #[test]
    fn legacy_root_and_context_entries() {
        let r = RootEntry {
            present: true,
            context_table: 0x1234_5000,
        };
        assert_eq!(r.encode(), [0x1234_5001, 0]);
        assert_eq!(RootEntry::decode(r.encode()), Some(r));
        assert_eq!(RootEntry::decode([0x1234_5003, 0]), None);
        assert_eq!(RootEntry::decode([0x1234_5001, 1]), None);

        let c = ContextEntry {
            present: true,
            fpd: false,
            tt: TranslationType::MultiLevelDevTlb,
            slptptr: 0xABC_D000,
            aw: 2,
            did: 0x1234,
        };
        // lo = ptr | TT 1 << 2 | P; hi = DID << 8 | AW.
        assert_eq!(c.encode(), [0xABC_D005, 0x12_3402]);
        assert_eq!(ContextEntry::decode(c.encode()), Some(c));
        let pt = ContextEntry {
            tt: TranslationType::PassThrough,
            fpd: true,
            ..c
        };
        assert_eq!(pt.encode()[0], 0xABC_D00B);
        // TT = 3 is reserved; so are bits 11:4 and high bits above DID.
        assert_eq!(ContextEntry::decode([0xABC_D00D, 0x12_3402]), None);
        assert_eq!(ContextEntry::decode([0xABC_D015, 0x12_3402]), None);
        assert_eq!(ContextEntry::decode([0xABC_D005, 1 << 24]), None);
    }

    #[test]
    fn scalable_root_context_and_pasid_entries() {
        let r = SmRootEntry {
            lower_present: true,
            lower_table: 0x10_0000,
            upper_present: true,
            upper_table: 0x20_0000,
        };
        assert_eq!(r.encode(), [0x10_0001, 0x20_0001]);
        assert_eq!(SmRootEntry::decode(r.encode()), Some(r));
        assert_eq!(r.table_for(0x7F), (true, 0x10_0000, 0x7F));
        assert_eq!(r.table_for(0x80), (true, 0x20_0000, 0));

        let c = SmContextEntry {
            present: true,
            fpd: false,
            dte: true,
            paside: true,
            pre: false,
            pdts: 3,
            pasid_dir: 0x55_5000,
            rid_pasid: 0,
        };
        // P | DTE << 2 | PASIDE << 3 | PDTS 3 << 9 = 0x60D.
        assert_eq!(c.encode(), [0x55_560D, 0, 0, 0]);
        assert_eq!(c.dir_entries(), 1024);
        assert_eq!(SmContextEntry::decode(c.encode()), Some(c));
        assert_eq!(SmContextEntry::decode([0x55_562D, 0, 0, 0]), None);

        let d = PasidDirEntry {
            present: true,
            fpd: true,
            table: 0x7000,
        };
        assert_eq!(d.encode(), 0x7003);
        assert_eq!(PasidDirEntry::decode(0x7003), Some(d));
        assert_eq!(PasidDirEntry::decode(0x7007), None);

        let p = PasidEntry {
            present: true,
            aw: 2,
            pgtt: Pgtt::SecondStage,
            slptptr: 0x9000,
            did: 7,
            flpm: 1,
            flptptr: 0xA000,
            sre: true,
            ..PasidEntry::default()
        };
        // w0 = ptr | PGTT 2 << 6 | AW 2 << 2 | P = 0x9089; w2 = ptr | FLPM 1 << 2 | SRE.
        let raw = p.encode();
        assert_eq!(raw[0], 0x9089);
        assert_eq!(raw[1], 7);
        assert_eq!(raw[2], 0xA005);
        assert_eq!(PasidEntry::decode(raw), Some(p));
        let mut bad = raw;
        bad[0] = 0x9001 | (5 << 6); // PGTT 5 reserved.
        assert_eq!(PasidEntry::decode(bad), None);
        // NXE is word 2 bit 5 (bit 133 of the entry).
        let n = PasidEntry { nxe: true, ..p };
        assert_eq!(n.encode()[2], 0xA025);
        assert_eq!(PasidEntry::decode(n.encode()), Some(n));
    }

    #[test]
    fn page_table_entries() {
        assert_eq!(SlPte::table(0x12_3000), 0x12_3003);
        assert_eq!(SlPte::leaf(0x4000_0000, Prot::READ, true), 0x4000_0081);
        assert_eq!(SlPte::leaf(0x5000, Prot::WRITE, false), 0x5002);
        assert_eq!(
            SlPte::decode(0x4000_0081, 3),
            SlPte::Leaf {
                pa: 0x4000_0000,
                prot: Prot::READ
            }
        );
        assert_eq!(
            SlPte::decode(0x12_3003, 2),
            SlPte::Table { next: 0x12_3000 }
        );
        assert_eq!(SlPte::decode(0x12_3000, 2), SlPte::NotPresent);
        // Bits above 51 are not address.
        assert_eq!(
            SlPte::decode((1 << 62) | 0x5003, 1),
            SlPte::Leaf {
                pa: 0x5000,
                prot: Prot::READ_WRITE
            }
        );
        // First stage (Linux 6.12): P | US | A, plus RW | D when writable; no XD.
        assert_eq!(FlPte::leaf(0x5000, false, false), 0x5025);
        assert_eq!(FlPte::leaf(0x20_0000, true, true), 0x20_00E7);
        assert_eq!(FlPte::table(0x6000), 0x6027);
        // Linux 5.6 to 6.10: XD on leaves and tables too; the decode ignores it.
        let xd = FlExecControl::LINUX_6_3;
        assert_eq!(
            FlPte::leaf_with(0x5000, false, false, xd),
            0x8000_0000_0000_5025
        );
        assert_eq!(FlPte::table_with(0x6000, xd), 0x8000_0000_0000_6027);
        assert_eq!(
            FlPte::leaf_with(0x5000, false, false, FlExecControl::LINUX_6_11),
            0x5025
        );
        assert_eq!(
            FlPte::decode(0x8000_0000_0000_6027, 3),
            FlPte::Table {
                next: 0x6000,
                write: true
            }
        );
        assert_eq!(
            FlPte::decode(0x8000_0000_0020_00E7, 2),
            FlPte::Leaf {
                pa: 0x20_0000,
                write: true
            }
        );
        assert_eq!(FlPte::decode(0x6026, 3), FlPte::NotPresent);
    }

    #[test]
    fn fault_record_round_trip() {
        let f = FaultRecord {
            addr: 0xDEAD_B000,
            sid: 0x0108,
            reason: reason::PTE_NO_WRITE,
            pasid: None,
            read: false,
        };
        // hi = SID | FR 5 << 32 | F.
        assert_eq!(f.encode(), [0xDEAD_B000, 0x8000_0005_0000_0108]);
        assert_eq!(FaultRecord::decode(f.encode()), Some(f));
        let g = FaultRecord {
            pasid: Some(0x12),
            read: true,
            ..f
        };
        assert_eq!(g.encode()[1], 0xC000_1205_8000_0108);
        assert_eq!(FaultRecord::decode(g.encode()), Some(g));
        assert_eq!(FaultRecord::decode([0, 0x0000_0005_0000_0108]), None);
    }

    #[test]
    fn descriptors_encode_to_hand_worked_words() {
        let psi = InvDesc::Iotlb {
            granularity: IotlbGranularity::Page {
                did: 5,
                addr: 0x1234_4000,
                am: 2,
                ih: true,
            },
            drain_reads: true,
            drain_writes: true,
        };
        // 2 | G 3 << 4 | DW << 6 | DR << 7 | DID 5 << 16; addr | IH << 6 | AM.
        assert_eq!(psi.encode().unwrap(), [0x5_00F2, 0x1234_4042]);
        let dsi = InvDesc::Iotlb {
            granularity: IotlbGranularity::Domain { did: 0x100 },
            drain_reads: false,
            drain_writes: false,
        };
        assert_eq!(dsi.encode().unwrap(), [0x100_0022, 0]);
        let glob = InvDesc::Iotlb {
            granularity: IotlbGranularity::Global,
            drain_reads: false,
            drain_writes: true,
        };
        assert_eq!(glob.encode().unwrap(), [0x52, 0]);

        let cc = InvDesc::ContextCache(CcGranularity::Device {
            did: 3,
            sid: 0x0108,
            fm: 0,
        });
        assert_eq!(cc.encode().unwrap(), [0x0108_0003_0031, 0]);
        assert_eq!(
            InvDesc::ContextCache(CcGranularity::Global)
                .encode()
                .unwrap(),
            [0x11, 0]
        );

        let wait = InvDesc::Wait {
            interrupt: false,
            status_write: true,
            fence: false,
            page_drain: false,
            status_data: 1,
            status_addr: 0x8000_1000,
        };
        assert_eq!(wait.encode().unwrap(), [0x1_0000_0025, 0x8000_1000]);

        let dev = InvDesc::DeviceTlb {
            sid: 0x0300,
            pfsid: 0x1234,
            qdep: 0x10,
            addr: 0x1_1000,
            size: true,
        };
        // PFSID low nibble 4 at 15:12, high 0x123 at 63:52; QDEP 0x10 at 20:16; SID at 47:32.
        assert_eq!(dev.encode().unwrap(), [0x1230_0300_0010_4003, 0x1_1001]);

        let piotlb = InvDesc::PasidIotlb {
            did: 1,
            pasid: 0xF_FFFF,
            granularity: PasidIotlbGranularity::Page {
                addr: 0x20_0000,
                am: 9,
                ih: false,
            },
        };
        assert_eq!(piotlb.encode().unwrap(), [0x000F_FFFF_0001_0036, 0x20_0009]);

        for d in [psi, dsi, glob, cc, wait, dev, piotlb] {
            assert_eq!(InvDesc::decode(d.encode().unwrap()), Ok(d));
        }
    }

    #[test]
    fn descriptor_encode_rejects_wide_fields() {
        let bad_pasid = InvDesc::PasidIotlb {
            did: 1,
            pasid: 1 << 20,
            granularity: PasidIotlbGranularity::AllOfPasid,
        };
        assert!(bad_pasid.encode().is_err());
        let bad_am = InvDesc::Iotlb {
            granularity: IotlbGranularity::Page {
                did: 1,
                addr: 0,
                am: 64,
                ih: false,
            },
            drain_reads: false,
            drain_writes: false,
        };
        assert!(bad_am.encode().is_err());
        let bad_addr = InvDesc::Wait {
            interrupt: false,
            status_write: true,
            fence: false,
            page_drain: false,
            status_data: 0,
            status_addr: 0x1002,
        };
        assert!(bad_addr.encode().is_err());
    }

    #[test]
    fn decode_rejects_malformed_descriptors() {
        assert_eq!(
            InvDesc::decode([0x0, 0]),
            Err(DescDecodeError::UnknownType { ty: 0 })
        );
        assert_eq!(
            InvDesc::decode([0x9, 0]),
            Err(DescDecodeError::UnknownType { ty: 9 })
        );
        // Type-high bits 11:9 set on an IOTLB descriptor.
        assert_eq!(
            InvDesc::decode([0x222, 0]),
            Err(DescDecodeError::UnknownType { ty: 0x12 })
        );
        // G = 0 is reserved for IOTLB and context-cache invalidation.
        assert_eq!(
            InvDesc::decode([0x2, 0]),
            Err(DescDecodeError::BadGranularity { ty: 2, g: 0 })
        );
        assert_eq!(
            InvDesc::decode([0x1, 0]),
            Err(DescDecodeError::BadGranularity { ty: 1, g: 0 })
        );
        // Bit 8 of an IOTLB descriptor, bit 7 of its address word.
        assert_eq!(
            InvDesc::decode([0x132, 0]),
            Err(DescDecodeError::Reserved {
                ty: 2,
                word: 0,
                bits: 0x100
            })
        );
        assert_eq!(
            InvDesc::decode([0x32, 0x1080]),
            Err(DescDecodeError::Reserved {
                ty: 2,
                word: 1,
                bits: 0x80
            })
        );
        // Wait with a misaligned status address; context-cache with a non-zero word 1.
        assert!(matches!(
            InvDesc::decode([0x25, 0x1001]),
            Err(DescDecodeError::Reserved { ty: 5, word: 1, .. })
        ));
        assert!(matches!(
            InvDesc::decode([0x11, 1]),
            Err(DescDecodeError::Reserved { ty: 1, word: 1, .. })
        ));
    }

    #[test]
    fn psi_and_devtlb_ranges() {
        // Address bits below the mask are ignored.
        assert_eq!(psi_range(0x1234_5000, 2), (0x1234_4000, 0x4000));
        assert_eq!(psi_range(0x1FF_F000, 14), (0, 0x400_0000));
        assert_eq!(psi_range(0x1000, 0), (0x1000, 0x1000));
        assert_eq!(psi_range(0x1000, 60), (0, u64::MAX));
        assert_eq!(devtlb_range(0x1_0000, false), (0x1_0000, 0x1000));
        // Bit 12 zero: 8 KiB; bits 12 set, 13 zero: 16 KiB.
        assert_eq!(devtlb_range(0x1_0000, true), (0x1_0000, 0x2000));
        assert_eq!(devtlb_range(0x1_1000, true), (0x1_0000, 0x4000));
        assert_eq!(devtlb_range(0x7FFF_FFFF_FFFF_F000, true), (0, 0));
    }

    #[test]
    fn pasid_cache_and_pasid_devtlb_descriptors() {
        // Type 7, G = 1 (PASID-selective): 7 | 1 << 4 | DID 9 << 16 | PASID 0x12 << 32.
        let pc = InvDesc::PasidCache {
            did: 9,
            granularity: PcGranularity::Pasid { pasid: 0x12 },
        };
        assert_eq!(pc.encode().unwrap(), [0x12_0009_0017, 0]);
        let all = InvDesc::PasidCache {
            did: 9,
            granularity: PcGranularity::Domain,
        };
        assert_eq!(all.encode().unwrap(), [0x9_0007, 0]);
        let glob = InvDesc::PasidCache {
            did: 0,
            granularity: PcGranularity::Global,
        };
        assert_eq!(glob.encode().unwrap(), [0x37, 0]);
        // G = 2 is reserved; word 1 must be zero.
        assert_eq!(
            InvDesc::decode([0x27, 0]),
            Err(DescDecodeError::BadGranularity { ty: 7, g: 2 })
        );
        assert!(matches!(
            InvDesc::decode([0x17, 1]),
            Err(DescDecodeError::Reserved { ty: 7, word: 1, .. })
        ));

        // Type 8: QDEP 3 << 4, PFSID 0x1234 (4 at 15:12, 0x123 at 63:52), SID 0x0300 << 16,
        // PASID 5 << 32; word 1: ADDR | S << 11 | G.
        let d = InvDesc::PasidDeviceTlb {
            sid: 0x0300,
            pfsid: 0x1234,
            qdep: 3,
            pasid: 5,
            global: false,
            addr: 0x1_1000,
            size: true,
        };
        assert_eq!(d.encode().unwrap(), [0x1230_0005_0300_4038, 0x1_1800]);
        let g = InvDesc::PasidDeviceTlb {
            sid: 0x0300,
            pfsid: 0x1234,
            qdep: 3,
            pasid: 5,
            global: true,
            addr: 0x1_1000,
            size: false,
        };
        assert_eq!(g.encode().unwrap()[1], 0x1_1001);
        for x in [pc, all, glob, d, g] {
            assert_eq!(InvDesc::decode(x.encode().unwrap()), Ok(x));
        }
        // Bits 10:1 of word 1 are reserved.
        assert!(matches!(
            InvDesc::decode([0x8, 0x1_1002]),
            Err(DescDecodeError::Reserved {
                ty: 8,
                word: 1,
                bits: 2
            })
        ));
    }

    #[test]
    fn devtlb_size_encoding_by_hand() {
        // One page: S = 0, the address as is.
        assert_eq!(devtlb_addr(0x1_2000, 0), (0x1_2000, false));
        // 2 pages from 0x1_2000: page number 0x12 has bit 0 (address bit 12) = 0 → 8 KiB.
        assert_eq!(devtlb_addr(0x1_2000, 1), (0x1_2000, true));
        assert_eq!(devtlb_range(0x1_2000, true), (0x1_2000, 0x2000));
        // 4 pages from 0x1_0000: bit 12 set, bit 13 clear → page number 0x11, 16 KiB.
        assert_eq!(devtlb_addr(0x1_0000, 2), (0x1_1000, true));
        // Not aligned: 0x1_3000 with 4 pages is aligned down to 0x1_0000 first.
        assert_eq!(devtlb_addr(0x1_3000, 2), (0x1_1000, true));
        // 512 pages (2 MiB) at 0x20_0000: bits 12..19 set, bit 20 clear → 0x2F_F000.
        assert_eq!(devtlb_addr(0x20_0000, 9), (0x2F_F000, true));
        assert_eq!(devtlb_range(0x2F_F000, true), (0x20_0000, 0x20_0000));
        // Linux's full flush (mask 52) sets bits 62:12: the whole space.
        let (all, s) = devtlb_addr(0, 52);
        assert_eq!((all, s), (0x7FFF_FFFF_FFFF_F000, true));
        assert_eq!(devtlb_range(all, s), (0, 0));
        // Round trip for every mask and a sample of addresses.
        for mask in 1..40 {
            for addr in [0u64, 0x1234_5000, 0xFFFF_F000, 0x7_6543_2100_0000] {
                let (a, s) = devtlb_addr(addr, mask);
                let size = 1u64 << (12 + mask);
                assert_eq!(
                    devtlb_range(a, s),
                    (addr & !(size - 1), size),
                    "{addr:#x} {mask}"
                );
            }
        }
    }

    #[test]
    fn rtaddr_ttm_and_sm_reason_codes() {
        assert_eq!(rtaddr_encode(0x1234_5000, false), 0x1234_5000);
        assert_eq!(rtaddr_encode(0x1234_5000, true), 0x1234_5400);
        // Codes are 0x30 + the index in Linux's dma_remap_sm_fault_reasons table.
        assert_eq!(reason::SM_ROOT_NOT_PRESENT, 0x30 + 9);
        assert_eq!(reason::SM_PASID_NOT_PRESENT, 0x30 + 0x29);
        assert_eq!(reason::SM_US_CLEAR, 129);
        assert_eq!(reason::SM_NO_WRITE, 0x30 + 0x55);
    }

    #[test]
    fn queue_registers() {
        assert_eq!(iqa_encode(0x8000_0000, false, 0), 0x8000_0000);
        assert_eq!(iqa_encode(0x8000_0000, true, 1), 0x8000_0801);
        assert_eq!(
            iqercd_encode(iqei::RESERVED_FIELD, 0x0100, 0x0200),
            0x0200_0100_0000_0004
        );
        // Intel's IQERCD_REG values (see `iqei`), not a round trip of the constants.
        assert_eq!(
            [
                iqei::INFO_NOT_AVAILABLE,
                iqei::INVALID_TAIL,
                iqei::FETCH_ERROR,
                iqei::INVALID_TYPE,
                iqei::RESERVED_FIELD,
                iqei::INVALID_WIDTH
            ],
            [0, 1, 2, 3, 4, 5]
        );
        assert_eq!(
            iqei::of(&DescDecodeError::UnknownType { ty: 9 }),
            iqei::INVALID_TYPE
        );
        assert_eq!(
            iqei::of(&DescDecodeError::Reserved {
                ty: 2,
                word: 0,
                bits: 1 << 20
            }),
            iqei::RESERVED_FIELD
        );
    }
}
