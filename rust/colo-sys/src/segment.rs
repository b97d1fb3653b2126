//! Shared segments: a sealed memfd mapped `MAP_SHARED` (spec/WIRE.md sections 1 and 3).

use rustix::fd::{AsFd, OwnedFd};
use rustix::fs::{fcntl_add_seals, fcntl_get_seals, fstat, ftruncate, memfd_create, MemfdFlags, SealFlags};
use rustix::mm::{mmap, munmap, MapFlags, ProtFlags};
use std::io;
use std::ptr::NonNull;

/// The seals a segment must carry: its size can never change under a mapping.
const REQUIRED_SEALS: SealFlags = SealFlags::SHRINK.union(SealFlags::GROW).union(SealFlags::SEAL);

/// A `MAP_SHARED` mapping, unmapped on drop.
#[derive(Debug)]
pub struct Mapping {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: a Mapping is an address range owned by this value; sharing it between threads is as safe
// as sharing the pointer, and all access to the memory goes through atomics or the ring protocol.
unsafe impl Send for Mapping {}
// SAFETY: as above; `&Mapping` gives only the address.
unsafe impl Sync for Mapping {}

impl Mapping {
    /// The first byte of the mapping.
    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }
    /// The mapping's length.
    pub fn len(&self) -> usize {
        self.len
    }
    /// Whether the mapping is empty (never, for a mapped segment).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Gives the pages of `offset..offset + len` back to the system (`MADV_REMOVE`: the memfd's
    /// backing store is freed, for every process that maps it; the range reads as zeros after).
    /// Only whole pages inside the range are released.
    pub fn release(&self, offset: usize, len: usize) -> io::Result<()> {
        let len = len.min(self.len.saturating_sub(offset));
        // SAFETY: the range lies inside this mapping (clamped above).
        unsafe { release_pages(self.ptr.as_ptr().wrapping_add(offset), len) }
    }

    /// Maps `fd`, a tmpfs memfd ([`create`] made it, or [`attach_sealed`] found it one) sealed
    /// against shrinking, with transparent huge pages refused (`MADV_NOHUGEPAGE`): a fault of
    /// ours in a page the peer punched allocates one 4 KiB page, never a 2 MiB folio, whatever
    /// `shmem_enabled` says but `force`, which a kernel may let override the advice.
    fn map(fd: &OwnedFd, len: usize, prot: ProtFlags) -> io::Result<Mapping> {
        // SAFETY: a fresh mapping at an address the kernel chooses aliases no Rust object; the file
        // is a tmpfs file sealed against shrinking, so every page below its size is backed while
        // mapped (a fault allocates a page or fails as out of memory, never raises SIGBUS).
        let ptr = unsafe { mmap(core::ptr::null_mut(), len, prot, MapFlags::SHARED, fd, 0)? };
        let map = Mapping { ptr: NonNull::new(ptr.cast()).ok_or(io::ErrorKind::Other)?, len };
        // SAFETY: the whole of the mapping just made; the advice changes no byte of it. Refused
        // (EINVAL) only by a kernel without transparent huge pages, which allocates none anyway.
        let _ = unsafe { rustix::mm::madvise(ptr, len, rustix::mm::Advice::LinuxNoHugepage) };
        Ok(map)
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: we own this mapping and nothing refers to it past our life (the connection types
        // that hand out pointers into it hold the Mapping).
        let _ = unsafe { munmap(self.ptr.as_ptr().cast(), self.len) };
    }
}

/// Gives the whole pages of `ptr..ptr + len` back to the system (`MADV_REMOVE` on a shared
/// memfd mapping frees the file's pages for every process that maps it; they read as zeros after).
///
/// # Safety
/// The range lies inside one shared mapping of a memfd whose contents every user treats as
/// shared and untrusted (zeros appearing must break nothing but the bytes' meaning).
pub unsafe fn release_pages(ptr: *mut u8, len: usize) -> io::Result<()> {
    const PAGE: usize = 4096;
    let addr = ptr as usize;
    let start = addr.div_ceil(PAGE) * PAGE;
    let end = (addr + len) / PAGE * PAGE;
    if start >= end {
        return Ok(());
    }
    // SAFETY: whole pages inside the caller's mapping; MADV_REMOVE changes only the contents,
    // never the mapping itself.
    unsafe { rustix::mm::madvise(start as *mut core::ffi::c_void, end - start, rustix::mm::Advice::LinuxRemove)? };
    Ok(())
}

/// The offset of the first byte at or after `from` that the file `fd` holds a page for
/// (`SEEK_DATA`: a swapped-out page counts), or `None` where only holes follow. Moves the file
/// offset, which no user of a segment's memfd reads (they map it or `pread` it).
pub fn first_data(fd: &OwnedFd, from: u64) -> io::Result<Option<u64>> {
    match rustix::fs::seek(fd, rustix::fs::SeekFrom::Data(from)) {
        Ok(at) => Ok(Some(at)),
        Err(rustix::io::Errno::NXIO) => Ok(None),
        Err(e) => Err(e.into()),
    }
}

/// Creates a zeroed, sealed memfd of `size` bytes named `colo-seg` and maps it read-write.
pub fn create(size: usize) -> io::Result<(OwnedFd, Mapping)> {
    let fd = memfd_create("colo-seg", MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING)?;
    ftruncate(&fd, size as u64)?;
    fcntl_add_seals(&fd, REQUIRED_SEALS)?;
    let map = Mapping::map(&fd, size, ProtFlags::READ | ProtFlags::WRITE)?;
    Ok((fd, map))
}

/// Why a received descriptor is not an acceptable segment.
#[derive(Debug)]
pub enum AttachError {
    /// Not a sealable memfd, missing seals, not on tmpfs, or the wrong size.
    BadSegment(&'static str),
    /// The kernel refused (e.g. out of address space).
    Os(io::Error),
    /// The caller's admission (`attach_admitted`) refused it: why.
    Refused(String),
}

/// `statfs`'s `f_type` of tmpfs, where every memfd but a hugetlbfs one lives.
const TMPFS_MAGIC: i64 = 0x0102_1994;

/// Largest segment a peer may hand us: 256 MiB. Enough for every geometry colo's own clients
/// create (the default is about 2.6 MiB; the test peer's 8 x 4 MiB pools about 65 MiB) and for
/// rings of up to 64 MiB per direction, the size of the largest TCP buffers (`tcp_rmem`), with
/// pools of up to 63 MiB beside them; small enough that one segment is a bounded part of the
/// mapped-bytes budgets (`colo::budget`).
pub const MAX_SEGMENT: u64 = 1 << 28;

/// Validates a segment received from a peer (a memfd with the required seals, at least `min`
/// bytes, at most [`MAX_SEGMENT`]) and maps all of it read-write. The caller checks the mapped
/// size against the segment's header.
pub fn attach(fd: &OwnedFd, min: usize) -> Result<Mapping, AttachError> {
    attach_admitted(fd, min, |_| Ok(())).map(|(map, ())| map)
}

/// As [`attach`], with `admit` asked, with the file's size, after the checks and before the
/// mapping (a budget of mapped bytes): if it refuses, nothing is mapped.
pub fn attach_admitted<T>(fd: &OwnedFd, min: usize, admit: impl FnOnce(u64) -> Result<T, String>) -> Result<(Mapping, T), AttachError> {
    let seals = fcntl_get_seals(fd).map_err(|_| AttachError::BadSegment("not a sealable memfd"))?;
    if !seals.contains(REQUIRED_SEALS) {
        return Err(AttachError::BadSegment("segment not sealed against resizing"));
    }
    attach_sealed(fd, min, admit)
}

/// As [`attach_admitted`], for a descriptor already found sealed against resizing ([`read_at`]
/// or [`read_prefix`] read it, or [`is_sealed`] said so): seals never come off a file, so its
/// seals are not asked again.
/// The file must be on tmpfs (`memfd_create` without `MFD_HUGETLB`): a hugetlbfs memfd takes
/// seals as well, and a fault in it raises SIGBUS once no huge page is free.
pub fn attach_sealed<T>(fd: &OwnedFd, min: usize, admit: impl FnOnce(u64) -> Result<T, String>) -> Result<(Mapping, T), AttachError> {
    let fs = rustix::fs::fstatfs(fd).map_err(|e| AttachError::Os(e.into()))?;
    if fs.f_type as i64 != TMPFS_MAGIC {
        return Err(AttachError::BadSegment("segment not a tmpfs memfd"));
    }
    let st = fstat(fd).map_err(|e| AttachError::Os(e.into()))?;
    if st.st_size < min as i64 || st.st_size as u64 > MAX_SEGMENT {
        return Err(AttachError::BadSegment("segment size out of range"));
    }
    let admitted = admit(st.st_size as u64).map_err(AttachError::Refused)?;
    let map = Mapping::map(fd, st.st_size as usize, ProtFlags::READ | ProtFlags::WRITE).map_err(AttachError::Os)?;
    Ok((map, admitted))
}

/// This process's address-space limit (`RLIMIT_AS`, as `ulimit -v` sets it), if it has one: the
/// budgets of mapped peer segments stay well inside it, so that the heap and thread stacks the
/// process needs are never crowded out by peers' segments.
pub fn address_space_limit() -> Option<u64> {
    rustix::process::getrlimit(rustix::process::Resource::As).current
}

/// Whether `fd` is a memfd sealed against resizing, as every segment is (for `colo stat`, which
/// reports other files named `colo-seg` as not segments).
pub fn is_sealed(fd: impl AsFd) -> bool {
    fcntl_get_seals(fd).is_ok_and(|s| s.contains(REQUIRED_SEALS))
}

/// The size of a segment descriptor's file.
pub fn file_size(fd: impl AsFd) -> io::Result<u64> {
    Ok(fstat(fd)?.st_size as u64)
}

/// Reads `buf.len()` bytes at `offset` of a segment descriptor without mapping it: a file that
/// another process truncates meanwhile gives a short read, never a fault. Returns how many bytes
/// were read. A descriptor that is not a memfd sealed against resizing is refused
/// (`InvalidData`) before anything is read: a peer's descriptor could be a file of a FUSE
/// mount, whose read waits for its server as long as that likes; `F_GET_SEALS` looks at the
/// file's kind alone (only shared-memory files have seals, and reading one never waits).
pub fn read_at(fd: impl AsFd, buf: &mut [u8], offset: u64) -> io::Result<usize> {
    if !is_sealed(&fd) {
        return Err(io::Error::new(io::ErrorKind::InvalidData, "not a memfd sealed against resizing"));
    }
    Ok(rustix::io::pread(fd, buf, offset)?)
}

/// As [`read_at`], for a descriptor already found to be a sealed memfd (a mapped segment's): no
/// check per read.
pub fn read_at_checked(fd: impl AsFd, buf: &mut [u8], offset: u64) -> io::Result<usize> {
    Ok(rustix::io::pread(fd, buf, offset)?)
}

/// Reads the first `buf.len()` bytes of a segment descriptor without mapping it (refused
/// unread, as by [`read_at`], unless it is a memfd sealed against resizing).
pub fn read_prefix(fd: impl AsFd, buf: &mut [u8]) -> io::Result<usize> {
    read_at(fd, buf, 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A peer's "segment" that is no memfd, or one not sealed, is refused before it is read (a
    /// FUSE file's read could wait forever; a regular file stands for it here).
    #[test]
    fn only_sealed_memfds_are_read() {
        const MAGIC: [u8; 8] = *b"COLOSEG\0";
        let mut head = [0u8; 8];
        let path = std::env::temp_dir().join(format!("colo-seg-test-{}", std::process::id()));
        std::fs::write(&path, b"COLOSEG\0 and more").unwrap();
        let file = std::fs::File::open(&path).unwrap();
        std::fs::remove_file(&path).unwrap();
        let e = read_prefix(&file, &mut head).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidData);
        let unsealed = memfd_create("colo-seg", MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING).unwrap();
        rustix::io::write(&unsealed, &MAGIC).unwrap();
        assert_eq!(read_prefix(&unsealed, &mut head).unwrap_err().kind(), io::ErrorKind::InvalidData);
        let (seg, map) = create(4096).unwrap();
        // SAFETY: the mapping is 4096 bytes, ours alone.
        unsafe { std::ptr::copy_nonoverlapping(MAGIC.as_ptr(), map.as_ptr(), 8) };
        assert_eq!(read_prefix(&seg, &mut head).unwrap(), 8);
        assert_eq!(head, MAGIC);
    }

    /// A hugetlbfs memfd, sealed and of a good size, is refused before it is mapped (a fault in
    /// it raises SIGBUS once no huge page is free).
    #[test]
    fn a_hugetlbfs_memfd_is_refused() {
        let Ok(fd) = memfd_create("colo-seg", MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING | MemfdFlags::HUGETLB) else {
            eprintln!("no hugetlbfs memfd on this kernel: nothing to refuse");
            return;
        };
        ftruncate(&fd, 2 << 20).unwrap();
        fcntl_add_seals(&fd, REQUIRED_SEALS).unwrap();
        match attach(&fd, 4096) {
            Err(AttachError::BadSegment(why)) => assert_eq!(why, "segment not a tmpfs memfd"),
            other => panic!("a hugetlbfs memfd was not refused as such: {other:?}"),
        }
    }

    /// Every segment mapping refuses transparent huge pages (`nh` in its `VmFlags`).
    #[test]
    fn segment_mappings_refuse_huge_pages() {
        let (fd, own) = create(1 << 20).unwrap();
        let peer = attach(&fd, 4096).unwrap();
        let smaps = std::fs::read_to_string("/proc/self/smaps").unwrap();
        for map in [&own, &peer] {
            let start = format!("{:x}-", map.as_ptr() as usize);
            let flags = smaps.lines().skip_while(|l| !l.starts_with(&start)).find(|l| l.starts_with("VmFlags")).unwrap_or("");
            assert!(flags.split_whitespace().any(|f| f == "nh"), "mapping at {start} lacks MADV_NOHUGEPAGE: {flags}");
        }
    }
}
