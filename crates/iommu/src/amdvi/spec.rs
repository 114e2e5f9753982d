//! AMD-Vi encodings: the 256-bit device table entry, v1 host page-table entries, the
//! 128-bit commands and event-log entries, with their decoding and the S-bit range encoding
//! of the invalidation commands.
//!
//! Every bit position of the model lives in this file. Positions come from the shared
//! research notes (`X86.md` §3.2, §3.3, §3.5, §3.6), which read them in Linux's
//! `drivers/iommu/amd/amd_iommu_types.h` and `iommu.c` and in VirtualBox's `iommu-amd.h`
//! (both written from the AMD I/O Virtualization Technology specification). Each layout is
//! tested below against words worked out by hand.
//!
//! Multi-word structures are arrays of little-endian `u64` words: bit `n` of the structure
//! is bit `n % 64` of word `n / 64`.
//!
//! # Device table entry (four words; `X86.md` §3.2, Linux `DTE_FLAG_*`, `DEV_ENTRY_MODE_*`)
//!
//! | bits | field |
//! |---|---|
//! | 0 | V: the entry is valid |
//! | 1 | TV: the translation fields are valid |
//! | 11:9 | Mode: 0 no translation, 1-6 page-table levels, 7 reserved |
//! | 51:12 | host page-table root pointer (4 KiB aligned, in place) |
//! | 61 / 62 | IR / IW: read / write permission |
//! | 79:64 | DomainID |
//! | 96 | I: device IOTLB (ATS) enabled |
//! | 97 / 98 | SE / SA: suppress (repeated / all) fault events |
//!
//! # v1 page-table entry (`X86.md` §3.3, Linux `IOMMU_PTE_*`, `PM_LEVEL_ENC`)
//!
//! | bits | field |
//! |---|---|
//! | 0 | PR: present |
//! | 11:9 | NextLevel: level of the table pointed at; 0 a page of the level's natural size; 7 a page whose size is encoded in the address |
//! | 51:12 | address (next table or page) |
//! | 59 / 60 | U / FC (force coherent; Linux sets it in every leaf) |
//! | 61 / 62 | IR / IW |
//!
//! Levels are 1-based, as in the specification: a level-1 table holds 4 KiB entries, and
//! one entry of a level-`n` table maps `2^(12 + 9 (n - 1))` bytes.
//!
//! # Commands (two words; `X86.md` §3.5, Linux `build_*` in `iommu.c`)
//!
//! | command | word 0 | word 1 |
//! |---|---|---|
//! | all | `[63:60]` opcode | |
//! | `COMPLETION_WAIT` (1) | `[0]` S, `[1]` I, `[2]` F, `[51:3]` store address | store data |
//! | `INVALIDATE_DEVTAB_ENTRY` (2) | `[15:0]` DeviceID | |
//! | `INVALIDATE_IOMMU_PAGES` (3) | `[19:0]` PASID, `[47:32]` DomainID | `[0]` S, `[1]` PDE, `[2]` GN, `[63:12]` address |
//! | `INVALIDATE_IOTLB_PAGES` (4) | `[15:0]` DeviceID, `[23:16]` PASID`[15:8]`, `[31:24]` Maxpend, `[47:32]` QueueID, `[55:48]` PASID`[7:0]` | `[0]` S, `[2]` GN, `[63:12]` address |
//! | `INVALIDATE_INTERRUPT_TABLE` (5) | `[15:0]` DeviceID | |
//! | `INVALIDATE_IOMMU_ALL` (8) | | |
//!
//! Every other bit is reserved. [`Command::decode`] rejects an unknown opcode or a set
//! reserved bit with a [`DecodeError`] and never panics (the hardware answers both with
//! `ILLEGAL_COMMAND_ERROR`). `INVALIDATE_IOTLB_PAGES`'s Type field (word 1 `[5:4]`) is not
//! modelled and is treated as reserved.
//!
//! # Event-log entries (two words; `X86.md` §3.6, Linux `EVENT_*`, `iommu_print_event`)
//!
//! | bits of word 0 | field |
//! |---|---|
//! | 15:0 | DeviceID |
//! | 19:16 | DomainID / PASID bits `[19:16]` |
//! | 47:32 | DomainID / PASID bits `[15:0]` |
//! | 59:48 | flags ([`fault_flags`]) |
//! | 63:60 | event code |
//!
//! Word 1 is the faulting address (for `ILLEGAL_COMMAND_ERROR`, the physical address of
//! the command).

use thiserror::Error;

use crate::addr::Prot;

/// Size of one command-buffer entry in bytes.
pub const CMD_BYTES: u64 = 16;
/// Size of one event-log entry in bytes.
pub const EVENT_BYTES: u64 = 16;
/// Size of one device table entry in bytes.
pub const DTE_BYTES: u64 = 32;

/// One encoded command: word 0 (bytes 0..8) and word 1 (bytes 8..16).
pub type RawCommand = [u64; 2];
/// One encoded event-log entry.
pub type RawEvent = [u64; 2];
/// One encoded device table entry.
pub type RawDte = [u64; 4];

/// A bit field `[hi:lo]` of one 64-bit word.
#[derive(Clone, Copy)]
struct Field {
    lo: u32,
    width: u32,
}

impl Field {
    const fn new(hi: u32, lo: u32) -> Self {
        Field {
            lo,
            width: hi - lo + 1,
        }
    }

    const fn bit(b: u32) -> Self {
        Field::new(b, b)
    }

    /// The field's bits, in place.
    const fn mask(self) -> u64 {
        if self.width == 64 {
            u64::MAX
        } else {
            ((1u64 << self.width) - 1) << self.lo
        }
    }

    const fn max(self) -> u64 {
        self.mask() >> self.lo
    }

    /// `value` shifted into place; the caller has checked it fits.
    const fn put(self, value: u64) -> u64 {
        (value << self.lo) & self.mask()
    }

    const fn get(self, word: u64) -> u64 {
        (word & self.mask()) >> self.lo
    }

    const fn flag(self, word: u64) -> bool {
        self.get(word) != 0
    }
}

/// Why a structure cannot be encoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Error)]
pub enum EncodeError {
    /// A field value does not fit in its bits.
    #[error("Field {field} value {value:#x} does not fit in {bits} bits")]
    FieldOverflow {
        /// The field's name.
        field: &'static str,
        /// The value given.
        value: u64,
        /// The field's width.
        bits: u32,
    },
    /// An address has bits set below its alignment or above the field's top bit.
    #[error("Address {addr:#x} for {field} has bits outside {mask:#x}")]
    BadAddress {
        /// The field's name.
        field: &'static str,
        /// The address given.
        addr: u64,
        /// The bits the field can hold.
        mask: u64,
    },
    /// A field value is reserved by the specification.
    #[error("Field {field} value {value:#x} is reserved")]
    ReservedValue {
        /// The field's name.
        field: &'static str,
        /// The value given.
        value: u64,
    },
}

/// Why words are not a valid command, event or device table entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Error)]
pub enum DecodeError {
    /// The command opcode is not one this model implements.
    #[error("Unknown command opcode {opcode:#x}")]
    UnknownOpcode {
        /// The opcode found.
        opcode: u8,
    },
    /// The event code is not one this model implements.
    #[error("Unknown event code {code:#x}")]
    UnknownEventCode {
        /// The code found.
        code: u8,
    },
    /// Reserved bits are set.
    #[error("{what} has reserved bits {bits:#x} set in word {word}")]
    ReservedBits {
        /// The structure ("INVALIDATE_IOMMU_PAGES", "IO_PAGE_FAULT", ...).
        what: &'static str,
        /// Which word.
        word: usize,
        /// The reserved bits that are set.
        bits: u64,
    },
    /// A field holds a reserved value.
    #[error("{what} field {field} holds reserved value {value:#x}")]
    ReservedValue {
        /// The structure.
        what: &'static str,
        /// The field's name.
        field: &'static str,
        /// The value found.
        value: u64,
    },
}

fn check_fits(field: &'static str, f: Field, value: u64) -> Result<u64, EncodeError> {
    if value > f.max() {
        return Err(EncodeError::FieldOverflow {
            field,
            value,
            bits: f.width,
        });
    }
    Ok(f.put(value))
}

fn check_addr(field: &'static str, f: Field, addr: u64) -> Result<u64, EncodeError> {
    if addr & !f.mask() != 0 {
        return Err(EncodeError::BadAddress {
            field,
            addr,
            mask: f.mask(),
        });
    }
    Ok(addr)
}

fn check_reserved(what: &'static str, raw: &[u64], defined: &[u64]) -> Result<(), DecodeError> {
    for (word, (w, d)) in raw.iter().zip(defined).enumerate() {
        if w & !d != 0 {
            return Err(DecodeError::ReservedBits {
                what,
                word,
                bits: w & !d,
            });
        }
    }
    Ok(())
}

// ------------------------------------------------------------------------------------------
// Device table entry.

const DTE_V: Field = Field::bit(0);
const DTE_TV: Field = Field::bit(1);
const DTE_MODE: Field = Field::new(11, 9);
const DTE_ROOT: Field = Field::new(51, 12);
const DTE_IR: Field = Field::bit(61);
const DTE_IW: Field = Field::bit(62);
// Word 1.
const DTE_DOMAIN_ID: Field = Field::new(15, 0);
const DTE_I: Field = Field::bit(32);
const DTE_SE: Field = Field::bit(33);
const DTE_SA: Field = Field::bit(34);

/// The largest DTE Mode that names a number of page-table levels (`X86.md` §3.2).
pub const MAX_DTE_MODE: u8 = 6;

/// The fields of a device table entry this model uses. See the [module docs](self) for the
/// layout; the interrupt-remapping and guest-translation fields are not modelled (encoded
/// as zero, ignored on decode).
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug, Default)]
pub struct Dte {
    /// V: the entry is valid. An invalid entry passes DMA through untranslated.
    pub valid: bool,
    /// TV: the translation fields (Mode, root pointer, IR/IW) are valid.
    pub translation_valid: bool,
    /// Mode: 0 no translation (permission check only), 1-6 levels of the host table.
    pub mode: u8,
    /// Physical address of the root table (4 KiB aligned, below 2^52).
    pub root: u64,
    /// IR: DMA reads are allowed.
    pub read: bool,
    /// IW: DMA writes are allowed.
    pub write: bool,
    /// The domain id that tags this device's cached translations.
    pub domain_id: u16,
    /// I: the device has an IOTLB (ATS).
    pub iotlb: bool,
    /// SE: suppress repeated fault events.
    pub suppress_events: bool,
    /// SA: suppress all fault events.
    pub suppress_all: bool,
}

impl Dte {
    /// An entry that translates through a `mode`-level table at `root` for `domain_id`,
    /// with read and write allowed, as Linux writes for a DMA domain (`X86.md` §3.2).
    pub const fn translated(domain_id: u16, mode: u8, root: u64) -> Self {
        Dte {
            valid: true,
            translation_valid: true,
            mode,
            root,
            read: true,
            write: true,
            domain_id,
            iotlb: false,
            suppress_events: false,
            suppress_all: false,
        }
    }

    /// Encodes the entry into its four words.
    ///
    /// # Errors
    ///
    /// [`EncodeError::ReservedValue`] for Mode 7 or more, [`EncodeError::BadAddress`] for a
    /// root that is not 4 KiB aligned or not below 2^52.
    pub fn encode(&self) -> Result<RawDte, EncodeError> {
        if self.mode > MAX_DTE_MODE {
            return Err(EncodeError::ReservedValue {
                field: "Mode",
                value: self.mode.into(),
            });
        }
        let w0 = DTE_V.put(self.valid.into())
            | DTE_TV.put(self.translation_valid.into())
            | DTE_MODE.put(self.mode.into())
            | check_addr("PageTableRootPtr", DTE_ROOT, self.root)?
            | DTE_IR.put(self.read.into())
            | DTE_IW.put(self.write.into());
        let w1 = DTE_DOMAIN_ID.put(self.domain_id.into())
            | DTE_I.put(self.iotlb.into())
            | DTE_SE.put(self.suppress_events.into())
            | DTE_SA.put(self.suppress_all.into());
        Ok([w0, w1, 0, 0])
    }

    /// Decodes the modelled fields of an entry; other bits are ignored.
    ///
    /// # Errors
    ///
    /// [`DecodeError::ReservedValue`] for Mode 7 in a valid entry with valid translation
    /// information (the hardware reports `ILLEGAL_DEV_TABLE_ENTRY`).
    pub fn decode(raw: RawDte) -> Result<Dte, DecodeError> {
        let [w0, w1, _, _] = raw;
        let dte = Dte {
            valid: DTE_V.flag(w0),
            translation_valid: DTE_TV.flag(w0),
            // Three bits: the cast is exact.
            mode: DTE_MODE.get(w0) as u8,
            root: w0 & DTE_ROOT.mask(),
            read: DTE_IR.flag(w0),
            write: DTE_IW.flag(w0),
            domain_id: DTE_DOMAIN_ID.get(w1) as u16,
            iotlb: DTE_I.flag(w1),
            suppress_events: DTE_SE.flag(w1),
            suppress_all: DTE_SA.flag(w1),
        };
        if dte.valid && dte.translation_valid && dte.mode > MAX_DTE_MODE {
            return Err(DecodeError::ReservedValue {
                what: "DTE",
                field: "Mode",
                value: dte.mode.into(),
            });
        }
        Ok(dte)
    }

    /// The permissions IR and IW grant.
    pub const fn prot(&self) -> Prot {
        Prot {
            read: self.read,
            write: self.write,
        }
    }
}

// ------------------------------------------------------------------------------------------
// v1 page-table entries.

/// v1 page-table entry bits (`X86.md` §3.3, Linux `IOMMU_PTE_*`).
pub mod pte {
    /// PR, bit 0: the entry is present.
    pub const PR: u64 = 1 << 0;
    /// Shift of NextLevel, bits `[11:9]`.
    pub const NEXT_LEVEL_SHIFT: u32 = 9;
    /// Mask of NextLevel.
    pub const NEXT_LEVEL_MASK: u64 = 0b111 << NEXT_LEVEL_SHIFT;
    /// NextLevel of a page of the level's natural size.
    pub const NEXT_LEVEL_PAGE: u8 = 0;
    /// NextLevel of a page whose size is encoded in its address bits (replicated).
    pub const NEXT_LEVEL_SIZED: u8 = 7;
    /// The address field, bits `[51:12]` (Linux `PM_ADDR_MASK`).
    pub const ADDR_MASK: u64 = 0x000f_ffff_ffff_f000;
    /// U, bit 59: untranslated access only.
    pub const U: u64 = 1 << 59;
    /// FC, bit 60: force coherent.
    pub const FC: u64 = 1 << 60;
    /// IR, bit 61: read permission.
    pub const IR: u64 = 1 << 61;
    /// IW, bit 62: write permission.
    pub const IW: u64 = 1 << 62;
    /// Highest physical-address bit an entry holds.
    pub const ADDR_TOP_BIT: u32 = 51;
}

/// log2 of the bytes one entry of a level-`level` table maps (1-based levels: 12 for
/// level 1, 21 for level 2, ..., 57 for level 6).
pub const fn level_shift(level: u32) -> u32 {
    12 + 9 * (level - 1)
}

/// The table level whose entries hold a page of `2^page_shift` bytes, natural or
/// replicated (Linux `PAGE_SIZE_LEVEL` + 1): 1 for 4 KiB to 1 MiB, 2 for 2 MiB to
/// 256 MiB, and so on.
pub const fn page_level(page_shift: u32) -> u32 {
    (page_shift - 12) / 9 + 1
}

/// How many consecutive entries a page of `2^page_shift` bytes occupies in its table
/// (Linux `PAGE_SIZE_PTE_COUNT`): 1 for a natural size, 16 for 64 KiB.
pub const fn page_replicas(page_shift: u32) -> u64 {
    1 << ((page_shift - 12) % 9)
}

/// The permission bits of `prot`.
pub const fn prot_bits(prot: Prot) -> u64 {
    (if prot.read { pte::IR } else { 0 }) | (if prot.write { pte::IW } else { 0 })
}

/// A directory entry pointing at a table of level `next_level` at `table_pa`, with both
/// permissions set as Linux writes it (`PM_LEVEL_PDE`), so only the leaf's IR/IW matter.
pub const fn encode_pde(table_pa: u64, next_level: u32) -> u64 {
    pte::PR
        | ((next_level as u64) << pte::NEXT_LEVEL_SHIFT)
        | (table_pa & pte::ADDR_MASK)
        | pte::IR
        | pte::IW
}

/// The leaf entry (each replica of it) mapping a page of `2^page_shift` bytes at `pa`,
/// with PR, FC and the permissions of `prot`, as Linux's `iommu_v1_map_pages` writes it.
///
/// A natural size for its level gets NextLevel 0 and the page address. Any other size
/// gets NextLevel 7 and the address with every bit below the size set except the bit just
/// below it (Linux `PAGE_SIZE_PTE`): a 64 KiB page has bits 14:12 set and bit 15 clear.
/// `pa` must be aligned to the page size.
pub const fn encode_leaf(pa: u64, page_shift: u32, prot: Prot) -> u64 {
    let size = 1u64 << page_shift;
    let attrs = pte::PR | pte::FC | prot_bits(prot);
    if page_replicas(page_shift) == 1 {
        attrs | (pa & pte::ADDR_MASK)
    } else {
        let addr = (pa | (size - 1)) & !(size >> 1) & pte::ADDR_MASK;
        attrs | ((pte::NEXT_LEVEL_SIZED as u64) << pte::NEXT_LEVEL_SHIFT) | addr
    }
}

/// A page-table entry, decoded for a table of a given level.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Entry {
    /// PR is clear.
    NotPresent,
    /// A directory entry: the next table is at `table_pa` and has level `next_level`
    /// (below the current level minus one when the entry skips levels).
    Table {
        /// Level of the table pointed at, 1 to the current level minus one.
        next_level: u32,
        /// Its physical address.
        table_pa: u64,
    },
    /// A page.
    Page {
        /// Physical address of the page (aligned to its size).
        pa: u64,
        /// log2 of the page size.
        page_shift: u32,
        /// IR and IW.
        prot: Prot,
    },
    /// Present but not valid at this level: a NextLevel at or above the current level
    /// (other than 7), or an encoded size that does not belong to this level.
    Invalid {
        /// The NextLevel found.
        next_level: u8,
    },
}

/// Decodes `entry` read from a table of level `level` (1..=6).
///
/// NextLevel 7 sizes are read as the hardware does (Linux `PTE_PAGE_SIZE`): the first
/// clear address bit at or above bit 12 is bit `z`, and the page is `2^(z + 1)` bytes.
/// Such a page must be larger than the level's natural size and smaller than the next
/// level's; otherwise the entry is [`Entry::Invalid`] (Linux writes only such sizes; what
/// hardware does with others is not documented in the sources, so the model faults).
pub const fn decode_entry(entry: u64, level: u32) -> Entry {
    if entry & pte::PR == 0 {
        return Entry::NotPresent;
    }
    // Three bits: the cast is exact.
    let next_level = ((entry & pte::NEXT_LEVEL_MASK) >> pte::NEXT_LEVEL_SHIFT) as u8;
    let prot = Prot {
        read: entry & pte::IR != 0,
        write: entry & pte::IW != 0,
    };
    let addr = entry & pte::ADDR_MASK;
    match next_level {
        pte::NEXT_LEVEL_PAGE => {
            let page_shift = level_shift(level);
            Entry::Page {
                pa: addr & !((1u64 << page_shift) - 1),
                page_shift,
                prot,
            }
        }
        pte::NEXT_LEVEL_SIZED => {
            let page_shift = (addr | 0xfff).trailing_ones() + 1;
            if page_shift <= level_shift(level) || page_shift >= level_shift(level) + 9 {
                return Entry::Invalid { next_level };
            }
            Entry::Page {
                pa: addr & !((1u64 << page_shift) - 1),
                page_shift,
                prot,
            }
        }
        n if (n as u32) < level => Entry::Table {
            next_level: n as u32,
            table_pa: addr,
        },
        _ => Entry::Invalid { next_level },
    }
}

// ------------------------------------------------------------------------------------------
// S-bit address encoding.

/// The address of `INVALIDATE_IOMMU_PAGES` and `INVALIDATE_IOTLB_PAGES` with its S bit
/// (`X86.md` §3.5, AMD spec Table 14 as quoted by QEMU, Linux `build_inv_address`).
///
/// S = 0: the one 4 KiB page at `addr`. S = 1: the first clear bit of `addr` at or above
/// bit 12 is bit `z`, and the command covers the naturally aligned `2^(z + 1)`-byte region
/// holding `addr`; `z >= 51` covers the whole address space.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub struct InvAddress {
    /// Address bits `[63:12]` (bits 11:0 are zero).
    pub addr: u64,
    /// The S (size) bit.
    pub s: bool,
}

/// What an [`InvAddress`] covers.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub enum InvSpan {
    /// `size` bytes from `start` (a power of two, `start` aligned to it).
    Range {
        /// First address covered.
        start: u64,
        /// Bytes covered.
        size: u64,
    },
    /// Every address.
    All,
}

impl InvSpan {
    /// Whether the span covers every byte of `[start, start + size)`.
    pub fn covers(&self, start: u64, size: u64) -> bool {
        match *self {
            InvSpan::All => true,
            InvSpan::Range { start: s, size: n } => {
                start >= s && (start - s).checked_add(size).is_some_and(|e| e <= n)
            }
        }
    }

    /// Whether the span and `[start, start + size)` share a byte.
    pub fn overlaps(&self, start: u64, size: u64) -> bool {
        match *self {
            InvSpan::All => size > 0,
            InvSpan::Range { start: s, size: n } => {
                size > 0 && start < s.saturating_add(n) && s < start.saturating_add(size)
            }
        }
    }
}

impl InvAddress {
    /// The "all pages" address Linux uses (`CMD_INV_IOMMU_ALL_PAGES_ADDRESS` with bits
    /// 11:0 cleared, S set): `0x7fff_ffff_ffff_f000`.
    pub const ALL: InvAddress = InvAddress {
        addr: 0x7fff_ffff_ffff_f000,
        s: true,
    };

    /// One 4 KiB page.
    pub const fn page(addr: u64) -> Self {
        InvAddress {
            addr: addr & !0xfff,
            s: false,
        }
    }

    /// The encoding of `[start, start + size)` as Linux's `build_inv_address` builds it: one
    /// page exactly; otherwise the smallest naturally aligned power-of-two region covering
    /// the range (all address bits below the highest bit in which the first and last byte
    /// differ set to one), or [`InvAddress::ALL`] when that bit is above 51 or the range
    /// wraps. A zero size is treated as one byte.
    pub const fn for_range(start: u64, size: u64) -> Self {
        let last = match start.checked_add(if size == 0 { 0 } else { size - 1 }) {
            Some(l) => l,
            None => return InvAddress::ALL,
        };
        if start >> 12 == last >> 12 {
            return InvAddress::page(start);
        }
        let msb = 63 - (start ^ last).leading_zeros();
        if msb > 51 {
            return InvAddress::ALL;
        }
        InvAddress {
            addr: (start | ((1u64 << msb) - 1)) & !0xfff,
            s: true,
        }
    }

    /// What the address covers, decoded as the hardware does.
    pub const fn span(&self) -> InvSpan {
        if !self.s {
            return InvSpan::Range {
                start: self.addr & !0xfff,
                size: 1 << 12,
            };
        }
        let z = (self.addr | 0xfff).trailing_ones();
        if z >= 51 {
            return InvSpan::All;
        }
        let size = 1u64 << (z + 1);
        InvSpan::Range {
            start: self.addr & !(size - 1),
            size,
        }
    }
}

// ------------------------------------------------------------------------------------------
// Commands.

/// Command opcodes (word 0 bits `[63:60]`; `X86.md` §3.5, Linux `CMD_*`).
pub mod opcode {
    /// `COMPLETION_WAIT`.
    pub const COMPLETION_WAIT: u8 = 1;
    /// `INVALIDATE_DEVTAB_ENTRY`.
    pub const INVALIDATE_DEVTAB_ENTRY: u8 = 2;
    /// `INVALIDATE_IOMMU_PAGES`.
    pub const INVALIDATE_IOMMU_PAGES: u8 = 3;
    /// `INVALIDATE_IOTLB_PAGES` (device IOTLB, ATS).
    pub const INVALIDATE_IOTLB_PAGES: u8 = 4;
    /// `INVALIDATE_INTERRUPT_TABLE`.
    pub const INVALIDATE_INTERRUPT_TABLE: u8 = 5;
    /// `INVALIDATE_IOMMU_ALL` (needs EFR.IA).
    pub const INVALIDATE_IOMMU_ALL: u8 = 8;
}

const OP: Field = Field::new(63, 60);
// COMPLETION_WAIT, word 0.
const CW_S: Field = Field::bit(0);
const CW_I: Field = Field::bit(1);
const CW_F: Field = Field::bit(2);
const CW_ADDR: Field = Field::new(51, 3);
// DeviceID (DEVTAB, IOTLB, INTERRUPT_TABLE), word 0.
const DEVID: Field = Field::new(15, 0);
// INVALIDATE_IOMMU_PAGES, word 0.
const IP_PASID: Field = Field::new(19, 0);
const IP_DOMAIN: Field = Field::new(47, 32);
// INVALIDATE_IOTLB_PAGES, word 0.
const IT_PASID_HI: Field = Field::new(23, 16);
const IT_MAXPEND: Field = Field::new(31, 24);
const IT_QUEUE: Field = Field::new(47, 32);
const IT_PASID_LO: Field = Field::new(55, 48);
// Both invalidations, word 1.
const INV_S: Field = Field::bit(0);
const INV_PDE: Field = Field::bit(1);
const INV_GN: Field = Field::bit(2);
const INV_ADDR: Field = Field::new(63, 12);

/// The bits each command defines in word 0 and word 1; everything else is reserved.
const fn defined_bits(op: u8) -> Option<[u64; 2]> {
    let o = OP.mask();
    match op {
        opcode::COMPLETION_WAIT => Some([
            o | CW_S.mask() | CW_I.mask() | CW_F.mask() | CW_ADDR.mask(),
            u64::MAX,
        ]),
        opcode::INVALIDATE_DEVTAB_ENTRY | opcode::INVALIDATE_INTERRUPT_TABLE => {
            Some([o | DEVID.mask(), 0])
        }
        opcode::INVALIDATE_IOMMU_PAGES => Some([
            o | IP_PASID.mask() | IP_DOMAIN.mask(),
            INV_S.mask() | INV_PDE.mask() | INV_GN.mask() | INV_ADDR.mask(),
        ]),
        opcode::INVALIDATE_IOTLB_PAGES => Some([
            o | DEVID.mask()
                | IT_PASID_HI.mask()
                | IT_MAXPEND.mask()
                | IT_QUEUE.mask()
                | IT_PASID_LO.mask(),
            INV_S.mask() | INV_GN.mask() | INV_ADDR.mask(),
        ]),
        opcode::INVALIDATE_IOMMU_ALL => Some([o, 0]),
        _ => None,
    }
}

/// One AMD-Vi command, decoded. [`Command::encode`] rejects values that do not fit.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub enum Command {
    /// `COMPLETION_WAIT`: completes after every earlier command; then, with `store`, writes
    /// `store_data` (8 bytes) to `store_addr`, and with `interrupt` raises
    /// Status.ComWaitInt.
    CompletionWait {
        /// S: store `store_data` at `store_addr` on completion.
        store: bool,
        /// I: interrupt on completion.
        interrupt: bool,
        /// F: flush the PPR queue first.
        flush_queue: bool,
        /// The store target (8-byte aligned, bits `[51:3]`).
        store_addr: u64,
        /// The 64-bit value stored.
        store_data: u64,
    },
    /// `INVALIDATE_DEVTAB_ENTRY`: drop the cached device table entry of `device_id`.
    InvalidateDevtabEntry {
        /// DeviceID (PCI bus/device/function).
        device_id: u16,
    },
    /// `INVALIDATE_IOMMU_PAGES`: drop cached translations of `domain_id` in `address`'s
    /// span; with `pde` the cached directory entries too.
    InvalidateIommuPages {
        /// PASID (guest translations only, with `gn`), 20 bits.
        pasid: u32,
        /// DomainID.
        domain_id: u16,
        /// PDE: also drop cached page-directory entries.
        pde: bool,
        /// GN: guest (PASID) translations.
        gn: bool,
        /// Address and S bit.
        address: InvAddress,
    },
    /// `INVALIDATE_IOTLB_PAGES`: ask device `device_id`'s IOTLB (ATS) to drop `address`'s
    /// span.
    InvalidateIotlbPages {
        /// DeviceID.
        device_id: u16,
        /// PASID bits 15:0 (with `gn`).
        pasid: u16,
        /// Maxpend (Linux puts the device's ATS queue depth here).
        maxpend: u8,
        /// QueueID (Linux puts the DeviceID here).
        queue_id: u16,
        /// GN: guest (PASID) translations.
        gn: bool,
        /// Address and S bit.
        address: InvAddress,
    },
    /// `INVALIDATE_INTERRUPT_TABLE`: drop the cached interrupt remapping table of
    /// `device_id`.
    InvalidateInterruptTable {
        /// DeviceID.
        device_id: u16,
    },
    /// `INVALIDATE_IOMMU_ALL`: drop every cached entry of every kind.
    InvalidateIommuAll,
}

impl Command {
    /// A `COMPLETION_WAIT` storing `data` at `addr` (S = 1, no interrupt), as Linux's
    /// `build_completion_wait` builds it.
    pub const fn completion_wait(addr: u64, data: u64) -> Self {
        Command::CompletionWait {
            store: true,
            interrupt: false,
            flush_queue: false,
            store_addr: addr,
            store_data: data,
        }
    }

    /// An `INVALIDATE_IOMMU_PAGES` of `[start, start + size)` for `domain_id` with PDE set,
    /// as Linux's `build_inv_iommu_pages` builds it for host (v1) translations.
    pub const fn invalidate_pages(domain_id: u16, start: u64, size: u64) -> Self {
        Command::InvalidateIommuPages {
            pasid: 0,
            domain_id,
            pde: true,
            gn: false,
            address: InvAddress::for_range(start, size),
        }
    }

    /// The command's opcode.
    pub const fn opcode(&self) -> u8 {
        match self {
            Command::CompletionWait { .. } => opcode::COMPLETION_WAIT,
            Command::InvalidateDevtabEntry { .. } => opcode::INVALIDATE_DEVTAB_ENTRY,
            Command::InvalidateIommuPages { .. } => opcode::INVALIDATE_IOMMU_PAGES,
            Command::InvalidateIotlbPages { .. } => opcode::INVALIDATE_IOTLB_PAGES,
            Command::InvalidateInterruptTable { .. } => opcode::INVALIDATE_INTERRUPT_TABLE,
            Command::InvalidateIommuAll => opcode::INVALIDATE_IOMMU_ALL,
        }
    }

    /// The command's name in the specification.
    pub const fn name(&self) -> &'static str {
        op_name(self.opcode())
    }

    /// Encodes the command into its two words.
    ///
    /// # Errors
    ///
    /// [`EncodeError::FieldOverflow`] for a PASID wider than 20 bits,
    /// [`EncodeError::BadAddress`] for a store address that is not 8-byte aligned or not
    /// below 2^52, or an invalidation address with bits 11:0 set.
    pub fn encode(&self) -> Result<RawCommand, EncodeError> {
        let op = OP.put(u64::from(self.opcode()));
        Ok(match *self {
            Command::CompletionWait {
                store,
                interrupt,
                flush_queue,
                store_addr,
                store_data,
            } => [
                op | CW_S.put(store.into())
                    | CW_I.put(interrupt.into())
                    | CW_F.put(flush_queue.into())
                    | check_addr("StoreAddr", CW_ADDR, store_addr)?,
                store_data,
            ],
            Command::InvalidateDevtabEntry { device_id }
            | Command::InvalidateInterruptTable { device_id } => {
                [op | DEVID.put(device_id.into()), 0]
            }
            Command::InvalidateIommuPages {
                pasid,
                domain_id,
                pde,
                gn,
                address,
            } => [
                op | check_fits("PASID", IP_PASID, pasid.into())? | IP_DOMAIN.put(domain_id.into()),
                INV_S.put(address.s.into())
                    | INV_PDE.put(pde.into())
                    | INV_GN.put(gn.into())
                    | check_addr("Address", INV_ADDR, address.addr)?,
            ],
            Command::InvalidateIotlbPages {
                device_id,
                pasid,
                maxpend,
                queue_id,
                gn,
                address,
            } => [
                op | DEVID.put(device_id.into())
                    | IT_PASID_HI.put(u64::from(pasid >> 8))
                    | IT_MAXPEND.put(maxpend.into())
                    | IT_QUEUE.put(queue_id.into())
                    | IT_PASID_LO.put(u64::from(pasid & 0xff)),
                INV_S.put(address.s.into())
                    | INV_GN.put(gn.into())
                    | check_addr("Address", INV_ADDR, address.addr)?,
            ],
            Command::InvalidateIommuAll => [op, 0],
        })
    }

    /// Decodes two words.
    ///
    /// # Errors
    ///
    /// [`DecodeError::UnknownOpcode`] for an opcode this model does not implement (6, 7 and
    /// anything above 8 included), [`DecodeError::ReservedBits`] for a set reserved bit.
    pub fn decode(raw: RawCommand) -> Result<Command, DecodeError> {
        let [w0, w1] = raw;
        // Four bits: the cast is exact.
        let op = OP.get(w0) as u8;
        let defined = defined_bits(op).ok_or(DecodeError::UnknownOpcode { opcode: op })?;
        check_reserved(op_name(op), &raw, &defined)?;
        // Every `as` below narrows a field whose width fits the target type.
        Ok(match op {
            opcode::COMPLETION_WAIT => Command::CompletionWait {
                store: CW_S.flag(w0),
                interrupt: CW_I.flag(w0),
                flush_queue: CW_F.flag(w0),
                store_addr: w0 & CW_ADDR.mask(),
                store_data: w1,
            },
            opcode::INVALIDATE_DEVTAB_ENTRY => Command::InvalidateDevtabEntry {
                device_id: DEVID.get(w0) as u16,
            },
            opcode::INVALIDATE_INTERRUPT_TABLE => Command::InvalidateInterruptTable {
                device_id: DEVID.get(w0) as u16,
            },
            opcode::INVALIDATE_IOMMU_PAGES => Command::InvalidateIommuPages {
                pasid: IP_PASID.get(w0) as u32,
                domain_id: IP_DOMAIN.get(w0) as u16,
                pde: INV_PDE.flag(w1),
                gn: INV_GN.flag(w1),
                address: InvAddress {
                    addr: w1 & INV_ADDR.mask(),
                    s: INV_S.flag(w1),
                },
            },
            opcode::INVALIDATE_IOTLB_PAGES => Command::InvalidateIotlbPages {
                device_id: DEVID.get(w0) as u16,
                pasid: ((IT_PASID_HI.get(w0) << 8) | IT_PASID_LO.get(w0)) as u16,
                maxpend: IT_MAXPEND.get(w0) as u8,
                queue_id: IT_QUEUE.get(w0) as u16,
                gn: INV_GN.flag(w1),
                address: InvAddress {
                    addr: w1 & INV_ADDR.mask(),
                    s: INV_S.flag(w1),
                },
            },
            opcode::INVALIDATE_IOMMU_ALL => Command::InvalidateIommuAll,
            // `defined_bits` returned `Some`, so the opcode is one of the above.
            _ => return Err(DecodeError::UnknownOpcode { opcode: op }),
        })
    }
}

const fn op_name(op: u8) -> &'static str {
    match op {
        opcode::COMPLETION_WAIT => "COMPLETION_WAIT",
        opcode::INVALIDATE_DEVTAB_ENTRY => "INVALIDATE_DEVTAB_ENTRY",
        opcode::INVALIDATE_IOMMU_PAGES => "INVALIDATE_IOMMU_PAGES",
        opcode::INVALIDATE_IOTLB_PAGES => "INVALIDATE_IOTLB_PAGES",
        opcode::INVALIDATE_INTERRUPT_TABLE => "INVALIDATE_INTERRUPT_TABLE",
        opcode::INVALIDATE_IOMMU_ALL => "INVALIDATE_IOMMU_ALL",
        _ => "unknown command",
    }
}

// ------------------------------------------------------------------------------------------
// Event-log entries.

/// Event codes (word 0 bits `[63:60]`; `X86.md` §3.6, Linux `EVENT_TYPE_*`).
pub mod event_code {
    /// `ILLEGAL_DEV_TABLE_ENTRY`.
    pub const ILLEGAL_DEV_TABLE_ENTRY: u8 = 1;
    /// `IO_PAGE_FAULT`.
    pub const IO_PAGE_FAULT: u8 = 2;
    /// `ILLEGAL_COMMAND_ERROR`.
    pub const ILLEGAL_COMMAND_ERROR: u8 = 5;
}

/// The flags of a fault event (word 0 bits `[59:48]`), in the order `X86.md` §3.6 lists
/// them; Linux `EVENT_FLAG_I` (0x008), `EVENT_FLAG_PR` (0x010), `EVENT_FLAG_RW` (0x020) and
/// `EVENT_FLAG_TR` (0x100) confirm the positions.
pub mod fault_flags {
    /// GN: the request carried a PASID.
    pub const GN: u16 = 1 << 0;
    /// NX: no-execute.
    pub const NX: u16 = 1 << 1;
    /// US: user/supervisor.
    pub const US: u16 = 1 << 2;
    /// I: an interrupt request (not a memory access).
    pub const I: u16 = 1 << 3;
    /// PR: the page was present (the fault is a permission fault).
    pub const PR: u16 = 1 << 4;
    /// RW: the access was a write (valid with PR).
    pub const RW: u16 = 1 << 5;
    /// PE: the access lacked permission.
    pub const PE: u16 = 1 << 6;
    /// RZ: a reserved bit was set in an entry read.
    pub const RZ: u16 = 1 << 7;
    /// TR: a translation request (ATS).
    pub const TR: u16 = 1 << 8;
}

const EV_DEVID: Field = Field::new(15, 0);
const EV_DOMID_HI: Field = Field::new(19, 16);
const EV_DOMID_LO: Field = Field::new(47, 32);
const EV_FLAGS: Field = Field::new(59, 48);
const EV_CODE: Field = Field::new(63, 60);

/// The largest domain id or PASID an event entry holds (20 bits).
pub const MAX_EVENT_DOMAIN: u32 = (1 << 20) - 1;

/// One event-log entry, decoded.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub enum Event {
    /// `ILLEGAL_DEV_TABLE_ENTRY`: a request found a malformed device table entry.
    IllegalDevTableEntry {
        /// DeviceID of the request.
        device_id: u16,
        /// PASID of the request (20 bits; 0 without one).
        pasid: u32,
        /// [`fault_flags`].
        flags: u16,
        /// The address requested.
        address: u64,
    },
    /// `IO_PAGE_FAULT`: a translation was missing or denied the access.
    IoPageFault {
        /// DeviceID of the request.
        device_id: u16,
        /// DomainID (or PASID with GN), 20 bits.
        domain_id: u32,
        /// [`fault_flags`].
        flags: u16,
        /// The IOVA requested.
        address: u64,
    },
    /// `ILLEGAL_COMMAND_ERROR`: the command at `cmd_addr` could not be decoded; the command
    /// buffer stopped there.
    IllegalCommand {
        /// Physical address of the command.
        cmd_addr: u64,
    },
}

impl Event {
    /// The event code.
    pub const fn code(&self) -> u8 {
        match self {
            Event::IllegalDevTableEntry { .. } => event_code::ILLEGAL_DEV_TABLE_ENTRY,
            Event::IoPageFault { .. } => event_code::IO_PAGE_FAULT,
            Event::IllegalCommand { .. } => event_code::ILLEGAL_COMMAND_ERROR,
        }
    }

    /// Encodes the entry into its two words.
    ///
    /// # Errors
    ///
    /// [`EncodeError::FieldOverflow`] for a domain id or PASID above 20 bits or flags
    /// above 12 bits.
    pub fn encode(&self) -> Result<RawEvent, EncodeError> {
        let code = EV_CODE.put(u64::from(self.code()));
        let fault = |device_id: u16, dom: u32, flags: u16| -> Result<u64, EncodeError> {
            check_fits("DomainID", Field::new(19, 0), dom.into())?;
            Ok(code
                | EV_DEVID.put(device_id.into())
                | EV_DOMID_HI.put(u64::from(dom >> 16))
                | EV_DOMID_LO.put(u64::from(dom & 0xffff))
                | check_fits("Flags", EV_FLAGS, flags.into())?)
        };
        Ok(match *self {
            Event::IllegalDevTableEntry {
                device_id,
                pasid,
                flags,
                address,
            } => [fault(device_id, pasid, flags)?, address],
            Event::IoPageFault {
                device_id,
                domain_id,
                flags,
                address,
            } => [fault(device_id, domain_id, flags)?, address],
            Event::IllegalCommand { cmd_addr } => [code, cmd_addr],
        })
    }

    /// Decodes two words.
    ///
    /// # Errors
    ///
    /// [`DecodeError::UnknownEventCode`] for a code this model does not produce,
    /// [`DecodeError::ReservedBits`] for a set reserved bit.
    pub fn decode(raw: RawEvent) -> Result<Event, DecodeError> {
        let [w0, w1] = raw;
        // Four bits: the cast is exact.
        let code = EV_CODE.get(w0) as u8;
        let fault_bits = EV_CODE.mask()
            | EV_DEVID.mask()
            | EV_DOMID_HI.mask()
            | EV_DOMID_LO.mask()
            | EV_FLAGS.mask();
        let dom = ((EV_DOMID_HI.get(w0) << 16) | EV_DOMID_LO.get(w0)) as u32;
        let (device_id, flags) = (EV_DEVID.get(w0) as u16, EV_FLAGS.get(w0) as u16);
        match code {
            event_code::ILLEGAL_DEV_TABLE_ENTRY => {
                check_reserved("ILLEGAL_DEV_TABLE_ENTRY", &raw, &[fault_bits, u64::MAX])?;
                Ok(Event::IllegalDevTableEntry {
                    device_id,
                    pasid: dom,
                    flags,
                    address: w1,
                })
            }
            event_code::IO_PAGE_FAULT => {
                check_reserved("IO_PAGE_FAULT", &raw, &[fault_bits, u64::MAX])?;
                Ok(Event::IoPageFault {
                    device_id,
                    domain_id: dom,
                    flags,
                    address: w1,
                })
            }
            event_code::ILLEGAL_COMMAND_ERROR => {
                check_reserved("ILLEGAL_COMMAND_ERROR", &raw, &[EV_CODE.mask(), u64::MAX])?;
                Ok(Event::IllegalCommand { cmd_addr: w1 })
            }
            code => Err(DecodeError::UnknownEventCode { code }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn round_trip(cmd: Command, expected: RawCommand) {
        let raw = cmd.encode().expect("encodable");
        assert_eq!(
            raw, expected,
            "encoding of {cmd:?}: got {:#018x} {:#018x}",
            raw[0], raw[1]
        );
        assert_eq!(Command::decode(raw), Ok(cmd));
    }

    #[test]
    fn dte_layout() {
        // word 0 = V 1 | TV 2 | Mode 3 << 9 = 0x600 | root 0x1234_5000
        //        | IR 1 << 61 = 0x2000_0000_0000_0000 | IW 1 << 62 = 0x4000_0000_0000_0000
        //        = 0x6000_0000_1234_5603
        // word 1 = DomainID 0x42 | I 1 << 32 = 0x1_0000_0042
        let dte = Dte {
            iotlb: true,
            ..Dte::translated(0x42, 3, 0x1234_5000)
        };
        let raw = dte.encode().unwrap();
        assert_eq!(raw, [0x6000_0000_1234_5603, 0x1_0000_0042, 0, 0]);
        assert_eq!(Dte::decode(raw), Ok(dte));
        // SE is bit 97 (word 1 bit 33), SA bit 98 (word 1 bit 34).
        let quiet = Dte {
            suppress_events: true,
            suppress_all: true,
            ..Dte::default()
        };
        assert_eq!(quiet.encode().unwrap(), [0, 0x6_0000_0000, 0, 0]);
        assert_eq!(Dte::decode([0, 0x6_0000_0000, 0, 0]), Ok(quiet));
    }

    #[test]
    fn dte_rejects_reserved_mode_and_bad_roots() {
        assert_eq!(
            Dte::translated(1, 7, 0).encode(),
            Err(EncodeError::ReservedValue {
                field: "Mode",
                value: 7
            })
        );
        assert!(Dte::translated(1, 3, 0x1234_5008).encode().is_err());
        assert!(Dte::translated(1, 3, 1 << 52).encode().is_err());
        // V | TV | Mode 7 (0xe00).
        assert_eq!(
            Dte::decode([0xe03, 0, 0, 0]),
            Err(DecodeError::ReservedValue {
                what: "DTE",
                field: "Mode",
                value: 7
            })
        );
        // Mode 7 without TV carries no translation information: accepted.
        assert!(Dte::decode([0xe01, 0, 0, 0]).is_ok());
    }

    #[test]
    fn pte_4k_leaf_layout() {
        // PR 1 | address 0xabc_d000 | FC 1 << 60 | IR 1 << 61 | IW 1 << 62.
        let e = encode_leaf(0xabc_d000, 12, Prot::READ_WRITE);
        assert_eq!(e, 0x7000_0000_0abc_d001);
        assert_eq!(
            decode_entry(e, 1),
            Entry::Page {
                pa: 0xabc_d000,
                page_shift: 12,
                prot: Prot::READ_WRITE
            }
        );
    }

    #[test]
    fn pde_layout() {
        // A level-3 entry pointing at a level-2 table at 0x8000_0000:
        // PR 1 | NextLevel 2 << 9 = 0x400 | address | IR | IW.
        let e = encode_pde(0x8000_0000, 2);
        assert_eq!(e, 0x6000_0000_8000_0401);
        assert_eq!(
            decode_entry(e, 3),
            Entry::Table {
                next_level: 2,
                table_pa: 0x8000_0000
            }
        );
        // The same entry in a level-2 table points at its own level: invalid.
        assert_eq!(decode_entry(e, 2), Entry::Invalid { next_level: 2 });
        // In a level-4 table it skips level 3.
        assert_eq!(
            decode_entry(e, 4),
            Entry::Table {
                next_level: 2,
                table_pa: 0x8000_0000
            }
        );
    }

    #[test]
    fn pte_2m_natural_leaf_has_next_level_0() {
        // 2 MiB in a level-2 table: PR | FC | IR, address 0x4020_0000.
        let e = encode_leaf(0x4020_0000, 21, Prot::READ);
        assert_eq!(e, 0x3000_0000_4020_0001);
        assert_eq!(
            decode_entry(e, 2),
            Entry::Page {
                pa: 0x4020_0000,
                page_shift: 21,
                prot: Prot::READ
            }
        );
        // Read from a level-1 table the same entry is a 4 KiB page.
        assert!(matches!(
            decode_entry(e, 1),
            Entry::Page { page_shift: 12, .. }
        ));
    }

    #[test]
    fn pte_64k_leaf_encodes_its_size_in_the_address() {
        // pa 0x1_0003_0000 | 0xffff, bit 15 cleared, bits 11:0 dropped: 0x1_0003_7000.
        // | NextLevel 7 << 9 = 0xe00 | PR | FC | IR = 0x3000_0001_0003_7e01.
        let e = encode_leaf(0x1_0003_0000, 16, Prot::READ);
        assert_eq!(e, 0x3000_0001_0003_7e01);
        assert_eq!(page_level(16), 1);
        assert_eq!(page_replicas(16), 16);
        assert_eq!(
            decode_entry(e, 1),
            Entry::Page {
                pa: 0x1_0003_0000,
                page_shift: 16,
                prot: Prot::READ
            }
        );
        // 64 KiB does not belong in a level-2 table.
        assert_eq!(decode_entry(e, 2), Entry::Invalid { next_level: 7 });
    }

    #[test]
    fn pte_4m_leaf_is_two_replicas_in_a_level_2_table() {
        // 4 MiB at 0x80_0000: bits 21:12 below the size set except bit 21:
        // 0x80_0000 | 0x1f_f000 = 0x9f_f000; | 0xe00 | PR | FC | IR | IW.
        let e = encode_leaf(0x80_0000, 22, Prot::READ_WRITE);
        assert_eq!(e, 0x7000_0000_009f_fe01);
        assert_eq!((page_level(22), page_replicas(22)), (2, 2));
        assert_eq!(
            decode_entry(e, 2),
            Entry::Page {
                pa: 0x80_0000,
                page_shift: 22,
                prot: Prot::READ_WRITE
            }
        );
    }

    #[test]
    fn not_present_entries_decode_as_such() {
        assert_eq!(decode_entry(0, 1), Entry::NotPresent);
        // Everything but PR set.
        assert_eq!(decode_entry(!pte::PR, 4), Entry::NotPresent);
    }

    #[test]
    fn level_geometry() {
        assert_eq!(
            (1..=6).map(level_shift).collect::<Vec<_>>(),
            [12, 21, 30, 39, 48, 57]
        );
        assert_eq!((page_level(12), page_replicas(12)), (1, 1));
        assert_eq!((page_level(20), page_replicas(20)), (1, 256));
        assert_eq!((page_level(30), page_replicas(30)), (3, 1));
        assert_eq!((page_level(51), page_replicas(51)), (5, 8));
    }

    #[test]
    fn completion_wait_layout() {
        // word 0 = S 1 | StoreAddr 0x1234_5678 (bits 51:3 in place) | opcode 1 << 60
        //        = 0x1000_0000_1234_5679; word 1 = the store data.
        round_trip(
            Command::completion_wait(0x1234_5678, 0xdead_beef_0000_0001),
            [0x1000_0000_1234_5679, 0xdead_beef_0000_0001],
        );
        // I (bit 1) and F (bit 2) without S: 0x1000_0000_0000_0006.
        round_trip(
            Command::CompletionWait {
                store: false,
                interrupt: true,
                flush_queue: true,
                store_addr: 0,
                store_data: 0,
            },
            [0x1000_0000_0000_0006, 0],
        );
    }

    #[test]
    fn invalidate_devtab_entry_layout() {
        // DeviceID 01:01.0 = 0x0108 | opcode 2 << 60.
        round_trip(
            Command::InvalidateDevtabEntry { device_id: 0x0108 },
            [0x2000_0000_0000_0108, 0],
        );
    }

    #[test]
    fn invalidate_iommu_pages_layout() {
        // Two pages from 0x1000: Linux's address is 0x1000 with S (the 16 KiB block at 0).
        // word 0 = DomainID 5 << 32 | opcode 3 << 60 = 0x3000_0005_0000_0000
        // word 1 = 0x1000 | S 1 | PDE 2 = 0x1003
        round_trip(
            Command::invalidate_pages(5, 0x1000, 0x2000),
            [0x3000_0005_0000_0000, 0x1003],
        );
        // Flush all: address 0x7fff_ffff_ffff_f000 | PDE | S.
        round_trip(
            Command::InvalidateIommuPages {
                pasid: 0,
                domain_id: 0xffff,
                pde: true,
                gn: false,
                address: InvAddress::ALL,
            },
            [0x3000_ffff_0000_0000, 0x7fff_ffff_ffff_f003],
        );
        // A guest invalidation: PASID 0xabcde in bits 19:0, GN bit 2, one page.
        round_trip(
            Command::InvalidateIommuPages {
                pasid: 0xa_bcde,
                domain_id: 1,
                pde: false,
                gn: true,
                address: InvAddress::page(0x5000),
            },
            [0x3000_0001_000a_bcde, 0x5004],
        );
    }

    #[test]
    fn invalidate_iotlb_pages_layout() {
        // DeviceID 0x0108 | Maxpend 0x20 << 24 | QueueID 0x0108 << 32 | opcode 4 << 60
        //   = 0x4000_0108_2000_0108; word 1 = one page at 0x4000.
        round_trip(
            Command::InvalidateIotlbPages {
                device_id: 0x0108,
                pasid: 0,
                maxpend: 0x20,
                queue_id: 0x0108,
                gn: false,
                address: InvAddress::page(0x4000),
            },
            [0x4000_0108_2000_0108, 0x4000],
        );
        // PASID 0x1234: bits 15:8 (0x12) at word 0 [23:16], bits 7:0 (0x34) at [55:48].
        round_trip(
            Command::InvalidateIotlbPages {
                device_id: 0,
                pasid: 0x1234,
                maxpend: 0,
                queue_id: 0,
                gn: true,
                address: InvAddress::for_range(0, 0x2000),
            },
            [0x4034_0000_0012_0000, 0x5],
        );
    }

    #[test]
    fn invalidate_all_and_interrupt_table_layouts() {
        round_trip(Command::InvalidateIommuAll, [0x8000_0000_0000_0000, 0]);
        round_trip(
            Command::InvalidateInterruptTable { device_id: 0xffff },
            [0x5000_0000_0000_ffff, 0],
        );
    }

    #[test]
    fn encode_rejects_values_that_do_not_fit() {
        assert!(matches!(
            Command::completion_wait(0x1004, 0).encode(),
            Err(EncodeError::BadAddress {
                field: "StoreAddr",
                ..
            })
        ));
        assert!(Command::completion_wait(1 << 52, 0).encode().is_err());
        let pages = Command::InvalidateIommuPages {
            pasid: 1 << 20,
            domain_id: 0,
            pde: true,
            gn: true,
            address: InvAddress::page(0),
        };
        assert_eq!(
            pages.encode(),
            Err(EncodeError::FieldOverflow {
                field: "PASID",
                value: 1 << 20,
                bits: 20
            })
        );
        let low_bits = Command::InvalidateIommuPages {
            pasid: 0,
            domain_id: 0,
            pde: true,
            gn: false,
            address: InvAddress {
                addr: 0x1008,
                s: false,
            },
        };
        assert!(matches!(
            low_bits.encode(),
            Err(EncodeError::BadAddress {
                field: "Address",
                ..
            })
        ));
    }

    #[test]
    fn decode_rejects_unknown_opcodes_and_reserved_bits() {
        assert_eq!(
            Command::decode([0, 0]),
            Err(DecodeError::UnknownOpcode { opcode: 0 })
        );
        // PREFETCH_IOMMU_PAGES (6) and COMPLETE_PPR_REQUEST (7) are not modelled.
        assert_eq!(
            Command::decode([0x6000_0000_0000_0000, 0]),
            Err(DecodeError::UnknownOpcode { opcode: 6 })
        );
        assert_eq!(
            Command::decode([0xf000_0000_0000_0000, 0]),
            Err(DecodeError::UnknownOpcode { opcode: 15 })
        );
        // INVALIDATE_DEVTAB_ENTRY with bit 16 of word 0 set.
        assert_eq!(
            Command::decode([0x2000_0000_0001_0000, 0]),
            Err(DecodeError::ReservedBits {
                what: "INVALIDATE_DEVTAB_ENTRY",
                word: 0,
                bits: 0x1_0000
            })
        );
        // INVALIDATE_IOMMU_PAGES with word 1 bit 3 (between GN and the address).
        assert_eq!(
            Command::decode([0x3000_0000_0000_0000, 0x8]),
            Err(DecodeError::ReservedBits {
                what: "INVALIDATE_IOMMU_PAGES",
                word: 1,
                bits: 0x8
            })
        );
        // INVALIDATE_IOTLB_PAGES with PDE (word 1 bit 1), which it does not have.
        assert_eq!(
            Command::decode([0x4000_0000_0000_0000, 0x2]),
            Err(DecodeError::ReservedBits {
                what: "INVALIDATE_IOTLB_PAGES",
                word: 1,
                bits: 0x2
            })
        );
        // COMPLETION_WAIT with bit 52 of word 0 (above the store address).
        assert_eq!(
            Command::decode([0x1010_0000_0000_0001, 0]),
            Err(DecodeError::ReservedBits {
                what: "COMPLETION_WAIT",
                word: 0,
                bits: 1 << 52
            })
        );
        // INVALIDATE_IOMMU_ALL with anything in word 1.
        assert!(Command::decode([0x8000_0000_0000_0000, 1]).is_err());
    }

    #[test]
    fn s_bit_single_page_is_exact() {
        let a = InvAddress::for_range(0x1000, 0x1000);
        assert_eq!(a, InvAddress::page(0x1000));
        assert_eq!(
            a.span(),
            InvSpan::Range {
                start: 0x1000,
                size: 0x1000
            }
        );
        // A few bytes inside one page: still one page.
        assert_eq!(
            InvAddress::for_range(0x1ff0, 0x10),
            InvAddress::page(0x1000)
        );
    }

    #[test]
    fn s_bit_aligned_pair_is_exact() {
        // [0x2000, 0x4000): first and last byte differ in bits 12 and below (0x2000 ^
        // 0x3fff = 0x1fff, msb 12); address 0x2000 | 0xfff -> 0x2000 with S. Decoded: the
        // first clear bit from 12 is 12 itself, size 2^13.
        let a = InvAddress::for_range(0x2000, 0x2000);
        assert_eq!(
            a,
            InvAddress {
                addr: 0x2000,
                s: true
            }
        );
        assert_eq!(
            a.span(),
            InvSpan::Range {
                start: 0x2000,
                size: 0x2000
            }
        );
    }

    #[test]
    fn s_bit_range_crossing_a_boundary_gets_the_larger_block() {
        // [0x1000, 0x3000): 0x1000 ^ 0x2fff = 0x3fff, msb 13; 0x1000 | 0x1fff = 0x1fff ->
        // address 0x1000 with S; decoded, bit 12 is set and bit 13 clear: 2^14 from 0.
        let a = InvAddress::for_range(0x1000, 0x2000);
        assert_eq!(
            a,
            InvAddress {
                addr: 0x1000,
                s: true
            }
        );
        assert_eq!(
            a.span(),
            InvSpan::Range {
                start: 0,
                size: 0x4000
            }
        );
        // Two pages straddling 2 MiB: [0x1f_f000, 0x20_1000). 0x1f_f000 ^ 0x20_0fff =
        // 0x3f_ffff, msb 21: the 4 MiB block at 0 covers it.
        let b = InvAddress::for_range(0x1f_f000, 0x2000);
        assert_eq!(
            b,
            InvAddress {
                addr: 0x1f_f000,
                s: true
            }
        );
        assert_eq!(
            b.span(),
            InvSpan::Range {
                start: 0,
                size: 0x40_0000
            }
        );
        assert!(b.span().covers(0x1f_f000, 0x2000));
        assert!(!b.span().covers(0x3f_f000, 0x2000));
    }

    #[test]
    fn s_bit_huge_ranges_become_flush_all() {
        // [0, 2^52): msb 51 is allowed, address 0x7_ffff_ffff_f000 with S; its first
        // clear bit is 51: the whole space.
        let a = InvAddress::for_range(0, 1 << 52);
        assert_eq!(
            a,
            InvAddress {
                addr: 0x7_ffff_ffff_f000,
                s: true
            }
        );
        assert_eq!(a.span(), InvSpan::All);
        // Crossing bit 52: Linux's all-pages address.
        assert_eq!(
            InvAddress::for_range(0xf_ffff_ffff_f000, 0x2000),
            InvAddress::ALL
        );
        assert_eq!(InvAddress::ALL.span(), InvSpan::All);
        // A range that wraps the address space.
        assert_eq!(
            InvAddress::for_range(u64::MAX - 0xfff, 0x2000),
            InvAddress::ALL
        );
    }

    #[test]
    fn io_page_fault_layout() {
        // DeviceID 0x10 | DomainID 0x1_2345: bits 19:16 = 1 (0x1_0000), bits 47:32 = 0x2345
        // | flags PR|RW = 0x30 << 48 | code 2 << 60 = 0x2030_2345_0001_0010.
        let ev = Event::IoPageFault {
            device_id: 0x10,
            domain_id: 0x1_2345,
            flags: fault_flags::PR | fault_flags::RW,
            address: 0xdead_b000,
        };
        let raw = ev.encode().unwrap();
        assert_eq!(raw, [0x2030_2345_0001_0010, 0xdead_b000]);
        assert_eq!(Event::decode(raw), Ok(ev));
    }

    #[test]
    fn illegal_dev_table_entry_and_command_layouts() {
        let ev = Event::IllegalDevTableEntry {
            device_id: 0xffff,
            pasid: 0,
            flags: fault_flags::RW,
            address: 0x1000,
        };
        // 0xffff | RW 0x20 << 48 | code 1 << 60.
        assert_eq!(ev.encode().unwrap(), [0x1020_0000_0000_ffff, 0x1000]);
        assert_eq!(Event::decode([0x1020_0000_0000_ffff, 0x1000]), Ok(ev));
        let ill = Event::IllegalCommand {
            cmd_addr: 0x4000_0010,
        };
        assert_eq!(ill.encode().unwrap(), [0x5000_0000_0000_0000, 0x4000_0010]);
        assert_eq!(Event::decode([0x5000_0000_0000_0000, 0x4000_0010]), Ok(ill));
    }

    #[test]
    fn event_decode_rejects_unknown_codes_and_reserved_bits() {
        assert_eq!(
            Event::decode([0x3000_0000_0000_0000, 0]),
            Err(DecodeError::UnknownEventCode { code: 3 })
        );
        // IO_PAGE_FAULT with bit 20 (between the domain's high bits and bit 32).
        assert!(matches!(
            Event::decode([0x2000_0000_0010_0000, 0]),
            Err(DecodeError::ReservedBits { word: 0, .. })
        ));
        // ILLEGAL_COMMAND_ERROR carries no DeviceID.
        assert!(Event::decode([0x5000_0000_0000_0001, 0]).is_err());
        let wide = Event::IoPageFault {
            device_id: 0,
            domain_id: 1 << 20,
            flags: 0,
            address: 0,
        };
        assert!(wide.encode().is_err());
    }

    /// The smallest naturally aligned power-of-two block (at least 4 KiB) holding both
    /// the first and last byte, as `(start, size)`; `None` beyond 2^51.
    fn covering_block(start: u64, last: u64) -> Option<(u64, u64)> {
        (12..52)
            .find(|&k| start >> k == last >> k)
            .map(|k| (start >> k << k, 1u64 << k))
    }

    fn any_command() -> impl Strategy<Value = Command> {
        let inv = (any::<u64>(), any::<bool>()).prop_map(|(a, s)| InvAddress {
            addr: a & !0xfff,
            s,
        });
        prop_oneof![
            (any::<(bool, bool, bool)>(), any::<u64>(), any::<u64>()).prop_map(
                |((store, interrupt, flush_queue), a, store_data)| Command::CompletionWait {
                    store,
                    interrupt,
                    flush_queue,
                    store_addr: a & CW_ADDR.mask(),
                    store_data,
                }
            ),
            any::<u16>().prop_map(|device_id| Command::InvalidateDevtabEntry { device_id }),
            (
                0u32..1 << 20,
                any::<u16>(),
                any::<(bool, bool)>(),
                inv.clone()
            )
                .prop_map(|(pasid, domain_id, (pde, gn), address)| {
                    Command::InvalidateIommuPages {
                        pasid,
                        domain_id,
                        pde,
                        gn,
                        address,
                    }
                }),
            (any::<(u16, u16, u8, u16)>(), any::<bool>(), inv).prop_map(
                |((device_id, pasid, maxpend, queue_id), gn, address)| {
                    Command::InvalidateIotlbPages {
                        device_id,
                        pasid,
                        maxpend,
                        queue_id,
                        gn,
                        address,
                    }
                }
            ),
            any::<u16>().prop_map(|device_id| Command::InvalidateInterruptTable { device_id }),
            Just(Command::InvalidateIommuAll),
        ]
    }

    proptest! {
        #[test]
        fn encode_then_decode_is_identity(cmd in any_command()) {
            let raw = cmd.encode().unwrap();
            prop_assert_eq!(Command::decode(raw), Ok(cmd));
        }

        #[test]
        fn accepted_words_round_trip(w0 in any::<u64>(), w1 in any::<u64>(), op in 0u64..16) {
            let w0 = (w0 & !OP.mask()) | (op << 60);
            if let Ok(cmd) = Command::decode([w0, w1]) {
                prop_assert_eq!(cmd.encode(), Ok([w0, w1]));
            }
        }

        #[test]
        fn accepted_events_round_trip(w0 in any::<u64>(), w1 in any::<u64>(), code in 0u64..8) {
            let w0 = (w0 & !EV_CODE.mask()) | (code << 60);
            if let Ok(ev) = Event::decode([w0, w1]) {
                prop_assert_eq!(ev.encode(), Ok([w0, w1]));
            }
        }

        #[test]
        fn s_bit_span_is_the_smallest_aligned_block_covering_the_range(
            start in any::<u64>(),
            size in 1u64..(1 << 40),
            shift in 0u32..52,
        ) {
            // Spread starts over every magnitude below 2^52.
            let start = start & ((1u64 << shift) - 1);
            let span = InvAddress::for_range(start, size).span();
            prop_assert!(span.covers(start, size));
            match covering_block(start, start + size - 1) {
                Some((s, n)) => prop_assert_eq!(span, InvSpan::Range { start: s, size: n }),
                None => prop_assert_eq!(span, InvSpan::All),
            }
        }

        #[test]
        fn leaves_decode_to_what_was_encoded(
            pfn in 0u64..(1 << 40),
            shift in 12u32..52,
            read in any::<bool>(),
            write in any::<bool>(),
        ) {
            let pa = (pfn << 12) & !((1u64 << shift) - 1) & pte::ADDR_MASK;
            let prot = Prot { read, write };
            let e = encode_leaf(pa, shift, prot);
            prop_assert_eq!(
                decode_entry(e, page_level(shift)),
                Entry::Page { pa, page_shift: shift, prot }
            );
        }
    }
}
