//! The relay is byte-exact in both directions and stdout carries nothing but the child's bytes
//! (DESIGN §2 invariants 1–2), through the real binary over real pipes.

mod stdio_support;

use proptest::prelude::*;
use stdio_support::*;

/// Identical copy of the fixture's `pattern_byte` (examples/stdio_fixture.rs).
fn pattern_byte(i: usize) -> u8 {
    if i % 97 == 96 {
        b'\n'
    } else {
        (i.wrapping_mul(2_654_435_761) >> 13) as u8
    }
}

proptest! {
    // Each case spawns two processes; a few dozen cases keep the run to seconds.
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    /// Random binary data written in random chunk sizes comes back identical: client → server
    /// through the wrapper, echoed by the fixture, server → client through the wrapper.
    #[test]
    fn random_binary_streams_round_trip_byte_exact(
        data in proptest::collection::vec(any::<u8>(), 0..300_000),
        chunks in proptest::collection::vec(1usize..100_000, 1..12),
    ) {
        let r = run_with(wrap_fixture(&[], &["cat"]), data.clone(), chunks, false);
        prop_assert_eq!(r.code(), Some(0), "stderr: {}", r.stderr);
        prop_assert_eq!(r.stdout.len(), data.len());
        prop_assert!(r.stdout == data, "bytes differ");
    }
}

#[test]
fn thirty_mb_line_round_trips() {
    let mut data: Vec<u8> = (0..30 * 1024 * 1024)
        .map(|i: usize| b'a' + (i % 26) as u8)
        .collect();
    data.push(b'\n');
    data.extend_from_slice(b"{\"jsonrpc\":\"2.0\",\"id\":1}\n");
    let r = run_with(
        wrap_fixture(&[], &["cat"]),
        data.clone(),
        vec![1 << 20, 7, 65_537],
        false,
    );
    assert_eq!(r.code(), Some(0), "stderr: {}", r.stderr);
    assert_eq!(r.stdout.len(), data.len());
    assert!(r.stdout == data, "30 MB line altered");
}

#[test]
fn invalid_utf8_non_json_and_unterminated_last_line_round_trip() {
    let mut data = Vec::new();
    data.extend_from_slice(b"not json at all\n");
    data.extend_from_slice(b"\xff\xfe\xc3\x28 invalid utf-8\n");
    data.extend_from_slice(b"\r\n\n\0\0binary\x80\n");
    data.extend_from_slice(b"{\"jsonrpc\":\"2.0\",\"method\":\"ping\"");
    data.extend_from_slice(b"\n[1,2,3]\nlast line without newline \xe2\x82");
    let r = run_with(
        wrap_fixture(&[], &["cat"]),
        data.clone(),
        vec![3, 1, 5],
        false,
    );
    assert_eq!(r.code(), Some(0), "stderr: {}", r.stderr);
    assert_eq!(r.stdout, data);
}

#[test]
fn server_output_arrives_byte_exact_without_final_newline() {
    // 5 MB the server writes on its own (not an echo), ending mid-line, then it exits.
    let n = 5 * 1024 * 1024 + 13;
    let r = run(wrap_fixture(&[], &["pattern", &n.to_string()]), b"");
    assert_eq!(r.code(), Some(0), "stderr: {}", r.stderr);
    let expected: Vec<u8> = (0..n).map(pattern_byte).collect();
    assert_ne!(expected.last(), Some(&b'\n'));
    assert_eq!(r.stdout.len(), expected.len());
    assert!(r.stdout == expected, "server bytes altered");
}

#[test]
fn debug_counts_frames_and_stdout_has_only_child_bytes() {
    let input = b"{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"ping\"}\nnot json\n\xff\xfe\n\n{\"id\":2}\ntail";
    let r = run(wrap_fixture(&["--debug"], &["cat"]), input);
    assert_eq!(r.code(), Some(0), "stderr: {}", r.stderr);
    // Invariant 1: --debug logs go to stderr only; stdout is exactly what the child wrote.
    assert_eq!(&r.stdout[..], &input[..]);
    // 6 frames: 5 newline-terminated (one empty) and the unterminated tail; bytes exclude
    // the newlines.
    let frames = 6;
    let bytes = input.len() - 5;
    let want =
        format!("frames_c2s={frames} frames_s2c={frames} bytes_c2s={bytes} bytes_s2c={bytes}");
    assert!(
        r.stderr.contains(&want),
        "want {want:?} in stderr:\n{}",
        r.stderr
    );
    for line in r.stderr.lines() {
        assert!(
            line.starts_with("[observe-mcp]"),
            "unprefixed stderr line {line:?}"
        );
    }
}

#[test]
fn child_stderr_is_inherited_not_mixed_into_stdout() {
    let canary = "fixture-stderr-canary-5f2a";
    let r = run(wrap_fixture(&[], &["stderr", canary]), b"hello\n");
    assert_eq!(r.code(), Some(0), "stderr: {}", r.stderr);
    assert_eq!(r.stdout, b"hello\n");
    assert!(
        r.stderr.contains(canary),
        "child stderr missing: {}",
        r.stderr
    );
}
