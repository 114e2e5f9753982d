//! Where each virtual CPU sits (cluster, die, socket) and what moving a cache line between
//! two CPUs costs.
//!
//! A cache line that one CPU wrote and another CPU then reads, writes or takes with an
//! atomic must move between their caches; the time depends on how far apart the two CPUs
//! are (same cluster sharing an L2, same die sharing an L3 slice ring or mesh, another die
//! of the socket, another socket). Published core-to-core latency tables (RESEARCH.md,
//! "Component facts for contention") show two to five distinct levels per machine, which
//! this type keeps: CPUs are numbered consecutively through clusters, dies and sockets
//! (as Linux numbers them on the bundled platforms: CPU `i` is in cluster
//! `i / cores_per_cluster`).
//!
//! Without a topology (a profile with no `[topology]` section) every transfer costs the
//! line's own flat [`LineParams::transfer_ns`](crate::resources::LineParams).

/// The transfer costs by distance, in nanoseconds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TransferCosts {
    /// Between two cores of one cluster (a shared L2 or cluster cache).
    pub same_cluster_ns: u64,
    /// Between clusters of one die.
    pub same_die_ns: u64,
    /// Between dies of one socket.
    pub other_die_ns: u64,
    /// Between sockets.
    pub other_socket_ns: u64,
}

/// The machine's CPU placement and transfer costs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Topology {
    cores_per_cluster: u32,
    cores_per_die: u32,
    cores_per_socket: u32,
    costs: TransferCosts,
}

impl Topology {
    /// CPUs numbered consecutively through `cores_per_cluster`-core clusters,
    /// `clusters_per_die` clusters per die and `dies_per_socket` dies per socket (each at
    /// least 1; a zero is taken as 1).
    pub fn new(
        cores_per_cluster: u32,
        clusters_per_die: u32,
        dies_per_socket: u32,
        costs: TransferCosts,
    ) -> Self {
        let cluster = cores_per_cluster.max(1);
        let die = cluster.saturating_mul(clusters_per_die.max(1));
        Topology {
            cores_per_cluster: cluster,
            cores_per_die: die,
            cores_per_socket: die.saturating_mul(dies_per_socket.max(1)),
            costs,
        }
    }

    /// The transfer costs.
    pub fn costs(&self) -> TransferCosts {
        self.costs
    }

    /// What moving a line from CPU `from` to CPU `to` costs, ns (0 for the same CPU).
    #[inline]
    pub fn transfer_ns(&self, from: u32, to: u32) -> u64 {
        if from == to {
            0
        } else if from / self.cores_per_cluster == to / self.cores_per_cluster {
            self.costs.same_cluster_ns
        } else if from / self.cores_per_die == to / self.cores_per_die {
            self.costs.same_die_ns
        } else if from / self.cores_per_socket == to / self.cores_per_socket {
            self.costs.other_die_ns
        } else {
            self.costs.other_socket_ns
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn distance_picks_the_level_shared_by_both_cpus() {
        let t = Topology::new(
            4,
            8,
            2,
            TransferCosts {
                same_cluster_ns: 34,
                same_die_ns: 36,
                other_die_ns: 80,
                other_socket_ns: 150,
            },
        );
        assert_eq!(t.transfer_ns(5, 5), 0);
        assert_eq!(t.transfer_ns(0, 3), 34);
        assert_eq!(t.transfer_ns(3, 4), 36);
        assert_eq!(t.transfer_ns(0, 31), 36);
        assert_eq!(t.transfer_ns(31, 32), 80);
        assert_eq!(t.transfer_ns(0, 63), 80);
        assert_eq!(t.transfer_ns(63, 64), 150);
        assert_eq!(t.transfer_ns(64, 0), 150);
    }
}
