//! An iolab domain behind rust-vmm vm-memory's `Iommu` trait, exercised through vm-memory's
//! own IOMMU-aware memory type (`IommuMemory` over mmap-backed guest memory): reads and
//! writes at an IOVA, a permission fault, a miss that faults, and unmaps seen by the IOTLB
//! (at once in strict mode, after the flush in lazy mode).
#![cfg(feature = "vm-memory")]

use std::sync::Arc;

use iolab_iommu::addr::{Iova, PhysAddr, SZ_4K};
use iolab_iommu::dma::{
    Device, Direction, DmaMapping, Domain, DomainConfig, DomainId, DomainMode, ImmediateInvalidator,
};
use iolab_iommu::iova::linux::{IovaSpaceConfig, LinuxIovaAllocator};
use iolab_iommu::pgtable::lpae::{LpaeConfig, LpaeTable};
use iolab_iommu::vmm::{IotlbInvalidator, SharedIotlb, VmmIommu};
use iolab_iommu::work::WorkRecord;
use vm_memory::{Bytes, GuestAddress, GuestMemory, GuestMemoryMmap, IommuMemory, Permissions};

/// Guest memory of 1 MiB at guest-physical 0.
const GUEST_BYTES: usize = 1 << 20;

struct Setup {
    mem: IommuMemory<GuestMemoryMmap<()>, VmmIommu>,
    inner: Arc<ImmediateInvalidator>,
    dev: Device,
}

fn setup(mode: DomainMode) -> Setup {
    let id = DomainId(3);
    let iotlb = SharedIotlb::new();
    let inner = Arc::new(ImmediateInvalidator::new());
    let inv = Arc::new(IotlbInvalidator::new(id, iotlb.clone(), inner.clone()));
    let table = LpaeTable::new(LpaeConfig::new(SZ_4K, 48, 48)).expect("LPAE config");
    let alloc = LinuxIovaAllocator::new(IovaSpaceConfig::new(SZ_4K, Iova::new(1 << 32)))
        .expect("IOVA config");
    let domain = Domain::translated(
        DomainConfig::new(id, mode),
        Box::new(table),
        Arc::new(alloc),
        inv,
    )
    .expect("domain");
    let dev = Device::new(7, 32).expect("device");
    let iommu = VmmIommu::new(Arc::new(domain), dev.clone(), iotlb);
    let guest = GuestMemoryMmap::<()>::from_ranges(&[(GuestAddress(0), GUEST_BYTES)])
        .expect("guest memory");
    Setup {
        mem: IommuMemory::new(guest, iommu, true, ()),
        inner,
        dev,
    }
}

impl Setup {
    fn map(&self, pa: u64, len: u64, dir: Direction) -> DmaMapping {
        let mut w = WorkRecord::new();
        self.mem
            .iommu()
            .domain()
            .map_page(&self.dev, PhysAddr::new(pa), len, dir, 0, &mut w)
            .expect("mapped")
    }

    fn unmap(&self, m: DmaMapping) {
        let mut w = WorkRecord::new();
        self.mem
            .iommu()
            .domain()
            .unmap_page(m, 0, 0, &mut w)
            .expect("unmapped");
    }
}

#[test]
fn reads_and_writes_at_an_iova_reach_the_mapped_guest_memory() {
    let s = setup(DomainMode::Strict);
    // Two pages at guest-physical 0x5000, mapped at an offset of 0x10 within the page.
    let m = s.map(0x5010, 2 * SZ_4K - 0x10, Direction::Bidirectional);
    let iova = m.dma_addr().0;
    assert_ne!(
        iova, 0x5010,
        "the device sees an IOVA, not the physical address"
    );

    // Write through the IOMMU across the page boundary, read it back both ways.
    let data: Vec<u8> = (0..64u8).collect();
    let at = iova + SZ_4K - 0x10 - 32; // 32 bytes before the second page
    s.mem
        .write_slice(&data, GuestAddress(at))
        .expect("IOMMU write");
    let mut phys = vec![0u8; 64];
    s.mem
        .get_backend()
        .read_slice(&mut phys, GuestAddress(0x5000 + SZ_4K - 32))
        .unwrap();
    assert_eq!(
        phys, data,
        "bytes landed at the translated physical address"
    );
    let mut back = vec![0u8; 64];
    s.mem
        .read_slice(&mut back, GuestAddress(at))
        .expect("IOMMU read");
    assert_eq!(back, data);

    // The first access filled the IOTLB; the read hit it.
    let iommu = s.mem.iommu();
    assert_eq!(iommu.fills(), 1);
    assert!(iommu.iotlb().caches(at, 64, Permissions::ReadWrite));
}

#[test]
fn a_write_to_a_read_only_mapping_is_a_permission_fault() {
    let s = setup(DomainMode::Strict);
    let m = s.map(0x8000, SZ_4K, Direction::ToDevice); // the device may only read
    let iova = GuestAddress(m.dma_addr().0);
    s.mem
        .get_backend()
        .write_slice(b"payload", GuestAddress(0x8000))
        .unwrap();
    let mut buf = [0u8; 7];
    s.mem.read_slice(&mut buf, iova).expect("reads are allowed");
    assert_eq!(&buf, b"payload");
    let err = s.mem.write_slice(b"x", iova).expect_err("writes are not");
    assert!(err.to_string().contains("Permission denied"), "{err}");
    assert!(!s.mem.check_range(iova, 1, Permissions::Write));
    assert!(s.mem.check_range(iova, 1, Permissions::Read));
    // The guest memory is untouched.
    let mut phys = [0u8; 7];
    s.mem
        .get_backend()
        .read_slice(&mut phys, GuestAddress(0x8000))
        .unwrap();
    assert_eq!(&phys, b"payload");
}

#[test]
fn an_unmapped_iova_misses_and_faults() {
    let s = setup(DomainMode::Strict);
    let m = s.map(0x3000, SZ_4K, Direction::Bidirectional);
    // IOVAs are allocated top-down: the page below the mapping is free.
    let past = GuestAddress(m.dma_addr().0 - SZ_4K);
    let mut buf = [0u8; 4];
    let err = s
        .mem
        .read_slice(&mut buf, past)
        .expect_err("nothing mapped there");
    assert!(err.to_string().contains("Not mapped"), "{err}");
    // An access straddling the end of the mapping faults as a whole.
    let straddle = GuestAddress(m.dma_addr().0 - 2);
    assert!(s.mem.read_slice(&mut buf, straddle).is_err());
    assert!(!s.mem.check_range(straddle, 4, Permissions::Read));
}

#[test]
fn a_strict_unmap_invalidates_the_iotlb_at_once() {
    let s = setup(DomainMode::Strict);
    let m = s.map(0x6000, SZ_4K, Direction::Bidirectional);
    let iova = m.dma_addr().0;
    s.mem.write_slice(&[1, 2, 3], GuestAddress(iova)).unwrap();
    let iotlb = s.mem.iommu().iotlb().clone();
    assert!(iotlb.caches(iova, 3, Permissions::Read));
    let before = iotlb.invalidations();
    s.unmap(m);
    assert!(
        iotlb.invalidations() > before,
        "the unmap reached the IOTLB"
    );
    assert!(s.inner.stats().ranges >= 1, "and the inner invalidator");
    assert!(!iotlb.caches(iova, 3, Permissions::Read));
    let mut buf = [0u8; 3];
    assert!(s.mem.read_slice(&mut buf, GuestAddress(iova)).is_err());
}

#[test]
fn a_lazy_unmap_leaves_the_translation_usable_until_the_flush() {
    let s = setup(DomainMode::Lazy);
    let m = s.map(0x9000, SZ_4K, Direction::Bidirectional);
    let iova = GuestAddress(m.dma_addr().0);
    s.mem.write_slice(b"live", iova).unwrap();
    s.unmap(m);
    // The page table no longer maps it, but the IOTLB still does: the lazy window.
    let mut buf = [0u8; 4];
    s.mem
        .read_slice(&mut buf, iova)
        .expect("a stale IOTLB entry still translates");
    assert_eq!(&buf, b"live");
    let mut w = WorkRecord::new();
    s.mem.iommu().domain().flush_all(&mut w);
    assert!(!s.mem.iommu().iotlb().caches(iova.0, 4, Permissions::Read));
    let err = s.mem.read_slice(&mut buf, iova).expect_err("flushed: gone");
    assert!(err.to_string().contains("Not mapped"), "{err}");
}

#[test]
fn a_scatter_gather_mapping_reads_as_one_iova_range_over_scattered_pages() {
    use iolab_iommu::dma::SgEntry;
    let s = setup(DomainMode::Strict);
    // Two whole pages far apart in guest-physical memory, in reverse order.
    let (first, second) = (0x40000u64, 0x11000u64);
    let backend = s.mem.get_backend();
    backend
        .write_slice(&[0xaa; 4096], GuestAddress(first))
        .unwrap();
    backend
        .write_slice(&[0xbb; 4096], GuestAddress(second))
        .unwrap();
    let mut w = WorkRecord::new();
    let sg = s
        .mem
        .iommu()
        .domain()
        .map_sg(
            &s.dev,
            &[
                SgEntry::new(PhysAddr::new(first), SZ_4K),
                SgEntry::new(PhysAddr::new(second), SZ_4K),
            ],
            Direction::ToDevice,
            0,
            &mut w,
        )
        .expect("mapped");
    // The IOMMU merges the list into one IOVA segment.
    assert_eq!(sg.segments().len(), 1);
    let iova = GuestAddress(sg.segments()[0].dma.0);
    let mut buf = vec![0u8; 2 * 4096];
    s.mem
        .read_slice(&mut buf, iova)
        .expect("one read across both pages");
    assert!(buf[..4096].iter().all(|&b| b == 0xaa));
    assert!(buf[4096..].iter().all(|&b| b == 0xbb));
    // One fill (one missing range) cached two physical pieces.
    assert_eq!(s.mem.iommu().fills(), 1);
}
