//! Linux kernel versions, and the DMA-path algorithms that changed between them.
//!
//! A scenario names the kernel it models ([`KernelVersion`], "6.12"); [`DmaPathVariants`]
//! says which variant of each changed algorithm that kernel runs: the IOVA rcache depot, what
//! an exhausted allocation flushes, the flush-queue shapes and sizes, where the timer path
//! frees, the PCI 32-bit-first allocation, the IOVA tree's retry and fast-fail, the SMMUv3
//! command-queue producer, range invalidation and E2H support, what VT-d writes for execute
//! control in first-stage domains (XD, NXE), and the default DMA mode per architecture.
//!
//! The answer comes from one table, [`KERNEL_CHANGES`]: the Linux 4.19 baseline is changed by
//! every entry whose release is at or below the version asked for, in release order. Each
//! entry names its commit subject, commit and release. Releases 4.19 to 6.12 are supported
//! ([`KernelVersion::OLDEST`], [`KernelVersion::NEWEST`]); the long-term releases in that
//! range are [`KernelVersion::LTS`]. docs/model/kernel-versions.md has the table with its
//! sources and what each variant does in the model.
//!
//! The variants are opt-in: every type's [`Default`] is iolab's behaviour so far, which is
//! Linux 6.12's for everything but the timer path ([`TimerFreeCpu`]) and the PCI 32-bit-first
//! allocation (`dma::DomainConfig::pci_32bit_first` is `None` unless asked for, as
//! `iommu.forcedac=1`; [`DmaPathVariants::pci_32bit_first`] gives the release's).
//!
//! ```
//! use iolab_iommu::iova::magazine::DepotKind;
//! use iolab_iommu::linux::{Arch, DmaPathVariants, KernelVersion};
//! use iolab_iommu::dma::DomainMode;
//!
//! let v: KernelVersion = "5.10".parse()?;
//! let paths = DmaPathVariants::for_kernel(v)?;
//! assert_eq!(paths.depot, DepotKind::LINUX_BOUNDED);
//! assert_eq!(paths.default_dma_mode(Arch::X86), DomainMode::Lazy);
//! assert!(KernelVersion::new(5, 10) > KernelVersion::new(5, 4));
//! # Ok::<(), iolab_iommu::linux::KernelVersionError>(())
//! ```

use std::fmt;
use std::str::FromStr;

use crate::dma::flush_queue::{FlushQueueConfig, FlushQueueShape, FlushQueueVariant, TimerFreeCpu};
use crate::dma::DomainMode;
use crate::iova::linux::LinuxTreeVariant;
use crate::iova::magazine::{DepotKind, ExhaustionFlush, MagazineConfig};
use crate::smmuv3::cmdq::ProducerKind;
use crate::vtd::spec::FlExecControl;

/// A Linux release, `major.minor` (patch levels do not change the DMA path here).
///
/// Ordered by release: 5.10 is after 5.4, 6.1 before 6.12.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct KernelVersion {
    /// Major number (the 6 of 6.12).
    pub major: u16,
    /// Minor number (the 12 of 6.12).
    pub minor: u16,
}

impl KernelVersion {
    /// The oldest release modelled.
    pub const OLDEST: KernelVersion = KernelVersion::new(4, 19);
    /// The newest release modelled.
    pub const NEWEST: KernelVersion = KernelVersion::new(6, 12);
    /// The long-term releases from [`KernelVersion::OLDEST`] to [`KernelVersion::NEWEST`].
    pub const LTS: [KernelVersion; 7] = [
        KernelVersion::new(4, 19),
        KernelVersion::new(5, 4),
        KernelVersion::new(5, 10),
        KernelVersion::new(5, 15),
        KernelVersion::new(6, 1),
        KernelVersion::new(6, 6),
        KernelVersion::new(6, 12),
    ];

    /// Release `major.minor`.
    pub const fn new(major: u16, minor: u16) -> Self {
        Self { major, minor }
    }

    /// Parses `"6.12"`, also `"v6.12"` and `"6.12.5"` (the patch level is dropped).
    ///
    /// # Errors
    ///
    /// [`KernelVersionError::Malformed`] for anything else. The range is not checked here:
    /// [`DmaPathVariants::for_kernel`] does that.
    pub fn parse(input: &str) -> Result<Self, KernelVersionError> {
        let malformed = || KernelVersionError::Malformed {
            input: input.chars().take(32).collect(),
        };
        let s = input.trim();
        let s = s.strip_prefix('v').unwrap_or(s);
        let mut parts = s.split('.');
        let mut number = || -> Result<u16, KernelVersionError> {
            let p = parts.next().ok_or_else(malformed)?;
            if p.is_empty() || p.len() > 4 || !p.bytes().all(|b| b.is_ascii_digit()) {
                return Err(malformed());
            }
            p.parse().map_err(|_| malformed())
        };
        let major = number()?;
        let minor = number()?;
        match parts.next() {
            None => {}
            Some(patch)
                if !patch.is_empty()
                    && patch.len() <= 4
                    && patch.bytes().all(|b| b.is_ascii_digit()) => {}
            Some(_) => return Err(malformed()),
        }
        if parts.next().is_some() {
            return Err(malformed());
        }
        Ok(Self::new(major, minor))
    }

    /// Whether this release is in the modelled range.
    pub fn is_supported(self) -> bool {
        (Self::OLDEST..=Self::NEWEST).contains(&self)
    }
}

impl fmt::Display for KernelVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}", self.major, self.minor)
    }
}

impl FromStr for KernelVersion {
    type Err = KernelVersionError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::parse(s)
    }
}

/// A kernel version that cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KernelVersionError {
    /// Not of the form `major.minor` (optionally `v` before and `.patch` after).
    #[error("Kernel version {input:?} is not of the form major.minor, like \"6.12\"")]
    Malformed {
        /// The input (its first 32 characters).
        input: String,
    },
    /// Outside the modelled releases.
    #[error("Kernel {version} is not modelled: the DMA path is modelled for {oldest} to {newest}")]
    Unsupported {
        /// The version asked for.
        version: KernelVersion,
        /// [`KernelVersion::OLDEST`].
        oldest: KernelVersion,
        /// [`KernelVersion::NEWEST`].
        newest: KernelVersion,
    },
}

/// A CPU architecture whose default DMA mode differs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Arch {
    /// arm64 (SMMUv3, dma-iommu).
    Arm64,
    /// x86-64 (VT-d or AMD-Vi).
    X86,
    /// 64-bit POWER (TCE tables, the powerpc IOMMU code, not dma-iommu).
    Powerpc,
}

/// How dma-iommu treats a PCI device whose DMA mask reaches above 4 GiB (the "SAC trick":
/// try to hand out a 32-bit IOVA first, without flushing the rcaches, then the full range
/// with the flush).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Pci32BitFirst {
    /// Every allocation tries below 4 GiB first (4.19 to 6.5).
    EveryAllocation,
    /// Tries below 4 GiB first until one such try fails, then never again for that device
    /// (6.6 and later: `pci_32bit_workaround`, cleared on the first failure).
    UntilFirstFailure,
}

/// The variants of the DMA-path algorithms one kernel release runs. Build it with
/// [`DmaPathVariants::for_kernel`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DmaPathVariants {
    /// The release described.
    pub kernel: KernelVersion,
    /// The IOVA rcache depot.
    pub depot: DepotKind,
    /// What an exhausted fast-path allocation flushes before its retry.
    pub exhaustion_flush: ExhaustionFlush,
    /// The per-CPU flush queues' sizing (256 slots, 10 ms in every release modelled).
    pub flush_queue: FlushQueueConfig,
    /// The single flush queue's sizing, when the release has one (6.7 and later; Linux uses
    /// it only for IOMMUs that shadow their tables on a flush, not for SMMUv3, VT-d or
    /// AMD-Vi).
    pub single_flush_queue: Option<FlushQueueConfig>,
    /// Where the flush-queue timer frees (the timer's CPU in every release modelled).
    pub timer_free_cpu: TimerFreeCpu,
    /// The PCI 32-bit-first allocation.
    pub pci_32bit_first: Pci32BitFirst,
    /// Whether the IOVA tree's first-fit, failing from its cached cursor, retries from the
    /// limit (5.11 and later; [`DmaPathVariants::iova_tree_variant`]).
    pub iova_retry_from_limit: bool,
    /// Whether a failed 32-bit request makes later ones of its size fail at once
    /// (`max32_alloc_size`; after 4.19; [`DmaPathVariants::iova_tree_variant`]).
    pub iova_32bit_fast_fail: bool,
    /// The SMMUv3 command-queue producer.
    pub cmdq: ProducerKind,
    /// Whether the SMMUv3 driver uses range invalidation (`CMD_TLBI_*` with `NUM`/`SCALE`)
    /// when the SMMU implements it (SMMUv3.2 `IDR3.RIL`).
    pub range_invalidation: bool,
    /// Whether arm64 (dma-iommu on SMMU) can run in lazy mode at all (`iommu.strict=0`).
    pub arm64_lazy_available: bool,
    /// Whether the SMMUv3 driver uses E2H (EL2 stage-1 streams, `CMD_TLBI_EL2_*`) when the
    /// SMMU has `IDR0.HYP` and the kernel runs at EL2 with VHE
    /// (`smmuv3::Smmuv3Config::driver_e2h`; 5.12 and later).
    pub smmuv3_e2h: bool,
    /// What intel-iommu writes for execute control in a first-stage DMA domain: XD on its
    /// page-table entries, NXE in its PASID-table entry (`vtd::DmarConfig::with_fl_exec`).
    /// First-stage DMA domains arrived in 5.6; for 4.19 to 5.5, which have none, the model
    /// writes 5.6's encoding.
    pub vtd_first_stage: FlExecControl,
}

impl DmaPathVariants {
    /// The Linux 4.19 DMA path, before any entry of [`KERNEL_CHANGES`].
    fn baseline() -> Self {
        Self {
            kernel: KernelVersion::OLDEST,
            depot: DepotKind::LINUX_BOUNDED,
            exhaustion_flush: ExhaustionFlush::CpusOnly,
            flush_queue: FlushQueueConfig::LINUX_PER_CPU,
            single_flush_queue: None,
            timer_free_cpu: TimerFreeCpu::TimerCpu,
            pci_32bit_first: Pci32BitFirst::EveryAllocation,
            iova_retry_from_limit: false,
            iova_32bit_fast_fail: false,
            cmdq: ProducerKind::Spinlock,
            range_invalidation: false,
            arm64_lazy_available: false,
            smmuv3_e2h: false,
            vtd_first_stage: FlExecControl::LINUX_5_6,
        }
    }

    /// The variants `kernel` runs.
    ///
    /// # Errors
    ///
    /// [`KernelVersionError::Unsupported`] outside [`KernelVersion::OLDEST`] to
    /// [`KernelVersion::NEWEST`].
    pub fn for_kernel(kernel: KernelVersion) -> Result<Self, KernelVersionError> {
        if !kernel.is_supported() {
            return Err(KernelVersionError::Unsupported {
                version: kernel,
                oldest: KernelVersion::OLDEST,
                newest: KernelVersion::NEWEST,
            });
        }
        let mut v = Self::baseline();
        for change in KERNEL_CHANGES.iter().filter(|c| c.since <= kernel) {
            (change.apply)(&mut v);
        }
        v.kernel = kernel;
        Ok(v)
    }

    /// A record of `kernel` for a DMA path that has no release variants in the model (the
    /// SBA IOMMU's and POWER's TCE code, not dma-iommu): any release, older ones included
    /// (Linux 2.6.0's ia64 `sba_iommu`). Its variants are the 4.19 baseline's; only the
    /// paths that consult none of them may use it. [`DmaPathVariants::for_kernel`] is the
    /// constructor for every other path.
    pub fn without_variants(kernel: KernelVersion) -> Self {
        Self {
            kernel,
            ..Self::baseline()
        }
    }

    /// The entries of [`KERNEL_CHANGES`] this release includes, oldest first.
    pub fn changes(&self) -> impl Iterator<Item = &'static KernelChange> + '_ {
        KERNEL_CHANGES
            .iter()
            .filter(move |c| c.since <= self.kernel)
    }

    /// The DMA mode a distribution kernel's defaults give a translated device on `arch`.
    ///
    /// - arm64: strict in every release modelled (`iommu.strict` defaulted to 1 before 5.15,
    ///   `CONFIG_IOMMU_DEFAULT_DMA_STRICT` since); lazy is opt-in from 4.20.
    /// - x86: lazy in every release (VT-d's and AMD-Vi's own defaults before 5.15, then
    ///   `default IOMMU_DEFAULT_DMA_LAZY if X86`).
    /// - powerpc: strict: its TCE path invalidates on every unmap and has no flush queue.
    pub fn default_dma_mode(&self, arch: Arch) -> DomainMode {
        match arch {
            Arch::Arm64 | Arch::Powerpc => DomainMode::Strict,
            Arch::X86 => DomainMode::Lazy,
        }
    }

    /// A magazine-cache configuration for `ncpus` CPUs with this release's depot and
    /// exhaustion flush (the rest as [`MagazineConfig::new`]).
    pub fn magazine_config(&self, ncpus: usize) -> MagazineConfig {
        MagazineConfig {
            depot: self.depot,
            exhaustion_flush: self.exhaustion_flush,
            ..MagazineConfig::new(ncpus)
        }
    }

    /// The IOVA tree's first fit in this release (`iova::linux::LinuxIovaAllocator::with_variant`).
    pub fn iova_tree_variant(&self) -> LinuxTreeVariant {
        LinuxTreeVariant {
            retry_from_limit: self.iova_retry_from_limit,
            fast_fail_32bit: self.iova_32bit_fast_fail,
        }
    }

    /// The flush-queue sizing and variant for a lazy domain: the single queue if `single`
    /// and the release has one, else the per-CPU queues.
    pub fn flush_queue_for(&self, single: bool) -> (FlushQueueConfig, FlushQueueVariant) {
        match (single, self.single_flush_queue) {
            (true, Some(config)) => (
                config,
                FlushQueueVariant {
                    shape: FlushQueueShape::Single,
                    timer_free_cpu: self.timer_free_cpu,
                },
            ),
            _ => (
                self.flush_queue,
                FlushQueueVariant {
                    shape: FlushQueueShape::PerCpu,
                    timer_free_cpu: self.timer_free_cpu,
                },
            ),
        }
    }
}

/// One upstream change to the DMA path: the release it first appeared in, its source, and
/// what it changes in [`DmaPathVariants`].
#[derive(Debug)]
pub struct KernelChange {
    /// The first release with the change.
    pub since: KernelVersion,
    /// The commit subject(s).
    pub subject: &'static str,
    /// The commit id(s), abbreviated.
    pub commit: &'static str,
    /// What it changes, in a line.
    pub effect: &'static str,
    apply: fn(&mut DmaPathVariants),
}

/// Every modelled change after Linux 4.19, in release order. The baseline (4.19): the
/// 32-magazine bounded depot, exhaustion flushing CPU caches only, per-CPU flush queues of
/// 256 slots and 10 ms whose timer frees on its own CPU, PCI 32-bit-first on every
/// allocation, no tree retry or 32-bit fast-fail, the spinlock SMMUv3 command queue, no range
/// invalidation, no lazy mode on arm64, no SMMUv3 E2H, and XD without NXE on VT-d first-stage
/// domains (5.6's encoding: 4.19 has no first-stage DMA domains).
pub static KERNEL_CHANGES: [KernelChange; 11] = [
    // Zhen Lei's non-strict series for dma-iommu and SMMUv3 (authored 2018-09, merged
    // after 4.19).
    KernelChange {
        since: KernelVersion::new(4, 20),
        subject: "iommu/dma: Add support for non-strict mode; iommu: Add \"iommu.strict\" \
                  command line option; iommu/arm-smmu-v3: Add support for non-strict mode",
        commit: "bd385efeffb6, eb59e3891ef3, c35eee6e8a28",
        effect: "arm64 can run lazy (iommu.strict=0); the default stays strict",
        apply: |v| v.arm64_lazy_available = true,
    },
    // Not in 4.19.y (the stable bot could not apply a later fix to 4.19 for lack of it);
    // present by 5.1.
    KernelChange {
        since: KernelVersion::new(5, 0),
        subject: "iommu/iova: Optimise attempts to allocate iova from 32bit address range",
        commit: "bee60e94a1e2",
        effect: "a failed 32-bit request makes later ones of its size fail in O(1)",
        apply: |v| v.iova_32bit_fast_fail = true,
    },
    // Will Deacon's pull "iommu/arm-smmu: Big batch of updates for 5.4".
    KernelChange {
        since: KernelVersion::new(5, 4),
        subject: "iommu/arm-smmu-v3: Reduce contention during command-queue insertion",
        commit: "587e6c10a7ce",
        effect: "SMMUv3 command queue: lock-free producer with owner election",
        apply: |v| v.cmdq = ProducerKind::LockFree,
    },
    // Rob Herring's SMMUv3.2 range invalidation (release from memory: see the doc).
    KernelChange {
        since: KernelVersion::new(5, 7),
        subject: "iommu/arm-smmu-v3: Add support for TLB range invalidation operations",
        commit: "6a481a95d4c1",
        effect: "SMMUv3 invalidates a range with one command when the SMMU has RIL",
        apply: |v| v.range_invalidation = true,
    },
    // Vijayanand Jitta's two patches, in the 5.11 IOMMU pull.
    KernelChange {
        since: KernelVersion::new(5, 11),
        subject: "iommu/iova: Retry from last rb tree node if iova search fails; \
                  iommu/iova: Free global iova rcache on iova alloc failure",
        commit: "4e89dce72521, 6fa3525b455a",
        effect: "the tree retries from the limit; exhaustion also flushes the depots",
        apply: |v| {
            v.iova_retry_from_limit = true;
            v.exhaustion_flush = ExhaustionFlush::CpusAndDepots;
        },
    },
    // Jean-Philippe Brucker's SVA groundwork, in "IOMMU Updates for Linux v5.12" ("Virtualization
    // Host Extension support for SMMUv3 (SVA)").
    KernelChange {
        since: KernelVersion::new(5, 12),
        subject: "iommu/arm-smmu-v3: Add support for VHE",
        commit: "9111aebf770d",
        effect: "with IDR0.HYP and a VHE host, SMMUv3 stage-1 STEs use STRW=EL2 and TLBI_EL2_*",
        apply: |v| v.smmuv3_e2h = true,
    },
    // Lu Baolu's VT-d batch posted 2023-01-31 (Fixes: ddf09b6d43ec); applied to the IOMMU
    // tree for the 6.3 merge window (in linux-next with the VT-d perfmon series, 2023-02).
    KernelChange {
        since: KernelVersion::new(6, 3),
        subject: "iommu/vt-d: Set No Execute Enable bit in PASID table entry",
        commit: "e06d24435596",
        effect: "VT-d first-stage PASID entries set NXE (bit 133) to go with XD on the entries",
        apply: |v| v.vtd_first_stage = FlExecControl::LINUX_6_3,
    },
    // Robin Murphy; applied to the IOMMU core branch on 2023-07-14, after the 6.5 merge
    // window.
    KernelChange {
        since: KernelVersion::new(6, 6),
        subject: "iommu: Optimise PCI SAC address trick",
        commit: "791c2b17fb40",
        effect: "PCI 32-bit-first stops for a device after its first 32-bit failure",
        apply: |v| v.pci_32bit_first = Pci32BitFirst::UntilFirstFailure,
    },
    // Robin Murphy, in "IOMMU Updates for Linux v6.7" ("Scaling improvements for the IOVA
    // rcache depot").
    KernelChange {
        since: KernelVersion::new(6, 7),
        subject: "iommu/iova: Make the rcache depot scale better; \
                  iommu/iova: Manage the depot list size",
        commit: "911aa1245da8, 233045378dbb",
        effect: "the depot is an unbounded list trimmed to one magazine per CPU every 100 ms",
        apply: |v| v.depot = DepotKind::Scalable,
    },
    // Niklas Schnelle's s390 DMA-API conversion, in "IOMMU Updates for Linux v6.7".
    KernelChange {
        since: KernelVersion::new(6, 7),
        subject: "iommu/dma: Allow a single FQ in addition to per-CPU FQs; \
                  iommu/dma: Use a large flush queue and timeout for shadow_on_flush",
        commit: "32d5bc8b09c7, 9f5b681e2a3f",
        effect: "a single flush queue of 32768 slots and 1 s, for shadow_on_flush IOMMUs",
        apply: |v| v.single_flush_queue = Some(FlushQueueConfig::LINUX_SINGLE),
    },
    // Lu Baolu, posted 2024-07-02 and applied to iommu (intel/vt-d) for the 6.11 merge
    // window (the VT-d specification dropped Execute-Requested, NXE and XD).
    KernelChange {
        since: KernelVersion::new(6, 11),
        subject: "iommu/vt-d: Remove control over Execute-Requested requests",
        commit: "e995fcde6070",
        effect: "VT-d first-stage entries lose XD (bit 63) and PASID entries NXE",
        apply: |v| v.vtd_first_stage = FlExecControl::LINUX_6_11,
    },
];

#[cfg(test)]
mod tests {
    use super::*;

    fn kv(s: &str) -> KernelVersion {
        s.parse().unwrap()
    }

    #[test]
    fn versions_parse_with_an_optional_v_and_patch_level() {
        assert_eq!(kv("6.12"), KernelVersion::new(6, 12));
        assert_eq!(kv("v5.10"), KernelVersion::new(5, 10));
        assert_eq!(kv(" 5.15.167 "), KernelVersion::new(5, 15));
        assert_eq!(kv("6.1").to_string(), "6.1");
    }

    #[test]
    fn malformed_versions_are_errors() {
        for bad in [
            "", "6", "6.", ".12", "6.x", "6.12.1.2", "-1.2", "6.12-rc1", "12345.1", "6..1", "v",
        ] {
            assert!(
                matches!(
                    KernelVersion::parse(bad),
                    Err(KernelVersionError::Malformed { .. })
                ),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn versions_order_by_release_not_by_text() {
        assert!(kv("5.10") > kv("5.4"));
        assert!(kv("6.1") < kv("6.12"));
        assert!(kv("4.19") < kv("5.0"));
        let mut lts = KernelVersion::LTS;
        lts.sort();
        assert_eq!(lts, KernelVersion::LTS);
    }

    #[test]
    fn versions_outside_the_range_are_unsupported() {
        for v in ["4.14", "6.13", "7.0"] {
            assert_eq!(
                DmaPathVariants::for_kernel(kv(v)),
                Err(KernelVersionError::Unsupported {
                    version: kv(v),
                    oldest: KernelVersion::OLDEST,
                    newest: KernelVersion::NEWEST,
                })
            );
        }
        assert!(KernelVersion::LTS.iter().all(|v| v.is_supported()));
    }

    #[test]
    fn a_release_without_variants_keeps_its_name_and_no_changes() {
        let v = DmaPathVariants::without_variants(kv("2.6.0"));
        assert_eq!(v.kernel.to_string(), "2.6");
        assert_eq!(v.changes().count(), 0);
        assert!(DmaPathVariants::for_kernel(kv("2.6")).is_err());
    }

    #[test]
    fn the_table_is_in_release_order_and_inside_the_range() {
        assert!(KERNEL_CHANGES.windows(2).all(|w| w[0].since <= w[1].since));
        for c in &KERNEL_CHANGES {
            assert!(c.since > KernelVersion::OLDEST && c.since <= KernelVersion::NEWEST);
            assert!(!c.subject.is_empty() && !c.commit.is_empty() && !c.effect.is_empty());
        }
    }

    /// The variants of each long-term release, one row per release.
    #[test]
    fn each_lts_release_gets_its_variants() {
        use DepotKind as D;
        use ExhaustionFlush as E;
        use Pci32BitFirst as P;
        use ProducerKind as C;
        type Row = (&'static str, D, E, C, bool, bool, P, bool);
        #[rustfmt::skip]
        let rows: [Row; 7] = [
            ("4.19", D::LINUX_BOUNDED, E::CpusOnly, C::Spinlock, false, false, P::EveryAllocation, false),
            ("5.4", D::LINUX_BOUNDED, E::CpusOnly, C::LockFree, false, false, P::EveryAllocation, false),
            ("5.10", D::LINUX_BOUNDED, E::CpusOnly, C::LockFree, true, false, P::EveryAllocation, false),
            ("5.15", D::LINUX_BOUNDED, E::CpusAndDepots, C::LockFree, true, true, P::EveryAllocation, false),
            ("6.1", D::LINUX_BOUNDED, E::CpusAndDepots, C::LockFree, true, true, P::EveryAllocation, false),
            ("6.6", D::LINUX_BOUNDED, E::CpusAndDepots, C::LockFree, true, true, P::UntilFirstFailure, false),
            ("6.12", D::Scalable, E::CpusAndDepots, C::LockFree, true, true, P::UntilFirstFailure, true),
        ];
        for (v, depot, flush, cmdq, ril, retry, pci, single) in rows {
            let p = DmaPathVariants::for_kernel(kv(v)).unwrap();
            assert_eq!(p.kernel, kv(v));
            assert_eq!(p.depot, depot, "{v}");
            assert_eq!(p.exhaustion_flush, flush, "{v}");
            assert_eq!(p.cmdq, cmdq, "{v}");
            assert_eq!(p.range_invalidation, ril, "{v}");
            assert_eq!(p.iova_retry_from_limit, retry, "{v}");
            assert_eq!(p.pci_32bit_first, pci, "{v}");
            assert_eq!(p.single_flush_queue.is_some(), single, "{v}");
            assert_eq!(p.flush_queue, FlushQueueConfig::LINUX_PER_CPU, "{v}");
            assert_eq!(p.timer_free_cpu, TimerFreeCpu::TimerCpu, "{v}");
            assert_eq!(p.default_dma_mode(Arch::Arm64), DomainMode::Strict);
            assert_eq!(p.default_dma_mode(Arch::X86), DomainMode::Lazy);
            assert_eq!(p.default_dma_mode(Arch::Powerpc), DomainMode::Strict);
        }
        // 4.19 is the only LTS without lazy mode on arm64 or the 32-bit fast-fail.
        let old = DmaPathVariants::for_kernel(kv("4.19")).unwrap();
        assert!(!old.arm64_lazy_available && !old.iova_32bit_fast_fail);
        assert_eq!(old.changes().count(), 0);
        let new = DmaPathVariants::for_kernel(kv("5.4")).unwrap();
        assert!(new.arm64_lazy_available && new.iova_32bit_fast_fail);
    }

    #[test]
    fn the_depot_and_single_queue_change_between_6_6_and_6_7() {
        let a = DmaPathVariants::for_kernel(kv("6.6")).unwrap();
        let b = DmaPathVariants::for_kernel(kv("6.7")).unwrap();
        assert_eq!(
            (a.depot, b.depot),
            (DepotKind::LINUX_BOUNDED, DepotKind::Scalable)
        );
        assert_eq!(b.single_flush_queue, Some(FlushQueueConfig::LINUX_SINGLE));
        assert_eq!(b.changes().count(), a.changes().count() + 2);
    }

    /// Today's defaults are Linux 6.12's, except where the timer path frees.
    #[test]
    fn the_newest_release_is_todays_default_but_for_the_timer_path() {
        let p = DmaPathVariants::for_kernel(KernelVersion::NEWEST).unwrap();
        assert_eq!(p.magazine_config(8), MagazineConfig::new(8));
        let (config, variant) = p.flush_queue_for(false);
        assert_eq!(config, FlushQueueConfig::default());
        assert_eq!(
            variant,
            FlushQueueVariant {
                timer_free_cpu: TimerFreeCpu::TimerCpu,
                ..FlushQueueVariant::default()
            }
        );
        let (config, variant) = p.flush_queue_for(true);
        assert_eq!(config, FlushQueueConfig::LINUX_SINGLE);
        assert_eq!(variant.shape, FlushQueueShape::Single);
        // Before 6.7 a single queue is not there to ask for.
        let old = DmaPathVariants::for_kernel(kv("6.1")).unwrap();
        assert_eq!(old.flush_queue_for(true).1.shape, FlushQueueShape::PerCpu);
    }

    #[test]
    fn smmuv3_e2h_arrives_in_5_12() {
        let at = |v: &str| DmaPathVariants::for_kernel(kv(v)).unwrap().smmuv3_e2h;
        assert!(!at("5.10") && !at("5.11"));
        assert!(at("5.12") && at("5.15") && at("6.12"));
        let c = crate::smmuv3::Smmuv3Config::default();
        assert_eq!(
            c.driver_e2h,
            at("6.12"),
            "the default is the newest release's"
        );
    }

    /// Linux's intel-iommu macros, written out: the test vectors, not the model's constants.
    /// iommu.h: `DMA_PTE_READ` BIT(0), `DMA_PTE_WRITE` BIT(1), `DMA_PTE_LARGE_PAGE`
    /// BIT_ULL(7), `DMA_FL_PTE_PRESENT` BIT_ULL(0), `DMA_FL_PTE_US` BIT_ULL(2),
    /// `DMA_FL_PTE_ACCESS` BIT_ULL(5), `DMA_FL_PTE_DIRTY` BIT_ULL(6), `DMA_FL_PTE_XD`
    /// BIT_ULL(63) (gone in 6.11). pasid.h: `pasid_set_flptr` puts the table in `val[2]`
    /// under `VTD_PAGE_MASK`, `pasid_set_flpm` in GENMASK_ULL(3, 2), `pasid_set_nxe` sets
    /// `val[2]` bit 5 (6.3 to 6.10).
    mod intel {
        pub const PTE_READ: u64 = 1;
        pub const PTE_WRITE: u64 = 1 << 1;
        pub const PTE_LARGE_PAGE: u64 = 1 << 7;
        pub const FL_PRESENT: u64 = 1;
        pub const FL_US: u64 = 1 << 2;
        pub const FL_ACCESS: u64 = 1 << 5;
        pub const FL_DIRTY: u64 = 1 << 6;
        pub const FL_XD: u64 = 1 << 63;
        pub const PASID_NXE: u64 = 1 << 5;
    }

    /// What each release writes for a first-stage DMA domain, against words built from the
    /// kernel's macros (`__domain_mapping`'s `attr`, `pfn_to_dma_pte`'s `pteval`,
    /// `intel_pasid_setup_first_level`'s `val[2]`), on both sides of 6.3 and 6.11.
    #[test]
    fn vtd_first_stage_words_follow_the_release() {
        use crate::vtd::spec::{FlPte, PasidEntry, Pgtt};
        use intel::*;
        // A writable 4 KiB leaf at 0x1234_5000: READ | WRITE | PRESENT | US | ACCESS | DIRTY.
        let rw_4k = 0x1234_5000 | PTE_READ | PTE_WRITE | FL_PRESENT | FL_US | FL_ACCESS | FL_DIRTY;
        assert_eq!(rw_4k, 0x1234_5067);
        // A read-only 2 MiB leaf at 0x4020_0000: READ | PRESENT | US | ACCESS | LARGE_PAGE.
        let ro_2m = 0x4020_0000 | PTE_READ | FL_PRESENT | FL_US | FL_ACCESS | PTE_LARGE_PAGE;
        assert_eq!(ro_2m, 0x4020_00A5);
        // A table entry for the page at 0x7_6000: READ | WRITE | US | ACCESS.
        let table = 0x7_6000 | PTE_READ | PTE_WRITE | FL_US | FL_ACCESS;
        assert_eq!(table, 0x7_6027);
        // PASID entry word 2 of a 4-level domain whose table is at 0x1_2345_6000.
        let w2 = 0x1_2345_6000u64;
        #[rustfmt::skip]
        let rows: [(&str, u64, u64, u64, u64); 6] = [
            // release, 4 KiB leaf, 2 MiB leaf, table entry, PASID word 2
            ("5.15", 0x8000_0000_1234_5067, 0x8000_0000_4020_00A5, 0x8000_0000_0007_6027, 0x1_2345_6000),
            ("6.2", rw_4k | FL_XD, ro_2m | FL_XD, table | FL_XD, w2),
            ("6.3", rw_4k | FL_XD, ro_2m | FL_XD, table | FL_XD, w2 | PASID_NXE),
            ("6.10", 0x8000_0000_1234_5067, 0x8000_0000_4020_00A5, 0x8000_0000_0007_6027, 0x1_2345_6020),
            ("6.11", rw_4k, ro_2m, table, w2),
            ("6.12", 0x1234_5067, 0x4020_00A5, 0x7_6027, 0x1_2345_6000),
        ];
        for (v, leaf, big, tab, word2) in rows {
            let exec = DmaPathVariants::for_kernel(kv(v)).unwrap().vtd_first_stage;
            assert_eq!(
                FlPte::leaf_with(0x1234_5000, true, false, exec),
                leaf,
                "{v}"
            );
            assert_eq!(FlPte::leaf_with(0x4020_0000, false, true, exec), big, "{v}");
            assert_eq!(FlPte::table_with(0x7_6000, exec), tab, "{v}");
            let pe = PasidEntry {
                present: true,
                pgtt: Pgtt::FirstStage,
                flptptr: 0x1_2345_6000,
                nxe: exec.nxe,
                did: 2,
                ..PasidEntry::default()
            };
            assert_eq!(pe.encode()[2], word2, "{v}");
        }
        // The newest release is the encoders' default.
        let newest = DmaPathVariants::for_kernel(KernelVersion::NEWEST).unwrap();
        assert_eq!(newest.vtd_first_stage, FlExecControl::default());
        assert_eq!(FlPte::leaf(0x1234_5000, true, false), rw_4k);
        assert_eq!(FlPte::table(0x7_6000), table);
    }

    /// The depot change seen through the version: 64 CPUs, each round 32 of them allocating
    /// two magazines' worth each, then the other 32 freeing it all. 6.6 sends work to the
    /// tree every round, 6.7 none once warm (the third round is measured).
    #[test]
    fn the_6_6_depot_sends_cross_cpu_frees_to_the_tree_and_6_7_does_not() {
        use crate::addr::{Iova, SZ_4K};
        use crate::iova::linux::{IovaSpaceConfig, LinuxIovaAllocator};
        use crate::iova::magazine::{MagazineCache, MAGAZINE_SIZE};
        use crate::iova::{AllocRequest, IovaAllocator};
        use crate::work::{LockId, WorkRecord};
        let tree_locks = |v: &str| {
            let p = DmaPathVariants::for_kernel(kv(v)).unwrap();
            let tree =
                LinuxIovaAllocator::new(IovaSpaceConfig::new(SZ_4K, Iova::new(1 << 40))).unwrap();
            let c = MagazineCache::new(tree, p.magazine_config(64)).unwrap();
            let mut w = WorkRecord::new();
            for round in 0..3 {
                if round == 2 {
                    w = WorkRecord::new();
                }
                let held: Vec<Vec<_>> = (0..32)
                    .map(|cpu| {
                        let req = AllocRequest::new(1, Iova::new(1 << 40), cpu);
                        (0..2 * MAGAZINE_SIZE)
                            .map(|_| c.alloc(req, &mut w).unwrap())
                            .collect()
                    })
                    .collect();
                for (cpu, blocks) in held.into_iter().enumerate() {
                    for b in blocks {
                        c.free(b, cpu + 32, &mut w).unwrap();
                    }
                }
            }
            w.lock_count(LockId::IovaTree)
        };
        assert_eq!(tree_locks("6.7"), 0);
        assert!(tree_locks("6.6") >= 32 * MAGAZINE_SIZE as u64);
    }

    #[test]
    fn the_release_s_magazine_config_builds_a_cache() {
        use crate::addr::{Iova, SZ_4K};
        use crate::iova::linux::{IovaSpaceConfig, LinuxIovaAllocator};
        use crate::iova::magazine::MagazineCache;
        for v in KernelVersion::LTS {
            let p = DmaPathVariants::for_kernel(v).unwrap();
            let tree =
                LinuxIovaAllocator::new(IovaSpaceConfig::new(SZ_4K, Iova::new(1 << 40))).unwrap();
            assert!(
                MagazineCache::new(tree, p.magazine_config(64)).is_ok(),
                "{v}"
            );
        }
    }
}
