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
//! | STE | 1 | `[31:30]` | STRW (StreamWorld): 0 NS-EL1, 2 EL2 (EL2-E2H with E2H) |
//! | CD | 0 | `[5:0]` | T0SZ (64 - input size) |
//! | CD | 0 | `[7:6]` | TG0: 0 4 KiB, 1 64 KiB, 2 16 KiB |
//! | CD | 0 | `[9:8]`, `[11:10]` | IRGN0, ORGN0: 1 write-back write-allocate (coherent walk), 0 non-cacheable |
//! | CD | 0 | `[13:12]` | SH0: 3 inner shareable (coherent walk), 2 outer shareable |
//! | CD | 0 | `[30]` | EPD1: no walks through TTB1 |
//! | CD | 0 | `[31]` | V |
//! | CD | 0 | `[34:32]` | IPS: the output size (0 32 bits, 1 36, 2 40, 3 42, 4 44, 5 48, 6 52) |
//! | CD | 0 | `[41]` | AA64: the AArch64 table format |
//! | CD | 0 | `[44]`, `[45]`, `[46]` | S (stall; the model never stalls), R (record faults), A (abort on fault) |
//! | CD | 0 | `[47]` | ASET: the ASID is not shared with the CPU's TLBs |
//! | CD | 0 | `[63:48]` | ASID |
//! | CD | 1 | `[51:4]` | TTB0 |
//! | CD | 3 | `[63:0]` | MAIR: attribute 0 non-cacheable (0x44), 1 write-back (0xff), 2 device (0x04), 3 inner non-cacheable outer write-back (0xf4) |
//!
//! Word 0 is what Linux's `arm_smmu_make_s1_cd` writes for a DMA domain on a little-endian
//! kernel (`CTXDESC_CD_0_*`), with the TCR fields io-pgtable-arm chooses
//! (`arm_64_lpae_alloc_pgtable_s1`), and word 3 is io-pgtable-arm's MAIR
//! (`ARM_LPAE_MAIR_ATTR_*`). Words 2 and 4-7 are zero.

use super::spec::StreamWorld;
use crate::addr::PhysAddr;

/// Size of one context descriptor in bytes.
pub const CD_BYTES: u64 = 64;

const STE_0_V: u64 = 1;
const STE_0_CFG_SHIFT: u32 = 1;
const STE_0_CFG_ABORT: u64 = 0b000;
const STE_0_CFG_BYPASS: u64 = 0b100;
const STE_0_CFG_S1_TRANS: u64 = 0b101;
const STE_0_S1CTXPTR_MASK: u64 = ((1 << 52) - 1) & !((1 << 6) - 1);
const STE_1_STRW_SHIFT: u32 = 30;

const CD_0_T0SZ_MASK: u64 = 0x3f;
const CD_0_TG0_SHIFT: u32 = 6;
const CD_0_IRGN0_SHIFT: u32 = 8;
const CD_0_ORGN0_SHIFT: u32 = 10;
const CD_0_SH0_SHIFT: u32 = 12;
const CD_0_EPD1: u64 = 1 << 30;
const CD_0_V: u64 = 1 << 31;
const CD_0_IPS_SHIFT: u32 = 32;
const CD_0_AA64: u64 = 1 << 41;
const CD_0_R: u64 = 1 << 45;
const CD_0_A: u64 = 1 << 46;
const CD_0_ASET: u64 = 1 << 47;
const CD_0_ASID_SHIFT: u32 = 48;
const CD_1_TTB0_MASK: u64 = ((1 << 52) - 1) & !((1 << 4) - 1);
/// io-pgtable-arm's MAIR: NC 0x44 at index 0, WBRWA 0xff at 1, DEVICE 0x04 at 2,
/// INC_OWBRWA 0xf4 at 3.
const CD_3_MAIR: u64 = 0x44 | (0xff << 8) | (0x04 << 16) | (0xf4 << 24);
/// TCR region attribute for a coherent table walk (write-back write-allocate) and not.
const RGN_WBWA: u64 = 1;
const RGN_NC: u64 = 0;
/// TCR shareability: inner shareable (coherent walk), outer shareable (not).
const SH_IS: u64 = 3;
const SH_OS: u64 = 2;

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
    /// The output (physical) address size in bits, encoded in `IPS`.
    pub oas: u32,
    /// Whether the SMMU's table walks snoop the CPU caches (`IRGN0`/`ORGN0`/`SH0`).
    pub coherent_walk: bool,
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

    /// The `IPS` encoding of the output size (`ARM_LPAE_TCR_PS_*`; the nearest size at or
    /// above it, 52 bits beyond).
    pub const fn ips(&self) -> u64 {
        match self.oas {
            0..=32 => 0,
            33..=36 => 1,
            37..=40 => 2,
            41..=42 => 3,
            43..=44 => 4,
            45..=48 => 5,
            _ => 6,
        }
    }

    /// The descriptor's eight words, valid bit set (an unsupported granule encodes as the
    /// reserved `TG0` value 3).
    pub fn encode_words(&self) -> [u64; 8] {
        let (rgn, sh) = if self.coherent_walk {
            (RGN_WBWA, SH_IS)
        } else {
            (RGN_NC, SH_OS)
        };
        let w0 = (u64::from(self.t0sz) & CD_0_T0SZ_MASK)
            | (self.tg0().unwrap_or(3) << CD_0_TG0_SHIFT)
            | (rgn << CD_0_IRGN0_SHIFT)
            | (rgn << CD_0_ORGN0_SHIFT)
            | (sh << CD_0_SH0_SHIFT)
            | CD_0_EPD1
            | CD_0_V
            | (self.ips() << CD_0_IPS_SHIFT)
            | CD_0_AA64
            | CD_0_R
            | CD_0_A
            | CD_0_ASET
            | (u64::from(self.asid) << CD_0_ASID_SHIFT);
        [
            w0,
            self.ttb.get() & CD_1_TTB0_MASK,
            0,
            CD_3_MAIR,
            0,
            0,
            0,
            0,
        ]
    }

    /// The first two words (see [`ContextDescriptor::encode_words`]).
    pub fn encode(&self) -> [u64; 2] {
        let w = self.encode_words();
        [w[0], w[1]]
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
        /// `STRW`: the regime the stream's TLB entries belong to, and so which TLBIs reach
        /// them.
        strw: StreamWorld,
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

    /// Word 1 of the entry: `STRW` of a stage-1 entry (the word's other fields are not
    /// modelled), 0 otherwise.
    pub fn encode_word1(&self) -> u64 {
        match self.config {
            SteConfig::Translate { strw, .. } => strw.strw() << STE_1_STRW_SHIFT,
            SteConfig::Abort | SteConfig::Bypass => 0,
        }
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
                strw: StreamWorld::NsEl1,
            },
        };
        assert_eq!(s1.encode_word0(), 0x8000_00c0 | 0b1011);
        assert_eq!(s1.encode_word1(), 0);
        assert_eq!(bypass.encode_word1(), 0);
    }

    /// Linux's `STRTAB_STE_1_STRW` (GENMASK_ULL(31, 30)) with `STRTAB_STE_1_STRW_EL2` (2),
    /// what `arm_smmu_make_cdtable_ste` writes with `ARM_SMMU_FEAT_E2H`.
    #[test]
    fn ste_word1_strw_el2_is_linux_s() {
        let strw_el2: u64 = 2 << 30;
        assert_eq!(strw_el2, 0x8000_0000);
        let s1 = Ste {
            valid: true,
            config: SteConfig::Translate {
                cd: 0,
                cd_addr: PhysAddr::new(0x3000_0000),
                strw: StreamWorld::El2,
            },
        };
        assert_eq!(s1.encode_word1(), strw_el2);
    }

    /// Linux's `CTXDESC_CD_0_*` macros (arm-smmu-v3.h) and io-pgtable-arm's TCR and MAIR
    /// values, written out: the test vectors, not the model's own constants.
    mod linux {
        pub const T0SZ: fn(u64) -> u64 = |v| v & 0x3f; // GENMASK_ULL(5, 0)
        pub const TG0: fn(u64) -> u64 = |v| (v & 3) << 6; // GENMASK_ULL(7, 6)
        pub const IRGN0: fn(u64) -> u64 = |v| (v & 3) << 8; // GENMASK_ULL(9, 8)
        pub const ORGN0: fn(u64) -> u64 = |v| (v & 3) << 10; // GENMASK_ULL(11, 10)
        pub const SH0: fn(u64) -> u64 = |v| (v & 3) << 12; // GENMASK_ULL(13, 12)
        pub const EPD1: u64 = 1 << 30; // CTXDESC_CD_0_TCR_EPD1
        pub const V: u64 = 1 << 31; // CTXDESC_CD_0_V
        pub const IPS: fn(u64) -> u64 = |v| (v & 7) << 32; // GENMASK_ULL(34, 32)
        pub const AA64: u64 = 1 << 41; // CTXDESC_CD_0_AA64
        pub const R: u64 = 1 << 45; // CTXDESC_CD_0_R
        pub const A: u64 = 1 << 46; // CTXDESC_CD_0_A
        pub const ASET: u64 = 1 << 47; // CTXDESC_CD_0_ASET
        pub const ASID: fn(u64) -> u64 = |v| (v & 0xffff) << 48; // GENMASK_ULL(63, 48)
        pub const TCR_RGN_WBWA: u64 = 1; // ARM_LPAE_TCR_RGN_WBWA
        pub const TCR_RGN_NC: u64 = 0; // ARM_LPAE_TCR_RGN_NC
        pub const TCR_SH_IS: u64 = 3; // ARM_LPAE_TCR_SH_IS
        pub const TCR_SH_OS: u64 = 2; // ARM_LPAE_TCR_SH_OS
        pub const TCR_PS_48_BIT: u64 = 5; // ARM_LPAE_TCR_PS_48_BIT
        pub const TCR_PS_40_BIT: u64 = 2; // ARM_LPAE_TCR_PS_40_BIT
                                          // ARM_LPAE_MAIR_ATTR_{NC 0x44, WBRWA 0xff, DEVICE 0x04, INC_OWBRWA 0xf4} at
                                          // ARM_LPAE_MAIR_ATTR_IDX_{NC 0, CACHE 1, DEV 2, INC_OCACHE 3}.
        pub const MAIR: u64 = 0xf404_ff44;
    }

    #[test]
    fn cd_words_are_what_linux_writes_for_a_dma_domain() {
        let cd = ContextDescriptor {
            asid: 0x1234,
            ttb: PhysAddr::new(0xffff_f000),
            granule: 0x1000,
            t0sz: 16,
            oas: 48,
            coherent_walk: true,
        };
        assert_eq!(cd.input_bits(), 48);
        let want = linux::T0SZ(16)
            | linux::TG0(0)
            | linux::IRGN0(linux::TCR_RGN_WBWA)
            | linux::ORGN0(linux::TCR_RGN_WBWA)
            | linux::SH0(linux::TCR_SH_IS)
            | linux::EPD1
            | linux::V
            | linux::IPS(linux::TCR_PS_48_BIT)
            | linux::AA64
            | linux::R
            | linux::A
            | linux::ASET
            | linux::ASID(0x1234);
        assert_eq!(want, 0x1234_e205_c000_3510);
        assert_eq!(
            cd.encode_words(),
            [want, 0xffff_f000, 0, linux::MAIR, 0, 0, 0, 0]
        );
        assert_eq!(cd.encode(), [want, 0xffff_f000]);
        // A non-coherent walk on a 40-bit bus, 64 KiB granule.
        let nc = ContextDescriptor {
            granule: 0x1_0000,
            oas: 40,
            coherent_walk: false,
            ..cd
        };
        let w0 = nc.encode_words()[0];
        assert_eq!(
            w0 & (0xff << 6),
            linux::TG0(1) | linux::SH0(linux::TCR_SH_OS)
        );
        assert_eq!(w0 & linux::IRGN0(3), linux::IRGN0(linux::TCR_RGN_NC));
        assert_eq!(w0 & linux::IPS(7), linux::IPS(linux::TCR_PS_40_BIT));
    }
}
