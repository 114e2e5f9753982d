//! Address-space newtypes.
//!
//! A device sees I/O virtual addresses ([`Iova`]); memory is indexed by physical addresses
//! ([`PhysAddr`]) and physical page frame numbers ([`Pfn`]). Keeping them as distinct types
//! means a physical address can never be passed where an IOVA is expected.

use std::fmt;

/// Base-2 logarithm of the smallest page size the stack uses (4 KiB).
pub const PAGE_SHIFT_4K: u32 = 12;
/// 4 KiB.
pub const SZ_4K: u64 = 1 << 12;
/// 16 KiB.
pub const SZ_16K: u64 = 1 << 14;
/// 64 KiB.
pub const SZ_64K: u64 = 1 << 16;
/// 2 MiB.
pub const SZ_2M: u64 = 1 << 21;
/// 16 MiB.
pub const SZ_16M: u64 = 1 << 24;
/// 32 MiB.
pub const SZ_32M: u64 = 1 << 25;
/// 512 MiB.
pub const SZ_512M: u64 = 1 << 29;
/// 1 GiB.
pub const SZ_1G: u64 = 1 << 30;
/// 4 GiB: the reach of a 32-bit DMA mask.
pub const SZ_4G: u64 = 1 << 32;

macro_rules! address_type {
    ($(#[$doc:meta])* $name:ident, $prefix:literal) => {
        $(#[$doc])*
        #[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
        pub struct $name(u64);

        impl $name {
            /// Wraps a raw address.
            #[inline]
            pub const fn new(raw: u64) -> Self {
                Self(raw)
            }

            /// The raw address.
            #[inline]
            pub const fn get(self) -> u64 {
                self.0
            }

            /// The address `bytes` further on, or `None` on overflow.
            #[inline]
            pub const fn checked_add(self, bytes: u64) -> Option<Self> {
                match self.0.checked_add(bytes) {
                    Some(v) => Some(Self(v)),
                    None => None,
                }
            }

            /// The address `bytes` further on. Panics in debug builds on overflow; callers
            /// that take untrusted sizes use [`Self::checked_add`].
            #[inline]
            pub const fn add(self, bytes: u64) -> Self {
                Self(self.0 + bytes)
            }

            /// Rounds down to a multiple of `align` (a power of two).
            #[inline]
            pub const fn align_down(self, align: u64) -> Self {
                debug_assert!(align.is_power_of_two());
                Self(self.0 & !(align - 1))
            }

            /// Offset of this address within an `align`-sized block (a power of two).
            #[inline]
            pub const fn offset_in(self, align: u64) -> u64 {
                debug_assert!(align.is_power_of_two());
                self.0 & (align - 1)
            }

            /// Whether the address is a multiple of `align` (a power of two).
            #[inline]
            pub const fn is_aligned(self, align: u64) -> bool {
                self.offset_in(align) == 0
            }
        }

        impl fmt::Debug for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, concat!($prefix, "({:#x})"), self.0)
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, "{:#x}", self.0)
            }
        }
    };
}

address_type!(
    /// An I/O virtual address: what a device puts on the bus when an IOMMU translates.
    Iova,
    "Iova"
);
address_type!(
    /// A physical (system) address.
    PhysAddr,
    "PhysAddr"
);

impl PhysAddr {
    /// The 4 KiB page frame that holds this address.
    #[inline]
    pub const fn pfn(self) -> Pfn {
        Pfn(self.0 >> PAGE_SHIFT_4K)
    }
}

/// A physical page frame number in units of 4 KiB.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Pfn(u64);

impl Pfn {
    /// Wraps a raw frame number.
    #[inline]
    pub const fn new(raw: u64) -> Self {
        Self(raw)
    }

    /// The raw frame number.
    #[inline]
    pub const fn get(self) -> u64 {
        self.0
    }

    /// The physical address of the first byte of the frame.
    #[inline]
    pub const fn addr(self) -> PhysAddr {
        PhysAddr(self.0 << PAGE_SHIFT_4K)
    }
}

impl fmt::Debug for Pfn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Pfn({:#x})", self.0)
    }
}

/// The address a device uses for DMA: an IOVA when translated, the physical address itself
/// when the IOMMU is off or bypassed. It is what a driver writes into a descriptor.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default, Debug)]
pub struct DmaAddr(pub u64);

impl fmt::Display for DmaAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:#x}", self.0)
    }
}

/// Access permissions of a mapping.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug, Default)]
pub struct Prot {
    /// The device may read memory through the mapping (DMA to the device).
    pub read: bool,
    /// The device may write memory through the mapping (DMA from the device).
    pub write: bool,
}

impl Prot {
    /// No access.
    pub const NONE: Prot = Prot { read: false, write: false };
    /// Device may read.
    pub const READ: Prot = Prot { read: true, write: false };
    /// Device may write.
    pub const WRITE: Prot = Prot { read: false, write: true };
    /// Device may read and write.
    pub const READ_WRITE: Prot = Prot { read: true, write: true };

    /// Whether every permission in `needed` is granted here.
    #[inline]
    pub const fn allows(self, needed: Prot) -> bool {
        (self.read || !needed.read) && (self.write || !needed.write)
    }
}

/// Whether an access reads or writes memory, from the device's side.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub enum Access {
    /// The device reads memory (a transmit, a disk write).
    Read,
    /// The device writes memory (a receive, a disk read).
    Write,
}

impl Access {
    /// The permission this access needs.
    #[inline]
    pub const fn prot(self) -> Prot {
        match self {
            Access::Read => Prot::READ,
            Access::Write => Prot::WRITE,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn alignment_helpers_work_on_powers_of_two() {
        let a = Iova::new(0x12_3456);
        assert_eq!(a.align_down(SZ_4K), Iova::new(0x12_3000));
        assert_eq!(a.offset_in(SZ_4K), 0x456);
        assert!(!a.is_aligned(SZ_4K));
        assert!(Iova::new(0x20_0000).is_aligned(SZ_2M));
    }

    #[test]
    fn pfn_and_phys_round_trip() {
        let pa = PhysAddr::new(0x1234_5678);
        assert_eq!(pa.pfn(), Pfn::new(0x12345));
        assert_eq!(pa.pfn().addr(), PhysAddr::new(0x1234_5000));
    }

    #[test]
    fn checked_add_reports_overflow() {
        assert_eq!(Iova::new(u64::MAX).checked_add(1), None);
        assert_eq!(Iova::new(1).checked_add(1), Some(Iova::new(2)));
    }

    #[test]
    fn prot_allows_subsets_only() {
        assert!(Prot::READ_WRITE.allows(Prot::READ));
        assert!(!Prot::READ.allows(Prot::WRITE));
        assert!(Prot::READ.allows(Prot::NONE));
    }
}
