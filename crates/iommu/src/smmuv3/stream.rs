//! Stream table entries (STEs) and context descriptors (CDs), as typed structs with the
//! words the hardware would read.
//!
//! The model keeps a *linear* stream table: entry `n` is StreamID `n`, and a StreamID past
//! the end is a `C_BAD_STREAMID`. A stage-1 STE points at one context descriptor (no
//! substreams: `S1CDMAX` = 0), which holds the ASID and the translation table base.
//!
//! Bit positions follow the SMMUv3 architecture specification (IHI 0070) as Linux's
//! `arm-smmu-v3.h` uses them (`STRTAB_STE_0_*`, `CTXDESC_CD_0_*`, `CTXDESC_CD_1_*`):
//!
//! | structure | word | bits | field |
//! |---|---|---|---|
//! | STE | 0 | `[0]` | V |
//! | STE | 0 | `[3:1]` | Config: 0b000 abort, 0b100 bypass, 0b101 stage-1 translate |
//! | STE | 0 | `[51:6]` | S1ContextPtr (64-byte aligned CD address) |
//! | CD | 0 | `[5:0]` | T0SZ (64 - input size) |
//! | CD | 0 | `[7:6]` | TG0: 0 4 KiB, 1 64 KiB, 2 16 KiB |
//! | CD | 0 | `[31]` | V |
//! | CD | 0 | `[63:48]` | ASID |
//! | CD | 1 | `[51:4]` | TTB0 |

use crate::addr::PhysAddr;

/// Size of one context descriptor in bytes.
pub const CD_BYTES: u64 = 64;

const STE_0_V: u64 = 1;
const STE_0_CFG_SHIFT: u32 = 1;
const STE_0_CFG_ABORT: u64 = 0b000;
const STE_0_CFG_BYPASS: u64 = 0b100;
const STE_0_CFG_S1_TRANS: u64 = 0b101;
const STE_0_S1CTXPTR_MASK: u64 = ((1 << 52) - 1) & !((1 << 6) - 1);

const CD_0_T0SZ_MASK: u64 = 0x3f;
const CD_0_TG0_SHIFT: u32 = 6;
const CD_0_V: u64 = 1 << 31;
const CD_0_ASID_SHIFT: u32 = 48;
const CD_1_TTB0_MASK: u64 = ((1 << 52) - 1) & !((1 << 4) - 1);

/// A stage-1 context descriptor: the address space a stream translates through.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub struct ContextDescriptor {
    /// Address space id: tags every IOTLB and walk-cache entry.
    pub asid: u16,
    /// Translation table base (`TTB0`): the physical address of the LPAE root table.
    pub ttb: PhysAddr,
    /// Translation granule in bytes (4 KiB, 16 KiB or 64 KiB).
    pub granule: u64,
    /// `T0SZ`: 64 minus the input (IOVA) address size in bits.
    pub t0sz: u8,
}

impl ContextDescriptor {
    /// The input address size in bits (`64 - T0SZ`).
    pub const fn input_bits(&self) -> u32 {
        64 - self.t0sz as u32
    }

    /// The `TG0` encoding of the granule (`None` for an unsupported granule).
    pub const fn tg0(&self) -> Option<u64> {
        match self.granule {
            0x1000 => Some(0),
            0x1_0000 => Some(1),
            0x4000 => Some(2),
            _ => None,
        }
    }

    /// The first two words of the descriptor, valid bit set (an unsupported granule
    /// encodes as the reserved `TG0` value 3).
    pub fn encode(&self) -> [u64; 2] {
        let w0 = (u64::from(self.t0sz) & CD_0_T0SZ_MASK)
            | (self.tg0().unwrap_or(3) << CD_0_TG0_SHIFT)
            | CD_0_V
            | (u64::from(self.asid) << CD_0_ASID_SHIFT);
        [w0, self.ttb.get() & CD_1_TTB0_MASK]
    }
}

/// What an STE does with a stream's transactions.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub enum SteConfig {
    /// Transactions are terminated with an abort; no event is recorded.
    Abort,
    /// Transactions pass untranslated: the physical address is the input address.
    Bypass,
    /// Stage-1 translation through the context descriptor at `cd_addr` (index `cd` of the
    /// SMMU's context table).
    Translate {
        /// Index of the context descriptor in the SMMU's context table.
        cd: usize,
        /// The descriptor's simulated physical address (`S1ContextPtr`).
        cd_addr: PhysAddr,
    },
}

/// One stream table entry.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub struct Ste {
    /// Whether the entry is valid; an access through an invalid entry is `C_BAD_STE`.
    pub valid: bool,
    /// What the entry does.
    pub config: SteConfig,
}

impl Ste {
    /// An invalid entry (the state after reset).
    pub const INVALID: Ste = Ste {
        valid: false,
        config: SteConfig::Abort,
    };

    /// Word 0 of the entry.
    pub fn encode_word0(&self) -> u64 {
        let (cfg, ptr) = match self.config {
            SteConfig::Abort => (STE_0_CFG_ABORT, 0),
            SteConfig::Bypass => (STE_0_CFG_BYPASS, 0),
            SteConfig::Translate { cd_addr, .. } => {
                (STE_0_CFG_S1_TRANS, cd_addr.get() & STE_0_S1CTXPTR_MASK)
            }
        };
        (u64::from(self.valid) * STE_0_V) | (cfg << STE_0_CFG_SHIFT) | ptr
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ste_word0_matches_hand_encoding() {
        assert_eq!(Ste::INVALID.encode_word0(), 0);
        let bypass = Ste {
            valid: true,
            config: SteConfig::Bypass,
        };
        assert_eq!(bypass.encode_word0(), 0b1001);
        let s1 = Ste {
            valid: true,
            config: SteConfig::Translate {
                cd: 3,
                cd_addr: PhysAddr::new(0x8000_00c0),
            },
        };
        assert_eq!(s1.encode_word0(), 0x8000_00c0 | 0b1011);
    }

    #[test]
    fn cd_words_match_hand_encoding() {
        let cd = ContextDescriptor {
            asid: 0x1234,
            ttb: PhysAddr::new(0xffff_f000),
            granule: 0x1000,
            t0sz: 16,
        };
        assert_eq!(cd.input_bits(), 48);
        assert_eq!(cd.encode(), [0x1234_0000_8000_0010, 0xffff_f000]);
        let cd64 = ContextDescriptor {
            granule: 0x1_0000,
            ..cd
        };
        assert_eq!(cd64.encode()[0] & 0xc0, 0x40);
    }
}
