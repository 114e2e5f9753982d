//! `[workload]` of kind `bonnie`: bonnie++'s phases through the page cache, and its
//! `[kernel]` page-cache and file-system fields.

use serde::Deserialize;

use crate::lab::caps::*;
use crate::lab::defaults as d;
use crate::lab::spec::device::Devices;
use crate::lab::spec::fields::{one_of, Fields};
use crate::lab::spec::kernel::KernelSpec;
use crate::lab::spec::Common;
use crate::lab::LabError;
use crate::tomlfile::{InputError, TomlDoc};

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(in crate::lab::spec) struct BonnieSpec {
    #[allow(dead_code)]
    kind: String,
    #[serde(default)]
    file_mib: Option<u64>,
    #[serde(default)]
    logical_file_mib: Option<u64>,
    #[serde(default)]
    ram_mib: Option<u64>,
    #[serde(default, deserialize_with = "crate::size::opt_bytes")]
    chunk_bytes: Option<u64>,
    #[serde(default)]
    seeks: Option<u64>,
    #[serde(default)]
    seeker_cpus: Option<Vec<usize>>,
    #[serde(default)]
    bonnie_cpu: Option<usize>,
    #[serde(default)]
    flusher_cpu: Option<usize>,
    #[serde(default)]
    files: Option<u64>,
    #[serde(default)]
    csv: Option<toml::Value>,
    #[serde(default, deserialize_with = "crate::size::opt_bytes")]
    stdio_buffer_bytes: Option<u64>,
    #[serde(default)]
    seek_update_every: Option<u64>,
    #[serde(default)]
    putc_ns_per_byte: Option<f64>,
    #[serde(default)]
    getc_ns_per_byte: Option<f64>,
    #[serde(default)]
    write_page_ns: Option<u64>,
    #[serde(default)]
    overwrite_page_ns: Option<u64>,
    #[serde(default)]
    read_page_ns: Option<u64>,
    #[serde(default)]
    writeback_page_ns: Option<u64>,
    #[serde(default)]
    cpu_slice_ns: Option<u64>,
    #[serde(default)]
    files_run: Option<u64>,
    #[serde(default)]
    create_ns: Option<u64>,
    #[serde(default)]
    unlink_ns: Option<u64>,
    #[serde(default)]
    stat_ns: Option<u64>,
    #[serde(default)]
    readdir_entry_ns: Option<u64>,
}

/// A validated bonnie++ workload.
#[derive(Clone, Debug, PartialEq)]
pub struct BonnieSetup {
    /// The suite's configuration (file, page cache, placement).
    pub config: crate::workloads::bonnie::BonnieConfig,
    /// The size column of the CSV row, MiB (the logical file size bonnie++ reports).
    pub size_mib: u64,
    /// The CSV layout the run prints (`workload.csv`, default bonnie++ 1.03).
    pub csv: crate::workloads::bonnie::CsvLayout,
}

/// bonnie on an NVMe SSD or a SAS HBA: the lab's bonnie defaults, the block devices' queue
/// limits.
pub(in crate::lab::spec) fn bonnie_on_block(
    doc: &TomlDoc<'_>,
    s: &BonnieSpec,
    k: &KernelSpec,
    c: &Common,
    devices: &Devices,
) -> Result<BonnieSetup, LabError> {
    let limits = crate::lab::block::bonnie_limits(devices).ok_or_else(|| {
        doc.field_error("device[0].kind", "expected a block device (nvme or sas)")
    })?;
    Ok(bonnie(doc, s, k, c, limits)?)
}

/// bonnie++ 1.03 on `limits`: every field's default from [`d`], the page cache on
/// `machine.memory_banks` or one bank of `workload.ram_mib` at [`d::PAGE_CACHE_BASE`].
pub(in crate::lab::spec) fn bonnie(
    doc: &TomlDoc<'_>,
    s: &BonnieSpec,
    k: &KernelSpec,
    c: &Common,
    limits: crate::block::QueueLimits,
) -> Result<BonnieSetup, InputError> {
    use crate::workloads::bonnie::{BonnieConfig, FileTestConfig};
    let wl = Fields::new(doc, "workload");
    let kernel = Fields::new(doc, "kernel");
    let file_mib = wl.int(
        "file_mib",
        s.file_mib.unwrap_or(d::BONNIE_FILE_MIB.0),
        1..=MAX_FILE_MIB,
        "MiB (cap MAX_FILE_MIB)",
    )?;
    let logical = wl.int(
        "logical_file_mib",
        s.logical_file_mib.unwrap_or(d::BONNIE_LOGICAL_FILE_MIB.0),
        file_mib..=MAX_TARGET_GIB << 10,
        "MiB (at least file_mib)",
    )?;
    // Dirty thresholds: as set, else the defaults (stated for a 64 MiB file) scaled with
    // the file.
    let scale = file_mib as f64 / d::DIRTY_REFERENCE_FILE_MIB.0 as f64;
    let default_background =
        (((d::DIRTY_BACKGROUND_MIB.0 * 1_048_576.0) as u64 as f64 * scale) as u64).max(4096);
    let dirty_background = match k.dirty_background_mib {
        Some(v) => (kernel.real("dirty_background_mib", v, 0.0..=1e6)? * 1_048_576.0) as u64,
        None => default_background,
    };
    let dirty_limit = match k.dirty_limit_mib {
        Some(v) => (kernel.real("dirty_limit_mib", v, 0.1..=1e6)? * 1_048_576.0) as u64,
        None => (((d::DIRTY_LIMIT_MIB.0 * 1_048_576.0) as u64 as f64 * scale) as u64)
            .max(default_background + 4096),
    };
    if dirty_background >= dirty_limit {
        let field = if k.dirty_limit_mib.is_some() {
            "kernel.dirty_limit_mib"
        } else {
            "kernel.dirty_background_mib"
        };
        return Err(doc.field_error(
            field,
            format!(
                "the background threshold ({dirty_background} bytes) must be below the dirty limit ({dirty_limit} bytes)"
            ),
        ));
    }
    let ram_banks = match &c.memory_banks {
        Some(banks) => {
            if s.ram_mib.is_some() {
                return Err(doc.field_error(
                    "workload.ram_mib",
                    "the page cache is machine.memory_banks' RAM: set one of the two",
                ));
            }
            banks.clone()
        }
        None => {
            let ram_mib = wl.int(
                "ram_mib",
                s.ram_mib.unwrap_or(d::BONNIE_RAM_MIB.0),
                1..=MAX_MEMORY_GIB << 10,
                "MiB",
            )?;
            // One bank above the first 4 GiB (docs/SCENARIOS.md).
            let base = d::PAGE_CACHE_BASE.0;
            if base + (ram_mib << 20) > c.memory_bytes {
                return Err(doc.field_error(
                    "workload.ram_mib",
                    format!(
                        "the page cache ({ram_mib} MiB above the first 4 GiB) does not fit in machine.memory_gib = {}",
                        c.memory_bytes >> 30
                    ),
                ));
            }
            vec![(base, ram_mib << 20)]
        }
    };
    let chunk = match s.chunk_bytes {
        Some(ch) if ch == 0 || ch % 512 != 0 || ch > 1 << 20 => {
            return Err(doc.field_error(
                "workload.chunk_bytes",
                format!("expected a non-zero multiple of 512 up to 1 MiB, got {ch}"),
            ))
        }
        Some(ch) => ch,
        None => d::BONNIE_CHUNK_BYTES.0,
    };
    let seeks = wl.int(
        "seeks",
        s.seeks.unwrap_or(d::BONNIE_SEEKS.0),
        1..=1_000_000,
        "seeks",
    )?;
    let seeker_cpus = if let Some(cpus) = &s.seeker_cpus {
        if cpus.is_empty() || cpus.len() > MAX_THREADS as usize {
            return Err(doc.field_error(
                "workload.seeker_cpus",
                format!("expected 1..={MAX_THREADS} seekers (cap MAX_THREADS)"),
            ));
        }
        for &x in cpus {
            wl.cpu("seeker_cpus", Some(x), 0, c.cpus)?;
        }
        cpus.clone()
    } else {
        d::BONNIE_SEEKER_CPUS
            .0
            .iter()
            .map(|&x| x % c.cpus)
            .collect()
    };
    let ns = |field: &str, v: Option<u64>, default: u64| {
        wl.int(field, v.unwrap_or(default), 0..=10_000_000, "ns")
    };
    let write_page_ns = ns("write_page_ns", s.write_page_ns, d::BONNIE_WRITE_PAGE_NS.0)?;
    let read_page_ns = ns("read_page_ns", s.read_page_ns, d::BONNIE_READ_PAGE_NS.0)?;
    let overwrite_page_ns = ns(
        "overwrite_page_ns",
        s.overwrite_page_ns,
        write_page_ns.saturating_sub(read_page_ns),
    )?;
    let files_k = wl.int(
        "files",
        s.files.unwrap_or(d::BONNIE_FILES_K.0),
        0..=1024,
        "x 1024 files (bonnie++ -n; 0: no file tests)",
    )?;
    let blocks = |field: &str, v: Option<u64>, default: u64| {
        kernel.int(field, v.unwrap_or(default), 1..=64, "journal blocks")
    };
    let file_tests = if files_k == 0 {
        None
    } else {
        let files = files_k * 1024;
        // The lab runs at most the default count per test unless told otherwise.
        let files_run = match s.files_run {
            Some(n) => wl.int(
                "files_run",
                n,
                1..=files,
                "files per test (at most files x 1024)",
            )?,
            None => d::BONNIE_FILES_RUN.0.min(files),
        };
        Some(FileTestConfig {
            files,
            files_run,
            create_ns: ns("create_ns", s.create_ns, d::BONNIE_CREATE_NS.0)?,
            unlink_ns: ns("unlink_ns", s.unlink_ns, d::BONNIE_UNLINK_NS.0)?,
            stat_ns: ns("stat_ns", s.stat_ns, d::BONNIE_STAT_NS.0)?,
            readdir_entry_ns: ns(
                "readdir_entry_ns",
                s.readdir_entry_ns,
                d::BONNIE_READDIR_ENTRY_NS.0,
            )?,
            create_journal_blocks: blocks(
                "create_journal_blocks",
                k.create_journal_blocks,
                d::CREATE_JOURNAL_BLOCKS.0,
            )?,
            delete_journal_blocks: blocks(
                "delete_journal_blocks",
                k.delete_journal_blocks,
                d::DELETE_JOURNAL_BLOCKS.0,
            )?,
        })
    };
    let config = BonnieConfig {
        file_bytes: file_mib << 20,
        logical_file_bytes: logical << 20,
        chunk,
        stdio_buffer: wl.int(
            "stdio_buffer_bytes",
            s.stdio_buffer_bytes
                .unwrap_or(d::BONNIE_STDIO_BUFFER_BYTES.0),
            512..=1 << 20,
            "bytes",
        )?,
        seeks,
        seekers: seeker_cpus.len(),
        seek_update_every: wl.int(
            "seek_update_every",
            s.seek_update_every.unwrap_or(d::BONNIE_SEEK_UPDATE_EVERY.0),
            1..=1_000_000,
            "seeks",
        )?,
        fsync_journal_blocks: kernel.int(
            "fsync_journal_blocks",
            k.fsync_journal_blocks.unwrap_or(d::FSYNC_JOURNAL_BLOCKS.0),
            0..=64,
            "journal blocks",
        )?,
        fsync_commit_flushes: kernel.int(
            "fsync_commit_flushes",
            k.fsync_commit_flushes.unwrap_or(d::FSYNC_COMMIT_FLUSHES.0),
            0..=2,
            "cache flushes (before and after the commit block)",
        )?,
        putc_ns_per_byte: wl.real(
            "putc_ns_per_byte",
            s.putc_ns_per_byte.unwrap_or(d::BONNIE_PUTC_NS_PER_BYTE.0),
            0.0..=1e4,
        )?,
        getc_ns_per_byte: wl.real(
            "getc_ns_per_byte",
            s.getc_ns_per_byte.unwrap_or(d::BONNIE_GETC_NS_PER_BYTE.0),
            0.0..=1e4,
        )?,
        write_page_ns,
        overwrite_page_ns,
        read_page_ns,
        writeback_page_ns: ns(
            "writeback_page_ns",
            s.writeback_page_ns,
            d::BONNIE_WRITEBACK_PAGE_NS.0,
        )?,
        syscall_ns: c.profile.cpu.syscall.ns().round() as u64,
        copy_bytes_per_ns: c.profile.memory.memcpy_bandwidth.gb_per_s,
        dirty_background,
        dirty_limit,
        writeback_chunk: kernel.int(
            "writeback_chunk_kib",
            k.writeback_chunk_kib.unwrap_or(d::WRITEBACK_CHUNK_KIB.0),
            4..=1_000_000,
            "KiB",
        )? << 10,
        readahead: kernel.int(
            "readahead_kib",
            k.readahead_kib.unwrap_or(d::READAHEAD_KIB.0),
            4..=1_000_000,
            "KiB",
        )? << 10,
        queue_depth: kernel.int(
            "block_queue_depth",
            k.block_queue_depth.unwrap_or(d::BLOCK_QUEUE_DEPTH.0),
            1..=MAX_IODEPTH as usize,
            "requests (cap MAX_IODEPTH)",
        )?,
        limits,
        ram_banks,
        bonnie_cpu: wl.cpu("bonnie_cpu", s.bonnie_cpu, d::BONNIE_CPU.0, c.cpus)?,
        flusher_cpu: wl.cpu(
            "flusher_cpu",
            s.flusher_cpu,
            d::BONNIE_FLUSHER_CPU.0,
            c.cpus,
        )?,
        seeker_cpus,
        slice_ns: wl.int(
            "cpu_slice_ns",
            s.cpu_slice_ns.unwrap_or(d::BONNIE_CPU_SLICE_NS.0),
            100..=10_000_000,
            "ns",
        )?,
        file_tests,
    };
    let csv = csv_layout(doc, s.csv.as_ref())?;
    Ok(BonnieSetup {
        config,
        size_mib: logical,
        csv,
    })
}

/// `workload.csv`: the bonnie++ CSV layout, a string naming a bonnie++ version.
fn csv_layout(
    doc: &TomlDoc<'_>,
    v: Option<&toml::Value>,
) -> Result<crate::workloads::bonnie::CsvLayout, InputError> {
    use crate::workloads::bonnie::CsvLayout;
    let expected = one_of(&CsvLayout::NAMES);
    match v {
        None => Ok(CsvLayout::default()),
        Some(toml::Value::String(name)) => CsvLayout::from_name(name).ok_or_else(|| {
            doc.field_error(
                "workload.csv",
                format!("unknown bonnie++ CSV layout \"{name}\": {expected}"),
            )
        }),
        Some(other) => Err(doc.field_error(
            "workload.csv",
            format!("{expected} (a quoted string), found a {}", other.type_str()),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lab::spec::testing::*;
    use crate::lab::spec::Workload;
    use crate::workloads::bonnie::CsvLayout;

    fn bonnie_of(text: &str) -> BonnieSetup {
        *variant!(ok(text).workload, Workload::Bonnie)
    }

    #[test]
    fn bonnie_fields_set_the_suite_with_defaults() {
        let b = bonnie_of(BONNIE_USB);
        assert_eq!(b.config.file_bytes, 16 << 20);
        assert_eq!(b.size_mib, d::BONNIE_LOGICAL_FILE_MIB.0);
        assert_eq!(
            (b.config.chunk, b.config.seeks),
            (d::BONNIE_CHUNK_BYTES.0, d::BONNIE_SEEKS.0)
        );
        assert_eq!(
            b.config.ram_banks,
            vec![(d::PAGE_CACHE_BASE.0, d::BONNIE_RAM_MIB.0 << 20)]
        );
        assert_eq!(b.csv, CsvLayout::default());
        assert!(b.config.file_tests.is_some());
        let b = bonnie_of(&with(
            BONNIE_USB,
            "workload",
            "files = 0\nchunk_bytes = \"16k\"\nseeker_cpus = [1, 2]\ncsv = \"1.98\"\nram_mib = 1024",
        ));
        assert!(b.config.file_tests.is_none(), "files = 0: no file tests");
        assert_eq!((b.config.chunk, b.config.seekers), (16384, 2));
        assert_eq!(b.config.seeker_cpus, vec![1, 2]);
        assert_eq!(Some(b.csv), CsvLayout::from_name("1.98"));
        assert_eq!(b.config.ram_banks, vec![(d::PAGE_CACHE_BASE.0, 1 << 30)]);
        // On a block device the page cache writes back through the device's queue limits.
        let s = ok(&FIO_SAS.replace(
            "kind = \"fio\"\nioengine = \"libaio\"\nrw = \"randread\"\nruntime_ms = 10",
            "kind = \"bonnie\"\nfile_mib = 16",
        ));
        assert_eq!(s.workload.kind(), "bonnie");
    }

    #[test]
    fn bonnie_fields_out_of_range_of_the_wrong_type_or_unknown_are_refused() {
        refused(
            &with(BONNIE_USB, "workload", "seeks = 0"),
            "workload.seeks",
            "expected 1..=1000000 seeks, got 0",
        );
        refused(
            &with(BONNIE_USB, "workload", "logical_file_mib = 8"),
            "workload.logical_file_mib",
            "MiB (at least file_mib), got 8",
        );
        refused(
            &with(BONNIE_USB, "workload", "chunk_bytes = 1000"),
            "workload.chunk_bytes",
            "expected a non-zero multiple of 512 up to 1 MiB, got 1000",
        );
        refused(
            &with(BONNIE_USB, "workload", "csv = 1"),
            "workload.csv",
            "expected one of \"1.03\", \"1.98\" (a quoted string), found a integer",
        );
        refused(
            &with(BONNIE_USB, "workload", "csv = \"2.0\""),
            "workload.csv",
            "unknown bonnie++ CSV layout \"2.0\": expected one of \"1.03\", \"1.98\"",
        );
        refused(
            &with(BONNIE_USB, "workload", "bonnie_cpu = \"x\""),
            "workload.bonnie_cpu",
            "invalid type: string \"x\", expected a non-negative integer",
        );
        refused(
            &with(BONNIE_USB, "workload", "rw = \"read\""),
            "workload.rw",
            "unknown field `rw`, expected one of `kind`, `file_mib`",
        );
    }

    #[test]
    fn bonnie_page_cache_fields_are_checked_together() {
        refused(
            &with(BONNIE_USB, "kernel", "dirty_background_mib = 10.0\ndirty_limit_mib = 5.0"),
            "kernel.dirty_limit_mib",
            "the background threshold (10485760 bytes) must be below the dirty limit (5242880 bytes)",
        );
        refused(
            &with(BONNIE_USB, "kernel", "fsync_commit_flushes = 3"),
            "kernel.fsync_commit_flushes",
            "expected 0..=2 cache flushes (before and after the commit block), got 3",
        );
        // With memory_banks the page cache is theirs: ram_mib does not apply.
        refused(
            &with(
                &with(
                    BONNIE_USB,
                    "machine",
                    "memory_banks = [{ base = 0x40000000, mib = 1024 }]",
                ),
                "workload",
                "ram_mib = 512",
            ),
            "workload.ram_mib",
            "the page cache is machine.memory_banks' RAM: set one of the two",
        );
        refused(
            &with(BONNIE_USB, "workload", "ram_mib = 8192"),
            "workload.ram_mib",
            "the page cache (8192 MiB above the first 4 GiB) does not fit in machine.memory_gib = 8",
        );
    }
}
