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
    let mut s = Scanner::new(strip);
    let mut tally = Tally::new(1 << 20);
    let mut out = Vec::new();
    let mut keep = |p: &[u8]| {
        if p.first() != Some(&b'{') {
            return true;
        }
        let seen = tally.observe(p);
        !(strip && seen.usage_only)
    };
    let mut at = 0;
    let mut cuts: Vec<usize> = cuts.iter().map(|c| c % (STREAM.len() + 1)).collect();
    cuts.sort_unstable();
    for c in cuts.into_iter().chain([STREAM.len()]) {
        let chunk = Bytes::copy_from_slice(&STREAM.as_bytes()[at..c.max(at)]);
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
    let mut keep = |_: &[u8]| false;
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
