//! One TCP flow's loss recovery and congestion control, in whole segments: the sender's
//! window and scoreboard and the receiver's reassembly, as the direct-DMA receive test
//! ([`crate::workloads::rx_stream`]) runs them when the NIC drops packets (pause frames
//! off, docs/model/fands-iotlb.md).
//!
//! The model follows Linux's TCP where it decides what the receiving host's NIC sees:
//!
//! - **Receiver** (`tcp_data_queue`): an in-order segment advances `rcv_nxt` and joins the
//!   delayed-ACK path; an out-of-order or duplicate segment is acknowledged at once with a
//!   SACK block naming it (quick ACK); the segment that fills a hole is acknowledged at once
//!   while the out-of-order queue held data.
//! - **Sender**: a window of `cwnd` segments in flight (RFC 6675's pipe: sent, not
//!   acknowledged, not SACKed, not marked lost); slow start from `init_cwnd` to `ssthresh`,
//!   then one segment per window (Reno's additive increase, which DCTCP keeps);
//!   RACK loss detection (RFC 8985, Linux `tcp_rack_mark_lost`): once three segments are
//!   SACKed, or during recovery, an unacknowledged segment sent before the most recently
//!   delivered one is lost (reordering window 0: the lab's network does not reorder);
//!   on the first loss of a window the window halves (DCTCP's reaction to loss,
//!   `dctcp_react_to_loss` since Linux 5.1) until the data outstanding then is
//!   acknowledged; lost segments go out again before new data. A flow that hears nothing
//!   for its probe timeout (`2 * srtt` plus a floor, Linux's tail-loss probe) retransmits
//!   its first unacknowledged segment.
//! - **Receive window**: at most `rwnd` segments outstanding.

use std::collections::{BTreeSet, VecDeque};

/// A flow's TCP parameters.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct TcpParams {
    /// Initial congestion window, segments.
    pub init_cwnd: f64,
    /// The receiver's advertised window, segments.
    pub rwnd: f64,
    /// What the probe timeout adds to twice the smoothed round trip, ns.
    pub min_pto_ns: u64,
}

/// What the sender keeps about one segment in flight.
#[derive(Clone, Copy, Debug, Default)]
struct Segment {
    /// When it was (last) sent, ns.
    sent_ns: u64,
    /// The receiver holds it (a SACK named it).
    sacked: bool,
    /// Marked lost and not yet sent again.
    lost: bool,
    /// Sent more than once.
    retransmitted: bool,
}

/// The sending side of one flow.
#[derive(Clone, Debug)]
pub struct TcpSender {
    params: TcpParams,
    /// Oldest unacknowledged segment.
    snd_una: u64,
    /// Next new segment.
    snd_nxt: u64,
    cwnd: f64,
    ssthresh: f64,
    /// `snd_nxt` when recovery began: recovery ends once it is acknowledged.
    recovery_point: Option<u64>,
    /// `snd_una..snd_nxt`.
    segments: VecDeque<Segment>,
    /// Lost segments waiting to go out again, oldest first.
    lost: BTreeSet<u64>,
    sacked_out: u64,
    lost_out: u64,
    /// Send time of the most recently sent segment known delivered (RACK).
    rack_sent_ns: u64,
    /// Smoothed round-trip time, ns (0 before the first sample).
    srtt_ns: f64,
    /// Segments retransmitted.
    pub retransmits: u64,
    /// Recovery episodes (window halvings).
    pub recoveries: u64,
}

impl TcpSender {
    /// A flow with nothing sent yet.
    pub fn new(params: TcpParams) -> Self {
        Self {
            params,
            snd_una: 0,
            snd_nxt: 0,
            cwnd: params.init_cwnd,
            ssthresh: f64::INFINITY,
            recovery_point: None,
            segments: VecDeque::new(),
            lost: BTreeSet::new(),
            sacked_out: 0,
            lost_out: 0,
            rack_sent_ns: 0,
            srtt_ns: 0.0,
            retransmits: 0,
            recoveries: 0,
        }
    }

    /// Segments in flight (RFC 6675 pipe).
    fn pipe(&self) -> u64 {
        (self.snd_nxt - self.snd_una) - self.sacked_out - self.lost_out
    }

    /// Whether the window lets a segment go now.
    pub fn can_send(&self) -> bool {
        if !self.lost.is_empty() {
            return (self.pipe() as f64) < self.cwnd;
        }
        (self.pipe() as f64) < self.cwnd
            && ((self.snd_nxt - self.snd_una) as f64) < self.params.rwnd
    }

    /// Sends the next segment at `now` (a lost one first): its sequence number, and
    /// whether it is a retransmission.
    pub fn send(&mut self, now: u64) -> (u64, bool) {
        if let Some(seq) = self.lost.pop_first() {
            let seg = &mut self.segments[(seq - self.snd_una) as usize];
            seg.lost = false;
            seg.retransmitted = true;
            seg.sent_ns = now;
            self.lost_out -= 1;
            self.retransmits += 1;
            return (seq, true);
        }
        let seq = self.snd_nxt;
        self.snd_nxt += 1;
        self.segments.push_back(Segment {
            sent_ns: now,
            ..Segment::default()
        });
        (seq, false)
    }

    /// The congestion window, segments.
    pub fn cwnd(&self) -> f64 {
        self.cwnd
    }

    /// How long the flow waits for an acknowledgement before it probes, ns: twice the
    /// smoothed round trip plus the floor (Linux `tcp_schedule_loss_probe`).
    pub fn probe_timeout_ns(&self) -> u64 {
        (2.0 * self.srtt_ns) as u64 + self.params.min_pto_ns
    }

    /// Whether data is outstanding.
    pub fn outstanding(&self) -> bool {
        self.snd_nxt > self.snd_una
    }

    /// The probe timeout fired with nothing heard: the first unacknowledged segment is
    /// marked lost (it goes out again next).
    pub fn probe(&mut self) {
        if !self.outstanding() {
            return;
        }
        let seq = self.snd_una;
        self.mark_lost(seq);
    }

    fn mark_lost(&mut self, seq: u64) {
        let seg = &mut self.segments[(seq - self.snd_una) as usize];
        if seg.lost || seg.sacked {
            return;
        }
        seg.lost = true;
        self.lost_out += 1;
        self.lost.insert(seq);
        if self.recovery_point.is_none() {
            // DCTCP on loss: the window halves (dctcp_react_to_loss).
            self.ssthresh = (self.cwnd / 2.0).max(2.0);
            self.cwnd = self.ssthresh;
            self.recovery_point = Some(self.snd_nxt);
            self.recoveries += 1;
        }
    }

    fn delivered(&mut self, seg: Segment, now: u64) {
        self.rack_sent_ns = self.rack_sent_ns.max(seg.sent_ns);
        if !seg.retransmitted {
            let sample = now.saturating_sub(seg.sent_ns) as f64;
            self.srtt_ns = if self.srtt_ns == 0.0 {
                sample
            } else {
                0.875 * self.srtt_ns + 0.125 * sample
            };
        }
        if self.recovery_point.is_none() {
            self.cwnd = if self.cwnd < self.ssthresh {
                self.cwnd + 1.0
            } else {
                self.cwnd + 1.0 / self.cwnd
            }
            .min(self.params.rwnd);
        }
    }

    /// An acknowledgement arrives at `now`: everything below `cum` is held by the receiver,
    /// and `sack` (if any) names a block of segments it holds, first to last.
    pub fn on_ack(&mut self, cum: u64, sack: Option<(u64, u64)>, now: u64) {
        while self.snd_una < cum.min(self.snd_nxt) {
            let Some(seg) = self.segments.pop_front() else {
                break;
            };
            let seq = self.snd_una;
            self.snd_una += 1;
            if seg.sacked {
                self.sacked_out -= 1;
            } else {
                if seg.lost {
                    self.lost_out -= 1;
                    self.lost.remove(&seq);
                }
                self.delivered(seg, now);
            }
        }
        let (first, last) = sack.unwrap_or((1, 0));
        for s in first.max(self.snd_una)..=last.min(self.snd_nxt.saturating_sub(1)) {
            let i = (s - self.snd_una) as usize;
            let seg = self.segments[i];
            if !seg.sacked {
                if seg.lost {
                    self.lost_out -= 1;
                    self.lost.remove(&s);
                }
                self.segments[i].sacked = true;
                self.segments[i].lost = false;
                self.sacked_out += 1;
                self.delivered(seg, now);
            }
        }
        if self.recovery_point.is_some_and(|p| self.snd_una >= p) {
            self.recovery_point = None;
        }
        // RACK: a segment sent before one now delivered is lost, once three are SACKed
        // or while recovering (no reordering window: the path does not reorder).
        if self.sacked_out > 0 && (self.sacked_out >= 3 || self.recovery_point.is_some()) {
            let rack = self.rack_sent_ns;
            for i in 0..self.segments.len() {
                let g = self.segments[i];
                if !g.sacked && !g.lost && g.sent_ns < rack {
                    self.mark_lost(self.snd_una + i as u64);
                }
            }
        }
    }
}

/// What the receiver does with one arriving segment.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Arrival {
    /// In order, no hole behind it: the delayed-ACK path.
    InOrder,
    /// In order and it filled a hole: acknowledged at once.
    FilledHole,
    /// Beyond a hole: acknowledged at once with a SACK naming it.
    OutOfOrder,
    /// Already held (a needless retransmission): acknowledged at once (D-SACK).
    Duplicate,
}

/// The receiving side of one flow.
#[derive(Clone, Debug, Default)]
pub struct TcpReceiver {
    /// Next segment expected in order.
    rcv_nxt: u64,
    /// Segments held beyond a hole.
    ooo: BTreeSet<u64>,
    /// Segments that arrived out of order or twice.
    pub out_of_order: u64,
}

impl TcpReceiver {
    /// Takes segment `seq`: what it is, for the ACK it calls for.
    pub fn receive(&mut self, seq: u64) -> Arrival {
        if seq != self.rcv_nxt {
            self.out_of_order += 1;
            if seq < self.rcv_nxt || !self.ooo.insert(seq) {
                return Arrival::Duplicate;
            }
            return Arrival::OutOfOrder;
        }
        self.rcv_nxt += 1;
        if self.ooo.is_empty() {
            return Arrival::InOrder;
        }
        while self.ooo.first() == Some(&self.rcv_nxt) {
            self.ooo.pop_first();
            self.rcv_nxt += 1;
        }
        Arrival::FilledHole
    }

    /// The cumulative acknowledgement: every segment below it is held.
    pub fn rcv_nxt(&self) -> u64 {
        self.rcv_nxt
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const P: TcpParams = TcpParams {
        init_cwnd: 10.0,
        rwnd: 1000.0,
        min_pto_ns: 10_000,
    };

    /// Sends what the window allows, one segment per ns from `now`.
    fn send_all(s: &mut TcpSender, now: u64) -> Vec<u64> {
        let mut out = Vec::new();
        while s.can_send() {
            out.push(s.send(now + out.len() as u64).0);
        }
        out
    }

    #[test]
    fn slow_start_doubles_the_window_per_round_trip_and_the_receive_window_caps_it() {
        let mut s = TcpSender::new(P);
        let sent = send_all(&mut s, 0);
        assert_eq!(sent, (0..10).collect::<Vec<_>>());
        for (i, seq) in sent.iter().enumerate() {
            s.on_ack(seq + 1, None, 100 + i as u64);
        }
        assert_eq!(s.cwnd(), 20.0);
        let mut r = TcpSender::new(TcpParams { rwnd: 12.0, ..P });
        let _ = send_all(&mut r, 0);
        r.on_ack(5, None, 100);
        assert_eq!(r.cwnd(), 12.0);
        assert_eq!(
            send_all(&mut r, 200).len(),
            7,
            "12 outstanding at most, 5 still are"
        );
    }

    #[test]
    fn a_drop_is_found_after_three_sacks_halves_the_window_and_goes_out_first() {
        let mut s = TcpSender::new(TcpParams {
            init_cwnd: 20.0,
            ..P
        });
        let sent = send_all(&mut s, 0);
        assert_eq!(sent.len(), 20);
        let mut r = TcpReceiver::default();
        // Segment 3 is dropped.
        let mut lost_found = false;
        for seq in sent.into_iter().filter(|&q| q != 3) {
            let a = r.receive(seq);
            let sack = (a == Arrival::OutOfOrder).then_some((seq, seq));
            s.on_ack(r.rcv_nxt(), sack, 1_000 + seq);
            if s.recoveries == 1 && !lost_found {
                lost_found = true;
                assert_eq!(seq, 6, "third SACK (4, 5, 6) finds 3 lost");
                assert_eq!(s.cwnd(), 13.0, "half of 20 + 6 slow-start increments");
            }
        }
        assert!(lost_found);
        assert_eq!(r.rcv_nxt(), 3);
        assert_eq!(s.send(2_000), (3, true), "the lost segment goes first");
        assert_eq!(r.receive(3), Arrival::FilledHole);
        assert_eq!(r.rcv_nxt(), 20);
        s.on_ack(20, None, 3_000);
        assert!(!s.outstanding());
        assert_eq!((s.retransmits, s.recoveries), (1, 1));
        assert_eq!(r.out_of_order, 16);
        assert_eq!(r.receive(5), Arrival::Duplicate);
    }

    #[test]
    fn a_lost_retransmission_is_found_again_by_later_deliveries() {
        let mut s = TcpSender::new(TcpParams {
            init_cwnd: 8.0,
            ..P
        });
        let _ = send_all(&mut s, 0);
        for seq in 1..8 {
            s.on_ack(0, Some((seq, seq)), 100);
        }
        assert_eq!(s.send(200), (0, true), "segment 0 retransmitted");
        // The retransmission is dropped; a new segment sent after it is delivered.
        let (fresh, resent) = s.send(300);
        assert!(!resent);
        s.on_ack(0, Some((fresh, fresh)), 400);
        assert_eq!(s.send(500), (0, true), "found lost again and retransmitted");
        assert_eq!(s.retransmits, 2);
        assert_eq!(s.recoveries, 1, "one halving per window");
    }

    #[test]
    fn one_sack_block_of_three_finds_the_hole_lost() {
        // GRO merged segments 4..=6, beyond the lost 3, into one skb: one ACK, one block.
        let mut s = TcpSender::new(TcpParams {
            init_cwnd: 10.0,
            ..P
        });
        let _ = send_all(&mut s, 0);
        s.on_ack(3, None, 100);
        assert_eq!(s.recoveries, 0);
        s.on_ack(3, Some((4, 6)), 200);
        assert_eq!(s.recoveries, 1, "three SACKed segments in one block");
        assert_eq!(s.send(300), (3, true), "the hole goes first");
        // A block reaching below the cumulative point or beyond what was sent is clamped
        // to what is outstanding.
        s.on_ack(7, Some((0, 99)), 400);
        assert_eq!(s.retransmits, 1);
    }

    #[test]
    fn the_probe_timeout_retransmits_a_tail_loss() {
        let mut s = TcpSender::new(TcpParams {
            init_cwnd: 2.0,
            ..P
        });
        let _ = send_all(&mut s, 0);
        s.on_ack(1, None, 50_000);
        assert_eq!(s.probe_timeout_ns(), 110_000);
        s.probe();
        assert!(s.can_send());
        assert_eq!(s.send(200_000), (1, true));
        assert_eq!(s.cwnd(), 2.0, "halved from 3 and floored at 2");
    }
}
