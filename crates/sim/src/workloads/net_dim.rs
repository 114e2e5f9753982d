//! Dynamic interrupt moderation as Linux's `net_dim` runs it for one receive queue
//! (lib/dim/net_dim.c, lib/dim/dim.c; mlx5e calls it each time a NAPI poll completes).
//!
//! Every [`DIM_NEVENTS`] interrupts it compares the queue's rates since its last sample
//! (bytes, then packets, then interrupts per millisecond; a change counts when it is more
//! than 10%) and steps through five moderation profiles: on through a profile that did
//! better, back when it did worse or the same, parked once it has turned on the same spot,
//! and parked "tired" after ten steps. The receive test applies a new profile at once (the
//! driver's work item applies it a little later).

/// Interrupts between two decisions (Linux `DIM_NEVENTS`).
pub const DIM_NEVENTS: u64 = 64;

/// One moderation profile: the completion period and the completions per interrupt.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Moderation {
    /// Longest hold of a completion, microseconds (from the first completion: CQE mode).
    pub usecs: u64,
    /// Completions that raise the interrupt at once.
    pub frames: u64,
}

/// The receive profiles in CQE period mode (Linux `NET_DIM_RX_CQE_PROFILES`, the mode mlx5
/// picks when the device starts its period from a completion, as ConnectX-5 does).
pub const RX_CQE_PROFILES: [Moderation; 5] = [
    Moderation {
        usecs: 2,
        frames: 256,
    },
    Moderation {
        usecs: 8,
        frames: 128,
    },
    Moderation {
        usecs: 16,
        frames: 64,
    },
    Moderation {
        usecs: 32,
        frames: 64,
    },
    Moderation {
        usecs: 64,
        frames: 64,
    },
];

/// The profile a queue starts with (Linux `NET_DIM_DEF_PROFILE_CQE`).
pub const DEFAULT_PROFILE: usize = 1;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Tune {
    ParkingOnTop,
    ParkingTired,
    GoingRight,
    GoingLeft,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Measure {
    Start,
    InProgress,
}

/// A queue's counters at one instant.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Sample {
    /// Virtual time, ns.
    pub now_ns: u64,
    /// Interrupts so far.
    pub events: u64,
    /// Packets received so far.
    pub packets: u64,
    /// Bytes received so far.
    pub bytes: u64,
}

/// Rates over a measurement (per millisecond, rounded up as Linux's `dim_calc_stats`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Stats {
    ppms: u64,
    bpms: u64,
    epms: u64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Compare {
    Better,
    Worse,
    Same,
}

/// More than 10% apart (Linux `IS_SIGNIFICANT_DIFF`).
fn significant(val: u64, reference: u64) -> bool {
    reference != 0 && 100 * val.abs_diff(reference) / reference > 10
}

fn compare(curr: Stats, prev: Stats) -> Compare {
    // Bytes, then packets per ms: more is better; a zero reference only tells some from none.
    for (c, p) in [(curr.bpms, prev.bpms), (curr.ppms, prev.ppms)] {
        if p == 0 {
            return if c != 0 {
                Compare::Better
            } else {
                Compare::Same
            };
        }
        if significant(c, p) {
            return if c > p {
                Compare::Better
            } else {
                Compare::Worse
            };
        }
    }
    // Then interrupts per ms: fewer is better.
    if prev.epms != 0 && significant(curr.epms, prev.epms) {
        return if curr.epms < prev.epms {
            Compare::Better
        } else {
            Compare::Worse
        };
    }
    Compare::Same
}

/// One queue's DIM state.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NetDim {
    profile: usize,
    tune: Tune,
    measure: Measure,
    steps_left: u32,
    steps_right: u32,
    tired: u32,
    prev: Stats,
    start: Sample,
}

impl Default for NetDim {
    fn default() -> Self {
        Self::new()
    }
}

impl NetDim {
    /// A queue's DIM as the driver allocates it: zeroed (profile index 0, parked), while the
    /// queue itself starts at [`DEFAULT_PROFILE`]; the first decision steps right to it.
    pub fn new() -> Self {
        NetDim {
            profile: 0,
            tune: Tune::ParkingOnTop,
            measure: Measure::Start,
            steps_left: 0,
            steps_right: 0,
            tired: 0,
            prev: Stats::default(),
            start: Sample::default(),
        }
    }

    /// The profile DIM stands on (index into [`RX_CQE_PROFILES`]).
    pub fn profile(&self) -> usize {
        self.profile
    }

    fn step(&mut self) -> Option<Step> {
        if self.tired == 2 * RX_CQE_PROFILES.len() as u32 {
            return Some(Step::TooTired);
        }
        match self.tune {
            Tune::ParkingOnTop | Tune::ParkingTired => {}
            Tune::GoingRight => {
                if self.profile == RX_CQE_PROFILES.len() - 1 {
                    return Some(Step::OnEdge);
                }
                self.profile += 1;
                self.steps_right += 1;
            }
            Tune::GoingLeft => {
                if self.profile == 0 {
                    return Some(Step::OnEdge);
                }
                self.profile -= 1;
                self.steps_left += 1;
            }
        }
        self.tired += 1;
        None
    }

    fn exit_parking(&mut self) {
        self.tune = if self.profile > 0 {
            Tune::GoingLeft
        } else {
            Tune::GoingRight
        };
        self.step();
    }

    fn on_top(&self) -> bool {
        match self.tune {
            Tune::ParkingOnTop | Tune::ParkingTired => true,
            Tune::GoingRight => self.steps_left > 1 && self.steps_right == 1,
            Tune::GoingLeft => self.steps_right > 1 && self.steps_left == 1,
        }
    }

    fn turn(&mut self) {
        match self.tune {
            Tune::ParkingOnTop | Tune::ParkingTired => {}
            Tune::GoingRight => {
                self.tune = Tune::GoingLeft;
                self.steps_left = 0;
            }
            Tune::GoingLeft => {
                self.tune = Tune::GoingRight;
                self.steps_right = 0;
            }
        }
    }

    fn park_on_top(&mut self) {
        self.steps_left = 0;
        self.steps_right = 0;
        self.tired = 0;
        self.tune = Tune::ParkingOnTop;
    }

    fn park_tired(&mut self) {
        self.steps_left = 0;
        self.steps_right = 0;
        self.tune = Tune::ParkingTired;
    }

    /// Linux's `net_dim_decision`: whether the profile changed.
    fn decide(&mut self, curr: Stats) -> bool {
        let (prev_tune, prev_profile) = (self.tune, self.profile);
        match self.tune {
            Tune::ParkingOnTop => {
                if compare(curr, self.prev) != Compare::Same {
                    self.exit_parking();
                }
            }
            Tune::ParkingTired => {
                self.tired = self.tired.saturating_sub(1);
                if self.tired == 0 {
                    self.exit_parking();
                }
            }
            Tune::GoingRight | Tune::GoingLeft => {
                if compare(curr, self.prev) != Compare::Better {
                    self.turn();
                }
                if self.on_top() {
                    self.park_on_top();
                } else {
                    match self.step() {
                        Some(Step::OnEdge) => self.park_on_top(),
                        Some(Step::TooTired) => self.park_tired(),
                        None => {}
                    }
                }
            }
        }
        if prev_tune != Tune::ParkingOnTop || self.tune != Tune::ParkingOnTop {
            self.prev = curr;
        }
        self.profile != prev_profile
    }

    /// The queue's NAPI poll completed with its counters at `end` (Linux `net_dim`): the new
    /// moderation when DIM changes profile.
    pub fn on_poll_complete(&mut self, end: Sample) -> Option<Moderation> {
        if self.measure == Measure::InProgress {
            if end.events.saturating_sub(self.start.events) < DIM_NEVENTS {
                return None;
            }
            let us = end.now_ns.saturating_sub(self.start.now_ns) / 1000;
            if us > 0 {
                let rate = |n: u64| (n * 1000).div_ceil(us);
                let curr = Stats {
                    ppms: rate(end.packets - self.start.packets),
                    bpms: rate(end.bytes - self.start.bytes),
                    epms: rate(DIM_NEVENTS),
                };
                if self.decide(curr) {
                    // The driver's work item applies the profile; measuring starts again.
                    self.measure = Measure::Start;
                    return Some(RX_CQE_PROFILES[self.profile]);
                }
            }
        }
        self.start = end;
        self.measure = Measure::InProgress;
        None
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Step {
    OnEdge,
    TooTired,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Feeds `dim` one decision's worth of interrupts over `us` microseconds at `gbps`.
    fn measure(dim: &mut NetDim, t: &mut Sample, us: u64, gbps: f64) -> Option<Moderation> {
        // The sample that starts the measurement, then DIM_NEVENTS interrupts later.
        dim.on_poll_complete(*t);
        t.now_ns += us * 1000;
        t.events += DIM_NEVENTS;
        let bytes = (gbps * us as f64 * 1000.0 / 8.0) as u64;
        t.bytes += bytes;
        t.packets += bytes / 1500;
        dim.on_poll_complete(*t)
    }

    #[test]
    fn the_first_decision_steps_right_to_the_default_profile() {
        let mut dim = NetDim::new();
        let mut t = Sample::default();
        assert_eq!(
            measure(&mut dim, &mut t, 1000, 10.0),
            Some(RX_CQE_PROFILES[1])
        );
        assert_eq!(dim.profile(), DEFAULT_PROFILE);
    }

    #[test]
    fn a_steady_load_walks_to_fewer_interrupts_and_parks() {
        // Same bytes and packets per ms whatever the profile, fewer interrupts per ms as
        // the period grows: DIM keeps going right while the interrupt rate falls.
        let mut dim = NetDim::new();
        let mut t = Sample::default();
        let mut seen = vec![dim.profile()];
        for _ in 0..40 {
            let period = RX_CQE_PROFILES[dim.profile()].usecs.max(1);
            // 64 interrupts take 64 periods (plus a base of 10 us each).
            measure(&mut dim, &mut t, DIM_NEVENTS * (period + 10), 50.0);
            seen.push(dim.profile());
        }
        assert_eq!(*seen.last().unwrap(), 4, "{seen:?}");
        assert!(seen.windows(2).all(|w| w[1] + 1 >= w[0]), "{seen:?}");
    }

    #[test]
    fn less_throughput_turns_dim_back() {
        let mut dim = NetDim::new();
        let mut t = Sample::default();
        measure(&mut dim, &mut t, 1000, 50.0); // 0 -> 1
        measure(&mut dim, &mut t, 1000, 60.0); // better: 1 -> 2
        assert_eq!(dim.profile(), 2);
        measure(&mut dim, &mut t, 1000, 40.0); // worse: turn, 2 -> 1
        assert_eq!(dim.profile(), 1);
    }

    #[test]
    fn significance_is_more_than_ten_percent() {
        assert!(!significant(110, 100));
        assert!(significant(111, 100));
        assert!(!significant(5, 0));
        assert_eq!(
            compare(
                Stats {
                    bpms: 105,
                    ppms: 50,
                    epms: 10
                },
                Stats {
                    bpms: 100,
                    ppms: 50,
                    epms: 20
                }
            ),
            Compare::Better,
            "same bytes and packets, half the interrupts"
        );
    }
}
