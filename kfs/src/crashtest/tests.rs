use super::*;

/// A quick configuration: `filter`'s operations alone, one line at a
/// time, images under /dev/shm when there is one.
fn quick(filter: &str) -> Config {
    Config {
        k: 1,
        filter: Some(filter.into()),
        shard: (0, 1),
        ..Config::default()
    }
}

fn explore(config: &Config) -> (Summary, Vec<String>) {
    let mut groups = Vec::new();
    let s = run(config, |e| {
        if let Event::Group { name, .. } = e {
            groups.push(name.to_owned())
        }
    })
    .unwrap();
    (s, groups)
}

#[test]
fn crashtest_of_renames_over_files_and_a_partial_write_finds_no_violation() {
    for filter in ["rename-file-over", "write-part"] {
        let (s, groups) = explore(&quick(filter));
        for v in &s.violations {
            eprintln!("{v}");
        }
        assert!(s.violations.is_empty(), "{} violations", s.violations.len());
        assert!(s.checked > 0 && s.recovered > 0, "{s:?}");
        assert!(s.bounded >= s.checked && s.checked >= s.recovered, "{s:?}");
        let want: Vec<&str> = OPS
            .iter()
            .map(|o| o.name)
            .filter(|n| n.contains(filter))
            .collect();
        assert_eq!(groups, want);
        assert_eq!(s.sequences, want.len() as u64);
    }
}

/// A recovery that loses acknowledged changes must be caught: with every
/// crash image replaced by the starting image, a crash during the
/// checkpoint after a chmod recovers to the mode before it.
#[test]
fn crashtest_reports_a_recovery_that_loses_an_acknowledged_change() {
    let config = Config {
        fault: Fault::RollBack,
        recovery: false,
        ..quick("chmod")
    };
    let (s, _) = explore(&config);
    assert!(!s.violations.is_empty());
    // Crashes inside the chmod may recover to before it: only the phases
    // after its reply lose it.
    for v in &s.violations {
        assert!(v.phase == "checkpoint" || v.phase == "close", "{v}");
        assert!(v.what.contains("a/f1 mode 100644, not 100600"), "{v}");
        assert_eq!(v.ops, "chmod");
    }
    let line = s.violations[0].to_string();
    assert!(
        line.starts_with("violation: chmod: crash in checkpoint at fence 0"),
        "{line}"
    );
}

#[test]
fn a_sample_is_the_same_for_the_same_seed_and_in_order() {
    let all: Vec<u32> = (0..100).collect();
    let a = sample(all.clone(), Some(10), 7);
    assert_eq!(a, sample(all.clone(), Some(10), 7));
    assert_ne!(a, sample(all.clone(), Some(10), 8));
    assert_eq!(a.len(), 10);
    assert!(a.windows(2).all(|w| w[0] < w[1]));
    assert_eq!(sample(all.clone(), Some(200), 7), all);
    assert_eq!(sample(all.clone(), None, 7), all);
}

#[test]
fn a_filter_that_matches_nothing_is_refused_naming_the_operations() {
    let e = run(&quick("no-such-op"), |_| {}).unwrap_err();
    assert!(matches!(e, CrashtestError::NoMatch { .. }));
    assert!(e.to_string().contains("rename-dir-over-across"), "{e}");
    let e = run(
        &Config {
            seq: 3,
            ..quick("chmod")
        },
        |_| {},
    )
    .unwrap_err();
    assert!(matches!(e, CrashtestError::Seq(3)));
}

#[test]
fn tree_differences_name_each_field_that_differs() {
    let node = |size, data: &[u8]| Node {
        kind: Kind::File,
        nlink: 1,
        mode: libc::S_IFREG | 0o644,
        uid: 0,
        gid: 0,
        size,
        same_as: None,
        data: data.to_vec(),
        times: [1, 2, 3],
    };
    let mut a = Tree::default();
    a.0.insert("x".into(), node(3, b"abc"));
    a.0.insert("y".into(), node(0, b""));
    let mut b = Tree::default();
    b.0.insert("x".into(), node(3, b"abd"));
    b.0.insert("z".into(), node(0, b""));
    assert_eq!(
        a.differences(&b, 10),
        vec!["x contents differ from byte 2", "z missing", "y unexpected"]
    );
    assert_eq!(a.differences(&a, 10), Vec::<String>::new());
}

/// Shards split the groups between them: together they explore what one
/// run explores, each group once.
#[test]
fn crashtest_shards_split_the_groups_between_them() {
    let config = |shard| Config {
        k: 0,
        filter: Some("ch".into()),
        recovery: false,
        shard,
        ..Config::default()
    };
    let names: Vec<&str> = sequences(&config((0, 1)))
        .unwrap()
        .iter()
        .map(|s| s[0].name)
        .collect();
    assert_eq!(names, ["chmod", "chown"]);
    let (whole, all) = explore(&config((0, 1)));
    let (first, a) = explore(&config((0, 2)));
    let (second, b) = explore(&config((1, 2)));
    assert_eq!((a, b), (vec!["chmod".to_owned()], vec!["chown".to_owned()]));
    assert_eq!(all, ["chmod", "chown"]);
    assert_eq!(first.checked + second.checked, whole.checked);
    assert!(first.checked > 0 && second.checked > 0);
}
