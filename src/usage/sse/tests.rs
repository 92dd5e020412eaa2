use bytes::Bytes;
use proptest::prelude::*;

use super::*;
use crate::usage::extract::Tally;

const STREAM: &str = concat!(
    "data: {\"choices\":[{\"delta\":{\"role\":\"assistant\",\"content\":\"tok \"}}],\"usage\":null}\n\n",
    "data: {\"choices\":[{\"delta\":{\"content\":\"tok \"}}],\"usage\":null}\n\n",
    "data: {\"choices\":[{\"delta\":{},\"finish_reason\":\"stop\"}],\"usage\":null}\n\n",
    "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":2}}\n\n",
    "data: [DONE]\n\n",
);

const WANTED: &str = concat!(
    "data: {\"choices\":[{\"delta\":{\"role\":\"assistant\",\"content\":\"tok \"}}]}\n\n",
    "data: {\"choices\":[{\"delta\":{\"content\":\"tok \"}}]}\n\n",
    "data: {\"choices\":[{\"delta\":{},\"finish_reason\":\"stop\"}]}\n\n",
    "data: [DONE]\n\n",
);

fn run(strip: bool, cuts: &[usize]) -> (String, Tally) {
    run_on(STREAM, strip, cuts)
}

/// `stream` through the scanner and the usage stage's own filter, in chunks cut at `cuts`.
fn run_on(stream: &str, strip: bool, cuts: &[usize]) -> (String, Tally) {
    let mut s = Scanner::new(strip);
    let mut tally = Tally::new(1 << 20);
    let mut out = Vec::new();
    let mut keep = |p: &[u8]| crate::usage::observe::keep(&mut tally, strip, p);
    let mut at = 0;
    let mut cuts: Vec<usize> = cuts.iter().map(|c| c % (stream.len() + 1)).collect();
    cuts.sort_unstable();
    for c in cuts.into_iter().chain([stream.len()]) {
        let chunk = Bytes::copy_from_slice(&stream.as_bytes()[at..c.max(at)]);
        at = c.max(at);
        out.extend_from_slice(&s.feed(chunk, &mut keep));
    }
    out.extend_from_slice(&s.finish(&mut keep));
    (String::from_utf8(out).unwrap(), tally)
}

#[test]
fn strips_the_usage_chunk_and_null_usage() {
    let (out, tally) = run(true, &[]);
    assert_eq!(out, WANTED);
    assert_eq!(tally.usage.unwrap().completion_tokens, Some(2));
    assert_eq!(tally.text, "tok tok ");
}

#[test]
fn observe_mode_forwards_untouched() {
    let (out, tally) = run(false, &[10, 100, 101]);
    assert_eq!(out, STREAM);
    assert_eq!(tally.usage.unwrap().prompt_tokens, Some(3));
}

#[test]
fn an_overlong_line_is_passed_through() {
    let mut s = Scanner::new(true);
    let long = format!("data: {}", "x".repeat(MAX_LINE + 10));
    let mut keep = |_: &[u8]| Verdict::Drop;
    let a = s.feed(Bytes::from(long.clone()), &mut keep);
    let b = s.feed(Bytes::from_static(b"\n\ndata: [DONE]\n\n"), &mut keep);
    assert_eq!(a.len(), long.len());
    // The long line's end and its event's blank line; the rejected event is gone.
    assert_eq!(&b[..], b"\n\n");
}

proptest! {
    #[test]
    fn any_chunking_gives_the_same_output(cuts in proptest::collection::vec(0usize..400, 0..12)) {
        let (stripped, t1) = run(true, &cuts);
        prop_assert_eq!(stripped, WANTED);
        prop_assert_eq!(t1.usage.unwrap().completion_tokens, Some(2));
        prop_assert_eq!(t1.text.as_str(), "tok tok ");
        let (plain, t2) = run(false, &cuts);
        prop_assert_eq!(plain, STREAM);
        prop_assert_eq!(t2.usage.unwrap().completion_tokens, Some(2));
    }
}

/// Events as providers write them, in the shapes that trip a stripper up.
const ODD: &str = concat!(
    "data: {\"id\":\"c\",\"choices\":[{\"delta\":{\"content\":\"a\"}}],\"usage\":null}\r\n\r\n",
    "data:{\"id\":\"c\",\"choices\":[{\"delta\":{\"content\":\"b\"}}],\"usage\":null}\n\n",
    "data: {\"id\":\"c\",\"choices\":[{\"delta\":{\"content\":\"c\"}}], \"usage\": null}\n\n",
    "data: {\"id\":\"c\",\"x\":{\"a\":1,\"usage\":null},\"choices\":[{\"delta\":{\"content\":\"d\"}}],\"usage\":null}\n\n",
    "data: {\"id\":\"c\",\"usage\":null,\"choices\":[{\"delta\":{\"content\":\"\\\"e\"}}]}\n\n",
    "data: {\"choices\":[{\"delta\":{\"content\":\",\\\"usage\\\":null\"}}],\"usage\":null}\n\n",
    "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":5}}\n\n",
    "data: [DONE]\n\n",
);

const ODD_WANTED: &str = concat!(
    "data: {\"id\":\"c\",\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\r\n\r\n",
    "data:{\"id\":\"c\",\"choices\":[{\"delta\":{\"content\":\"b\"}}]}\n\n",
    "data: {\"id\":\"c\",\"choices\":[{\"delta\":{\"content\":\"c\"}}], \"usage\": null}\n\n",
    "data: {\"id\":\"c\",\"x\":{\"a\":1,\"usage\":null},\"choices\":[{\"delta\":{\"content\":\"d\"}}]}\n\n",
    "data: {\"id\":\"c\",\"choices\":[{\"delta\":{\"content\":\"\\\"e\"}}]}\n\n",
    "data: {\"choices\":[{\"delta\":{\"content\":\",\\\"usage\\\":null\"}}]}\n\n",
    "data: [DONE]\n\n",
);

#[test]
fn only_the_top_level_null_usage_is_removed_wherever_the_stream_is_cut() {
    // Every event's top-level `,"usage":null` goes, whatever comes before or after it; a
    // nested one, one with spaces, and the same bytes inside a text stay.
    let (out, tally) = run_on(ODD, true, &[]);
    assert_eq!(out, ODD_WANTED);
    assert_eq!(tally.text, "abcd\"e,\"usage\":null");
    assert_eq!(tally.usage.unwrap().completion_tokens, Some(5));
    // An event split across two chunks at every byte offset, and across three.
    for cut in 0..=ODD.len() {
        assert_eq!(run_on(ODD, true, &[cut]).0, ODD_WANTED, "cut at {cut}");
        assert_eq!(
            run_on(ODD, true, &[cut, cut + 7]).0,
            ODD_WANTED,
            "cut at {cut}"
        );
        assert_eq!(run_on(ODD, false, &[cut]).0, ODD, "cut at {cut}");
    }
}
