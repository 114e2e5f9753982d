//! Timeline tracing: what each virtual CPU, the IOMMU's command consumer and each device
//! queue was doing, slice by slice, for `iolab trace`.
//!
//! Every [`Sim`](crate::Sim) carries a [`Tracer`], off by default: recording then costs one
//! `Cell<bool>` load at the few places that can record (the start of a
//! [`Cpu::spend`](crate::engine::Cpu::spend), the end of a spinlock spin, the models' own
//! calls). Tracing is switched on from outside the model code, for the simulations that a
//! closure creates on the current thread, with [`capture`]: the experiments run exactly as
//! `iolab run` runs them, and the first [`TraceOptions::sims`] simulations they create record
//! up to [`TraceOptions::max_events`] slices each (memory is capped; slices beyond the cap are
//! counted in [`SimTrace::dropped`]).
//!
//! A slice is `(track, name, start, duration, args)` in virtual nanoseconds. What records:
//!
//! - the engine: every CPU spend, on its CPU's track, named by its label
//!   ([`Cpu::spend_labeled`](crate::engine::Cpu::spend_labeled)) or its account (`user`,
//!   `system`);
//! - [`SpinLock`](crate::resources::SpinLock): `spin <lock name>` for the time a waiter
//!   spins;
//! - the models: enclosing slices (`cmdq issue`, `cmdq sync wait`) on a CPU track with
//!   [`Ctx::trace_since`](crate::Ctx::trace_since), the IOMMU command consumer's batches,
//!   and each device queue's in-flight I/Os (which overlap: the exporter spreads them over
//!   lanes).
//!
//! ```
//! use iolab_sim::engine::{Sim, SimConfig, SimDuration};
//! use iolab_sim::trace::{capture, Track, TraceOptions};
//! use iolab_sim::Account;
//!
//! let ((), traces) = capture(TraceOptions::default(), || {
//!     let mut sim = Sim::new(SimConfig { cpus: 1, seed: 1 }).unwrap();
//!     sim.spawn_on(0, |ctx| async move {
//!         ctx.cpu()
//!             .spend_labeled(SimDuration::ns(700), Account::System, "dma map")
//!             .await;
//!         ctx.cpu().spend(SimDuration::ns(300), Account::User).await;
//!     })
//!     .unwrap();
//!     sim.run().unwrap();
//! });
//! let t = &traces[0];
//! assert_eq!(t.events.len(), 2);
//! assert_eq!((t.events[0].track.clone(), t.events[0].name.as_ref()), (Track::Cpu(0), "dma map"));
//! assert_eq!((t.events[1].start_ns, t.events[1].dur_ns), (700, 300));
//! ```

use std::borrow::Cow;
use std::cell::{Cell, RefCell};

/// Where a slice is drawn.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Track {
    /// A virtual CPU, by index.
    Cpu(u32),
    /// A unit of the IOMMU, e.g. `cmdq consumer`.
    Iommu(Cow<'static, str>),
    /// A device queue, e.g. `nvme sq3` or `sas cq5`.
    Device(Cow<'static, str>),
}

/// One recorded slice.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TraceEvent {
    /// Where.
    pub track: Track,
    /// What, e.g. `dma map`, `spin cmdq_lock`, `read`.
    pub name: Cow<'static, str>,
    /// Start, virtual ns.
    pub start_ns: u64,
    /// Duration, virtual ns.
    pub dur_ns: u64,
    /// Numeric details (`len`, `cmds` ...), shown beside the slice.
    pub args: Vec<(&'static str, u64)>,
}

/// What [`capture`] records.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TraceOptions {
    /// How many simulations to trace, in the order they are created (an experiment creates
    /// one per configuration and run). Later ones run untraced.
    pub sims: usize,
    /// The most slices kept per simulation (within the window); more are counted, not kept.
    pub max_events: usize,
    /// Virtual-time window, ns: only slices that overlap `from_ns..to_ns` are kept (a slice
    /// that crosses an edge is kept whole); the others are counted in
    /// [`SimTrace::outside`]. `0..u64::MAX` keeps every slice.
    pub from_ns: u64,
    /// End of the window, ns (exclusive).
    pub to_ns: u64,
}

impl Default for TraceOptions {
    fn default() -> Self {
        TraceOptions {
            sims: 1,
            max_events: 200_000,
            from_ns: 0,
            to_ns: u64::MAX,
        }
    }
}

/// The trace of one simulation.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SimTrace {
    /// 0 for the first simulation created under [`capture`], 1 for the next ...
    pub index: usize,
    /// The machine's CPU count (CPU tracks 0..cpus).
    pub cpus: usize,
    /// The slices in recording order (not necessarily by start time: an enclosing slice is
    /// recorded when it ends).
    pub events: Vec<TraceEvent>,
    /// Slices beyond [`TraceOptions::max_events`], not kept.
    pub dropped: u64,
    /// Slices outside the window ([`TraceOptions::from_ns`], [`TraceOptions::to_ns`]), not
    /// kept.
    pub outside: u64,
    /// Virtual time when the simulation was dropped (its end).
    pub end_ns: u64,
}

struct Capture {
    options: TraceOptions,
    started: usize,
    done: Vec<SimTrace>,
    /// Inside [`untraced`]: simulations created now are neither traced nor counted.
    paused: bool,
}

thread_local! {
    static CAPTURE: RefCell<Option<Capture>> = const { RefCell::new(None) };
}

/// Resets the thread's capture when [`capture`] returns or unwinds.
struct CaptureGuard;

impl Drop for CaptureGuard {
    fn drop(&mut self) {
        CAPTURE.with(|c| c.borrow_mut().take());
    }
}

/// Runs `f`, tracing the first `options.sims` simulations it creates on this thread; returns
/// `f`'s result and their traces, in creation order. A simulation still alive when `f`
/// returns is not included. Captures do not nest: an inner `capture` replaces the outer one
/// for its duration.
pub fn capture<R>(options: TraceOptions, f: impl FnOnce() -> R) -> (R, Vec<SimTrace>) {
    CAPTURE.with(|c| {
        *c.borrow_mut() = Some(Capture {
            options,
            started: 0,
            done: Vec::new(),
            paused: false,
        });
    });
    let guard = CaptureGuard;
    let r = f();
    let mut traces = CAPTURE
        .with(|c| c.borrow_mut().take())
        .map(|c| c.done)
        .unwrap_or_default();
    drop(guard);
    traces.sort_by_key(|t| t.index);
    (r, traces)
}

/// Runs `f` with the current [`capture`] (if any) paused: simulations `f` creates are not
/// traced and do not count towards [`TraceOptions::sims`]. For helper simulations that only
/// lend a [`Handle`](crate::Handle) to a model's constructor and never run, so that the
/// simulation that does run is the one traced.
pub fn untraced<R>(f: impl FnOnce() -> R) -> R {
    let set = |paused: bool| {
        CAPTURE.with(|c| {
            c.borrow_mut()
                .as_mut()
                .map(|c| std::mem::replace(&mut c.paused, paused))
        })
    };
    let before = set(true);
    /// Restores the pause state when `f` returns or unwinds.
    struct Restore<F: Fn()>(F);
    impl<F: Fn()> Drop for Restore<F> {
        fn drop(&mut self) {
            (self.0)()
        }
    }
    let _restore = Restore(|| {
        if let Some(b) = before {
            set(b);
        }
    });
    f()
}

/// Records a slice on the CPU track of `ctx`'s task, from `start_ns` for `dur_ns`: for a part
/// of one CPU spend that the model prices as a whole (the DMA map inside
/// `dma map + driver submit`), recorded where the spend starts. Nothing for an agent task or
/// when tracing is off.
#[inline]
pub fn cpu_part(ctx: &crate::Ctx, name: &'static str, start_ns: u64, dur_ns: u64) {
    let tracer = ctx.handle().tracer();
    if tracer.is_on() && dur_ns > 0 {
        if let Some(cpu) = ctx.cpu_id() {
            tracer.slice(Track::Cpu(cpu as u32), name, start_ns, dur_ns, &[]);
        }
    }
}

/// Whether a slice from `start_ns` for `dur_ns` overlaps the window `from_ns..to_ns`: it
/// starts before the window ends and ends after it starts (a slice of no duration, when it
/// lies in the window).
fn overlaps(start_ns: u64, dur_ns: u64, from_ns: u64, to_ns: u64) -> bool {
    let end_ns = start_ns.saturating_add(dur_ns);
    start_ns < to_ns && (end_ns > from_ns || (dur_ns == 0 && start_ns >= from_ns))
}

struct Buffer {
    index: usize,
    cpus: usize,
    max_events: usize,
    from_ns: u64,
    to_ns: u64,
    events: Vec<TraceEvent>,
    dropped: u64,
    outside: u64,
}

/// A simulation's slice recorder; reach it with [`Handle::tracer`](crate::Handle::tracer).
/// Off unless the simulation was created under [`capture`].
pub struct Tracer {
    on: Cell<bool>,
    buf: RefCell<Option<Buffer>>,
}

impl std::fmt::Debug for Tracer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tracer")
            .field("on", &self.on.get())
            .finish()
    }
}

impl Tracer {
    /// A tracer for a simulation of `cpus` CPUs being created now: on if a [`capture`] on
    /// this thread still has room for it.
    pub(crate) fn for_new_sim(cpus: usize) -> Tracer {
        let buf = CAPTURE.with(|c| {
            let mut c = c.borrow_mut();
            let c = c.as_mut()?;
            if c.paused || c.started >= c.options.sims {
                return None;
            }
            c.started += 1;
            Some(Buffer {
                index: c.started - 1,
                cpus,
                max_events: c.options.max_events,
                from_ns: c.options.from_ns,
                to_ns: c.options.to_ns,
                events: Vec::new(),
                dropped: 0,
                outside: 0,
            })
        });
        Tracer {
            on: Cell::new(buf.is_some()),
            buf: RefCell::new(buf),
        }
    }

    /// Whether slices are being recorded. Check it before building a slice's name.
    #[inline(always)]
    pub fn is_on(&self) -> bool {
        self.on.get()
    }

    /// Records a slice (nothing when off; counted but not kept past the cap).
    pub fn slice(
        &self,
        track: Track,
        name: impl Into<Cow<'static, str>>,
        start_ns: u64,
        dur_ns: u64,
        args: &[(&'static str, u64)],
    ) {
        if !self.is_on() {
            return;
        }
        let Ok(mut b) = self.buf.try_borrow_mut() else {
            return;
        };
        let Some(b) = b.as_mut() else { return };
        if !overlaps(start_ns, dur_ns, b.from_ns, b.to_ns) {
            b.outside += 1;
            return;
        }
        if b.events.len() >= b.max_events {
            b.dropped += 1;
            return;
        }
        b.events.push(TraceEvent {
            track,
            name: name.into(),
            start_ns,
            dur_ns,
            args: args.to_vec(),
        });
    }

    /// Records a slice on the device-queue track that `queue` names (called only when
    /// tracing, so the name costs nothing otherwise): an I/O from submission to completion,
    /// a packet on the wire.
    #[inline]
    pub fn device(
        &self,
        queue: impl FnOnce() -> String,
        name: &'static str,
        start_ns: u64,
        dur_ns: u64,
        args: &[(&'static str, u64)],
    ) {
        if self.is_on() {
            self.slice(Track::Device(queue().into()), name, start_ns, dur_ns, args);
        }
    }

    /// Ends recording and hands the trace to the capture (called when the simulation is
    /// dropped, at virtual time `end_ns`).
    pub(crate) fn finish(&self, end_ns: u64) {
        if !self.is_on() {
            return;
        }
        self.on.set(false);
        let Some(b) = self.buf.borrow_mut().take() else {
            return;
        };
        let trace = SimTrace {
            index: b.index,
            cpus: b.cpus,
            events: b.events,
            dropped: b.dropped,
            outside: b.outside,
            end_ns,
        };
        CAPTURE.with(|c| {
            if let Some(c) = c.borrow_mut().as_mut() {
                c.done.push(trace);
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::accounting::Account;
    use crate::engine::{Sim, SimConfig, SimDuration};
    use crate::resources::{SpinLock, SpinParams};

    fn contended_run(cpus: usize) {
        let mut sim = Sim::new(SimConfig { cpus, seed: 3 }).unwrap();
        let lock = SpinLock::new(sim.handle(), "l", SpinParams::default()).unwrap();
        for cpu in 0..cpus {
            let lock = lock.clone();
            sim.spawn_on(cpu, move |ctx| async move {
                for _ in 0..5 {
                    let g = lock.lock(&ctx).await;
                    ctx.cpu()
                        .spend_labeled(SimDuration::ns(500), Account::System, "work")
                        .await;
                    g.unlock().await;
                }
            })
            .unwrap();
        }
        sim.run().unwrap();
    }

    #[test]
    fn off_by_default_and_outside_capture() {
        let sim = Sim::new(SimConfig { cpus: 1, seed: 1 }).unwrap();
        assert!(!sim.handle().tracer().is_on());
    }

    #[test]
    fn records_spends_and_spins_of_the_first_sims_only() {
        let ((), traces) = capture(
            TraceOptions {
                sims: 1,
                max_events: 10_000,
                ..TraceOptions::default()
            },
            || {
                contended_run(3);
                contended_run(2);
            },
        );
        assert_eq!(traces.len(), 1);
        let t = &traces[0];
        assert_eq!(t.cpus, 3);
        let work = t.events.iter().filter(|e| e.name == "work").count();
        assert_eq!(work, 15);
        let spins: Vec<_> = t.events.iter().filter(|e| e.name == "spin l").collect();
        assert!(!spins.is_empty(), "three CPUs on one lock must spin");
        // Slices on one CPU never overlap: spends and spins are sequential there.
        for cpu in 0..3 {
            let mut s: Vec<_> = t
                .events
                .iter()
                .filter(|e| e.track == Track::Cpu(cpu))
                .collect();
            s.sort_by_key(|e| e.start_ns);
            for w in s.windows(2) {
                assert!(w[0].start_ns + w[0].dur_ns <= w[1].start_ns, "{w:?}");
            }
        }
        // Outside the capture nothing records.
        let sim = Sim::new(SimConfig { cpus: 1, seed: 1 }).unwrap();
        assert!(!sim.handle().tracer().is_on());
    }

    #[test]
    fn cap_counts_what_it_drops() {
        let traced = |max_events| {
            let ((), mut traces) = capture(
                TraceOptions {
                    sims: 1,
                    max_events,
                    ..TraceOptions::default()
                },
                || contended_run(2),
            );
            traces.remove(0)
        };
        // Uncapped, the run records every event; capped at 4, it keeps the first 4 and
        // counts every other one as dropped.
        let all = traced(10_000);
        assert_eq!(all.dropped, 0);
        assert!(all.events.len() > 10, "{}", all.events.len());
        let capped = traced(4);
        assert_eq!(capped.events, all.events[..4]);
        assert_eq!(capped.dropped, (all.events.len() - 4) as u64);
    }

    #[test]
    fn the_window_keeps_overlapping_slices_and_caps_within_it() {
        let traced = |from_ns, to_ns, max_events| {
            let ((), mut traces) = capture(
                TraceOptions {
                    sims: 1,
                    max_events,
                    from_ns,
                    to_ns,
                },
                || contended_run(2),
            );
            traces.remove(0)
        };
        let all = traced(0, u64::MAX, 10_000);
        assert_eq!(all.outside, 0);
        let (from, to) = (1_000, 3_000);
        let inside: Vec<TraceEvent> = all
            .events
            .iter()
            .filter(|e| e.start_ns < to && e.start_ns + e.dur_ns > from)
            .cloned()
            .collect();
        assert!(!inside.is_empty() && inside.len() < all.events.len());
        let w = traced(from, to, 10_000);
        assert_eq!(w.events, inside);
        assert_eq!(w.outside, (all.events.len() - inside.len()) as u64);
        assert_eq!(w.dropped, 0);
        // The cap applies to the slices in the window.
        let capped = traced(from, to, 2);
        assert_eq!(capped.events, inside[..2]);
        assert_eq!(capped.dropped, (inside.len() - 2) as u64);
        assert_eq!(capped.outside, w.outside);
    }

    #[test]
    fn overlap_rule() {
        assert!(overlaps(900, 200, 1_000, 2_000), "crosses the start");
        assert!(overlaps(1_900, 200, 1_000, 2_000), "crosses the end");
        assert!(overlaps(500, 5_000, 1_000, 2_000), "covers the window");
        assert!(!overlaps(800, 200, 1_000, 2_000), "ends at the start");
        assert!(!overlaps(2_000, 10, 1_000, 2_000), "starts at the end");
        assert!(overlaps(1_000, 0, 1_000, 2_000), "instant at the start");
        assert!(!overlaps(2_000, 0, 1_000, 2_000), "instant at the end");
        assert!(overlaps(u64::MAX - 1, 10, 0, u64::MAX), "no overflow");
    }

    #[test]
    fn tracing_does_not_change_the_run() {
        let run = || {
            let mut sim = Sim::new(SimConfig { cpus: 4, seed: 9 }).unwrap();
            let lock = SpinLock::new(sim.handle(), "l", SpinParams::default()).unwrap();
            for cpu in 0..4 {
                let lock = lock.clone();
                sim.spawn_on(cpu, move |ctx| async move {
                    for i in 0..20u64 {
                        let g = lock.lock(&ctx).await;
                        ctx.cpu()
                            .spend(SimDuration::ns(100 + i * 7), Account::System)
                            .await;
                        g.unlock().await;
                        ctx.sleep(SimDuration::ns(300)).await;
                    }
                })
                .unwrap();
            }
            sim.run().unwrap().to_string()
        };
        let plain = run();
        let (traced, traces) = capture(TraceOptions::default(), run);
        assert_eq!(plain, traced);
        assert!(!traces[0].events.is_empty());
    }

    #[test]
    fn untraced_sims_are_not_counted() {
        let ((), traces) = capture(TraceOptions::default(), || {
            let scratch = untraced(|| Sim::new(SimConfig { cpus: 1, seed: 1 }).unwrap());
            assert!(!scratch.handle().tracer().is_on());
            contended_run(2);
        });
        assert_eq!(traces.len(), 1);
        assert_eq!(
            traces[0].cpus, 2,
            "the run, not the scratch sim, was traced"
        );
    }

    /// A small workload scenario of each DMA path the lab builds, traced and not: the same
    /// report, and the trace shows the path's map and unmap and a device queue.
    #[test]
    fn lab_runs_are_unchanged_by_tracing_and_show_their_dma_paths() {
        use crate::lab::{self, LabOptions};
        let fio = |iommu: &str| {
            format!(
                "name = \"t\"\n[machine]\nplatform = \"hisilicon-d06\"\ncpus = 4\n\
                 [iommu]\n{iommu}\n[[device]]\nkind = \"nvme\"\n[workload]\nkind = \"fio\"\nioengine = \"libaio\"\n\
                 rw = \"randread\"\niodepth = 4\nnumjobs = 2\nruntime_ms = 1\nramp_ms = 0\n"
            )
        };
        for (text, names, queue) in [
            (
                fio("model = \"smmuv3\"\nmode = \"strict\""),
                &["dma map", "dma unmap", "cmdq issue", "cmdq sync wait"][..],
                "nvme0 q0",
            ),
            (
                fio("model = \"smmuv3\"\nmode = \"lazy\""),
                &["dma map", "dma unmap"][..],
                "nvme0 q1",
            ),
            (
                lab::examples::example("netperf-pseries-ddw")
                    .unwrap()
                    .to_owned(),
                &["dma map", "dma unmap"][..],
                "nic tx q0",
            ),
        ] {
            let plain = lab::run_scenario(&text, "t.toml", &LabOptions::default()).unwrap();
            let (traced, traces) = capture(TraceOptions::default(), || {
                lab::run_scenario(&text, "t.toml", &LabOptions::default()).unwrap()
            });
            assert_eq!(plain.report.report_text, traced.report.report_text);
            assert_eq!(traces.len(), 1);
            let t = &traces[0];
            for n in names {
                assert!(
                    t.events
                        .iter()
                        .any(|e| matches!(e.track, Track::Cpu(_)) && e.name == *n),
                    "{n} missing"
                );
            }
            assert!(
                t.events
                    .iter()
                    .any(|e| e.track == Track::Device(queue.to_owned().into())),
                "no slice on {queue}"
            );
        }
    }
}
