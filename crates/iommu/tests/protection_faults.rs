//! Faults under a storm: every device fault reaches the SMMUv3 model's bounded event queue
//! (or is lost with the overflow flag raised, as the hardware does), the counts stay exact,
//! and the queue never grows past its capacity. The other models count their faults too.

use std::sync::Arc;

use iolab_iommu::addr::{Access, DmaAddr, Iova, PhysAddr, SZ_4G, SZ_4K};
use iolab_iommu::dma::{Device, Direction, DomainConfig, DomainId, DomainMode, FaultReason};
use iolab_iommu::hw::{DmaPath, PseriesConfig, PseriesIommu, SbaIommu, SbaIommuConfig};
use iolab_iommu::iova::linux::{IovaSpaceConfig, LinuxIovaAllocator};
use iolab_iommu::pgtable::lpae::LpaeConfig;
use iolab_iommu::smmuv3::{EventId, SmmuFaultReason, Smmuv3, Smmuv3Config};
use iolab_iommu::work::WorkRecord;

const SID: u32 = 3;
const STORM: u64 = 1_000_000;

fn smmu(evtq_log2size: u32) -> Smmuv3 {
    Smmuv3::new(Smmuv3Config {
        evtq_log2size,
        ..Smmuv3Config::default()
    })
    .unwrap()
}

#[test]
fn a_million_translation_faults_are_counted_exactly_in_a_bounded_queue() {
    let s = smmu(7);
    let alloc = LinuxIovaAllocator::new(IovaSpaceConfig::new(SZ_4K, Iova::new(SZ_4G))).unwrap();
    let d = s
        .new_domain(
            1,
            DomainConfig::new(DomainId(1), DomainMode::Strict),
            LpaeConfig::new(SZ_4K, 48, 48),
            Arc::new(alloc),
        )
        .unwrap();
    s.attach(SID, &d, &mut WorkRecord::new()).unwrap();
    let mut w = WorkRecord::new();
    let capacity = s.with_events(|q| q.capacity());
    let mut max_len = 0;
    for i in 0..STORM {
        // Unmapped addresses all over the 4 GiB the domain could use.
        let at = Iova::new((i * 0x1_3000) % SZ_4G);
        let f = s.translate(SID, at, 8, Access::Read, &mut w).unwrap_err();
        assert_eq!(f.reason, SmmuFaultReason::Translation);
        if i % 65_536 == 0 {
            max_len = max_len.max(s.with_events(|q| q.len()));
        }
    }
    let st = s.fault_stats();
    assert_eq!(st.translation, STORM);
    assert_eq!(st.permission, 0);
    assert_eq!(st.events_written, capacity as u64);
    assert_eq!(st.events_lost, STORM - capacity as u64);
    assert_eq!(
        st.event_queue_overflows, 1,
        "one episode: never acknowledged"
    );
    assert_eq!(st.event_queue_len, capacity);
    assert!(max_len <= capacity);
    assert!(s.with_events(|q| q.overflow_pending() && q.prod_ovflg()));
    // The records kept are the first ones, in order, in the architecture's layout.
    let first = s.drain_events();
    assert_eq!(first.len(), capacity);
    assert!(first
        .iter()
        .all(|e| e.id == EventId::Translation && e.stream_id == SID));
    assert_eq!(first[1].iova, Iova::new(0x1_3000));
}

#[test]
fn a_storm_with_a_draining_handler_toggles_ovflg_once_per_episode() {
    let s = smmu(4); // 16 records
    let mut w = WorkRecord::new();
    // Stream SID has an invalid STE: every transaction is a C_BAD_STE.
    let mut expected_overflows = 0;
    for burst in 0..1_000u64 {
        // A burst of 20 overflows a 16-record queue by 4.
        for i in 0..20 {
            let at = Iova::new(burst * 20 + i);
            let f = s.translate(SID, at, 1, Access::Write, &mut w).unwrap_err();
            assert_eq!(f.event_recorded, i < 16);
        }
        expected_overflows += 1;
        let ovflg = s.with_events(|q| q.prod_ovflg());
        assert_eq!(
            ovflg,
            expected_overflows % 2 == 1,
            "OVFLG toggles per episode"
        );
        // The handler drains and acknowledges, as Linux's evtq thread does.
        assert_eq!(s.drain_events().len(), 16);
        s.with_events(|q| q.ack_overflow());
    }
    let st = s.fault_stats();
    assert_eq!(st.bad_ste, 20_000);
    assert_eq!((st.events_written, st.events_lost), (16_000, 4_000));
    assert_eq!(st.event_queue_overflows, 1_000);
    assert_eq!(st.event_queue_len, 0);
}

#[test]
fn permission_faults_are_f_permission_events() {
    let s = smmu(7);
    let alloc = LinuxIovaAllocator::new(IovaSpaceConfig::new(SZ_4K, Iova::new(SZ_4G))).unwrap();
    let d = s
        .new_domain(
            2,
            DomainConfig::new(DomainId(2), DomainMode::Strict),
            LpaeConfig::new(SZ_4K, 48, 48),
            Arc::new(alloc),
        )
        .unwrap();
    s.attach(SID, &d, &mut WorkRecord::new()).unwrap();
    let dev = Device::new(1, 64).unwrap();
    let mut w = WorkRecord::new();
    let m = d
        .domain()
        .map_page(
            &dev,
            PhysAddr::new(0x8000),
            64,
            Direction::ToDevice,
            0,
            &mut w,
        )
        .unwrap();
    let f = s
        .translate(SID, Iova::new(m.dma_addr().0), 8, Access::Write, &mut w)
        .unwrap_err();
    assert!(matches!(f.reason, SmmuFaultReason::Permission { .. }));
    let ev = s.drain_events();
    assert_eq!(ev.len(), 1);
    assert_eq!(ev[0].id.raw(), 0x13);
    assert_eq!(
        ev[0].encode()[0] & 0xff,
        0x13,
        "F_PERMISSION in word 0 bits [7:0]"
    );
    assert_eq!(s.fault_stats().permission, 1);
    d.domain().unmap_page(m, 0, 0, &mut w).unwrap();
}

#[test]
fn the_other_models_count_their_faults_and_bypasses() {
    let dev = Device::new(1, 64).unwrap();
    let mut w = WorkRecord::new();
    // SBA: an unmapped address inside the IOV window faults; one outside bypasses.
    let sba = SbaIommu::new(SbaIommuConfig::new(DomainId(7), 1 << 30, 1 << 30, SZ_4K)).unwrap();
    let f = sba
        .translate(&dev, DmaAddr((1 << 30) + 0x5000), 8, Access::Read, &mut w)
        .unwrap_err();
    assert_eq!(f.reason, FaultReason::Unmapped);
    sba.translate(&dev, DmaAddr(0x1000), 8, Access::Read, &mut w)
        .unwrap();
    let p = sba.protection();
    assert_eq!((p.translation_faults, p.bypass_accesses), (1, 1));
    // pseries: nothing mapped in the default window.
    let ps = PseriesIommu::new(PseriesConfig::new(DomainId(8), 1 << 32)).unwrap();
    for _ in 0..3 {
        ps.translate(&dev, DmaAddr(0x2000), 8, Access::Write, &mut w)
            .unwrap_err();
    }
    assert_eq!(ps.protection().translation_faults, 3);
}
