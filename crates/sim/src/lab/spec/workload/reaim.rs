//! `[workload]` of kind `reaim`: re-aim's user ramp and workfile on a SCSI/SAS disk.

use serde::Deserialize;

use crate::lab::caps::*;
use crate::lab::defaults as d;
use crate::lab::spec::device::scsi::ScsiSetup;
use crate::lab::spec::fields::{one_of, Fields};
use crate::lab::spec::kernel::KernelSpec;
use crate::lab::spec::{Common, BUFFER_BASE};
use crate::tomlfile::{InputError, TomlDoc};

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(in crate::lab::spec) struct ReaimSpec {
    #[allow(dead_code)]
    kind: String,
    #[serde(default)]
    workfile: Option<String>,
    start: u32,
    end: u32,
    increment: u32,
    #[serde(default)]
    timeslice_ms: Option<f64>,
    #[serde(default)]
    jitter_pct: Option<f64>,
    #[serde(default, deserialize_with = "crate::size::opt_bytes")]
    fs_block: Option<u64>,
    #[serde(default)]
    journal_blocks: Option<u64>,
    #[serde(default)]
    user_scale: Option<f64>,
    #[serde(default)]
    sys_scale: Option<f64>,
    #[serde(default)]
    task: Option<Vec<ReaimTaskSpec>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ReaimTaskSpec {
    name: String,
    weight: u32,
    #[serde(default)]
    user_kcycles: f64,
    #[serde(default)]
    sys_kcycles: f64,
    #[serde(default)]
    sync_write_kib: u64,
    #[serde(default)]
    #[allow(dead_code)]
    source: Option<String>,
}

/// A validated re-aim workload.
#[derive(Clone, Debug, PartialEq)]
pub struct ReaimSetup {
    /// The workfile (task costs resolved to ns at the profile's clock).
    pub workfile: crate::workloads::reaim::Workfile,
    /// The user counts of the ramp.
    pub users: Vec<u32>,
    /// Scheduler timeslice, ns.
    pub slice_ns: u64,
    /// Per-run cost variation, fraction.
    pub jitter: f64,
    /// File-system block size, bytes.
    pub fs_block: u64,
    /// Journal blocks per commit.
    pub journal_blocks: u64,
    /// The kernel's page size (page-cache pages), bytes.
    pub page: u64,
    /// Factors on every task's user and system CPU cost.
    pub scale: (f64, f64),
}

pub(in crate::lab::spec) fn reaim(
    doc: &TomlDoc<'_>,
    s: &ReaimSpec,
    k: &KernelSpec,
    c: &Common,
    scsi: &ScsiSetup,
) -> Result<ReaimSetup, InputError> {
    let wl = Fields::new(doc, "workload");
    use crate::workloads::reaim::{Task, Workfile};
    let start = wl.int("start", s.start, 1..=MAX_USERS, "users (cap MAX_USERS)")?;
    let end = wl.int(
        "end",
        s.end,
        start..=MAX_USERS,
        "users, from workload.start (cap MAX_USERS)",
    )?;
    let increment = wl.int("increment", s.increment, 1..=MAX_USERS, "users")?;
    let users: Vec<u32> = (start..=end).step_by(increment as usize).collect();
    if users.len() > MAX_RAMP_POINTS {
        return Err(doc.field_error(
            "workload.increment",
            format!(
                "the ramp has {} user counts, more than the cap MAX_RAMP_POINTS = {MAX_RAMP_POINTS}",
                users.len()
            ),
        ));
    }
    let ghz = c.profile.cpu.clock_ghz;
    let tasks: Vec<Task> = match &s.task {
        None => {
            let name = s.workfile.as_deref().unwrap_or("lab_mix");
            let Some((_, list)) = d::REAIM_WORKFILES.iter().find(|(n, _)| *n == name) else {
                let names: Vec<&str> = d::REAIM_WORKFILES.iter().map(|(n, _)| *n).collect();
                return Err(doc.field_error(
                    "workload.workfile",
                    format!(
                        "unknown workfile \"{name}\": without [[workload.task]] tables {}",
                        one_of(&names)
                    ),
                ));
            };
            list.iter()
                .map(|&(name, weight, user, sys, bytes, _)| Task {
                    name: name.to_owned(),
                    weight,
                    user_ns: user * 1e3 / ghz,
                    sys_ns: sys * 1e3 / ghz,
                    sync_write_bytes: bytes,
                })
                .collect()
        }
        Some(list) => {
            if list.is_empty() || list.len() > MAX_TASKS {
                return Err(doc.field_error(
                    "workload.task",
                    format!(
                        "expected 1..={MAX_TASKS} tasks (cap MAX_TASKS), got {}",
                        list.len()
                    ),
                ));
            }
            let mut v = Vec::with_capacity(list.len());
            for (i, t) in list.iter().enumerate() {
                let task = Fields::new(doc, format!("workload.task[{i}]"));
                if t.name.trim().is_empty() {
                    return Err(
                        doc.field_error(&task.path("name"), "expected a non-empty task name")
                    );
                }
                let weight = task.int("weight", t.weight, 1..=10_000, "runs per job")?;
                let user = task.real("user_kcycles", t.user_kcycles, 0.0..=1e7)?;
                let sys = task.real("sys_kcycles", t.sys_kcycles, 0.0..=1e7)?;
                let kib = task.int("sync_write_kib", t.sync_write_kib, 0..=1 << 20, "KiB")?;
                v.push(Task {
                    name: t.name.clone(),
                    weight,
                    user_ns: user * 1e3 / ghz,
                    sys_ns: sys * 1e3 / ghz,
                    sync_write_bytes: kib << 10,
                });
            }
            v
        }
    };
    let workfile = Workfile {
        name: s.workfile.clone().unwrap_or_else(|| "lab_mix".to_owned()),
        tasks,
    };
    let runs: u64 = users.iter().map(|&u| u64::from(u)).sum::<u64>() * workfile.weight_sum();
    if runs > MAX_TASK_RUNS {
        return Err(doc.field_error(
            "workload.end",
            format!(
                "the ramp runs {runs} tasks (users summed over the ramp x the workfile's weight {}), more than the cap MAX_TASK_RUNS = {MAX_TASK_RUNS}",
                workfile.weight_sum()
            ),
        ));
    }
    #[rustfmt::skip]
    let [slice_ms, jitter_pct] = wl.reals([
        ("timeslice_ms", s.timeslice_ms, d::REAIM_TIMESLICE_MS, 0.01..=10_000.0),
        ("jitter_pct", s.jitter_pct, d::REAIM_JITTER_PCT, 0.0..=90.0),
    ])?;
    let jitter = jitter_pct / 100.0;
    let page = k.page_size.unwrap_or(d::REAIM_PAGE.0);
    if !page.is_power_of_two() || !(4096..=65536).contains(&page) {
        return Err(doc.field_error(
            "kernel.page_size",
            format!("expected a power of two in 4096..=65536 bytes, got {page}"),
        ));
    }
    let fs_block = s.fs_block.unwrap_or(d::REAIM_FS_BLOCK.0);
    if !(512..=page).contains(&fs_block) || !fs_block.is_power_of_two() {
        return Err(doc.field_error(
            "workload.fs_block",
            format!(
                "expected a power of two from 512 to the page size {page} (kernel.page_size), got {fs_block}"
            ),
        ));
    }
    let [user_scale, sys_scale] = wl.reals([
        ("user_scale", s.user_scale, d::REAIM_TASK_SCALE, 0.0..=1e4),
        ("sys_scale", s.sys_scale, d::REAIM_TASK_SCALE, 0.0..=1e4),
    ])?;
    // A scaled cost is held to the cap of a written one (1e7 kcycles per run), which bounds
    // the time-slicer's events and so the host time.
    let max_ns = 1e7 * 1e3 / ghz;
    for (field, scale, cost) in [
        (
            "user_scale",
            user_scale,
            workfile.tasks.iter().map(|t| t.user_ns).fold(0.0, f64::max),
        ),
        (
            "sys_scale",
            sys_scale,
            workfile.tasks.iter().map(|t| t.sys_ns).fold(0.0, f64::max),
        ),
    ] {
        if cost * scale > max_ns {
            return Err(doc.field_error(
                &wl.path(field),
                format!(
                    "{scale} makes a task cost more than 1e7 kcycles per run (the cap of user_kcycles and sys_kcycles)"
                ),
            ));
        }
    }
    let journal_blocks = wl.int(
        "journal_blocks",
        s.journal_blocks.unwrap_or(d::REAIM_JOURNAL_BLOCKS.0),
        1..=1024,
        "blocks",
    )?;
    if scsi.disk_bytes / fs_block < 1 << 16 {
        return Err(doc.field_error(
            "device[0].capacity_gb",
            "expected a disk of at least 65536 file-system blocks (the journal takes its last 1%)",
        ));
    }
    if c.memory_bytes < BUFFER_BASE + (1 << 30) {
        return Err(doc.field_error(
            "machine.memory_gib",
            "expected at least 5 GiB: re-aim's page cache lives above the first 4 GiB",
        ));
    }
    Ok(ReaimSetup {
        workfile,
        users,
        slice_ns: (slice_ms * 1e6).round() as u64,
        jitter,
        fs_block,
        journal_blocks,
        page,
        scale: (user_scale, sys_scale),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lab::spec::testing::*;
    use crate::lab::spec::Workload;

    fn reaim_of(text: &str) -> ReaimSetup {
        *variant!(ok(text).workload, Workload::Reaim)
    }

    #[test]
    fn reaim_fields_set_the_ramp_and_workfile_with_defaults() {
        let r = reaim_of(REAIM_SCSI);
        assert_eq!(r.users, vec![2, 4, 6, 8]);
        assert_eq!(r.workfile.name, "lab_mix");
        assert!(!r.workfile.tasks.is_empty());
        assert_eq!((r.page, r.fs_block), (d::REAIM_PAGE.0, d::REAIM_FS_BLOCK.0));
        assert_eq!(r.scale, (d::REAIM_TASK_SCALE.0, d::REAIM_TASK_SCALE.0));
        let own = format!(
            "{}\n[[workload.task]]\nname = \"sync\"\nweight = 3\nsys_kcycles = 20\nsync_write_kib = 8\n",
            with(REAIM_SCSI, "kernel", "page_size = 16384")
        );
        let r = reaim_of(&own);
        assert_eq!(r.page, 16384);
        assert_eq!(r.workfile.tasks.len(), 1);
        let t = &r.workfile.tasks[0];
        assert_eq!(
            (t.name.as_str(), t.weight, t.user_ns, t.sync_write_bytes),
            ("sync", 3, 0.0, 8192)
        );
    }

    #[test]
    fn reaim_fields_out_of_range_of_the_wrong_type_or_unknown_are_refused() {
        refused(
            &REAIM_SCSI.replace("end = 8", "end = 1"),
            "workload.end",
            &format!("expected 2..={MAX_USERS} users, from workload.start (cap MAX_USERS), got 1"),
        );
        refused(
            &REAIM_SCSI.replace("start = 2", "start = \"two\""),
            "workload.start",
            "invalid type: string \"two\", expected a non-negative integer",
        );
        refused(
            &with(REAIM_SCSI, "workload", "jitter_pct = 95.0"),
            "workload.jitter_pct",
            "expected a number in 0..=90, got 95",
        );
        refused(
            &with(REAIM_SCSI, "workload", "workfile = \"shared\""),
            "workload.workfile",
            "unknown workfile \"shared\": without [[workload.task]] tables expected one of",
        );
        refused(
            &with(REAIM_SCSI, "workload", "users = 4"),
            "workload.users",
            "unknown field `users`, expected one of `kind`, `workfile`, `start`",
        );
        refused(
            &format!("{REAIM_SCSI}\n[[workload.task]]\nname = \"t\"\nweight = 0\n"),
            "workload.task[0].weight",
            "expected 1..=10000 runs per job, got 0",
        );
        refused(
            &with(REAIM_SCSI, "kernel", "page_size = 5000"),
            "kernel.page_size",
            "expected a power of two in 4096..=65536 bytes, got 5000",
        );
        refused(
            &with(REAIM_SCSI, "workload", "fs_block = 8192"),
            "workload.fs_block",
            "expected a power of two from 512 to the page size 4096 (kernel.page_size), got 8192",
        );
        refused(
            &REAIM_SCSI.replace("memory_gib = 8", "memory_gib = 4"),
            "machine.memory_gib",
            "expected at least 5 GiB: re-aim's page cache lives above the first 4 GiB",
        );
    }
}
