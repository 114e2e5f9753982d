//! SMMUv3 command encodings: the 16-byte command-queue entries, as two little-endian `u64`
//! words, and their decoding.
//!
//! Every bit position lives in this file. Positions follow the SMMUv3 architecture
//! specification (IHI 0070) as the Linux driver uses them (`arm-smmu-v3.h`, `CMDQ_*`
//! field masks); the unit tests check each layout against words worked out by hand.
//!
//! | command | word 0 | word 1 |
//! |---|---|---|
//! | all | `[7:0]` opcode | |
//! | `CMD_TLBI_NH_VA` (0x12) | `[16:12]` NUM, `[24:20]` SCALE, `[47:32]` VMID, `[63:48]` ASID | `[0]` LEAF, `[9:8]` TTL, `[11:10]` TG, `[63:12]` VA |
//! | `CMD_TLBI_NH_ASID` (0x11) | `[47:32]` VMID, `[63:48]` ASID | |
//! | `CMD_TLBI_EL2_ALL` (0x20) | | |
//! | `CMD_TLBI_EL2_ASID` (0x21) | `[63:48]` ASID | |
//! | `CMD_TLBI_EL2_VA` (0x22) | `[16:12]` NUM, `[24:20]` SCALE, `[63:48]` ASID | `[0]` LEAF, `[9:8]` TTL, `[11:10]` TG, `[63:12]` VA |
//! | `CMD_TLBI_NSNH_ALL` (0x30) | | |
//! | `CMD_CFGI_STE` (0x03) | `[63:32]` SID | `[0]` LEAF |
//! | `CMD_CFGI_CD` (0x05) | `[31:12]` SSID, `[63:32]` SID | `[0]` LEAF |
//! | `CMD_SYNC` (0x46) | `[13:12]` CS, `[23:22]` MSH, `[27:24]` MSIATTR, `[63:32]` MSIDATA | `[51:2]` MSIADDR |
//!
//! The EL2 forms are the NH ones without VMID (Linux's `arm_smmu_cmdq_build_cmd` builds
//! `CMDQ_OP_TLBI_EL2_VA` as `CMDQ_OP_TLBI_NH_VA` less the VMID, and `CMDQ_OP_TLBI_EL2_ASID`
//! with the ASID alone); they reach the stage-1 entries of streams whose STE has
//! `STRW` = EL2 ([`StreamWorld::El2`]), which Linux writes when the SMMU has E2H.
//!
//! Every other bit is reserved (RES0 in the spec). [`Command::decode`] rejects a word with a
//! reserved bit set or an unknown opcode with a [`CommandDecodeError`]; it never panics, so a
//! hardware model can feed it whatever a guest wrote into the queue.

use thiserror::Error;

/// Size of one command-queue entry in bytes.
pub const CMD_BYTES: u64 = 16;

/// `SMMU_IDR3.RIL` (bit 10): the SMMU implements range invalidation (SMMUv3.2), so
/// `CMD_TLBI_*` commands with `TG != 0` invalidate `(NUM + 1) << SCALE` granules.
pub const IDR3_RIL: u32 = 1 << 10;

/// `SMMU_IDR0.HYP` (bit 9): the SMMU supports hypervisor (EL2) stage-1 contexts. Linux
/// sets `ARM_SMMU_FEAT_HYP` from it, and `ARM_SMMU_FEAT_E2H` when the CPU also runs the
/// kernel at EL2 with VHE (`ARM64_HAS_VIRT_HOST_EXTN`); there is no separate E2H bit.
pub const IDR0_HYP: u32 = 1 << 9;

/// The translation regime a stream's stage-1 TLB entries belong to: the STE's `STRW`
/// (StreamWorld, word 1 bits `[31:30]`). TLBI commands reach one regime only: the NH forms
/// [`StreamWorld::NsEl1`], the EL2 forms [`StreamWorld::El2`].
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug, Default)]
pub enum StreamWorld {
    /// `STRTAB_STE_1_STRW_NSEL1` (0): non-secure EL1; what Linux writes without E2H.
    #[default]
    NsEl1,
    /// `STRTAB_STE_1_STRW_EL2` (2): EL2, which is EL2-E2H with `SMMU_CR2.E2H` set; what
    /// Linux writes on an SMMU with `ARM_SMMU_FEAT_E2H`.
    El2,
}

impl StreamWorld {
    /// The `STRW` field value.
    pub const fn strw(self) -> u64 {
        match self {
            StreamWorld::NsEl1 => 0,
            StreamWorld::El2 => 2,
        }
    }
}

/// One encoded command: word 0 (bytes 0..8) and word 1 (bytes 8..16).
pub type RawCommand = [u64; 2];

/// Command opcodes (word 0 bits `[7:0]`).
pub mod opcode {
    /// `CMD_CFGI_STE`: invalidate the cached stream table entry of one StreamID.
    pub const CFGI_STE: u8 = 0x03;
    /// `CMD_CFGI_CD`: invalidate one cached context descriptor.
    pub const CFGI_CD: u8 = 0x05;
    /// `CMD_TLBI_NH_ASID`: invalidate every stage-1 TLB entry of one ASID.
    pub const TLBI_NH_ASID: u8 = 0x11;
    /// `CMD_TLBI_NH_VA`: invalidate stage-1 TLB entries by address (or address range).
    pub const TLBI_NH_VA: u8 = 0x12;
    /// `CMD_TLBI_EL2_ALL`: invalidate all EL2 (and EL2-E2H) TLB entries.
    pub const TLBI_EL2_ALL: u8 = 0x20;
    /// `CMD_TLBI_EL2_ASID`: invalidate every EL2-E2H stage-1 TLB entry of one ASID.
    pub const TLBI_EL2_ASID: u8 = 0x21;
    /// `CMD_TLBI_EL2_VA`: invalidate EL2-E2H stage-1 TLB entries by address (or range).
    pub const TLBI_EL2_VA: u8 = 0x22;
    /// `CMD_TLBI_NSNH_ALL`: invalidate all non-secure, non-hypervisor TLB entries.
    pub const TLBI_NSNH_ALL: u8 = 0x30;
    /// `CMD_SYNC`: completes once every earlier command has completed.
    pub const CMD_SYNC: u8 = 0x46;
}

/// A bit field `[lo + width - 1 : lo]` of one 64-bit word.
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

    /// The field's bits, in place.
    const fn mask(self) -> u64 {
        if self.width == 64 {
            u64::MAX
        } else {
            ((1u64 << self.width) - 1) << self.lo
        }
    }

    /// The largest value the field holds.
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
}

// Word 0, all commands.
const OP: Field = Field::new(7, 0);
// TLBI, word 0.
const TLBI_0_NUM: Field = Field::new(16, 12);
const TLBI_0_SCALE: Field = Field::new(24, 20);
const TLBI_0_VMID: Field = Field::new(47, 32);
const TLBI_0_ASID: Field = Field::new(63, 48);
// TLBI, word 1. The VA field holds address bits [63:12] in place.
const TLBI_1_LEAF: Field = Field::new(0, 0);
const TLBI_1_TTL: Field = Field::new(9, 8);
const TLBI_1_TG: Field = Field::new(11, 10);
const TLBI_1_VA: Field = Field::new(63, 12);
// CFGI, word 0 and 1.
const CFGI_0_SSID: Field = Field::new(31, 12);
const CFGI_0_SID: Field = Field::new(63, 32);
const CFGI_1_LEAF: Field = Field::new(0, 0);
// CMD_SYNC, word 0 and 1. MSIADDR holds address bits [51:2] in place.
const SYNC_0_CS: Field = Field::new(13, 12);
const SYNC_0_MSH: Field = Field::new(23, 22);
const SYNC_0_MSIATTR: Field = Field::new(27, 24);
const SYNC_0_MSIDATA: Field = Field::new(63, 32);
const SYNC_1_MSIADDR: Field = Field::new(51, 2);
/// The address bits a `CMD_SYNC`'s MSIADDR holds (`[51:2]`, in place in word 1).
pub(crate) const SYNC_MSIADDR_BITS: u64 = SYNC_1_MSIADDR.mask();

/// The bits each command defines in word 0 and word 1; everything else is reserved.
const fn defined_bits(op: u8) -> Option<[u64; 2]> {
    let op_bits = OP.mask();
    match op {
        opcode::TLBI_NH_VA => Some([
            op_bits
                | TLBI_0_NUM.mask()
                | TLBI_0_SCALE.mask()
                | TLBI_0_VMID.mask()
                | TLBI_0_ASID.mask(),
            TLBI_1_LEAF.mask() | TLBI_1_TTL.mask() | TLBI_1_TG.mask() | TLBI_1_VA.mask(),
        ]),
        opcode::TLBI_NH_ASID => Some([op_bits | TLBI_0_VMID.mask() | TLBI_0_ASID.mask(), 0]),
        opcode::TLBI_EL2_VA => Some([
            op_bits | TLBI_0_NUM.mask() | TLBI_0_SCALE.mask() | TLBI_0_ASID.mask(),
            TLBI_1_LEAF.mask() | TLBI_1_TTL.mask() | TLBI_1_TG.mask() | TLBI_1_VA.mask(),
        ]),
        opcode::TLBI_EL2_ASID => Some([op_bits | TLBI_0_ASID.mask(), 0]),
        opcode::TLBI_EL2_ALL | opcode::TLBI_NSNH_ALL => Some([op_bits, 0]),
        opcode::CFGI_STE => Some([op_bits | CFGI_0_SID.mask(), CFGI_1_LEAF.mask()]),
        opcode::CFGI_CD => Some([
            op_bits | CFGI_0_SSID.mask() | CFGI_0_SID.mask(),
            CFGI_1_LEAF.mask(),
        ]),
        opcode::CMD_SYNC => Some([
            op_bits
                | SYNC_0_CS.mask()
                | SYNC_0_MSH.mask()
                | SYNC_0_MSIATTR.mask()
                | SYNC_0_MSIDATA.mask(),
            SYNC_1_MSIADDR.mask(),
        ]),
        _ => None,
    }
}

/// How a `CMD_SYNC` signals its completion (the CS field, word 0 bits `[13:12]`).
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub enum SyncCs {
    /// `SIG_NONE` (0): no signal; software polls the consumer index.
    None,
    /// `SIG_IRQ` (1): an interrupt, or an MSI write of MSIDATA to MSIADDR when MSIADDR is not
    /// zero. Linux points MSIADDR at the sync's own queue slot and polls that memory.
    Irq,
    /// `SIG_SEV` (2): a send-event to wake CPUs waiting in WFE.
    Sev,
}

impl SyncCs {
    const fn bits(self) -> u64 {
        match self {
            SyncCs::None => 0,
            SyncCs::Irq => 1,
            SyncCs::Sev => 2,
        }
    }
}

/// Shareability of the MSI write (MSH): inner shareable, as Linux uses.
pub const MSH_INNER_SHAREABLE: u8 = 3;
/// Memory attributes of the MSI write (MSIATTR): outer and inner write-back cacheable, as
/// Linux uses.
pub const MSIATTR_OIWB: u8 = 0xf;

/// One SMMUv3 command, decoded.
///
/// Field widths are those of the encoding; [`Command::encode`] rejects values that do not
/// fit rather than truncating them.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub enum Command {
    /// `CMD_TLBI_NH_VA`: invalidate stage-1 entries for `addr` (or a range from `addr`).
    ///
    /// With `tg == 0` the command covers the single page holding `addr` (`num` and `scale`
    /// should be zero); with `tg` = 1, 2, 3 (4 KiB, 16 KiB, 64 KiB granule) it is an SMMUv3.2
    /// range invalidation of `(num + 1) << scale` granules from `addr`.
    TlbiNhVa {
        /// Virtual machine id (stage 2 owner; 0 without nesting).
        vmid: u16,
        /// Address space id.
        asid: u16,
        /// The virtual address, 4 KiB aligned.
        addr: u64,
        /// Only leaf (last-level) entries need invalidating; walk caches may stay.
        leaf: bool,
        /// Translation table level hint of the leaf (0: unknown, 1..=3), 2 bits.
        ttl: u8,
        /// Translation granule of a range invalidation (0: not a range), 2 bits.
        tg: u8,
        /// Range NUM field, 5 bits: `num + 1` units.
        num: u8,
        /// Range SCALE field, 5 bits: each unit is `1 << scale` granules.
        scale: u8,
    },
    /// `CMD_TLBI_NH_ASID`: invalidate every stage-1 entry of one ASID.
    TlbiNhAsid {
        /// Virtual machine id (0 without nesting).
        vmid: u16,
        /// Address space id.
        asid: u16,
    },
    /// `CMD_TLBI_NSNH_ALL`: invalidate all non-secure, non-hypervisor TLB entries.
    TlbiNsnhAll,
    /// `CMD_TLBI_EL2_VA`: invalidate EL2-E2H stage-1 entries for `addr` (or a range from
    /// `addr`); the fields are those of [`Command::TlbiNhVa`] but VMID, which the EL2 form
    /// lacks.
    TlbiEl2Va {
        /// Address space id.
        asid: u16,
        /// The virtual address, 4 KiB aligned.
        addr: u64,
        /// Only leaf (last-level) entries need invalidating; walk caches may stay.
        leaf: bool,
        /// Translation table level hint of the leaf (0: unknown, 1..=3), 2 bits.
        ttl: u8,
        /// Translation granule of a range invalidation (0: not a range), 2 bits.
        tg: u8,
        /// Range NUM field, 5 bits: `num + 1` units.
        num: u8,
        /// Range SCALE field, 5 bits: each unit is `1 << scale` granules.
        scale: u8,
    },
    /// `CMD_TLBI_EL2_ASID`: invalidate every EL2-E2H stage-1 entry of one ASID.
    TlbiEl2Asid {
        /// Address space id.
        asid: u16,
    },
    /// `CMD_TLBI_EL2_ALL`: invalidate all EL2 and EL2-E2H entries (Linux issues it once at
    /// reset on an SMMU with `IDR0.HYP`).
    TlbiEl2All,
    /// `CMD_CFGI_STE`: invalidate the cached stream table entry of `sid`.
    CfgiSte {
        /// StreamID.
        sid: u32,
        /// Only the STE itself, not the level-1 descriptor pointing at it (Linux sets it).
        leaf: bool,
    },
    /// `CMD_CFGI_CD`: invalidate the cached context descriptor `ssid` of stream `sid`.
    CfgiCd {
        /// StreamID.
        sid: u32,
        /// SubstreamID, 20 bits.
        ssid: u32,
        /// Only the CD itself, not the level-1 CD table descriptor.
        leaf: bool,
    },
    /// `CMD_SYNC`: completes when every earlier command has completed, then signals.
    Sync {
        /// Completion signal.
        cs: SyncCs,
        /// Shareability of the MSI write, 2 bits ([`MSH_INNER_SHAREABLE`] in Linux).
        msh: u8,
        /// Memory attributes of the MSI write, 4 bits ([`MSIATTR_OIWB`] in Linux).
        msi_attr: u8,
        /// MSI target (bits `[51:2]`, 4-byte aligned; 0: no MSI).
        msi_addr: u64,
        /// The 32-bit value the MSI writes.
        msi_data: u32,
    },
}

/// Why a [`Command`] cannot be encoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Error)]
pub enum CommandEncodeError {
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
}

/// Why two words are not a valid command.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Error)]
pub enum CommandDecodeError {
    /// The opcode is not one this model implements (hardware reports `CERROR_ILL`).
    #[error("Unknown command opcode {opcode:#04x}")]
    UnknownOpcode {
        /// The opcode found.
        opcode: u8,
    },
    /// Reserved bits are set.
    #[error("Command {opcode:#04x} has reserved bits {bits:#x} set in word {word}")]
    ReservedBits {
        /// The command's opcode.
        opcode: u8,
        /// Which word (0 or 1).
        word: usize,
        /// The reserved bits that are set.
        bits: u64,
    },
    /// A field holds a reserved value.
    #[error("Command {opcode:#04x} field {field} holds reserved value {value:#x}")]
    ReservedValue {
        /// The command's opcode.
        opcode: u8,
        /// The field's name.
        field: &'static str,
        /// The value found.
        value: u64,
    },
}

fn check_fits(field: &'static str, f: Field, value: u64) -> Result<u64, CommandEncodeError> {
    if value > f.max() {
        return Err(CommandEncodeError::FieldOverflow {
            field,
            value,
            bits: f.width,
        });
    }
    Ok(f.put(value))
}

fn check_addr(field: &'static str, f: Field, addr: u64) -> Result<u64, CommandEncodeError> {
    if addr & !f.mask() != 0 {
        return Err(CommandEncodeError::BadAddress {
            field,
            addr,
            mask: f.mask(),
        });
    }
    Ok(addr)
}

/// The fields a VA invalidation shares between its NH and EL2 forms, encoded (word 0
/// without opcode and VMID), each checked against its width.
fn va_words(
    asid: u16,
    addr: u64,
    leaf: bool,
    ttl: u8,
    tg: u8,
    num: u8,
    scale: u8,
) -> Result<RawCommand, CommandEncodeError> {
    Ok([
        check_fits("NUM", TLBI_0_NUM, num.into())?
            | check_fits("SCALE", TLBI_0_SCALE, scale.into())?
            | TLBI_0_ASID.put(asid.into()),
        TLBI_1_LEAF.put(leaf.into())
            | check_fits("TTL", TLBI_1_TTL, ttl.into())?
            | check_fits("TG", TLBI_1_TG, tg.into())?
            | check_addr("VA", TLBI_1_VA, addr)?,
    ])
}

impl Command {
    /// A `CMD_SYNC` completed by an MSI write of `msi_data` to `msi_addr`, with the
    /// shareability and attributes Linux uses.
    pub const fn sync_msi(msi_addr: u64, msi_data: u32) -> Self {
        Command::Sync {
            cs: SyncCs::Irq,
            msh: MSH_INNER_SHAREABLE,
            msi_attr: MSIATTR_OIWB,
            msi_addr,
            msi_data,
        }
    }

    /// The command's opcode.
    pub const fn opcode(&self) -> u8 {
        match self {
            Command::TlbiNhVa { .. } => opcode::TLBI_NH_VA,
            Command::TlbiNhAsid { .. } => opcode::TLBI_NH_ASID,
            Command::TlbiNsnhAll => opcode::TLBI_NSNH_ALL,
            Command::TlbiEl2Va { .. } => opcode::TLBI_EL2_VA,
            Command::TlbiEl2Asid { .. } => opcode::TLBI_EL2_ASID,
            Command::TlbiEl2All => opcode::TLBI_EL2_ALL,
            Command::CfgiSte { .. } => opcode::CFGI_STE,
            Command::CfgiCd { .. } => opcode::CFGI_CD,
            Command::Sync { .. } => opcode::CMD_SYNC,
        }
    }

    /// Whether this is a `CMD_SYNC`.
    pub const fn is_sync(&self) -> bool {
        matches!(self, Command::Sync { .. })
    }

    /// The same invalidation in the TLBI forms that reach `world`'s entries: for
    /// [`StreamWorld::El2`], `CMD_TLBI_NH_VA` becomes `CMD_TLBI_EL2_VA` (its VMID dropped),
    /// `CMD_TLBI_NH_ASID` `CMD_TLBI_EL2_ASID` and `CMD_TLBI_NSNH_ALL` `CMD_TLBI_EL2_ALL`;
    /// for [`StreamWorld::NsEl1`] the reverse (VMID 0). Other commands are unchanged.
    #[inline]
    pub const fn in_world(self, world: StreamWorld) -> Command {
        match (self, world) {
            (
                Command::TlbiNhVa {
                    asid,
                    addr,
                    leaf,
                    ttl,
                    tg,
                    num,
                    scale,
                    ..
                },
                StreamWorld::El2,
            ) => Command::TlbiEl2Va {
                asid,
                addr,
                leaf,
                ttl,
                tg,
                num,
                scale,
            },
            (Command::TlbiNhAsid { asid, .. }, StreamWorld::El2) => Command::TlbiEl2Asid { asid },
            (Command::TlbiNsnhAll, StreamWorld::El2) => Command::TlbiEl2All,
            (
                Command::TlbiEl2Va {
                    asid,
                    addr,
                    leaf,
                    ttl,
                    tg,
                    num,
                    scale,
                },
                StreamWorld::NsEl1,
            ) => Command::TlbiNhVa {
                vmid: 0,
                asid,
                addr,
                leaf,
                ttl,
                tg,
                num,
                scale,
            },
            (Command::TlbiEl2Asid { asid }, StreamWorld::NsEl1) => {
                Command::TlbiNhAsid { vmid: 0, asid }
            }
            (Command::TlbiEl2All, StreamWorld::NsEl1) => Command::TlbiNsnhAll,
            (cmd, _) => cmd,
        }
    }

    /// For a `CMD_TLBI_NH_VA` or `CMD_TLBI_EL2_VA`, the bytes it invalidates from `addr`:
    /// one 4 KiB page without a range (`tg == 0`), else `(num + 1) << scale` granules of
    /// 4 KiB, 16 KiB or 64 KiB. `None` for other commands.
    pub fn tlbi_range_bytes(&self) -> Option<u64> {
        match *self {
            Command::TlbiNhVa { tg, num, scale, .. }
            | Command::TlbiEl2Va { tg, num, scale, .. } => {
                let granule_shift = match tg {
                    0 => return Some(1 << 12),
                    1 => 12,
                    2 => 14,
                    _ => 16,
                };
                let granules = (u64::from(num) + 1) << scale;
                Some(granules << granule_shift)
            }
            _ => None,
        }
    }

    /// Encodes the command into its two words.
    #[inline]
    pub fn encode(&self) -> Result<RawCommand, CommandEncodeError> {
        // The commands the invalidation paths issue, with one test for all their checked
        // fields; anything that fails it (or another command) takes the field-by-field
        // checks, which name the culprit.
        match *self {
            Command::TlbiNhVa {
                vmid,
                asid,
                addr,
                leaf,
                ttl,
                tg,
                num,
                scale,
            } => {
                let over = (u64::from(num) & !TLBI_0_NUM.max())
                    | (u64::from(scale) & !TLBI_0_SCALE.max())
                    | (u64::from(ttl) & !TLBI_1_TTL.max())
                    | (u64::from(tg) & !TLBI_1_TG.max())
                    | (addr & !TLBI_1_VA.mask());
                if over == 0 {
                    return Ok([
                        OP.put(u64::from(opcode::TLBI_NH_VA))
                            | TLBI_0_NUM.put(num.into())
                            | TLBI_0_SCALE.put(scale.into())
                            | TLBI_0_VMID.put(vmid.into())
                            | TLBI_0_ASID.put(asid.into()),
                        TLBI_1_LEAF.put(leaf.into())
                            | TLBI_1_TTL.put(ttl.into())
                            | TLBI_1_TG.put(tg.into())
                            | addr,
                    ]);
                }
            }
            Command::Sync {
                cs,
                msh,
                msi_attr,
                msi_addr,
                msi_data,
            } => {
                let over = (u64::from(msh) & !SYNC_0_MSH.max())
                    | (u64::from(msi_attr) & !SYNC_0_MSIATTR.max())
                    | (msi_addr & !SYNC_1_MSIADDR.mask());
                if over == 0 {
                    return Ok([
                        OP.put(u64::from(opcode::CMD_SYNC))
                            | SYNC_0_CS.put(cs.bits())
                            | SYNC_0_MSH.put(msh.into())
                            | SYNC_0_MSIATTR.put(msi_attr.into())
                            | SYNC_0_MSIDATA.put(msi_data.into()),
                        msi_addr,
                    ]);
                }
            }
            _ => {}
        }
        self.encode_checked()
    }

    /// [`Command::encode`] field by field: every check in turn, the first failure reported.
    fn encode_checked(&self) -> Result<RawCommand, CommandEncodeError> {
        let op = OP.put(u64::from(self.opcode()));
        Ok(match *self {
            Command::TlbiNhVa {
                vmid,
                asid,
                addr,
                leaf,
                ttl,
                tg,
                num,
                scale,
            } => {
                let [w0, w1] = va_words(asid, addr, leaf, ttl, tg, num, scale)?;
                [op | w0 | TLBI_0_VMID.put(vmid.into()), w1]
            }
            Command::TlbiNhAsid { vmid, asid } => [
                op | TLBI_0_VMID.put(vmid.into()) | TLBI_0_ASID.put(asid.into()),
                0,
            ],
            Command::TlbiNsnhAll | Command::TlbiEl2All => [op, 0],
            Command::TlbiEl2Va {
                asid,
                addr,
                leaf,
                ttl,
                tg,
                num,
                scale,
            } => {
                let [w0, w1] = va_words(asid, addr, leaf, ttl, tg, num, scale)?;
                [op | w0, w1]
            }
            Command::TlbiEl2Asid { asid } => [op | TLBI_0_ASID.put(asid.into()), 0],
            Command::CfgiSte { sid, leaf } => [
                op | CFGI_0_SID.put(sid.into()),
                CFGI_1_LEAF.put(leaf.into()),
            ],
            Command::CfgiCd { sid, ssid, leaf } => [
                op | check_fits("SSID", CFGI_0_SSID, ssid.into())? | CFGI_0_SID.put(sid.into()),
                CFGI_1_LEAF.put(leaf.into()),
            ],
            Command::Sync {
                cs,
                msh,
                msi_attr,
                msi_addr,
                msi_data,
            } => [
                op | SYNC_0_CS.put(cs.bits())
                    | check_fits("MSH", SYNC_0_MSH, msh.into())?
                    | check_fits("MSIATTR", SYNC_0_MSIATTR, msi_attr.into())?
                    | SYNC_0_MSIDATA.put(msi_data.into()),
                check_addr("MSIADDR", SYNC_1_MSIADDR, msi_addr)?,
            ],
        })
    }

    /// Decodes two words. Unknown opcodes, reserved bits and reserved field values are
    /// errors; decoding never panics.
    #[inline]
    pub fn decode(raw: RawCommand) -> Result<Command, CommandDecodeError> {
        let [w0, w1] = raw;
        // The opcode field is 8 bits, so the cast is exact.
        let op = OP.get(w0) as u8;
        // One dispatch on the opcode: each arm checks the reserved bits of its own layout
        // (`defined_bits` of a constant opcode folds to two masks), then reads the fields.
        // Every `as` below narrows a field whose width fits the target type.
        Ok(match op {
            opcode::TLBI_NH_VA => return Self::decode_tlbi_nh_va(raw),
            opcode::TLBI_NH_ASID => {
                check_reserved(opcode::TLBI_NH_ASID, raw)?;
                Command::TlbiNhAsid {
                    vmid: TLBI_0_VMID.get(w0) as u16,
                    asid: TLBI_0_ASID.get(w0) as u16,
                }
            }
            opcode::TLBI_NSNH_ALL => {
                check_reserved(opcode::TLBI_NSNH_ALL, raw)?;
                Command::TlbiNsnhAll
            }
            opcode::TLBI_EL2_VA => {
                check_reserved(opcode::TLBI_EL2_VA, raw)?;
                Command::TlbiEl2Va {
                    asid: TLBI_0_ASID.get(w0) as u16,
                    addr: w1 & TLBI_1_VA.mask(),
                    leaf: TLBI_1_LEAF.get(w1) != 0,
                    ttl: TLBI_1_TTL.get(w1) as u8,
                    tg: TLBI_1_TG.get(w1) as u8,
                    num: TLBI_0_NUM.get(w0) as u8,
                    scale: TLBI_0_SCALE.get(w0) as u8,
                }
            }
            opcode::TLBI_EL2_ASID => {
                check_reserved(opcode::TLBI_EL2_ASID, raw)?;
                Command::TlbiEl2Asid {
                    asid: TLBI_0_ASID.get(w0) as u16,
                }
            }
            opcode::TLBI_EL2_ALL => {
                check_reserved(opcode::TLBI_EL2_ALL, raw)?;
                Command::TlbiEl2All
            }
            opcode::CFGI_STE => {
                check_reserved(opcode::CFGI_STE, raw)?;
                Command::CfgiSte {
                    sid: CFGI_0_SID.get(w0) as u32,
                    leaf: CFGI_1_LEAF.get(w1) != 0,
                }
            }
            opcode::CFGI_CD => {
                check_reserved(opcode::CFGI_CD, raw)?;
                Command::CfgiCd {
                    sid: CFGI_0_SID.get(w0) as u32,
                    ssid: CFGI_0_SSID.get(w0) as u32,
                    leaf: CFGI_1_LEAF.get(w1) != 0,
                }
            }
            opcode::CMD_SYNC => return Self::decode_sync(raw),
            _ => return Err(CommandDecodeError::UnknownOpcode { opcode: op }),
        })
    }
    /// The opcode of an encoded command (word 0 bits `[7:0]`).
    #[inline]
    pub(crate) const fn raw_opcode(raw: RawCommand) -> u8 {
        // The opcode field is 8 bits, so the cast is exact.
        OP.get(raw[0]) as u8
    }

    /// [`Command::decode`] of words whose opcode is `CMD_TLBI_NH_VA`. (The queue's consumer
    /// calls it directly for the command every unmap issues, so that the command it hands
    /// on is built for that one kind rather than for whichever arm decoded it.)
    #[inline]
    pub(crate) fn decode_tlbi_nh_va(raw: RawCommand) -> Result<Command, CommandDecodeError> {
        let [w0, w1] = raw;
        check_reserved(opcode::TLBI_NH_VA, raw)?;
        // Every `as` below narrows a field whose width fits the target type.
        Ok(Command::TlbiNhVa {
            vmid: TLBI_0_VMID.get(w0) as u16,
            asid: TLBI_0_ASID.get(w0) as u16,
            addr: w1 & TLBI_1_VA.mask(),
            leaf: TLBI_1_LEAF.get(w1) != 0,
            ttl: TLBI_1_TTL.get(w1) as u8,
            tg: TLBI_1_TG.get(w1) as u8,
            num: TLBI_0_NUM.get(w0) as u8,
            scale: TLBI_0_SCALE.get(w0) as u8,
        })
    }

    /// [`Command::decode`] of words whose opcode is `CMD_SYNC` (see
    /// [`Command::decode_tlbi_nh_va`]).
    #[inline]
    pub(crate) fn decode_sync(raw: RawCommand) -> Result<Command, CommandDecodeError> {
        let [w0, w1] = raw;
        let op = opcode::CMD_SYNC;
        check_reserved(op, raw)?;
        let cs = match SYNC_0_CS.get(w0) {
            0 => SyncCs::None,
            1 => SyncCs::Irq,
            2 => SyncCs::Sev,
            value => {
                return Err(CommandDecodeError::ReservedValue {
                    opcode: op,
                    field: "CS",
                    value,
                })
            }
        };
        // Every `as` below narrows a field whose width fits the target type.
        Ok(Command::Sync {
            cs,
            msh: SYNC_0_MSH.get(w0) as u8,
            msi_attr: SYNC_0_MSIATTR.get(w0) as u8,
            msi_addr: w1 & SYNC_1_MSIADDR.mask(),
            msi_data: SYNC_0_MSIDATA.get(w0) as u32,
        })
    }
}

/// Checks that the words of a command of the known opcode `op` have no reserved bit set
/// (word 0 reported first), as [`Command::decode`]'s arms do.
#[inline(always)]
fn check_reserved(op: u8, raw: RawCommand) -> Result<(), CommandDecodeError> {
    let Some(d) = defined_bits(op) else {
        return Err(CommandDecodeError::UnknownOpcode { opcode: op });
    };
    if (raw[0] & !d[0]) | (raw[1] & !d[1]) != 0 {
        let word = usize::from(raw[0] & !d[0] == 0);
        return Err(CommandDecodeError::ReservedBits {
            opcode: op,
            word,
            bits: raw[word] & !d[word],
        });
    }
    Ok(())
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
    fn tlbi_nh_va_range_layout() {
        // word 0 = opcode 0x12
        //        | NUM 31 << 12     = 0x1f000
        //        | SCALE 2 << 20    = 0x200000
        //        | VMID 7 << 32     = 0x7_0000_0000
        //        | ASID 0x1234 << 48 = 0x1234_0000_0000_0000
        //        = 0x1234_0007_0021_f012
        // word 1 = VA 0xffff_8000_1234_5000
        //        | LEAF 1 | TTL 3 << 8 = 0x300 | TG 1 << 10 = 0x400   (0x701)
        //        = 0xffff_8000_1234_5701
        round_trip(
            Command::TlbiNhVa {
                vmid: 7,
                asid: 0x1234,
                addr: 0xffff_8000_1234_5000,
                leaf: true,
                ttl: 3,
                tg: 1,
                num: 31,
                scale: 2,
            },
            [0x1234_0007_0021_f012, 0xffff_8000_1234_5701],
        );
    }

    #[test]
    fn tlbi_nh_va_single_page_layout() {
        // word 0 = 0x12 | ASID 1 << 48 = 0x0001_0000_0000_0012; word 1 = VA 0x4000_0000.
        round_trip(
            Command::TlbiNhVa {
                vmid: 0,
                asid: 1,
                addr: 0x4000_0000,
                leaf: false,
                ttl: 0,
                tg: 0,
                num: 0,
                scale: 0,
            },
            [0x0001_0000_0000_0012, 0x4000_0000],
        );
    }

    #[test]
    fn tlbi_nh_asid_layout() {
        // word 0 = 0x11 | VMID 5 << 32 | ASID 0xbeef << 48 = 0xbeef_0005_0000_0011.
        round_trip(
            Command::TlbiNhAsid {
                vmid: 5,
                asid: 0xbeef,
            },
            [0xbeef_0005_0000_0011, 0],
        );
    }

    /// Linux's `CMDQ_*` macros (arm-smmu-v3.h) for the EL2 TLBIs, written out: the test
    /// vectors, not the model's own constants.
    mod linux {
        pub const OP_TLBI_EL2_ALL: u64 = 0x20; // CMDQ_OP_TLBI_EL2_ALL
        pub const OP_TLBI_EL2_ASID: u64 = 0x21; // CMDQ_OP_TLBI_EL2_ASID
        pub const OP_TLBI_EL2_VA: u64 = 0x22; // CMDQ_OP_TLBI_EL2_VA
                                              // CMDQ_TLBI_0_NUM GENMASK_ULL(16, 12)
        pub const NUM: fn(u64) -> u64 = |v| (v & 0x1f) << 12;
        // CMDQ_TLBI_0_SCALE GENMASK_ULL(24, 20)
        pub const SCALE: fn(u64) -> u64 = |v| (v & 0x1f) << 20;
        // CMDQ_TLBI_0_ASID GENMASK_ULL(63, 48)
        pub const ASID: fn(u64) -> u64 = |v| (v & 0xffff) << 48;
        pub const LEAF: u64 = 1; // CMDQ_TLBI_1_LEAF (1UL << 0)
        pub const TTL: fn(u64) -> u64 = |v| (v & 3) << 8; // CMDQ_TLBI_1_TTL GENMASK_ULL(9, 8)
        pub const TG: fn(u64) -> u64 = |v| (v & 3) << 10; // CMDQ_TLBI_1_TG GENMASK_ULL(11, 10)
        pub const VA_MASK: u64 = !0xfff; // CMDQ_TLBI_1_VA_MASK GENMASK_ULL(63, 12)
    }

    #[test]
    fn tlbi_el2_va_layout_from_the_driver_macros() {
        // arm_smmu_cmdq_build_cmd for CMDQ_OP_TLBI_EL2_VA: NUM, SCALE, ASID in word 0 (no
        // VMID), LEAF, TTL, TG and the VA in word 1.
        let want = [
            linux::OP_TLBI_EL2_VA | linux::NUM(31) | linux::SCALE(2) | linux::ASID(0x1234),
            linux::LEAF | linux::TTL(3) | linux::TG(1) | (0xffff_8000_1234_5000 & linux::VA_MASK),
        ];
        assert_eq!(want, [0x1234_0000_0021_f022, 0xffff_8000_1234_5701]);
        round_trip(
            Command::TlbiEl2Va {
                asid: 0x1234,
                addr: 0xffff_8000_1234_5000,
                leaf: true,
                ttl: 3,
                tg: 1,
                num: 31,
                scale: 2,
            },
            want,
        );
        // A single page, not a leaf: opcode, ASID and the VA alone.
        let single = [linux::OP_TLBI_EL2_VA | linux::ASID(1), 0x4000_0000];
        assert_eq!(single, [0x0001_0000_0000_0022, 0x4000_0000]);
        round_trip(
            Command::TlbiEl2Va {
                asid: 1,
                addr: 0x4000_0000,
                leaf: false,
                ttl: 0,
                tg: 0,
                num: 0,
                scale: 0,
            },
            single,
        );
        // VMID's bits [47:32] are reserved in the EL2 form.
        assert_eq!(
            Command::decode([0x0001_0005_0000_0022, 0]),
            Err(CommandDecodeError::ReservedBits {
                opcode: 0x22,
                word: 0,
                bits: 0x5_0000_0000
            })
        );
    }

    #[test]
    fn tlbi_el2_asid_and_all_layout_from_the_driver_macros() {
        // CMDQ_OP_TLBI_EL2_ASID: the ASID alone.
        let want = [linux::OP_TLBI_EL2_ASID | linux::ASID(0xbeef), 0];
        assert_eq!(want, [0xbeef_0000_0000_0021, 0]);
        round_trip(Command::TlbiEl2Asid { asid: 0xbeef }, want);
        round_trip(Command::TlbiEl2All, [linux::OP_TLBI_EL2_ALL, 0]);
        assert_eq!(
            Command::decode([0xbeef_0005_0000_0021, 0]),
            Err(CommandDecodeError::ReservedBits {
                opcode: 0x21,
                word: 0,
                bits: 0x5_0000_0000
            })
        );
    }

    #[test]
    fn commands_move_between_worlds() {
        let nh = Command::TlbiNhVa {
            vmid: 0,
            asid: 7,
            addr: 0x5000,
            leaf: true,
            ttl: 3,
            tg: 1,
            num: 0,
            scale: 0,
        };
        let el2 = nh.in_world(StreamWorld::El2);
        assert_eq!(el2.opcode(), opcode::TLBI_EL2_VA);
        assert_eq!(el2.tlbi_range_bytes(), nh.tlbi_range_bytes());
        assert_eq!(el2.in_world(StreamWorld::NsEl1), nh);
        assert_eq!(nh.in_world(StreamWorld::NsEl1), nh);
        let asid = Command::TlbiNhAsid { vmid: 0, asid: 7 };
        assert_eq!(
            asid.in_world(StreamWorld::El2),
            Command::TlbiEl2Asid { asid: 7 }
        );
        assert_eq!(
            Command::TlbiNsnhAll.in_world(StreamWorld::El2),
            Command::TlbiEl2All
        );
        let sync = Command::sync_msi(0x1000, 1);
        assert_eq!(sync.in_world(StreamWorld::El2), sync);
        assert_eq!((StreamWorld::NsEl1.strw(), StreamWorld::El2.strw()), (0, 2));
    }

    #[test]
    fn tlbi_nsnh_all_layout() {
        round_trip(Command::TlbiNsnhAll, [0x30, 0]);
    }

    #[test]
    fn cfgi_ste_layout() {
        // word 0 = 0x03 | SID 0xabcd << 32 = 0x0000_abcd_0000_0003; word 1 = LEAF = 1.
        round_trip(
            Command::CfgiSte {
                sid: 0xabcd,
                leaf: true,
            },
            [0x0000_abcd_0000_0003, 1],
        );
    }

    #[test]
    fn cfgi_cd_layout() {
        // word 0 = 0x05 | SSID 0xfffff << 12 = 0xffff_f000 | SID 0x42 << 32
        //        = 0x0000_0042_ffff_f005; word 1 = LEAF = 1.
        round_trip(
            Command::CfgiCd {
                sid: 0x42,
                ssid: 0xf_ffff,
                leaf: true,
            },
            [0x0000_0042_ffff_f005, 1],
        );
    }

    #[test]
    fn sync_msi_layout() {
        // word 0 = 0x46 | CS IRQ 1 << 12 = 0x1000 | MSH 3 << 22 = 0xc0_0000
        //        | MSIATTR 0xf << 24 = 0xf00_0000 | MSIDATA 0xdead_beef << 32
        //        = 0xdead_beef_0fc0_1046
        // word 1 = MSIADDR 0x8000_1230 (bits [51:2], in place)
        round_trip(
            Command::sync_msi(0x8000_1230, 0xdead_beef),
            [0xdead_beef_0fc0_1046, 0x8000_1230],
        );
    }

    #[test]
    fn sync_sev_layout_matches_linux_without_msi() {
        // What Linux builds without MSI polling: CS SEV 2 << 12 = 0x2000, MSH ISH, OIWB.
        // word 0 = 0x46 | 0x2000 | 0xc0_0000 | 0xf00_0000 = 0x0fc0_2046.
        round_trip(
            Command::Sync {
                cs: SyncCs::Sev,
                msh: MSH_INNER_SHAREABLE,
                msi_attr: MSIATTR_OIWB,
                msi_addr: 0,
                msi_data: 0,
            },
            [0x0fc0_2046, 0],
        );
    }

    #[test]
    fn encode_rejects_values_that_do_not_fit() {
        let va = |addr, num| Command::TlbiNhVa {
            vmid: 0,
            asid: 0,
            addr,
            leaf: false,
            ttl: 0,
            tg: 1,
            num,
            scale: 0,
        };
        assert_eq!(
            va(0x1000, 32).encode(),
            Err(CommandEncodeError::FieldOverflow {
                field: "NUM",
                value: 32,
                bits: 5
            })
        );
        assert!(matches!(
            va(0x1001, 0).encode(),
            Err(CommandEncodeError::BadAddress { field: "VA", .. })
        ));
        let cd = Command::CfgiCd {
            sid: 0,
            ssid: 1 << 20,
            leaf: true,
        };
        assert!(matches!(
            cd.encode(),
            Err(CommandEncodeError::FieldOverflow { field: "SSID", .. })
        ));
        // MSIADDR holds bits [51:2]: bit 52 and bit 1 are out.
        assert!(Command::sync_msi(1 << 52, 0).encode().is_err());
        assert!(Command::sync_msi(0x2, 0).encode().is_err());
    }

    #[test]
    fn decode_rejects_unknown_opcodes_and_reserved_bits() {
        assert_eq!(
            Command::decode([0x00, 0]),
            Err(CommandDecodeError::UnknownOpcode { opcode: 0 })
        );
        // CMD_TLBI_NH_ALL (0x10) exists in the spec but is not modelled.
        assert_eq!(
            Command::decode([0x10, 0]),
            Err(CommandDecodeError::UnknownOpcode { opcode: 0x10 })
        );
        // TLBI_NSNH_ALL with bit 8 of word 0 set.
        assert_eq!(
            Command::decode([0x130, 0]),
            Err(CommandDecodeError::ReservedBits {
                opcode: 0x30,
                word: 0,
                bits: 0x100
            })
        );
        // CFGI_STE with SSec (bit 10, secure streams, not modelled) set.
        assert_eq!(
            Command::decode([0x403, 1]),
            Err(CommandDecodeError::ReservedBits {
                opcode: 0x03,
                word: 0,
                bits: 0x400
            })
        );
        // TLBI_NH_VA with word 1 bit 4 set (between LEAF and TTL).
        assert_eq!(
            Command::decode([0x12, 0x10]),
            Err(CommandDecodeError::ReservedBits {
                opcode: 0x12,
                word: 1,
                bits: 0x10
            })
        );
        // CMD_SYNC with CS = 3.
        assert_eq!(
            Command::decode([0x3046, 0]),
            Err(CommandDecodeError::ReservedValue {
                opcode: 0x46,
                field: "CS",
                value: 3
            })
        );
    }

    #[test]
    fn range_bytes_follow_num_and_scale() {
        let va = |tg, num, scale| Command::TlbiNhVa {
            vmid: 0,
            asid: 0,
            addr: 0,
            leaf: true,
            ttl: 3,
            tg,
            num,
            scale,
        };
        assert_eq!(va(0, 0, 0).tlbi_range_bytes(), Some(4096));
        // (3 + 1) << 1 = 8 granules of 4 KiB.
        assert_eq!(va(1, 3, 1).tlbi_range_bytes(), Some(8 * 4096));
        // (31 + 1) << 31 granules of 64 KiB: the largest range, 2^52 bytes.
        assert_eq!(va(3, 31, 31).tlbi_range_bytes(), Some(1 << 52));
        assert_eq!(Command::TlbiNsnhAll.tlbi_range_bytes(), None);
    }

    fn any_command() -> impl Strategy<Value = Command> {
        prop_oneof![
            (
                any::<u16>(),
                any::<u16>(),
                any::<u64>(),
                any::<bool>(),
                0u8..4,
                0u8..4,
                0u8..32,
                0u8..32
            )
                .prop_map(|(vmid, asid, addr, leaf, ttl, tg, num, scale)| {
                    Command::TlbiNhVa {
                        vmid,
                        asid,
                        addr: addr & !0xfff,
                        leaf,
                        ttl,
                        tg,
                        num,
                        scale,
                    }
                }),
            (any::<u16>(), any::<u16>())
                .prop_map(|(vmid, asid)| Command::TlbiNhAsid { vmid, asid }),
            Just(Command::TlbiNsnhAll),
            (
                any::<u16>(),
                any::<u64>(),
                any::<bool>(),
                0u8..4,
                0u8..4,
                0u8..32,
                0u8..32
            )
                .prop_map(|(asid, addr, leaf, ttl, tg, num, scale)| {
                    Command::TlbiEl2Va {
                        asid,
                        addr: addr & !0xfff,
                        leaf,
                        ttl,
                        tg,
                        num,
                        scale,
                    }
                }),
            any::<u16>().prop_map(|asid| Command::TlbiEl2Asid { asid }),
            Just(Command::TlbiEl2All),
            (any::<u32>(), any::<bool>()).prop_map(|(sid, leaf)| Command::CfgiSte { sid, leaf }),
            (any::<u32>(), 0u32..(1 << 20), any::<bool>())
                .prop_map(|(sid, ssid, leaf)| Command::CfgiCd { sid, ssid, leaf }),
            (0u8..3, 0u8..4, 0u8..16, any::<u64>(), any::<u32>()).prop_map(
                |(cs, msh, msi_attr, addr, msi_data)| Command::Sync {
                    cs: [SyncCs::None, SyncCs::Irq, SyncCs::Sev][usize::from(cs)],
                    msh,
                    msi_attr,
                    msi_addr: addr & SYNC_1_MSIADDR.mask(),
                    msi_data,
                }
            ),
        ]
    }

    /// Any field values, in range or not (the encodings' range checks are what is tested).
    fn any_fields() -> impl Strategy<Value = Command> {
        let small = || prop_oneof![0u8..4, 0u8..64, any::<u8>()];
        let addr = || prop_oneof![any::<u64>().prop_map(|a| a & !0xfff), any::<u64>()];
        prop_oneof![
            (
                any::<u16>(),
                any::<u16>(),
                addr(),
                any::<bool>(),
                small(),
                small(),
                small(),
                small()
            )
                .prop_map(|(vmid, asid, addr, leaf, ttl, tg, num, scale)| {
                    Command::TlbiNhVa {
                        vmid,
                        asid,
                        addr,
                        leaf,
                        ttl,
                        tg,
                        num,
                        scale,
                    }
                }),
            (0u8..3, small(), small(), addr(), any::<u32>()).prop_map(
                |(cs, msh, msi_attr, msi_addr, msi_data)| Command::Sync {
                    cs: [SyncCs::None, SyncCs::Irq, SyncCs::Sev][usize::from(cs)],
                    msh,
                    msi_attr,
                    msi_addr,
                    msi_data,
                }
            ),
            any_command(),
            (any::<u32>(), any::<u32>(), any::<bool>())
                .prop_map(|(sid, ssid, leaf)| Command::CfgiCd { sid, ssid, leaf }),
        ]
    }

    /// Decoding's errors as first written: unknown opcode, then word 0's reserved bits,
    /// then word 1's.
    fn reference_decode_error(raw: RawCommand) -> Option<CommandDecodeError> {
        let op = raw[0] as u8;
        let Some(d) = defined_bits(op) else {
            return Some(CommandDecodeError::UnknownOpcode { opcode: op });
        };
        (0..2)
            .find(|&w| raw[w] & !d[w] != 0)
            .map(|word| CommandDecodeError::ReservedBits {
                opcode: op,
                word,
                bits: raw[word] & !d[word],
            })
    }

    proptest! {
        #[test]
        fn encode_then_decode_is_identity(cmd in any_command()) {
            let raw = cmd.encode().unwrap();
            prop_assert_eq!(Command::decode(raw), Ok(cmd));
        }

        #[test]
        fn decode_never_panics_and_accepted_words_round_trip(
            w0 in any::<u64>(),
            w1 in any::<u64>(),
            op in 0usize..10,
        ) {
            // Bias the opcode towards the known ones so the reserved-bit paths are hit.
            let ops = [0x03u64, 0x05, 0x11, 0x12, 0x20, 0x21, 0x22, 0x30, 0x46, w0 & 0xff];
            let w0 = (w0 & !0xff) | ops[op];
            if let Ok(cmd) = Command::decode([w0, w1]) {
                prop_assert_eq!(cmd.encode(), Ok([w0, w1]));
            }
        }

        /// The one-test encoding of the hot commands equals the field-by-field checks,
        /// errors included.
        #[test]
        fn encode_fast_path_matches_the_checked_encoding(cmd in any_fields()) {
            prop_assert_eq!(cmd.encode(), cmd.encode_checked());
        }

        /// The consumer's own arms decode exactly as `decode`, and `decode` reports the
        /// errors it always did.
        #[test]
        fn per_opcode_decoding_matches_decode(
            w0 in any::<u64>(),
            w1 in any::<u64>(),
            op in 0usize..10,
            clean in any::<bool>(),
        ) {
            let ops = [0x03u64, 0x05, 0x11, 0x12, 0x20, 0x21, 0x22, 0x30, 0x46, w0 & 0xff];
            let mut raw = [(w0 & !0xff) | ops[op], w1];
            if clean {
                // Mostly legal words, so the field paths are hit too.
                if let Some(d) = defined_bits(raw[0] as u8) {
                    raw = [raw[0] & d[0], raw[1] & d[1]];
                }
            }
            let decoded = Command::decode(raw);
            prop_assert_eq!(Command::raw_opcode(raw), raw[0] as u8);
            match Command::raw_opcode(raw) {
                opcode::TLBI_NH_VA => prop_assert_eq!(Command::decode_tlbi_nh_va(raw), decoded),
                opcode::CMD_SYNC => prop_assert_eq!(Command::decode_sync(raw), decoded),
                _ => {}
            }
            match decoded {
                Ok(cmd) => {
                    prop_assert_eq!(reference_decode_error(raw), None);
                    prop_assert_eq!(cmd.encode(), Ok(raw));
                }
                Err(CommandDecodeError::ReservedValue { .. }) => {
                    prop_assert_eq!(reference_decode_error(raw), None);
                }
                Err(e) => prop_assert_eq!(reference_decode_error(raw), Some(e)),
            }
        }
    }
}
