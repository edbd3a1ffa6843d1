use super::*;
use crate::model::Kind;

fn file(index: usize, size: u64) -> SendFile {
    SendFile {
        index,
        path: format!("f{index}"),
        kind: Kind::File {
            size,
            mode: 0o644,
            blake3: None,
            stamp: None,
        },
    }
}

#[test]
fn parts_have_about_equal_bytes_and_keep_the_files_order() {
    let mut files: Vec<SendFile> = (0..40).map(|i| file(i, 10 + i as u64)).collect();
    files.push(file(40, 1000));
    let parts = cut_parts(files, 4);
    assert_eq!(parts.len(), 4);
    let bytes: Vec<u64> = parts.iter().map(|p| p.iter().map(size).sum()).collect();
    // The 1000-byte file fills a part alone; the others share the rest.
    assert!(bytes.contains(&1000), "{bytes:?}");
    let rest: Vec<u64> = bytes.iter().copied().filter(|b| *b != 1000).collect();
    let (lo, hi) = (rest.iter().min().unwrap(), rest.iter().max().unwrap());
    assert!(hi - lo <= 50, "{bytes:?}");
    for p in &parts {
        assert!(p.windows(2).all(|w| w[0].index < w[1].index));
    }
    let mut all: Vec<usize> = parts.iter().flatten().map(|f| f.index).collect();
    all.sort();
    assert_eq!(all, (0..41).collect::<Vec<_>>());
}

#[test]
fn fewer_files_than_parts() {
    let parts = cut_parts(vec![file(0, 5), file(1, 0)], 8);
    assert_eq!(parts.len(), 2);
    assert!(cut_parts(Vec::new(), 3).is_empty());
}

#[test]
fn auto_takes_half_the_fewest_cores() {
    let big = 4 << 30;
    let c = |src, dst, here| Cores { src, dst, here };
    assert_eq!(
        lane_count(Connections::Auto, c(16, 16, Some(16)), big).count,
        8
    );
    assert_eq!(
        lane_count(Connections::Auto, c(16, 16, Some(2)), big).count,
        1
    );
    assert_eq!(lane_count(Connections::Auto, c(16, 6, None), big).count, 3);
    assert_eq!(lane_count(Connections::Auto, c(64, 64, None), big).count, 8);
    // Unknown cores count as one.
    assert_eq!(lane_count(Connections::Auto, c(0, 16, None), big).count, 1);
    // Small streams: one.
    assert_eq!(
        lane_count(Connections::Auto, c(16, 16, None), 100 << 20).count,
        1
    );
    // One lane per 128 MiB at most.
    assert_eq!(
        lane_count(Connections::Auto, c(16, 16, None), 600 << 20).count,
        4
    );
    let fixed = lane_count(Connections::Fixed(5), c(1, 1, Some(1)), 10);
    assert_eq!((fixed.count, fixed.probe), (5, false));
    assert!(lane_count(Connections::Auto, c(16, 16, None), big).probe);
}

#[test]
fn connections_parse() {
    assert_eq!("auto".parse::<Connections>(), Ok(Connections::Auto));
    assert_eq!("4".parse::<Connections>(), Ok(Connections::Fixed(4)));
    assert!("0".parse::<Connections>().is_err());
    assert!("33".parse::<Connections>().is_err());
    assert!("many".parse::<Connections>().is_err());
}

#[test]
fn the_probe_takes_small_files_in_order_up_to_its_bytes() {
    let files = vec![
        file(0, 50),
        file(1, 500),
        file(2, 40),
        file(3, 30),
        file(4, 20),
    ];
    let (probe, rest) = take_probe(files, 100);
    let ids = |v: &[SendFile]| v.iter().map(|f| f.index).collect::<Vec<_>>();
    assert_eq!(ids(&probe), vec![0, 2, 3]);
    assert_eq!(ids(&rest), vec![1, 4]);
    // Never more than PROBE_MAX.
    let (probe, _) = take_probe(vec![file(0, PROBE_MAX), file(1, 1)], u64::MAX);
    assert_eq!(ids(&probe), vec![0]);
}
