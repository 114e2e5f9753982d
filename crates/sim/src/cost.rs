//! The cost model: platform profiles turn work records into virtual time.
//!
//! The functional stack (`iolab-iommu`) reports *what* an operation did as exact step counts
//! in a [`WorkRecord`]. A [`PlatformProfile`] says what each step costs on one machine: CPU
//! clock, per-step CPU costs, atomic and cache-line costs, lock costs, MMIO latencies, the
//! IOMMU's own timings, hypercall costs and copy bandwidth. Every value carries a `source`:
//! a citation or an `assumption: ...` with its reasoning (docs/MODEL.md lists them all).
//!
//! Profiles are TOML files (the bundled ones live in `scenarios/platforms/` and are also
//! compiled into the binary, see [`PlatformProfile::bundled`]). A cost entry looks like
//!
//! ```toml
//! [cpu.pte_write]
//! value = 15
//! unit = "cycles"          # optional: "ns" (the default) or "cycles" at cpu.clock_ghz
//! source = "assumption: build one descriptor and store it to an L1-resident table"
//! ```
//!
//! # What the conversion covers (the split with the engine)
//!
//! [`CpuCostModel`] precomputes one weight per [`WorkRecord`] counter so that a conversion is
//! a dot product. Each counter is charged in exactly one way, listed in [`COUNTER_CHARGES`]:
//!
//! - [`Charge::Cpu`]: uncontended CPU time of the calling thread, summed by
//!   [`CpuCostModel::cpu_ns`] (page-table and allocator steps, command writes, uncontended
//!   atomics, MMIO accesses).
//! - [`Charge::Translation`]: time the IOMMU adds to the device's DMA (IOTLB lookups, walk
//!   reads), summed by [`CpuCostModel::translation_ns`].
//! - [`Charge::Hypervisor`]: time spent in the hypervisor (hypercalls and the TCEs they touch),
//!   summed by [`CpuCostModel::hypervisor_ns`]; it fails if the profile has no hypervisor.
//! - [`Charge::Engine`]: waits on shared hardware the engine models itself (command-queue
//!   consumption and syncs, register flush polling, SBA purges), using the profile's
//!   [`IommuCosts`] accessors. Counting them as CPU time would double-count the wait.
//! - [`Charge::NotCharged`]: counts that carry no cost of their own (the work is charged
//!   through another counter, or by the engine's link and device models).
//!
//! Lock acquisitions (`WorkRecord::locks`) are *not* in `cpu_ns`: the engine models locks as
//! contended resources and charges [`CpuCostModel::lock_uncontended_ns`] per acquisition and
//! [`SyncCosts::lock_handoff`] per hand-off itself. [`CpuCostModel::locks_uncontended_ns`]
//! is there for callers that do not model a lock as a resource.
//!
//! All conversions return `f64` nanoseconds, summed in a fixed order, so results are
//! deterministic; the engine rounds to its integer time base where it schedules events.
//! [`CpuCostModel::record_cost`] returns a record's conversions at once and keeps the last
//! few records' costs (records repeat from I/O to I/O), bit for bit the computed values
//! (docs/model/cost-speed.md).

use std::cell::RefCell;
use std::fmt::{self, Write as _};
use std::path::Path;

use iolab_iommu::work::{LockId, WorkRecord};
use serde::Deserialize;
use toml::de::DeTable;

use crate::tomlfile::{backticked_after, line_col, path_at, span_of_path};

// ---------------------------------------------------------------------------------------------
// Values
// ---------------------------------------------------------------------------------------------

/// The unit a [`Cost`] value is written in.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
pub enum Unit {
    /// Nanoseconds (the default).
    #[default]
    #[serde(rename = "ns")]
    Ns,
    /// CPU cycles at the profile's `cpu.clock_ghz`.
    #[serde(rename = "cycles")]
    Cycles,
}

impl Unit {
    /// The unit as written in profiles and tables.
    pub const fn name(self) -> &'static str {
        match self {
            Unit::Ns => "ns",
            Unit::Cycles => "cycles",
        }
    }
}

/// One time cost with its source.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Cost {
    /// The value, in [`Cost::unit`]s; finite and `>= 0`.
    pub value: f64,
    /// The unit of `value` (`"ns"` unless the entry says `"cycles"`).
    #[serde(default)]
    pub unit: Unit,
    /// A citation, or `assumption: ...` with the reasoning. Never empty.
    pub source: String,
    /// The value in nanoseconds, resolved against the CPU clock when the profile is loaded.
    #[serde(skip)]
    ns: f64,
}

impl Cost {
    /// The cost in nanoseconds (cycles are converted at the profile's CPU clock).
    #[inline]
    pub fn ns(&self) -> f64 {
        self.ns
    }
}

/// A bandwidth with its source.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Bandwidth {
    /// Gigabytes (10^9 bytes) per second, which is also bytes per nanosecond; finite, `> 0`.
    pub gb_per_s: f64,
    /// A citation, or `assumption: ...` with the reasoning. Never empty.
    pub source: String,
}

/// A yes/no fact of the hardware with its source, written `{ value = 0 | 1, source = "..." }`.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Flag {
    /// `1` (yes) or `0` (no); other values are refused when the profile is loaded.
    pub value: u8,
    /// A citation, or `assumption: ...` with the reasoning. Never empty.
    pub source: String,
}

/// A count of hardware units with its source, written `{ value = N, source = "..." }`.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Count {
    /// The count; at least 1 (checked when the profile is loaded).
    pub value: u32,
    /// A citation, or `assumption: ...` with the reasoning. Never empty.
    pub source: String,
}

/// An IOTLB's geometry with its source, written
/// `{ entries = N, ways = W, index = "low-bits" | "folded", source = "..." }`.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct IotlbGeometry {
    /// Total entries; 1 to 65,536.
    pub entries: u32,
    /// Entries per set; divides `entries`.
    pub ways: u32,
    /// How a page picks its set: `"low-bits"` (the page number's low bits) or `"folded"`
    /// (its bits folded together, [`iolab_iommu::iotlb::SetIndex::Folded`]).
    pub index: String,
    /// A citation, or `assumption: ...` with the reasoning. Never empty.
    pub source: String,
}

impl IotlbGeometry {
    /// The IOTLB configuration (LRU replacement), when the fields are valid.
    pub fn config(&self) -> Option<iolab_iommu::iotlb::IotlbConfig> {
        use iolab_iommu::iotlb::{IotlbConfig, Replacement, SetIndex};
        let index = match self.index.as_str() {
            "low-bits" => SetIndex::LowBits,
            "folded" => SetIndex::Folded,
            _ => return None,
        };
        let c = IotlbConfig::new(self.entries as usize, self.ways as usize, Replacement::Lru)
            .with_index(index);
        c.validate().ok().map(|()| c)
    }
}

impl Flag {
    /// Whether the fact holds (`value = 1`).
    #[inline]
    pub fn is_set(&self) -> bool {
        self.value == 1
    }
}

impl Bandwidth {
    /// Nanoseconds to move `bytes` at this bandwidth.
    #[inline]
    pub fn ns_for(&self, bytes: u64) -> f64 {
        bytes as f64 / self.gb_per_s
    }
}

// ---------------------------------------------------------------------------------------------
// Groups
// ---------------------------------------------------------------------------------------------

/// Declares a cost group: a struct whose `costs` are all [`Cost`]s (listed in `FIELDS`),
/// with optional leading `plain` fields of other types.
macro_rules! cost_group {
    (
        $(#[$meta:meta])*
        pub struct $name:ident {
            plain { $( $(#[$pmeta:meta])* $pfield:ident : $pty:ty ),* $(,)? }
            costs { $( $(#[$fmeta:meta])* $field:ident ),* $(,)? }
        }
    ) => {
        $(#[$meta])*
        #[derive(Clone, Debug, PartialEq, Deserialize)]
        #[serde(deny_unknown_fields)]
        pub struct $name {
            $( $(#[$pmeta])* pub $pfield: $pty, )*
            $( $(#[$fmeta])* pub $field: Cost, )*
        }

        impl $name {
            /// The names of this group's cost fields, in declaration order.
            pub const FIELDS: &'static [&'static str] = &[$(stringify!($field)),*];

            #[allow(dead_code)] // unused by groups without costs
            fn entries(&self) -> Vec<(&'static str, &Cost)> {
                vec![$((stringify!($field), &self.$field)),*]
            }

            #[allow(dead_code)]
            fn entries_mut(&mut self) -> Vec<(&'static str, &mut Cost)> {
                vec![$((stringify!($field), &mut self.$field)),*]
            }
        }
    };
}

cost_group! {
    /// The CPU: identity and the uncontended cost of each primitive step the stack counts.
    ///
    /// Steps are charged per counted unit (see [`COUNTER_CHARGES`] for which counter uses
    /// which field); the work a step triggers elsewhere (locks, commands, MMIO) is counted
    /// and charged separately, so these are the step's own costs only.
    pub struct CpuCosts {
        plain {
            /// The core model, e.g. `"Cortex-A57"`.
            model: String,
            /// The clock in GHz, used to convert `unit = "cycles"` entries; `> 0`.
            clock_ghz: f64,
            /// Cores (logical CPUs) the lab can run threads on; `>= 1`.
            cores: u32,
            /// Where model, clock and core count come from.
            source: String,
        }
        costs {
            /// Writing one page-table entry (leaf or table descriptor).
            pte_write,
            /// Clearing one page-table entry.
            pte_clear,
            /// Reading one page-table entry during a software walk.
            pte_read,
            /// Allocating (and zeroing) one page-table page.
            table_alloc,
            /// Freeing one page-table page.
            table_free,
            /// One cache clean for a non-coherent table walker (per PTE write batch).
            cache_clean,
            /// Visiting one IOVA-tree node (search, insert, delete, rebalance).
            tree_node_visit,
            /// One tree rotation while rebalancing.
            tree_rotation,
            /// A per-CPU magazine cache hit.
            magazine_hit,
            /// A per-CPU magazine cache miss (the bookkeeping before falling to the tree).
            magazine_miss,
            /// Exchanging one magazine with the shared depot.
            depot_exchange,
            /// The fixed part of flushing all per-CPU caches after an allocation failure.
            rcache_flush,
            /// Scanning one 64-bit bitmap word.
            bitmap_word_scan,
            /// The error path of one failed IOVA allocation.
            alloc_failure,
            /// Driver bookkeeping for one gathered range invalidation.
            inval_range,
            /// Driver bookkeeping per page covered by a range invalidation.
            inval_page,
            /// Driver bookkeeping for one walk-cache (table) invalidation.
            inval_walk,
            /// Driver bookkeeping for one whole-domain invalidation.
            inval_domain,
            /// Queueing one IOVA on a lazy flush queue.
            flush_queue_add,
            /// The fixed part of one lazy flush-queue flush.
            flush_queue_flush,
            /// Returning one IOVA from a flush queue after its flush completed.
            flush_queue_free,
            /// Building and writing one 16-byte command into an IOMMU command queue.
            command_write,
            /// The extra work of one command-queue owner election won.
            owner_election,
            /// One system call entry and exit (charged by workloads, not by work records).
            syscall,
        }
    }
}

cost_group! {
    /// Atomics executed at a line's home instead of in the CPU's cache (Arm LSE far
    /// atomics): the engine's [`AtomicsAt::Far`](crate::resources::AtomicsAt::Far).
    pub struct FarAtomicCosts {
        plain {}
        costs {
            /// The home's time per atomic (it executes one at a time).
            service,
        }
    }
}

cost_group! {
    /// Synchronisation primitives, uncontended; the engine adds contention itself.
    pub struct SyncCosts {
        plain {
            /// Present when the CPUs execute atomics on contended lines at the line's home
            /// (far atomics); absent, atomics are near (in the CPU's cache).
            #[serde(default)]
            far_atomics: Option<FarAtomicCosts>,
        }
        costs {
            /// An uncontended atomic read-modify-write (CAS, fetch-add) on an owned line.
            atomic_rmw,
            /// Moving one dirty cache line from another core (a failed CAS pays one).
            cacheline_transfer,
            /// Acquiring and releasing an uncontended spinlock.
            lock_acquire_release,
            /// Handing a contended lock to the next waiter (release to waiter's ownership).
            lock_handoff,
        }
    }
}

cost_group! {
    /// Where the CPUs sit and what moving a cache line between two of them costs (the
    /// engine's [`Topology`](crate::engine::Topology)). CPUs are numbered consecutively
    /// through clusters, dies and sockets. Optional: without it every transfer costs
    /// `sync.cacheline_transfer`.
    pub struct TopologyCosts {
        plain {
            /// Cores sharing a cluster (an L2 or cluster cache); `>= 1`.
            cores_per_cluster: u32,
            /// Clusters per die; `>= 1`.
            clusters_per_die: u32,
            /// Dies per socket; `>= 1`.
            dies_per_socket: u32,
            /// Where the layout comes from.
            source: String,
        }
        costs {
            /// A line transfer between two cores of one cluster.
            same_cluster,
            /// Between two clusters of one die.
            same_die,
            /// Between two dies of one socket.
            other_die,
            /// Between two sockets.
            other_socket,
        }
    }
}

cost_group! {
    /// Device-register (MMIO) accesses from the CPU.
    pub struct MmioCosts {
        plain {}
        costs {
            /// A non-posted register read: the CPU stalls for the round trip.
            read,
            /// A posted register write: the CPU's cost to issue and order it.
            write,
        }
    }
}

cost_group! {
    /// Command-queue timings (SMMUv3-style IOMMUs).
    pub struct CmdqCosts {
        plain {
            /// Whether the SMMU completes `CMD_SYNC` with an MSI write the CPU polls in memory
            /// (`1`; SMMU_IDR0.MSI with coherent access) or the CPU polls the CONS register
            /// (`0`). Optional: absent, the command-queue model's default (MSI) applies.
            #[serde(default)]
            sync_msi: Option<Flag>,
            /// Whether the SMMU implements SMMUv3.2 range invalidation (`1`; SMMU_IDR3.RIL):
            /// the lab's default for `iommu.range_invalidation`. Optional: absent, `0`.
            #[serde(default)]
            range_invalidation: Option<Flag>,
        }
        costs {
            /// Time the IOMMU takes to fetch and execute one command.
            command_consume,
            /// Completion latency of a sync once the commands before it are consumed.
            sync_latency,
        }
    }
}

cost_group! {
    /// Register-flush timings (IOMMUs invalidated by a register write and a poll or read-back).
    pub struct RegisterFlushCosts {
        plain {}
        costs {
            /// Time the hardware takes to complete one flush or purge after the register write.
            flush_duration,
            /// The step at which software re-checks completion (the poll interval).
            poll_interval,
        }
    }
}

cost_group! {
    /// The IOMMU hardware.
    pub struct IommuCosts {
        plain {
            /// The IOMMU model, e.g. `"SMMUv3"`.
            model: String,
            /// Where the model facts come from.
            source: String,
            /// Command-queue timings; present for command-queue IOMMUs only.
            cmdq: Option<CmdqCosts>,
            /// Register-flush timings; present for IOMMUs flushed by register write.
            register_flush: Option<RegisterFlushCosts>,
            /// Page walks the unit serves at once (the DMA port's walkers,
            /// [`crate::iommu::port`]); one when absent.
            #[serde(default)]
            walkers: Option<Count>,
            /// The unit's IOTLB (VT-d and AMD-Vi units); the model's default when absent.
            #[serde(default)]
            iotlb: Option<IotlbGeometry>,
        }
        costs {
            /// One IOTLB lookup (hit or miss).
            iotlb_lookup,
            /// One memory read by the hardware table walker.
            walk_read,
            /// One walk-cache lookup.
            walk_cache_lookup,
        }
    }
}

cost_group! {
    /// Hypervisor costs for IOMMUs managed through hypercalls (POWER TCE under PowerVM).
    pub struct HypervisorCosts {
        plain {}
        costs {
            /// A hypercall's base round trip (a null hypercall).
            call,
            /// Per TCE hypercall: invalidating the host bridge's cached TCEs.
            tce_invalidate,
            /// Per TCE validated and written by `H_PUT_TCE`.
            tce_put,
            /// Per TCE validated and written by `H_PUT_TCE_INDIRECT`.
            tce_indirect,
            /// Per TCE cleared by `H_STUFF_TCE`.
            tce_stuff,
        }
    }
}

cost_group! {
    /// The kernel's and fio's per-I/O costs on the block path, around the DMA mapping and
    /// the device (docs/model/io-path.md). `block_submit` and `block_complete` are totals
    /// for libaio on a direct-I/O file; `aio_submit`, `file_ref` and `page_pin` are shares
    /// of `block_submit`, and `wakeup` a share of `block_complete`, that other I/O engines
    /// replace or save (`workload.ioengine`).
    pub struct IoPathCosts {
        plain {}
        costs {
            /// The kernel's submission of one I/O below the system call's entry, for libaio:
            /// the iocb, the file reference, pinning the user buffer, the direct-I/O bio
            /// and the blk-mq request (the driver's own work is `nvme_submit`).
            block_submit,
            /// The kernel's completion of one I/O above the driver: blk-mq completion, bio
            /// end and unpin, the completion event, and waking the waiting thread.
            block_complete,
            /// libaio's own share of `block_submit` (copying the iocb, the kiocb, posting and
            /// copying out the event): what psync does not do and io_uring replaces.
            aio_submit,
            /// io_uring's own per-I/O work in place of `aio_submit` (the SQE, the request
            /// from its cache, the CQE).
            uring_submit,
            /// The share of `block_submit` that takes and drops the file reference, which
            /// io_uring's `registerfiles` saves.
            file_ref,
            /// The share of `block_submit` that pins and later unpins the user buffer, which
            /// io_uring's `fixedbufs` saves.
            page_pin,
            /// The share of `block_complete` that wakes the sleeping thread and switches to
            /// it, which polled completions (`hipri`) save.
            wakeup,
            /// Entry into and exit from one completion interrupt.
            irq_entry,
            /// One completion found by polling the queue (`hipri`), in place of an interrupt.
            poll_check,
            /// fio's own user-space work per I/O step, charged once at issue and once at reap.
            fio_user,
            /// The NVMe driver's submission of one command (`nvme_queue_rq`: the command and
            /// its PRPs, the copy into the submission queue); the doorbell is `mmio.write`.
            nvme_submit,
            /// The NVMe driver's handling of one completion entry.
            nvme_complete,
        }
    }
}

cost_group! {
    /// Memory.
    pub struct MemoryCosts {
        plain {
            /// Single-thread `memcpy` bandwidth (bounce buffers, copies by the CPU).
            memcpy_bandwidth: Bandwidth,
        }
        costs {}
    }
}

impl IoPathCosts {
    /// Checks that the shares fit in their totals: `aio_submit + file_ref + page_pin <=
    /// block_submit` and `wakeup <= block_complete` (compared in ns at `clock_ghz`).
    fn check_shares(&self, clock_ghz: f64) -> Result<(), (String, String)> {
        let ns = |c: &Cost| match c.unit {
            Unit::Ns => c.value,
            Unit::Cycles => c.value / clock_ghz,
        };
        let shares = ns(&self.aio_submit) + ns(&self.file_ref) + ns(&self.page_pin);
        if shares > ns(&self.block_submit) + 1e-9 {
            return Err((
                "io_path.block_submit.value".into(),
                format!(
                    "expected at least its shares aio_submit + file_ref + page_pin ({shares:.1} ns), found {:.1} ns",
                    ns(&self.block_submit)
                ),
            ));
        }
        if ns(&self.wakeup) > ns(&self.block_complete) + 1e-9 {
            return Err((
                "io_path.block_complete.value".into(),
                format!(
                    "expected at least its share wakeup ({:.1} ns), found {:.1} ns",
                    ns(&self.wakeup),
                    ns(&self.block_complete)
                ),
            ));
        }
        Ok(())
    }
}

/// The hypercall kinds that touch TCEs, for [`HypervisorCosts::call_ns`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TceCall {
    /// `H_PUT_TCE`: one TCE.
    Put,
    /// `H_PUT_TCE_INDIRECT`: up to 512 TCEs from a list page.
    PutIndirect,
    /// `H_STUFF_TCE`: clear up to 512 TCEs.
    Stuff,
}

impl HypervisorCosts {
    /// Nanoseconds for one hypercall of `kind` touching `tces` TCEs: base round trip,
    /// host-bridge TCE invalidation, and the per-TCE cost of that call kind.
    pub fn call_ns(&self, kind: TceCall, tces: u64) -> f64 {
        let per_tce = match kind {
            TceCall::Put => &self.tce_put,
            TceCall::PutIndirect => &self.tce_indirect,
            TceCall::Stuff => &self.tce_stuff,
        };
        self.call.ns() + self.tce_invalidate.ns() + tces as f64 * per_tce.ns()
    }

    /// Replaces the per-TCE cost of `H_PUT_TCE` (`tce_put`) by `value` in `unit` (cycles
    /// at `clock_ghz`, or ns), and moves `tce_indirect` with it: `H_PUT_TCE_INDIRECT` does
    /// the same per-TCE validation and store plus reading the entry from the guest's list
    /// page, so its cost is the new `tce_put` plus the profile's own difference
    /// `tce_indirect - tce_put` (in cycles, at least 0). One override of `tce_put` (a
    /// calibration, a scenario's `machine.costs."hypervisor.tce_put"`) therefore moves both,
    /// as the pseries-ddw experiment has always priced it. Call
    /// [`PlatformProfile::revalidate`] afterwards so the nanosecond values follow.
    pub fn set_tce_put(&mut self, clock_ghz: f64, value: f64, unit: Unit, source: &str) {
        let in_cycles = |value: f64, unit: Unit| match unit {
            Unit::Cycles => value,
            Unit::Ns => value * clock_ghz,
        };
        let extra = (in_cycles(self.tce_indirect.value, self.tce_indirect.unit)
            - in_cycles(self.tce_put.value, self.tce_put.unit))
        .max(0.0);
        self.tce_put.value = value;
        self.tce_put.unit = unit;
        self.tce_put.source = source.to_owned();
        self.tce_indirect.value = in_cycles(value, unit) + extra;
        self.tce_indirect.unit = Unit::Cycles;
        self.tce_indirect.source = format!(
            "hypervisor.tce_put ({source}) plus the profile's list-page read ({extra} cycles)"
        );
    }
}

// ---------------------------------------------------------------------------------------------
// The profile
// ---------------------------------------------------------------------------------------------

/// A platform profile: what each primitive step costs on one machine, with sources.
///
/// Build one with [`PlatformProfile::from_toml_str`], [`PlatformProfile::from_file`] or
/// [`PlatformProfile::bundled`]; all of them validate (finite, non-negative values, a
/// positive clock, non-empty sources) and resolve every cost to nanoseconds. The fields are
/// public to read; after editing one in place (a scenario override, a calibrated value),
/// call [`PlatformProfile::revalidate`] so the checks and the nanosecond values follow.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PlatformProfile {
    /// Short name, e.g. `"rcar-h3"`.
    pub name: String,
    /// One line saying what machine this is.
    pub description: String,
    /// CPU identity and per-step costs.
    pub cpu: CpuCosts,
    /// Atomics, cache-line transfers and locks.
    pub sync: SyncCosts,
    /// CPU placement and distance-dependent line transfers, if the profile has them.
    #[serde(default)]
    pub topology: Option<TopologyCosts>,
    /// MMIO accesses.
    pub mmio: MmioCosts,
    /// The IOMMU hardware.
    pub iommu: IommuCosts,
    /// The hypervisor, for platforms whose IOMMU is driven by hypercalls.
    pub hypervisor: Option<HypervisorCosts>,
    /// Memory bandwidth.
    pub memory: MemoryCosts,
    /// The kernel's and fio's per-I/O costs on the block path.
    pub io_path: IoPathCosts,
    /// Where the profile was read from (file name or `bundled:NAME`).
    #[serde(skip)]
    origin: String,
}

/// Most cores a profile may declare: the engine's virtual-CPU cap ([`crate::engine::MAX_CPUS`]).
pub const MAX_CORES: u32 = crate::engine::MAX_CPUS as u32;
/// Slowest CPU clock a profile may declare, GHz.
pub const MIN_CLOCK_GHZ: f64 = 0.01;
/// Fastest CPU clock a profile may declare, GHz.
pub const MAX_CLOCK_GHZ: f64 = 100.0;
/// Largest unit cost a profile may declare, in its unit (ns or cycles): 1000 s at 1 GHz,
/// far above any hardware step, and small enough that sums of costs stay finite.
pub const MAX_COST_VALUE: f64 = 1e12;
/// Slowest memcpy bandwidth a profile may declare, GB/s.
pub const MIN_BANDWIDTH_GB_PER_S: f64 = 0.001;
/// Fastest memcpy bandwidth a profile may declare, GB/s.
pub const MAX_BANDWIDTH_GB_PER_S: f64 = 100_000.0;

/// The bundled profiles, embedded at build time (also on disk in `scenarios/platforms/`).
const BUNDLED: &[(&str, &str)] = &[
    (
        "rcar-h3",
        include_str!("../../../scenarios/platforms/rcar-h3.toml"),
    ),
    (
        "hisilicon-d05",
        include_str!("../../../scenarios/platforms/hisilicon-d05.toml"),
    ),
    (
        "hisilicon-d06",
        include_str!("../../../scenarios/platforms/hisilicon-d06.toml"),
    ),
    (
        "hp-zx1",
        include_str!("../../../scenarios/platforms/hp-zx1.toml"),
    ),
    (
        "power-lpar",
        include_str!("../../../scenarios/platforms/power-lpar.toml"),
    ),
    (
        "nvidia-grace",
        include_str!("../../../scenarios/platforms/nvidia-grace.toml"),
    ),
    (
        "intel-icelake-2s",
        include_str!("../../../scenarios/platforms/intel-icelake-2s.toml"),
    ),
    (
        "intel-sapphire-rapids-2s",
        include_str!("../../../scenarios/platforms/intel-sapphire-rapids-2s.toml"),
    ),
    (
        "amd-epyc-genoa-2s",
        include_str!("../../../scenarios/platforms/amd-epyc-genoa-2s.toml"),
    ),
    (
        "intel-cascadelake-4s",
        include_str!("../../../scenarios/platforms/intel-cascadelake-4s.toml"),
    ),
];

impl PlatformProfile {
    /// Parses and validates a profile. `origin` names the input in errors (a file name).
    pub fn from_toml_str(text: &str, origin: &str) -> Result<Self, CostError> {
        let doc = match DeTable::parse(text) {
            Ok(doc) => doc,
            Err(e) => {
                let (line, column) = e.span().map_or((1, 1), |s| line_col(text, s.start));
                return Err(CostError::Syntax {
                    origin: origin.to_owned(),
                    line,
                    column,
                    message: e.message().to_owned(),
                });
            }
        };
        let mut profile: PlatformProfile = match toml::from_str(text) {
            Ok(p) => p,
            Err(e) => return Err(field_error_from_toml(text, origin, doc.get_ref(), &e)),
        };
        profile.origin = origin.to_owned();
        if let Err((field, problem)) = profile.validate() {
            let (line, column) = match span_of_path(doc.get_ref(), &field) {
                Some(s) => {
                    let (l, c) = line_col(text, s.start);
                    (Some(l), Some(c))
                }
                None => (None, None),
            };
            return Err(CostError::Field {
                origin: origin.to_owned(),
                line,
                column,
                field,
                problem,
            });
        }
        profile.resolve();
        Ok(profile)
    }

    /// Re-runs the checks after in-place edits and re-resolves every cost to nanoseconds
    /// (cycle costs follow a changed `cpu.clock_ghz`). Errors name the field.
    pub fn revalidate(&mut self) -> Result<(), CostError> {
        if let Err((field, problem)) = self.validate() {
            return Err(CostError::Field {
                origin: self.origin.clone(),
                line: None,
                column: None,
                field,
                problem,
            });
        }
        self.resolve();
        Ok(())
    }

    /// Reads, parses and validates a profile file. Errors name the file.
    pub fn from_file(path: impl AsRef<Path>) -> Result<Self, CostError> {
        let path = path.as_ref();
        let text = std::fs::read_to_string(path).map_err(|source| CostError::Read {
            path: path.display().to_string(),
            source,
        })?;
        Self::from_toml_str(&text, &path.display().to_string())
    }

    /// A bundled profile by name (see [`PlatformProfile::bundled_names`]).
    pub fn bundled(name: &str) -> Result<Self, CostError> {
        let text = Self::bundled_toml(name).ok_or_else(|| CostError::UnknownBundled {
            name: name.to_owned(),
            known: Self::bundled_names().join(", "),
        })?;
        Self::from_toml_str(text, &format!("scenarios/platforms/{name}.toml"))
    }

    /// The TOML text of a bundled profile, as embedded in the binary.
    pub fn bundled_toml(name: &str) -> Option<&'static str> {
        BUNDLED.iter().find(|(n, _)| *n == name).map(|(_, t)| *t)
    }

    /// The names of the bundled profiles.
    pub fn bundled_names() -> Vec<&'static str> {
        BUNDLED.iter().map(|(n, _)| *n).collect()
    }

    /// Where this profile was read from.
    pub fn origin(&self) -> &str {
        &self.origin
    }

    /// The costs of atomics on a shared cache line: an uncontended atomic, the flat
    /// line transfer, and where atomics execute (`sync.far_atomics`).
    pub fn line_params(&self) -> crate::resources::LineParams {
        let r = |c: &Cost| c.ns().round() as u64;
        crate::resources::LineParams {
            base_ns: r(&self.sync.atomic_rmw),
            transfer_ns: r(&self.sync.cacheline_transfer),
            atomics: match &self.sync.far_atomics {
                Some(f) => crate::resources::AtomicsAt::Far {
                    service_ns: r(&f.service).max(1),
                },
                None => crate::resources::AtomicsAt::Near,
            },
        }
    }

    /// The DMA port's unit parameters of this profile: its walkers (`iommu.walkers`, one
    /// when absent) and walk costs.
    pub fn port_params(&self) -> crate::iommu::port::PortParams {
        crate::iommu::port::PortParams {
            walkers: self.iommu.walkers.as_ref().map_or(1, |w| w.value as usize),
            walk_read_ns: self.iommu.walk_read.ns(),
            walk_cache_lookup_ns: self.iommu.walk_cache_lookup.ns(),
        }
    }

    /// The engine topology of this profile (`None` without a `[topology]` group).
    pub fn engine_topology(&self) -> Option<crate::engine::Topology> {
        let t = self.topology.as_ref()?;
        let r = |c: &Cost| c.ns().round() as u64;
        Some(crate::engine::Topology::new(
            t.cores_per_cluster,
            t.clusters_per_die,
            t.dies_per_socket,
            crate::engine::TransferCosts {
                same_cluster_ns: r(&t.same_cluster),
                same_die_ns: r(&t.same_die),
                other_die_ns: r(&t.other_die),
                other_socket_ns: r(&t.other_socket),
            },
        ))
    }

    /// The hypervisor costs, or an error naming the profile if it has none.
    pub fn require_hypervisor(&self) -> Result<&HypervisorCosts, CostError> {
        self.hypervisor
            .as_ref()
            .ok_or_else(|| self.missing("hypervisor", "hypercall costs (H_PUT_TCE, ...)"))
    }

    /// The IOMMU command-queue costs, or an error naming the profile if it has none.
    pub fn require_cmdq(&self) -> Result<&CmdqCosts, CostError> {
        self.iommu
            .cmdq
            .as_ref()
            .ok_or_else(|| self.missing("iommu.cmdq", "a command-queue IOMMU model"))
    }

    /// The IOMMU register-flush costs, or an error naming the profile if it has none.
    pub fn require_register_flush(&self) -> Result<&RegisterFlushCosts, CostError> {
        self.iommu.register_flush.as_ref().ok_or_else(|| {
            self.missing(
                "iommu.register_flush",
                "a register-flushed IOMMU model (IPMMU, SBA)",
            )
        })
    }

    fn missing(&self, group: &str, needed_for: &str) -> CostError {
        CostError::MissingGroup {
            origin: self.origin.clone(),
            profile: self.name.clone(),
            group: group.to_owned(),
            needed_for: needed_for.to_owned(),
        }
    }

    /// The cost at a dotted path such as `"iommu.cmdq.sync_latency"`, if this profile has it.
    pub fn cost(&self, path: &str) -> Option<&Cost> {
        self.costs()
            .into_iter()
            .find(|(p, _)| p == path)
            .map(|(_, c)| c)
    }

    /// The cost at a dotted path, for an in-place override (call
    /// [`PlatformProfile::revalidate`] afterwards so its nanoseconds follow).
    pub fn cost_mut(&mut self, path: &str) -> Option<&mut Cost> {
        let (group, field) = path.rsplit_once('.')?;
        let entries = match group {
            "cpu" => self.cpu.entries_mut(),
            "sync" => self.sync.entries_mut(),
            "sync.far_atomics" => self.sync.far_atomics.as_mut()?.entries_mut(),
            "topology" => self.topology.as_mut()?.entries_mut(),
            "mmio" => self.mmio.entries_mut(),
            "iommu" => self.iommu.entries_mut(),
            "iommu.cmdq" => self.iommu.cmdq.as_mut()?.entries_mut(),
            "iommu.register_flush" => self.iommu.register_flush.as_mut()?.entries_mut(),
            "hypervisor" => self.hypervisor.as_mut()?.entries_mut(),
            "io_path" => self.io_path.entries_mut(),
            _ => return None,
        };
        entries
            .into_iter()
            .find(|(name, _)| *name == field)
            .map(|(_, c)| c)
    }

    /// Every cost this profile has, with its dotted path, in a stable order.
    pub fn costs(&self) -> Vec<(String, &Cost)> {
        let mut out = Vec::new();
        collect(&mut out, "cpu", self.cpu.entries());
        collect(&mut out, "sync", self.sync.entries());
        if let Some(f) = &self.sync.far_atomics {
            collect(&mut out, "sync.far_atomics", f.entries());
        }
        if let Some(t) = &self.topology {
            collect(&mut out, "topology", t.entries());
        }
        collect(&mut out, "mmio", self.mmio.entries());
        collect(&mut out, "iommu", self.iommu.entries());
        if let Some(q) = &self.iommu.cmdq {
            collect(&mut out, "iommu.cmdq", q.entries());
        }
        if let Some(f) = &self.iommu.register_flush {
            collect(&mut out, "iommu.register_flush", f.entries());
        }
        if let Some(h) = &self.hypervisor {
            collect(&mut out, "hypervisor", h.entries());
        }
        collect(&mut out, "io_path", self.io_path.entries());
        out
    }

    /// The dotted path of every cost field a profile can have (optional groups included).
    pub fn cost_paths() -> Vec<String> {
        let groups: [(&str, &[&str]); 10] = [
            ("cpu", CpuCosts::FIELDS),
            ("sync", SyncCosts::FIELDS),
            ("sync.far_atomics", FarAtomicCosts::FIELDS),
            ("topology", TopologyCosts::FIELDS),
            ("mmio", MmioCosts::FIELDS),
            ("iommu", IommuCosts::FIELDS),
            ("iommu.cmdq", CmdqCosts::FIELDS),
            ("iommu.register_flush", RegisterFlushCosts::FIELDS),
            ("hypervisor", HypervisorCosts::FIELDS),
            ("io_path", IoPathCosts::FIELDS),
        ];
        groups
            .iter()
            .flat_map(|(g, fields)| fields.iter().map(move |f| format!("{g}.{f}")))
            .collect()
    }

    /// Semantic checks; on failure returns the field path and what was expected.
    fn validate(&mut self) -> Result<(), (String, String)> {
        non_empty("name", &self.name)?;
        non_empty("description", &self.description)?;
        non_empty("cpu.model", &self.cpu.model)?;
        non_empty("cpu.source", &self.cpu.source)?;
        let clock = self.cpu.clock_ghz;
        if !(clock.is_finite() && (MIN_CLOCK_GHZ..=MAX_CLOCK_GHZ).contains(&clock)) {
            return Err((
                "cpu.clock_ghz".into(),
                format!(
                    "expected a clock of {MIN_CLOCK_GHZ} to {MAX_CLOCK_GHZ} GHz, found {clock}"
                ),
            ));
        }
        if self.cpu.cores == 0 || self.cpu.cores > MAX_CORES {
            return Err((
                "cpu.cores".into(),
                format!(
                    "expected 1 to {MAX_CORES} cores (the lab's virtual-CPU cap), found {}",
                    self.cpu.cores
                ),
            ));
        }
        if let Some(t) = &self.topology {
            for (field, n) in [
                ("cores_per_cluster", t.cores_per_cluster),
                ("clusters_per_die", t.clusters_per_die),
                ("dies_per_socket", t.dies_per_socket),
            ] {
                if n == 0 || n > MAX_CORES {
                    return Err((
                        format!("topology.{field}"),
                        format!("expected 1 to {MAX_CORES}, found {n}"),
                    ));
                }
            }
            non_empty("topology.source", &t.source)?;
        }
        non_empty("iommu.model", &self.iommu.model)?;
        non_empty("iommu.source", &self.iommu.source)?;
        if let Some(w) = &self.iommu.walkers {
            if w.value == 0 || w.value > 4096 {
                return Err((
                    "iommu.walkers.value".into(),
                    format!("expected 1 to 4096 concurrent walks, found {}", w.value),
                ));
            }
            non_empty("iommu.walkers.source", &w.source)?;
        }
        if let Some(g) = &self.iommu.iotlb {
            if g.config().is_none() {
                return Err((
                    "iommu.iotlb".into(),
                    format!(
                        "expected 1 to 65536 entries in whole sets of `ways` and index \"low-bits\" or \"folded\", found {} entries, {} ways, index {:?}",
                        g.entries, g.ways, g.index
                    ),
                ));
            }
            non_empty("iommu.iotlb.source", &g.source)?;
        }
        let bw = &self.memory.memcpy_bandwidth;
        let range = MIN_BANDWIDTH_GB_PER_S..=MAX_BANDWIDTH_GB_PER_S;
        if !(bw.gb_per_s.is_finite() && range.contains(&bw.gb_per_s)) {
            return Err((
                "memory.memcpy_bandwidth.gb_per_s".into(),
                format!(
                    "expected a bandwidth of {MIN_BANDWIDTH_GB_PER_S} to {MAX_BANDWIDTH_GB_PER_S} GB/s, found {}",
                    bw.gb_per_s
                ),
            ));
        }
        non_empty("memory.memcpy_bandwidth.source", &bw.source)?;
        if let Some(f) = self.iommu.cmdq.as_ref().and_then(|q| q.sync_msi.as_ref()) {
            if f.value > 1 {
                return Err((
                    "iommu.cmdq.sync_msi.value".into(),
                    format!(
                        "expected 0 (no MSI: CONS polling) or 1 (MSI), found {}",
                        f.value
                    ),
                ));
            }
            non_empty("iommu.cmdq.sync_msi.source", &f.source)?;
        }
        if let Some(f) = self
            .iommu
            .cmdq
            .as_ref()
            .and_then(|q| q.range_invalidation.as_ref())
        {
            if f.value > 1 {
                return Err((
                    "iommu.cmdq.range_invalidation.value".into(),
                    format!(
                        "expected 0 (no IDR3.RIL) or 1 (SMMUv3.2 range invalidation), found {}",
                        f.value
                    ),
                ));
            }
            non_empty("iommu.cmdq.range_invalidation.source", &f.source)?;
        }
        for (path, cost) in self.costs() {
            if !(cost.value.is_finite() && (0.0..=MAX_COST_VALUE).contains(&cost.value)) {
                return Err((
                    format!("{path}.value"),
                    format!(
                        "expected a finite number >= 0 and <= {MAX_COST_VALUE:e} ({}), found {}",
                        cost.unit.name(),
                        cost.value
                    ),
                ));
            }
            non_empty(&format!("{path}.source"), &cost.source)?;
        }
        self.io_path.check_shares(clock)
    }

    /// Fills every cost's nanosecond value (cycles at the CPU clock).
    fn resolve(&mut self) {
        let clock = self.cpu.clock_ghz;
        let resolve = |entries: Vec<(&'static str, &mut Cost)>| {
            for (_, c) in entries {
                c.ns = match c.unit {
                    Unit::Ns => c.value,
                    Unit::Cycles => c.value / clock,
                };
            }
        };
        resolve(self.cpu.entries_mut());
        resolve(self.sync.entries_mut());
        if let Some(f) = &mut self.sync.far_atomics {
            resolve(f.entries_mut());
        }
        if let Some(t) = &mut self.topology {
            resolve(t.entries_mut());
        }
        resolve(self.mmio.entries_mut());
        resolve(self.iommu.entries_mut());
        if let Some(q) = &mut self.iommu.cmdq {
            resolve(q.entries_mut());
        }
        if let Some(f) = &mut self.iommu.register_flush {
            resolve(f.entries_mut());
        }
        if let Some(h) = &mut self.hypervisor {
            resolve(h.entries_mut());
        }
        resolve(self.io_path.entries_mut());
    }

    /// The precomputed per-counter weights for converting work records.
    pub fn cpu_cost_model(&self) -> CpuCostModel {
        CpuCostModel::new(self)
    }

    /// This profile as Markdown for docs/MODEL.md: a heading, the CPU and IOMMU facts, and a
    /// table of every cost (field, value, unit, ns, source). Deterministic.
    pub fn markdown_table(&self) -> String {
        let mut s = String::new();
        let _ = writeln!(s, "### `{}`: {}", self.name, md_cell(&self.description));
        let _ = writeln!(s);
        let _ = writeln!(s, "| field | value | unit | ns | source |");
        let _ = writeln!(s, "|---|---|---|---|---|");
        let _ = writeln!(
            s,
            "| cpu.model | {} | | | {} |",
            md_cell(&self.cpu.model),
            md_cell(&self.cpu.source)
        );
        let _ = writeln!(
            s,
            "| cpu.clock_ghz | {} | GHz | | (as cpu.model) |",
            fmt_num(self.cpu.clock_ghz)
        );
        let _ = writeln!(s, "| cpu.cores | {} | | | (as cpu.model) |", self.cpu.cores);
        if let Some(t) = &self.topology {
            let _ = writeln!(
                s,
                "| topology.layout | {} x {} x {} | cores/cluster x clusters/die x dies/socket | | {} |",
                t.cores_per_cluster,
                t.clusters_per_die,
                t.dies_per_socket,
                md_cell(&t.source)
            );
        }
        let _ = writeln!(
            s,
            "| iommu.model | {} | | | {} |",
            md_cell(&self.iommu.model),
            md_cell(&self.iommu.source)
        );
        for (path, c) in self.costs() {
            let _ = writeln!(
                s,
                "| {path} | {} | {} | {} | {} |",
                fmt_num(c.value),
                c.unit.name(),
                fmt_num(c.ns()),
                md_cell(&c.source)
            );
        }
        if let Some(g) = &self.iommu.iotlb {
            let _ = writeln!(
                s,
                "| iommu.iotlb | {} entries, {}-way, {} index | | | {} |",
                g.entries,
                g.ways,
                g.index,
                md_cell(&g.source)
            );
        }
        if let Some(w) = &self.iommu.walkers {
            let _ = writeln!(
                s,
                "| iommu.walkers | {} | walks | | {} |",
                w.value,
                md_cell(&w.source)
            );
        }
        if let Some(f) = self.iommu.cmdq.as_ref().and_then(|q| q.sync_msi.as_ref()) {
            let _ = writeln!(
                s,
                "| iommu.cmdq.sync_msi | {} | | | {} |",
                f.value,
                md_cell(&f.source)
            );
        }
        if let Some(f) = self
            .iommu
            .cmdq
            .as_ref()
            .and_then(|q| q.range_invalidation.as_ref())
        {
            let _ = writeln!(
                s,
                "| iommu.cmdq.range_invalidation | {} | | | {} |",
                f.value,
                md_cell(&f.source)
            );
        }
        let bw = &self.memory.memcpy_bandwidth;
        let _ = writeln!(
            s,
            "| memory.memcpy_bandwidth | {} | GB/s | | {} |",
            fmt_num(bw.gb_per_s),
            md_cell(&bw.source)
        );
        let absent: Vec<&str> = [
            ("sync.far_atomics", self.sync.far_atomics.is_none()),
            ("topology", self.topology.is_none()),
            ("iommu.cmdq", self.iommu.cmdq.is_none()),
            ("iommu.register_flush", self.iommu.register_flush.is_none()),
            ("hypervisor", self.hypervisor.is_none()),
        ]
        .iter()
        .filter(|(_, a)| *a)
        .map(|(g, _)| *g)
        .collect();
        if !absent.is_empty() {
            let _ = writeln!(s);
            let _ = writeln!(
                s,
                "Groups this platform does not have: {}.",
                absent
                    .iter()
                    .map(|g| format!("`{g}`"))
                    .collect::<Vec<_>>()
                    .join(", ")
            );
        }
        s
    }
}

fn collect<'a>(out: &mut Vec<(String, &'a Cost)>, group: &str, entries: Vec<(&str, &'a Cost)>) {
    for (f, c) in entries {
        out.push((format!("{group}.{f}"), c));
    }
}

fn non_empty(field: &str, value: &str) -> Result<(), (String, String)> {
    if value.trim().is_empty() {
        Err((
            field.to_owned(),
            "expected a non-empty string (a citation or `assumption: ...`)".to_owned(),
        ))
    } else {
        Ok(())
    }
}

/// A number for tables: integers without a fraction, others with up to 3 decimals.
fn fmt_num(v: f64) -> String {
    if v == v.trunc() && v.abs() < 1e15 {
        format!("{}", v as i64)
    } else {
        let s = format!("{v:.3}");
        s.trim_end_matches('0').trim_end_matches('.').to_owned()
    }
}

/// Text safe inside a Markdown table cell.
fn md_cell(s: &str) -> String {
    s.split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
        .replace('|', "\\|")
}

// ---------------------------------------------------------------------------------------------
// Counters -> costs
// ---------------------------------------------------------------------------------------------

/// How one [`WorkRecord`] counter is charged (see the module docs for the split).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Charge {
    /// CPU time of the calling thread, at the cost path given, per counted unit.
    Cpu(&'static str),
    /// Time added to the device's DMA by the IOMMU, at the cost path given, per unit.
    Translation(&'static str),
    /// Time in the hypervisor, at the cost path given, per unit.
    Hypervisor(&'static str),
    /// A wait on shared hardware that the engine models itself; says which costs it uses.
    Engine(&'static str),
    /// Carries no cost of its own; says why.
    NotCharged(&'static str),
}

macro_rules! counter_charges {
    ($( $field:ident => $charge:expr ),* $(,)?) => {
        /// Every [`WorkRecord`] counter and how it is charged, in the record's field order.
        pub const COUNTER_CHARGES: &[(&str, Charge)] = &[ $( (stringify!($field), $charge) ),* ];

        const N_CHARGED: usize = [$(stringify!($field)),*].len();

        /// The counters of `w` in [`COUNTER_CHARGES`] order (direct field reads, no copies
        /// of the names: this is the hot path).
        #[inline]
        fn counter_values(w: &WorkRecord) -> [u64; N_CHARGED] {
            [ $( w.$field ),* ]
        }


        /// Counter `i` of `w` ([`COUNTER_CHARGES`] order), to set it in tests.
        #[cfg(test)]
        fn counter_mut(w: &mut WorkRecord, i: usize) -> &mut u64 {
            let fields: [&mut u64; N_CHARGED] = [ $( &mut w.$field ),* ];
            fields.into_iter().nth(i).expect("a counter index")
        }
    };
}

counter_charges! {
    ptes_written => Charge::Cpu("cpu.pte_write"),
    ptes_cleared => Charge::Cpu("cpu.pte_clear"),
    pte_reads => Charge::Cpu("cpu.pte_read"),
    tables_allocated => Charge::Cpu("cpu.table_alloc"),
    tables_freed => Charge::Cpu("cpu.table_free"),
    cache_cleans => Charge::Cpu("cpu.cache_clean"),
    tree_nodes_visited => Charge::Cpu("cpu.tree_node_visit"),
    tree_rotations => Charge::Cpu("cpu.tree_rotation"),
    magazine_hits => Charge::Cpu("cpu.magazine_hit"),
    magazine_misses => Charge::Cpu("cpu.magazine_miss"),
    depot_exchanges => Charge::Cpu("cpu.depot_exchange"),
    rcache_flushes => Charge::Cpu("cpu.rcache_flush"),
    bitmap_words_scanned => Charge::Cpu("cpu.bitmap_word_scan"),
    alloc_failures => Charge::Cpu("cpu.alloc_failure"),
    inval_ranges => Charge::Cpu("cpu.inval_range"),
    inval_pages => Charge::Cpu("cpu.inval_page"),
    inval_walks => Charge::Cpu("cpu.inval_walk"),
    inval_domains => Charge::Cpu("cpu.inval_domain"),
    inval_syncs => Charge::Engine(
        "iommu.cmdq.sync_latency after the queue drains (iommu.cmdq.command_consume per command)"
    ),
    flush_queue_adds => Charge::Cpu("cpu.flush_queue_add"),
    flush_queue_flushes => Charge::Cpu("cpu.flush_queue_flush"),
    flush_queue_frees => Charge::Cpu("cpu.flush_queue_free"),
    dma_bytes => Charge::NotCharged(
        "bytes moved by the device: the engine's link and device models charge them"
    ),
    translations => Charge::NotCharged(
        "each translation's cost is its IOTLB lookups and walk reads, counted separately"
    ),
    commands_written => Charge::Cpu("cpu.command_write"),
    cas_attempts => Charge::Cpu("sync.atomic_rmw"),
    cas_failures => Charge::Cpu("sync.cacheline_transfer"),
    owner_elections => Charge::Cpu("cpu.owner_election"),
    polls => Charge::Engine(
        "iommu.register_flush.poll_interval until iommu.register_flush.flush_duration has passed"
    ),
    hypercalls => Charge::Hypervisor("hypervisor.call + hypervisor.tce_invalidate"),
    tces_touched => Charge::Hypervisor("hypervisor.tce_put"),
    purges => Charge::Engine("iommu.register_flush.flush_duration per purge"),
    iotlb_hits => Charge::Translation("iommu.iotlb_lookup"),
    iotlb_misses => Charge::Translation("iommu.iotlb_lookup + iommu.walk_cache_lookup"),
    iotlb_stale_hits => Charge::NotCharged(
        "a subset of iotlb_hits (already charged); counted for safety reports"
    ),
    walk_reads => Charge::Translation("iommu.walk_read"),
    full_walks => Charge::NotCharged(
        "the walks' reads are counted in walk_reads (already charged)"
    ),
    mmio_writes => Charge::Cpu("mmio.write"),
    mmio_reads => Charge::Cpu("mmio.read"),
    iova_tree_retries => Charge::NotCharged(
        "the retry's steps are counted in tree_nodes_visited"
    ),
    iova_32bit_failures => Charge::NotCharged(
        "the failed try's steps are counted in alloc_failures and tree_nodes_visited"
    ),
    iova_full_range_allocs => Charge::NotCharged(
        "the allocation's steps are counted in the allocator's own counters"
    ),
}

/// Nanoseconds of a `+`-separated list of cost paths in `profile` (0 for absent groups).
fn path_sum_ns(profile: &PlatformProfile, paths: &str) -> Option<f64> {
    let mut sum = 0.0;
    for p in paths.split('+').map(str::trim) {
        sum += profile.cost(p)?.ns();
    }
    Some(sum)
}

/// Per-counter weights (ns per counted unit) precomputed from a profile, so converting a
/// [`WorkRecord`] is a dot product. Build one per profile and reuse it.
///
/// It also keeps a small memo of the last records [`CpuCostModel::record_cost`] priced (a
/// cache, invisible in results: equality and `Debug` ignore it).
#[derive(Clone)]
pub struct CpuCostModel {
    cpu: [f64; N_CHARGED],
    /// The non-zero entries of `cpu`, as (counter index, weight), in index order.
    cpu_terms: Vec<(usize, f64)>,
    /// The weights of the [`Charge::Translation`] counters, in [`TRANSLATION_COUNTERS`] order.
    translation: [f64; N_TRANSLATION],
    /// The non-zero entries of the hypervisor weights, if the profile has the group.
    hypervisor_terms: Option<Vec<(usize, f64)>>,
    lock_ns: f64,
    /// The DMA port's unit parameters ([`PlatformProfile::port_params`]).
    port: crate::iommu::port::PortParams,
    profile_name: String,
    origin: String,
    memo: RefCell<RecordMemo>,
}

impl fmt::Debug for CpuCostModel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CpuCostModel")
            .field("cpu", &self.cpu)
            .field("translation", &self.translation)
            .field("hypervisor_terms", &self.hypervisor_terms)
            .field("lock_ns", &self.lock_ns)
            .field("profile_name", &self.profile_name)
            .field("origin", &self.origin)
            .finish_non_exhaustive()
    }
}

impl PartialEq for CpuCostModel {
    /// Models are equal when they price every record alike: the memo is not compared.
    fn eq(&self, other: &Self) -> bool {
        self.cpu == other.cpu
            && self.cpu_terms == other.cpu_terms
            && self.translation == other.translation
            && self.hypervisor_terms == other.hypervisor_terms
            && self.lock_ns == other.lock_ns
            && self.port == other.port
            && self.profile_name == other.profile_name
            && self.origin == other.origin
    }
}

/// Every conversion of one [`WorkRecord`] the lab's DMA paths need, computed at once by
/// [`CpuCostModel::record_cost`]. Each field is bit for bit what the named method returns.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RecordCost {
    /// [`CpuCostModel::cpu_ns`].
    pub cpu_ns: f64,
    /// [`CpuCostModel::locks_uncontended_ns`].
    pub locks_uncontended_ns: f64,
    /// [`CpuCostModel::hypervisor_ns`], `None` where that is an error (hypercalls counted,
    /// no hypervisor group: call it for the error).
    pub hypervisor_ns: Option<f64>,
    /// [`CpuCostModel::tree_ns`].
    pub tree_ns: f64,
    /// [`CpuCostModel::flush_queue_ns`].
    pub flush_queue_ns: f64,
}

/// How many records the memo of [`CpuCostModel::record_cost`] keeps. A DMA path's records
/// take few shapes (a map that hits the IOVA caches, an unmap, now and then a cache miss
/// with a tree walk), so a handful of entries catch nearly all of them.
const MEMO_ENTRIES: usize = 4;

/// How many counters are priced by [`CpuCostModel::record_cost`] ([`Charge::Cpu`] and
/// [`Charge::Hypervisor`]); the others cannot change a [`RecordCost`].
const N_PRICED: usize = {
    let mut n = 0;
    let mut i = 0;
    while i < COUNTER_CHARGES.len() {
        if matches!(COUNTER_CHARGES[i].1, Charge::Cpu(_) | Charge::Hypervisor(_)) {
            n += 1;
        }
        i += 1;
    }
    n
};

/// The priced counters, as indices into [`COUNTER_CHARGES`] in index order.
const PRICED_COUNTERS: [usize; N_PRICED] = {
    let mut out = [0; N_PRICED];
    let (mut i, mut k) = (0, 0);
    while i < COUNTER_CHARGES.len() {
        if matches!(COUNTER_CHARGES[i].1, Charge::Cpu(_) | Charge::Hypervisor(_)) {
            out[k] = i;
            k += 1;
        }
        i += 1;
    }
    out
};

/// Words of a record's memo key: its priced counters, then its lock counts.
const KEY_WORDS: usize = N_PRICED + LockId::COUNT;

/// A record as the memo compares it: every counter a [`RecordCost`] depends on and every
/// lock count, one array (compared as one block of memory, not field by field).
type RecordKey = [u64; KEY_WORDS];

/// The memo key of `w`: its [`PRICED_COUNTERS`], then its lock counts.
#[inline]
fn record_key(w: &WorkRecord) -> RecordKey {
    let counts = counter_values(w);
    std::array::from_fn(|k| {
        if k < N_PRICED {
            counts[PRICED_COUNTERS[k]]
        } else {
            w.locks[k - N_PRICED]
        }
    })
}

/// Whether two memo keys are equal. The first two words (PTEs written, PTEs cleared)
/// tell most records of different shapes apart (a map from an unmap), so they are compared
/// inline before the whole keys are.
#[inline]
fn same_key(a: &RecordKey, b: &RecordKey) -> bool {
    a[0] == b[0] && a[1] == b[1] && a == b
}

/// The last records priced and their costs, replaced round-robin. Every entry is valid
/// (the empty record's cost at first), so a lookup needs no flags.
#[derive(Clone)]
struct RecordMemo {
    entries: [(RecordKey, RecordCost); MEMO_ENTRIES],
    /// The entry the next miss replaces.
    next: usize,
}

impl RecordMemo {
    /// The kept cost of `key`, if an entry has it.
    #[inline]
    fn find(&self, key: &RecordKey) -> Option<RecordCost> {
        self.entries
            .iter()
            .find(|(k, _)| same_key(k, key))
            .map(|(_, cost)| *cost)
    }

    /// Keeps `cost` as the cost of `key`, in place of the oldest entry.
    fn insert(&mut self, key: RecordKey, cost: RecordCost) {
        let slot = self.next;
        self.entries[slot] = (key, cost);
        self.next = (slot + 1) % MEMO_ENTRIES;
    }
}

impl CpuCostModel {
    /// Precomputes the weights of `profile`.
    pub fn new(profile: &PlatformProfile) -> Self {
        let mut cpu = [0.0; N_CHARGED];
        let mut translation = [0.0; N_CHARGED];
        let mut hypervisor = [0.0; N_CHARGED];
        for (i, (_, charge)) in COUNTER_CHARGES.iter().enumerate() {
            // Every path named here exists in the schema (a unit test checks it); an absent
            // optional group yields 0 and is reported by the accessor that needs it.
            match *charge {
                Charge::Cpu(p) => cpu[i] = path_sum_ns(profile, p).unwrap_or(0.0),
                Charge::Translation(p) => translation[i] = path_sum_ns(profile, p).unwrap_or(0.0),
                Charge::Hypervisor(p) => hypervisor[i] = path_sum_ns(profile, p).unwrap_or(0.0),
                Charge::Engine(_) | Charge::NotCharged(_) => {}
            }
        }
        let empty = WorkRecord::new();
        let zero = RecordCost {
            cpu_ns: 0.0,
            locks_uncontended_ns: 0.0,
            hypervisor_ns: Some(0.0),
            tree_ns: 0.0,
            flush_queue_ns: 0.0,
        };
        let mut model = CpuCostModel {
            cpu,
            cpu_terms: nonzero_terms(&cpu),
            translation: TRANSLATION_COUNTERS.map(|i| translation[i]),
            hypervisor_terms: profile
                .hypervisor
                .as_ref()
                .map(|_| nonzero_terms(&hypervisor)),
            lock_ns: profile.sync.lock_acquire_release.ns(),
            port: profile.port_params(),
            profile_name: profile.name.clone(),
            origin: profile.origin.clone(),
            memo: RefCell::new(RecordMemo {
                entries: [(record_key(&empty), zero); MEMO_ENTRIES],
                next: 0,
            }),
        };
        // The empty record's cost, computed rather than assumed.
        let empty_cost = model.record_cost_uncached(&empty);
        model.memo.get_mut().entries = [(record_key(&empty), empty_cost); MEMO_ENTRIES];
        model
    }

    /// The uncontended CPU time of the counted steps, in ns: the dot product of the
    /// [`Charge::Cpu`] counters with their costs. Excludes locks, engine-modelled waits,
    /// hypervisor time and translation time (see the module docs).
    #[inline]
    pub fn cpu_ns(&self, work: &WorkRecord) -> f64 {
        dot(&counter_values(work), &self.cpu_terms)
    }

    /// The time the IOMMU adds to the device's accesses, in ns ([`Charge::Translation`]).
    ///
    /// The dense sum over the translation counters only, at indices known when the crate is
    /// built (so only those fields are read): the other counters' terms are `+0.0` (zero
    /// weight), which `dot` shows change no bit, and a zero counter is skipped likewise.
    #[inline]
    pub fn translation_ns(&self, work: &WorkRecord) -> f64 {
        self.translation_ns_of(work.iotlb_hits, work.iotlb_misses, work.walk_reads)
    }

    /// The DMA port's unit parameters of the profile this model prices
    /// ([`PlatformProfile::port_params`]).
    pub fn port_params(&self) -> crate::iommu::port::PortParams {
        self.port
    }

    /// A fresh [DMA port](crate::iommu::port) of the profile's unit (its walkers all free).
    pub fn dma_port(&self) -> crate::iommu::port::DmaPort {
        crate::iommu::port::DmaPort::new(self.port)
    }

    /// [`CpuCostModel::translation_ns`] of a record whose translation counters are
    /// `iotlb_hits`, `iotlb_misses` and `walk_reads` (the [`Charge::Translation`] counters,
    /// a unit test checks the list): the same value, bit for bit, without a record (the
    /// lab's block stack counts a transfer's translations in the record of its map).
    #[inline]
    pub fn translation_ns_of(&self, iotlb_hits: u64, iotlb_misses: u64, walk_reads: u64) -> f64 {
        let counts = [iotlb_hits, iotlb_misses, walk_reads];
        let mut acc = [0.0f64; 4];
        for (k, &i) in TRANSLATION_COUNTERS.iter().enumerate() {
            let c = counts[k];
            if c != 0 {
                acc[i & 3] += c as f64 * self.translation[k];
            }
        }
        (acc[0] + acc[1]) + (acc[2] + acc[3])
    }

    /// Hypervisor time in ns ([`Charge::Hypervisor`]: per call, base plus TCE invalidation;
    /// per TCE touched, the `H_PUT_TCE` cost). Zero for a record with no hypercalls; an
    /// error if the record has some and the profile has no hypervisor group.
    pub fn hypervisor_ns(&self, work: &WorkRecord) -> Result<f64, CostError> {
        self.hypervisor_ns_if_priced(work)
            .ok_or_else(|| CostError::MissingGroup {
                origin: self.origin.clone(),
                profile: self.profile_name.clone(),
                group: "hypervisor".into(),
                needed_for: "a work record with hypercalls".into(),
            })
    }

    /// [`CpuCostModel::hypervisor_ns`] without building its error: `None` for a record
    /// with hypercalls or TCEs on a profile without a hypervisor group.
    #[inline]
    fn hypervisor_ns_if_priced(&self, work: &WorkRecord) -> Option<f64> {
        match &self.hypervisor_terms {
            Some(w) => Some(dot(&counter_values(work), w)),
            None if work.hypercalls == 0 && work.tces_touched == 0 => Some(0.0),
            None => None,
        }
    }

    /// Every conversion the lab's DMA paths need of `work` ([`RecordCost`]), bit for bit
    /// what the separate methods return.
    ///
    /// A record's counters repeat from one I/O to the next (every strict map that hits the
    /// IOVA caches counts the same steps), so the costs of the last few records are kept
    /// and a record equal to one of them in every counter charged as CPU or hypervisor
    /// time and every lock count gets its costs back without a dot product. Nothing else
    /// goes into a cost (the other counters are not priced here, the weights are fixed
    /// when the model is built), so a kept cost is exactly the one a computation would
    /// give.
    #[inline(always)]
    pub fn record_cost(&self, work: &WorkRecord) -> RecordCost {
        let key = record_key(work);
        let mut memo = self.memo.borrow_mut();
        if let Some(cost) = memo.find(&key) {
            return cost;
        }
        let cost = self.record_cost_uncached(work);
        memo.insert(key, cost);
        cost
    }

    /// [`CpuCostModel::record_cost`], computed.
    fn record_cost_uncached(&self, work: &WorkRecord) -> RecordCost {
        RecordCost {
            cpu_ns: self.cpu_ns(work),
            locks_uncontended_ns: self.locks_uncontended_ns(work),
            hypervisor_ns: self.hypervisor_ns_if_priced(work),
            tree_ns: self.tree_ns(work),
            flush_queue_ns: self.flush_queue_ns(work),
        }
    }

    /// One uncontended acquire and release of `lock`, in ns. All locks are spinlocks of the
    /// same cost today; the id is there so lock classes can differ later.
    #[inline]
    pub fn lock_uncontended_ns(&self, lock: LockId) -> f64 {
        let _ = lock;
        self.lock_ns
    }

    /// The uncontended cost of every lock acquisition in `work`, in ns, for callers that do
    /// not model locks as contended resources.
    ///
    /// Locks not taken are skipped: their term is `+0.0` (lock costs are finite and
    /// non-negative, checked when the profile is read), which changes no bit of a sum that
    /// starts at `+0.0`. Most records take one lock or none.
    #[inline]
    pub fn locks_uncontended_ns(&self, work: &WorkRecord) -> f64 {
        self.locks_uncontended_ns_except(work, None)
    }

    /// [`CpuCostModel::locks_uncontended_ns`] without the acquisitions of `except` (a lock
    /// the caller does not charge, such as the lab's page-table lock, which stands in for
    /// Linux's cmpxchg-based io-pgtable updates).
    #[inline]
    pub fn locks_uncontended_ns_except(&self, work: &WorkRecord, except: Option<LockId>) -> f64 {
        let mut ns = 0.0;
        for id in LockId::ALL {
            let n = work.lock_count(id);
            if n != 0 && Some(id) != except {
                ns += n as f64 * self.lock_uncontended_ns(id);
            }
        }
        ns
    }

    /// The weight (ns per unit) [`CpuCostModel::cpu_ns`] gives counter `name`, if it exists.
    pub fn cpu_weight(&self, name: &str) -> Option<f64> {
        COUNTER_CHARGES
            .iter()
            .position(|(n, _)| *n == name)
            .map(|i| self.cpu[i])
    }
}

/// Whether two strings are equal, in a `const` context.
const fn const_str_eq(a: &str, b: &str) -> bool {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    if a.len() != b.len() {
        return false;
    }
    let mut i = 0;
    while i < a.len() {
        if a[i] != b[i] {
            return false;
        }
        i += 1;
    }
    true
}

/// The index of counter `name` in [`COUNTER_CHARGES`]; a name that is not there stops the
/// build (the function is only evaluated in constants).
const fn charge_index(name: &str) -> usize {
    let mut i = 0;
    while i < COUNTER_CHARGES.len() {
        if const_str_eq(COUNTER_CHARGES[i].0, name) {
            return i;
        }
        i += 1;
    }
    panic!("not a counter of COUNTER_CHARGES")
}

/// The counters charged under the IOVA tree's lock, as indices into [`COUNTER_CHARGES`]
/// in index order.
const TREE_COUNTERS: [usize; 2] = [
    charge_index("tree_nodes_visited"),
    charge_index("tree_rotations"),
];
/// The counters charged under a flush queue's lock, in index order.
const FLUSH_QUEUE_COUNTERS: [usize; 3] = [
    charge_index("flush_queue_adds"),
    charge_index("flush_queue_flushes"),
    charge_index("flush_queue_frees"),
];

/// How many counters are charged as [`Charge::Translation`].
const N_TRANSLATION: usize = {
    let mut n = 0;
    let mut i = 0;
    while i < COUNTER_CHARGES.len() {
        if matches!(COUNTER_CHARGES[i].1, Charge::Translation(_)) {
            n += 1;
        }
        i += 1;
    }
    n
};

/// The [`Charge::Translation`] counters, as indices into [`COUNTER_CHARGES`] in index
/// order (derived from the table, so a new translation counter joins by itself).
const TRANSLATION_COUNTERS: [usize; N_TRANSLATION] = {
    let mut out = [0; N_TRANSLATION];
    let (mut i, mut k) = (0, 0);
    while i < COUNTER_CHARGES.len() {
        if matches!(COUNTER_CHARGES[i].1, Charge::Translation(_)) {
            out[k] = i;
            k += 1;
        }
        i += 1;
    }
    out
};

impl CpuCostModel {
    /// [`CpuCostModel::cpu_ns`] of a record whose only non-zero counters are the IOVA
    /// tree's of `w` (`tree_nodes_visited`, `tree_rotations`): the CPU time of the work done
    /// under the tree's lock. The same value, bit for bit, without building that record.
    #[inline]
    pub fn tree_ns(&self, w: &WorkRecord) -> f64 {
        self.sparse_cpu_ns(&[
            (TREE_COUNTERS[0], w.tree_nodes_visited),
            (TREE_COUNTERS[1], w.tree_rotations),
        ])
    }

    /// [`CpuCostModel::cpu_ns`] of a record whose only non-zero counters are the flush
    /// queue's of `w` (adds, flushes, frees): the work done under a flush queue's lock.
    /// The same value, bit for bit, without building that record.
    #[inline]
    pub fn flush_queue_ns(&self, w: &WorkRecord) -> f64 {
        self.sparse_cpu_ns(&[
            (FLUSH_QUEUE_COUNTERS[0], w.flush_queue_adds),
            (FLUSH_QUEUE_COUNTERS[1], w.flush_queue_flushes),
            (FLUSH_QUEUE_COUNTERS[2], w.flush_queue_frees),
        ])
    }

    /// The CPU dot product of the counters `parts` (index, value; in index order), every
    /// other counter zero: [`dot`]'s lanes and order, so the result is [`CpuCostModel::cpu_ns`]'s
    /// of that record exactly (a zero counter or weight adds nothing there either).
    #[inline]
    fn sparse_cpu_ns(&self, parts: &[(usize, u64)]) -> f64 {
        let mut acc = [0.0f64; 4];
        for &(i, c) in parts {
            let w = self.cpu[i];
            if c != 0 && w != 0.0 {
                acc[i & 3] += c as f64 * w;
            }
        }
        (acc[0] + acc[1]) + (acc[2] + acc[3])
    }
}

/// The non-zero weights of a dense weight vector, as (counter index, weight) in index order.
fn nonzero_terms(weights: &[f64; N_CHARGED]) -> Vec<(usize, f64)> {
    weights
        .iter()
        .enumerate()
        .filter(|&(_, &w)| w != 0.0)
        .map(|(i, &w)| (i, w))
        .collect()
}

/// The dot product of the counters with the non-zero weights `terms`, skipping zero
/// counters (most of a record's counters are zero).
///
/// The result is exactly the dense four-lane sum the model has always computed: counter
/// `i` goes to accumulator `i % 4`, each lane adds in index order, and the lanes combine
/// as `(a0 + a1) + (a2 + a3)`. Why skipping a term changes no bit:
///
/// - A skipped term is `c as f64 * w` with `c == 0` or `w == 0`. Every weight is `>= +0.0`
///   and finite: profile values are checked finite and in `0..=MAX_COST_VALUE` when read,
///   the clock is at least [`MIN_CLOCK_GHZ`], and a weight is a sum starting at `+0.0`
///   ([`path_sum_ns`]), so even a profile value written `-0.0` gives `+0.0 + -0.0 = +0.0`.
///   So the skipped term is `+0.0` (`0 * w` and `c * +0.0` with `c >= 0` are both `+0.0`),
///   never `-0.0` or NaN.
/// - Every kept term is `>= +0.0` and finite (a count below 2^64 times a weight below
///   1e14 ns is below 2e33), so a lane, starting at `+0.0`, stays `>= +0.0` and finite:
///   never `-0.0`, NaN or infinite.
/// - For such an accumulator `a`, `a + +0.0 == a` bit for bit (IEEE 754: `x + +0.0` is `x`
///   for every `x` but `-0.0`, which gives `+0.0`). So adding the skipped terms, at any
///   point of the lane, leaves it unchanged, and the lane sums and their combination are
///   those of the dense sum.
///
/// The unit tests check it against the dense sum, every bundled profile, random records.
#[inline]
fn dot(counts: &[u64; N_CHARGED], terms: &[(usize, f64)]) -> f64 {
    let mut acc = [0.0f64; 4];
    for &(i, w) in terms {
        let c = counts[i];
        if c != 0 {
            acc[i & 3] += c as f64 * w;
        }
    }
    (acc[0] + acc[1]) + (acc[2] + acc[3])
}

/// The counter-to-cost mapping as a Markdown table, for docs/MODEL.md.
pub fn counter_charges_markdown() -> String {
    let mut s = String::from("| counter | charged as | cost |\n|---|---|---|\n");
    for (name, charge) in COUNTER_CHARGES {
        let (kind, what) = match charge {
            Charge::Cpu(p) => ("CPU (`cpu_ns`)", *p),
            Charge::Translation(p) => ("translation (DMA port)", *p),
            Charge::Hypervisor(p) => ("hypervisor (`hypervisor_ns`)", *p),
            Charge::Engine(p) => ("engine-modelled wait", *p),
            Charge::NotCharged(p) => ("not charged", *p),
        };
        let _ = writeln!(s, "| {name} | {kind} | {} |", md_cell(what));
    }
    let _ = writeln!(
        s,
        "| locks[id] | engine-modelled resource | sync.lock_acquire_release uncontended, sync.lock_handoff per hand-off |"
    );
    s
}

// ---------------------------------------------------------------------------------------------
// Errors
// ---------------------------------------------------------------------------------------------

/// What went wrong loading or using a platform profile. Every variant names the input.
#[derive(Debug, thiserror::Error)]
pub enum CostError {
    /// The file could not be read.
    #[error("Cannot read platform profile {path}")]
    Read {
        /// The path as given.
        path: String,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// The text is not valid TOML.
    #[error("Invalid platform profile {origin} at line {line}, column {column}: TOML syntax error: {message}")]
    Syntax {
        /// The file name (or other origin).
        origin: String,
        /// 1-based line.
        line: usize,
        /// 1-based column (characters).
        column: usize,
        /// The parser's message.
        message: String,
    },
    /// A field is missing, unknown, of the wrong type, or out of range.
    #[error("Invalid platform profile {origin}{}: field `{field}`: {problem}", at(*line, *column))]
    Field {
        /// The file name (or other origin).
        origin: String,
        /// 1-based line, when known.
        line: Option<usize>,
        /// 1-based column, when known.
        column: Option<usize>,
        /// The dotted field path, e.g. `iommu.cmdq.sync_latency.value`.
        field: String,
        /// What was expected (and what was found).
        problem: String,
    },
    /// A scenario needs an optional group the profile does not have.
    #[error(
        "Platform profile `{profile}` ({origin}) has no `{group}` group, needed for {needed_for}"
    )]
    MissingGroup {
        /// The file name (or other origin).
        origin: String,
        /// The profile's name.
        profile: String,
        /// The missing group's path.
        group: String,
        /// What needed it.
        needed_for: String,
    },
    /// No bundled profile has this name.
    #[error("No bundled platform profile `{name}` (bundled: {known})")]
    UnknownBundled {
        /// The name asked for.
        name: String,
        /// The bundled names, comma-separated.
        known: String,
    },
}

impl CostError {
    /// The dotted field path this error is about, if it is about one field.
    pub fn field(&self) -> Option<&str> {
        match self {
            CostError::Field { field, .. } => Some(field),
            CostError::MissingGroup { group, .. } => Some(group),
            _ => None,
        }
    }

    /// The 1-based line this error points at, if known.
    pub fn line(&self) -> Option<usize> {
        match self {
            CostError::Syntax { line, .. } => Some(*line),
            CostError::Field { line, .. } => *line,
            _ => None,
        }
    }
}

fn at(line: Option<usize>, column: Option<usize>) -> String {
    match (line, column) {
        (Some(l), Some(c)) => format!(" at line {l}, column {c}"),
        (Some(l), None) => format!(" at line {l}"),
        _ => String::new(),
    }
}

/// Turns a serde error from `toml` into a [`CostError::Field`] with the field's dotted path.
fn field_error_from_toml(
    text: &str,
    origin: &str,
    doc: &DeTable<'_>,
    e: &toml::de::Error,
) -> CostError {
    let message = e.message();
    let span = e.span();
    let mut path = span.clone().map(|s| path_at(doc, &s)).unwrap_or_default();
    // "missing field `x`" points at the table that lacks it: name the field itself.
    if let Some(missing) = backticked_after(message, "missing field ") {
        path.push(missing.to_owned());
    }
    let field = if path.is_empty() {
        "(document)".to_owned()
    } else {
        path.join(".")
    };
    let (line, column) = match span {
        Some(s) => {
            let (l, c) = line_col(text, s.start);
            (Some(l), Some(c))
        }
        None => (None, None),
    };
    CostError::Field {
        origin: origin.to_owned(),
        line,
        column,
        field,
        problem: friendly(message),
    }
}

/// Serde's type names rephrased for profile authors.
fn friendly(message: &str) -> String {
    message
        .replace(
            "expected struct Cost",
            "expected a cost table `{ value = NUMBER, unit = \"ns\"|\"cycles\", source = \"...\" }`",
        )
        .replace(
            "expected struct Bandwidth",
            "expected a table `{ gb_per_s = NUMBER, source = \"...\" }`",
        )
        .replace("expected f64", "expected a number")
        .replace("expected u32", "expected a non-negative integer")
}

#[cfg(test)]
mod tests {
    use super::*;
    use iolab_iommu::work::WORK_COUNTER_COUNT;

    #[test]
    fn counter_charges_follow_the_work_record_fields() {
        let names: Vec<&str> = WorkRecord::new()
            .counters()
            .iter()
            .map(|(n, _)| *n)
            .collect();
        let charged: Vec<&str> = COUNTER_CHARGES.iter().map(|(n, _)| *n).collect();
        assert_eq!(
            charged, names,
            "every WorkRecord counter needs a charge, in field order"
        );
        assert_eq!(N_CHARGED, WORK_COUNTER_COUNT);
    }

    /// The dense four-lane dot product the model used before the sparse one.
    fn dense_dot(counts: &[u64; N_CHARGED], weights: &[f64; N_CHARGED]) -> f64 {
        let mut acc = [0.0f64; 4];
        for i in 0..N_CHARGED {
            acc[i % 4] += counts[i] as f64 * weights[i];
        }
        (acc[0] + acc[1]) + (acc[2] + acc[3])
    }

    #[test]
    fn sparse_dot_is_bit_identical_to_the_dense_sum() {
        let mut rng = crate::engine::Rng::seed_from_u64(3);
        for round in 0..2_000 {
            let mut counts = [0u64; N_CHARGED];
            let mut weights = [0.0f64; N_CHARGED];
            for i in 0..N_CHARGED {
                // Mostly zero counters and some zero weights, as in real records.
                if rng.below(4) == 0 {
                    counts[i] = rng.below(if round % 2 == 0 { 10 } else { 1 << 40 });
                }
                if rng.below(5) != 0 {
                    weights[i] = rng.next_f64() * 100.0;
                }
            }
            let sparse = dot(&counts, &nonzero_terms(&weights));
            let dense = dense_dot(&counts, &weights);
            assert_eq!(sparse.to_bits(), dense.to_bits(), "{counts:?} {weights:?}");
        }
    }

    #[test]
    fn the_critical_section_costs_equal_the_dense_costs_of_the_split_records() {
        let models: Vec<CpuCostModel> = PlatformProfile::bundled_names()
            .into_iter()
            .map(|n| CpuCostModel::new(&PlatformProfile::bundled(n).expect("a bundled profile")))
            .collect();
        assert!(models.len() > 1);
        let mut rng = 0x9e37_79b9_7f4a_7c15u64;
        for round in 0..2000u64 {
            let m = &models[round as usize % models.len()];
            rng = rng
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let mut w = WorkRecord::new();
            // Zero, small and large counts, in every combination over the rounds.
            let pick = |k: u32| match (rng >> k) % 4 {
                0 => 0,
                1 => (rng >> (k + 2)) % 7,
                2 => (rng >> (k + 2)) % 1000,
                _ => round * 37 + 1,
            };
            w.tree_nodes_visited = pick(3);
            w.tree_rotations = pick(11);
            w.flush_queue_adds = pick(19);
            w.flush_queue_flushes = pick(27);
            w.flush_queue_frees = pick(35);
            w.ptes_written = pick(43);
            let mut t = WorkRecord::new();
            t.tree_nodes_visited = w.tree_nodes_visited;
            t.tree_rotations = w.tree_rotations;
            let mut f = WorkRecord::new();
            f.flush_queue_adds = w.flush_queue_adds;
            f.flush_queue_flushes = w.flush_queue_flushes;
            f.flush_queue_frees = w.flush_queue_frees;
            assert_eq!(m.tree_ns(&w).to_bits(), m.cpu_ns(&t).to_bits(), "{w:?}");
            assert_eq!(
                m.flush_queue_ns(&w).to_bits(),
                m.cpu_ns(&f).to_bits(),
                "{w:?}"
            );
        }
        assert!(models[0].tree_ns(&WorkRecord::new()) == 0.0);
        // The weights are not all zero, so the comparison above compares something.
        let mut w = WorkRecord::new();
        w.tree_nodes_visited = 10;
        w.flush_queue_adds = 3;
        assert!(models
            .iter()
            .any(|m| m.tree_ns(&w) > 0.0 && m.flush_queue_ns(&w) > 0.0));
    }

    /// The dense per-counter weights of `p` (CPU, translation, hypervisor), as the model
    /// has always derived them: every counter, zero where it is not charged that way.
    fn dense_weights(p: &PlatformProfile) -> [[f64; N_CHARGED]; 3] {
        let mut out = [[0.0; N_CHARGED]; 3];
        for (i, (_, charge)) in COUNTER_CHARGES.iter().enumerate() {
            let (k, path) = match *charge {
                Charge::Cpu(path) => (0, path),
                Charge::Translation(path) => (1, path),
                Charge::Hypervisor(path) => (2, path),
                Charge::Engine(_) | Charge::NotCharged(_) => continue,
            };
            out[k][i] = path_sum_ns(p, path).unwrap_or(0.0);
        }
        out
    }

    /// The conversions of `w` the old, dense way: every counter's term added, every lock's.
    fn dense_record_cost(p: &PlatformProfile, w: &WorkRecord) -> (RecordCost, f64) {
        let [cpu, translation, hypervisor] = dense_weights(p);
        let counts = counter_values(w);
        let only = |idx: &[usize]| {
            let mut c = [0u64; N_CHARGED];
            for &i in idx {
                c[i] = counts[i];
            }
            c
        };
        let mut locks = 0.0;
        for id in LockId::ALL {
            locks += w.lock_count(id) as f64 * p.sync.lock_acquire_release.ns();
        }
        let hv = if p.hypervisor.is_some() {
            Some(dense_dot(&counts, &hypervisor))
        } else if w.hypercalls == 0 && w.tces_touched == 0 {
            Some(0.0)
        } else {
            None
        };
        let cost = RecordCost {
            cpu_ns: dense_dot(&counts, &cpu),
            locks_uncontended_ns: locks,
            hypervisor_ns: hv,
            tree_ns: dense_dot(&only(&TREE_COUNTERS), &cpu),
            flush_queue_ns: dense_dot(&only(&FLUSH_QUEUE_COUNTERS), &cpu),
        };
        (cost, dense_dot(&counts, &translation))
    }

    /// `a` and `b` to the bit (an `Option` as its `None`ness and its value's bits).
    fn assert_same_bits(a: &RecordCost, b: &RecordCost, what: &str) {
        let bits = |c: &RecordCost| {
            [
                c.cpu_ns.to_bits(),
                c.locks_uncontended_ns.to_bits(),
                c.hypervisor_ns.map_or(u64::MAX, f64::to_bits),
                u64::from(c.hypervisor_ns.is_none()),
                c.tree_ns.to_bits(),
                c.flush_queue_ns.to_bits(),
            ]
        };
        assert_eq!(bits(a), bits(b), "{what}: {a:?} vs {b:?}");
    }

    /// Every bundled profile, and variants with zero and `-0.0` costs (profiles accept
    /// `value = -0.0`: it is `>= 0`).
    fn test_profiles() -> Vec<PlatformProfile> {
        let mut out: Vec<PlatformProfile> = PlatformProfile::bundled_names()
            .into_iter()
            .map(|n| PlatformProfile::bundled(n).expect("a bundled profile"))
            .collect();
        for (k, base) in out.clone().into_iter().enumerate().take(3) {
            let mut p = base;
            let paths = [
                "cpu.pte_write",
                "cpu.tree_node_visit",
                "sync.lock_acquire_release",
                "iommu.walk_read",
                "cpu.flush_queue_add",
            ];
            for (j, path) in paths.iter().enumerate() {
                let c = p.cost_mut(path).expect("a cost path");
                c.value = if (j + k) % 2 == 0 { -0.0 } else { 0.0 };
            }
            p.revalidate().expect("zero costs are valid");
            out.push(p);
        }
        out
    }

    /// A random record: mostly zero counters, small or huge counts, some locks.
    fn random_record(rng: &mut crate::engine::Rng) -> WorkRecord {
        let mut w = WorkRecord::new();
        let density = 1 + rng.below(8);
        for i in 0..N_CHARGED {
            if rng.below(density + 2) == 0 {
                *counter_mut(&mut w, i) = match rng.below(4) {
                    0 => 1,
                    1 => rng.below(40),
                    2 => rng.below(1 << 40),
                    _ => rng.next_u64(),
                };
            }
        }
        for id in LockId::ALL {
            if rng.below(3) == 0 {
                w.locks[id as usize] = if rng.below(8) == 0 {
                    rng.next_u64()
                } else {
                    rng.below(5)
                };
            }
        }
        w
    }

    #[test]
    fn record_costs_are_bit_identical_to_the_dense_conversions() {
        let mut rng = crate::engine::Rng::seed_from_u64(19);
        for p in test_profiles() {
            let m = CpuCostModel::new(&p);
            // A pool of records drawn over and over, more than the memo keeps, so that
            // lookups hit, miss and evict; each result is checked against the dense sums.
            let pool: Vec<WorkRecord> = (0..3 * MEMO_ENTRIES)
                .map(|_| random_record(&mut rng))
                .collect();
            for round in 0..3_000 {
                let w = if round % 3 == 0 {
                    random_record(&mut rng)
                } else {
                    pool[rng.below(pool.len() as u64) as usize]
                };
                let (dense, dense_translation) = dense_record_cost(&p, &w);
                let what = format!("{} {w:?}", p.name);
                assert_same_bits(&m.record_cost(&w), &dense, &what);
                assert_same_bits(&m.record_cost_uncached(&w), &dense, &what);
                assert_eq!(m.cpu_ns(&w).to_bits(), dense.cpu_ns.to_bits(), "{what}");
                assert_eq!(
                    m.translation_ns(&w).to_bits(),
                    dense_translation.to_bits(),
                    "{what}"
                );
                assert_eq!(
                    m.translation_ns_of(w.iotlb_hits, w.iotlb_misses, w.walk_reads)
                        .to_bits(),
                    dense_translation.to_bits(),
                    "{what}"
                );
                assert_eq!(
                    m.locks_uncontended_ns(&w).to_bits(),
                    dense.locks_uncontended_ns.to_bits(),
                    "{what}"
                );
                assert_eq!(
                    m.hypervisor_ns(&w).ok().map(f64::to_bits),
                    dense.hypervisor_ns.map(f64::to_bits),
                    "{what}"
                );
            }
        }
    }

    #[test]
    fn the_record_memo_tells_apart_records_that_differ_in_one_word() {
        let models: Vec<CpuCostModel> = test_profiles().iter().map(CpuCostModel::new).collect();
        let mut base = WorkRecord::new();
        base.ptes_written = 1;
        base.pte_reads = 4;
        base.magazine_hits = 1;
        base.lock(LockId::RcacheCpu);
        base.lock(LockId::PageTable);
        for m in &models {
            let cost = m.record_cost(&base);
            // Every counter and every lock, one more than in `base`: a different key for
            // a priced counter or a lock, the same key and the same cost for the others.
            for i in 0..N_CHARGED + LockId::COUNT {
                let mut w = base;
                if i < N_CHARGED {
                    *counter_mut(&mut w, i) += 1;
                } else {
                    w.locks[i - N_CHARGED] += 1;
                }
                let priced = i >= N_CHARGED || PRICED_COUNTERS.contains(&i);
                assert_eq!(record_key(&w) != record_key(&base), priced, "word {i}");
                let uncached = m.record_cost_uncached(&w);
                assert_same_bits(&m.record_cost(&w), &uncached, "one up");
                if !priced {
                    assert_same_bits(&uncached, &cost, "an unpriced counter");
                }
                assert_same_bits(&m.record_cost(&base), &cost, "base again");
            }
        }
        // The key is the priced counters in order, then the locks; the first two are the
        // ones `same_key` compares first.
        let mut w = WorkRecord::new();
        w.mmio_reads = 5;
        w.hypercalls = 2;
        w.lock(LockId::Other);
        let key = record_key(&w);
        let counts = counter_values(&w);
        assert_eq!(key[..N_PRICED], PRICED_COUNTERS.map(|i| counts[i]));
        assert_eq!(key[N_PRICED..], w.locks);
        assert_eq!(
            [
                COUNTER_CHARGES[PRICED_COUNTERS[0]].0,
                COUNTER_CHARGES[PRICED_COUNTERS[1]].0
            ],
            ["ptes_written", "ptes_cleared"]
        );
        let expected: Vec<usize> = COUNTER_CHARGES
            .iter()
            .enumerate()
            .filter(|(_, (_, c))| matches!(c, Charge::Cpu(_) | Charge::Hypervisor(_)))
            .map(|(i, _)| i)
            .collect();
        assert_eq!(PRICED_COUNTERS.to_vec(), expected);
    }

    #[test]
    fn the_memo_is_invisible_in_equality_and_clones() {
        let p = PlatformProfile::bundled("hisilicon-d06").unwrap();
        let (a, b) = (CpuCostModel::new(&p), CpuCostModel::new(&p));
        let mut w = WorkRecord::new();
        w.ptes_cleared = 1;
        w.inval_ranges = 1;
        let cost = a.record_cost(&w);
        assert_eq!(a, b, "a model that priced a record equals a fresh one");
        assert_same_bits(&a.clone().record_cost(&w), &cost, "a clone");
        assert!(!format!("{a:?}").contains("memo"));
    }

    #[test]
    fn translation_counters_are_the_translation_charges() {
        let expected: Vec<usize> = COUNTER_CHARGES
            .iter()
            .enumerate()
            .filter(|(_, (_, c))| matches!(c, Charge::Translation(_)))
            .map(|(i, _)| i)
            .collect();
        assert_eq!(TRANSLATION_COUNTERS.to_vec(), expected);
        assert_eq!(
            TRANSLATION_COUNTERS.map(|i| COUNTER_CHARGES[i].0),
            ["iotlb_hits", "iotlb_misses", "walk_reads"]
        );
    }

    #[test]
    fn counter_values_reads_each_field_at_its_position() {
        let mut w = WorkRecord::new();
        // Give every counter a distinct value through the public fields' order.
        let n = COUNTER_CHARGES.len();
        for (i, v) in counter_values(&w).iter().enumerate() {
            assert_eq!(*v, 0, "counter {i} starts at zero");
        }
        w.ptes_written = 1;
        w.mmio_reads = 5;
        w.iova_full_range_allocs = 7;
        let vals = counter_values(&w);
        assert_eq!(vals[0], 1);
        assert_eq!(vals[n - 4], 5);
        assert_eq!(vals[n - 1], 7);
        let by_name: Vec<u64> = w.counters().iter().map(|(_, v)| *v).collect();
        assert_eq!(vals.to_vec(), by_name);
    }

    #[test]
    fn every_charged_cost_path_exists_in_the_schema() {
        let paths = PlatformProfile::cost_paths();
        for (name, charge) in COUNTER_CHARGES {
            if let Charge::Cpu(p) | Charge::Translation(p) | Charge::Hypervisor(p) = charge {
                for part in p.split('+').map(str::trim) {
                    assert!(
                        paths.iter().any(|q| q == part),
                        "{name}: {part} is not a cost path"
                    );
                }
            }
        }
    }

    #[test]
    fn line_col_counts_lines_and_characters() {
        let t = "ab\ncdé\nxyz";
        assert_eq!(line_col(t, 0), (1, 1));
        assert_eq!(line_col(t, 3), (2, 1));
        assert_eq!(line_col(t, 8), (3, 1)); // after 'é' (2 bytes) and the newline
        assert_eq!(line_col(t, 1000), (3, 4));
        assert_eq!(line_col("", 0), (1, 1));
    }

    #[test]
    fn numbers_print_compactly() {
        assert_eq!(fmt_num(15.0), "15");
        assert_eq!(fmt_num(2.5), "2.5");
        assert_eq!(fmt_num(1.0 / 3.0), "0.333");
        assert_eq!(fmt_num(10.0 / 1.5), "6.667");
    }

    #[test]
    fn path_at_finds_the_innermost_key() {
        let text = "name = \"x\"\n[g]\na = { value = 1 }\n[g.b]\nvalue = 2\n";
        let doc = DeTable::parse(text).unwrap();
        let at = |needle: &str| {
            let start = text.find(needle).unwrap();
            path_at(doc.get_ref(), &(start..start + needle.len())).join(".")
        };
        assert_eq!(at("[g.b]"), "g.b");
        assert_eq!(at("{ value = 1 }"), "g.a");
        assert_eq!(at("2"), "g.b.value");
        assert_eq!(at("\"x\""), "name");
    }

    #[test]
    fn markdown_cells_escape_pipes_and_newlines() {
        assert_eq!(md_cell("a | b\n c"), "a \\| b c");
    }
}
