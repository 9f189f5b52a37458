//! Opening a real 1.1 GB model maps it: the header is parsed into a few MB of owned values and
//! tensor data stays in the page cache. Checked three ways: heap bytes allocated by `open`
//! (a counting global allocator), `VmRSS` growth, and `RssAnon` staying flat while every page of
//! every tensor is read (file-backed pages count as `RssFile`, copies would be anonymous).

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};

use gguf::GgufFile;

/// Counts live heap bytes and their peak; everything else is the system allocator.
struct Counting;

static LIVE: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

// SAFETY: forwards every call unchanged to `System`, which upholds the GlobalAlloc contract;
// the counters are plain atomics and never allocate.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: same layout the caller gave us, per the trait contract.
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            let now = LIVE.fetch_add(layout.size(), Ordering::Relaxed) + layout.size();
            PEAK.fetch_max(now, Ordering::Relaxed);
        }
        p
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
        // SAFETY: `ptr` came from `alloc` above with this layout.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static ALLOC: Counting = Counting;

/// A field of /proc/self/status in bytes (`VmRSS`, `RssAnon`, `RssFile`).
fn status_bytes(field: &str) -> u64 {
    let s = std::fs::read_to_string("/proc/self/status").expect("/proc/self/status");
    let line = s
        .lines()
        .find(|l| l.starts_with(&format!("{field}:")))
        .expect("field in /proc/self/status");
    let kb: u64 = line.split_whitespace().nth(1).and_then(|v| v.parse().ok()).expect("number");
    kb * 1024
}

const MB: u64 = 1 << 20;

#[test]
fn opening_a_1gb_model_does_not_copy_weights_to_the_heap() {
    let path =
        hub::ensure("qwen2.5-coder-1.5b").expect("qwen2.5-coder-1.5b in the cache (snug pull)");
    let (rss0, heap0) = (status_bytes("VmRSS"), LIVE.load(Ordering::Relaxed));
    PEAK.store(heap0, Ordering::Relaxed);

    let f = GgufFile::open(&path).unwrap();
    let heap = (LIVE.load(Ordering::Relaxed) - heap0) as u64;
    let heap_peak = (PEAK.load(Ordering::Relaxed) - heap0) as u64;
    let rss = status_bytes("VmRSS").saturating_sub(rss0);
    assert!(f.file_len() > 1_000_000_000);
    // The header holds 151,936 tokens and 151,387 merges as Strings: a few tens of MB at most.
    assert!(
        heap < 48 * MB && heap_peak < 64 * MB,
        "open allocated {heap} bytes (peak {heap_peak})"
    );
    assert!(rss < 96 * MB, "RSS grew by {rss} bytes on open");
    println!(
        "open: heap +{:.1} MB (peak {:.1} MB), VmRSS +{:.1} MB",
        heap as f64 / MB as f64,
        heap_peak as f64 / MB as f64,
        rss as f64 / MB as f64
    );

    // Tensor views are slices of the mapping.
    let map = f.mapping().expect("opened from disk, so mapped");
    let range = map.as_ptr_range();
    for t in &f.tensors {
        let d = f.tensor_data(t);
        assert!(
            range.contains(&d.as_ptr()) && d.len() as u64 == t.size,
            "{} is not inside the mapping",
            t.name
        );
    }

    // Touch every page of every tensor: resident set grows in file pages, not anonymous ones.
    let anon0 = status_bytes("RssAnon");
    let mut sum = 0u64;
    for t in &f.tensors {
        sum += f.tensor_data(t).iter().step_by(4096).map(|&b| b as u64).sum::<u64>();
    }
    let anon = status_bytes("RssAnon").saturating_sub(anon0);
    assert!(
        anon < 16 * MB,
        "reading all tensors grew anonymous memory by {anon} bytes (checksum {sum})"
    );
}
