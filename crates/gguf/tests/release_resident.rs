//! `Mapping::release_resident` takes the pages a read touched out of the process's resident set
//! (the adapter store calls it once a cold adapter's file has been converted): the mapping's
//! `Rss` in `/proc/self/smaps` falls to (nearly) nothing and its bytes still read the same.

use std::io::Write;

use gguf::Mapping;

/// The `Rss:` of the mapping that starts at `addr`, in KiB, from `/proc/self/smaps`.
fn mapping_rss_kib(addr: usize) -> usize {
    let smaps = std::fs::read_to_string("/proc/self/smaps").unwrap();
    let mut lines = smaps.lines();
    while let Some(l) = lines.next() {
        let start = l.split('-').next().and_then(|a| usize::from_str_radix(a, 16).ok());
        if start == Some(addr) {
            for l in lines.by_ref() {
                if let Some(v) = l.strip_prefix("Rss:") {
                    return v.trim().trim_end_matches("kB").trim().parse().unwrap();
                }
            }
        }
    }
    panic!("no mapping at {addr:#x} in /proc/self/smaps");
}

#[test]
fn released_pages_leave_the_resident_set_and_read_back_the_same() {
    const LEN: usize = 8 << 20;
    let path = std::env::temp_dir().join(format!("snug-release-{}.bin", std::process::id()));
    let data: Vec<u8> = (0..LEN).map(|i| (i * 31 % 251) as u8).collect();
    std::fs::File::create(&path).unwrap().write_all(&data).unwrap();
    let m = Mapping::open(&std::fs::File::open(&path).unwrap()).unwrap();
    let addr = m.as_ptr() as usize;

    assert_eq!(&m[..], &data[..]);
    let before = mapping_rss_kib(addr);
    assert!(before >= LEN / 1024 * 9 / 10, "reading all 8 MiB made only {before} KiB resident");

    m.release_resident();
    let after = mapping_rss_kib(addr);
    assert!(after <= 64, "{after} KiB still resident after release_resident (was {before})");

    assert_eq!(&m[..], &data[..], "bytes read after the release differ");
    std::fs::remove_file(&path).unwrap();
}
