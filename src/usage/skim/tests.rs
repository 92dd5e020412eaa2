use proptest::prelude::*;

use super::*;
use crate::usage::extract::{Seen, Tally};

fn text_of(json: &str) -> (Option<Skim>, String) {
    let mut text = String::new();
    let found = skim(json.as_bytes(), &mut |raw, escaped| {
        if escaped {
            assert!(unescape(raw, &mut text));
        } else {
            text.push_str(std::str::from_utf8(raw).unwrap());
        }
    });
    (found, text)
}

#[test]
fn reads_text_on_its_paths_only() {
    let (s, t) = text_of(
        r#"{"id":"c","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"role":"assistant","content":"tok "},"logprobs":null,"finish_reason":null}],"usage":null}"#,
    );
    assert_eq!(
        s,
        Some(Skim {
            usage: None,
            choices: true,
            null_usage: Some(173),
        })
    );
    assert_eq!(t, "tok ");
    let (_, t) = text_of(
        r#"{"choices":[{"delta":{"tool_calls":[{"index":0,"function":{"name":"f","arguments":"{\"a\":"}}]}},{"text":"b","message":{"content":"c"}}]}"#,
    );
    assert_eq!(t, "{\"a\":bc");
    // Responses API: a string `delta` counts; the `text` of a `*.done` event does not.
    assert_eq!(
        text_of(r#"{"type":"response.output_text.delta","delta":"d"}"#).1,
        "d"
    );
    assert_eq!(
        text_of(r#"{"type":"response.output_text.done","text":"all"}"#).1,
        ""
    );
    // Keys off the paths: a `content` at the top, a `text` inside a message, a delta object.
    assert_eq!(
        text_of(r#"{"content":"x","choices":[{"delta":{"text":"y","content":null}}],"delta":{"content":"z"}}"#).1,
        ""
    );
}

#[test]
fn reads_usage_by_preference_and_whether_choices_were_empty() {
    let u = |p, c| {
        Some(Usage {
            prompt_tokens: Some(p),
            completion_tokens: Some(c),
            ..Usage::default()
        })
    };
    let s = |j: &str| text_of(j).0.unwrap();
    assert_eq!(
        s(r#"{"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":2}}"#),
        Skim {
            usage: u(3, 2),
            choices: false,
            null_usage: None
        }
    );
    assert_eq!(
        s(
            r#"{"type":"response.completed","response":{"id":"r","output":[{"content":[{"text":"no"}]}],"usage":{"input_tokens":7,"output_tokens":9}}}"#
        ),
        Skim {
            usage: u(7, 9),
            choices: false,
            null_usage: None
        }
    );
    assert_eq!(
        s(
            r#"{"x_groq":{"usage":{"prompt_tokens":1,"completion_tokens":1}},"usage":{"prompt_tokens":5,"completion_tokens":6},"choices":[{"delta":{}}]}"#
        ),
        Skim {
            usage: u(5, 6),
            choices: true,
            null_usage: None
        }
    );
    // A usage nested elsewhere, or null, is none.
    assert_eq!(
        s(r#"{"choices":[{"usage":{"prompt_tokens":1,"completion_tokens":1}}],"usage":null}"#)
            .usage,
        None
    );
    assert_eq!(
        s(r#"{"meta":{"usage":{"prompt_tokens":1,"completion_tokens":1}}}"#).usage,
        None
    );
}

#[test]
fn what_is_not_one_object_says_nothing() {
    for bad in [
        "not json",
        "[1]",
        r#"{"a":1"#,
        r#"{"a":1}x"#,
        r#"{"a":}"#,
        r#"{"a" 1}"#,
        r#"{"choices":[{"delta":{"content":"x"}}"#,
        r#"{"s":"unterminated}"#,
        "",
    ] {
        assert_eq!(text_of(bad).0, None, "{bad}");
    }
    assert!(text_of(" {\"a\":[1,{\"b\":[]}],\"c\":true} \r").0.is_some());
}

#[test]
fn unescapes_as_json_does_and_refuses_what_it_refuses() {
    let mut out = String::from("keep:");
    assert!(unescape(
        br#"a\n\t\"\\\/\b\f\r\u00e9\ud83d\ude00z"#,
        &mut out
    ));
    assert_eq!(out, "keep:a\n\t\"\\/\u{8}\u{c}\r\u{e9}\u{1F600}z");
    for bad in [
        &br"\x"[..],
        br"\u12",
        br"\ud83d",
        br"\ud83dx\ude00",
        br"\ude00",
        br"\",
        b"\xff",
    ] {
        let mut out = String::from("keep");
        assert!(!unescape(bad, &mut out), "{bad:?}");
        assert_eq!(out, "keep");
    }
}

/// `s` as a JSON string's content, with some characters written as `\u` escapes.
fn escaped(s: &str, mask: u64) -> String {
    let mut out = String::new();
    for (i, c) in s.chars().enumerate() {
        if mask >> (i % 64) & 1 == 1 {
            let mut units = [0u16; 2];
            for u in c.encode_utf16(&mut units) {
                out.push_str(&format!("\\u{u:04x}"));
            }
        } else {
            let j = serde_json::to_string(&c.to_string()).unwrap();
            out.push_str(&j[1..j.len() - 1]);
        }
    }
    out
}

proptest! {
    #[test]
    fn unescape_inverts_any_escaping(s in any::<String>(), mask in any::<u64>()) {
        let mut out = String::new();
        prop_assert!(unescape(escaped(&s, mask).as_bytes(), &mut out));
        prop_assert_eq!(out, s);
    }

    /// Over the shapes providers send, the skim sees what a full parse sees.
    #[test]
    fn the_skim_sees_what_a_parse_sees(
        texts in proptest::collection::vec(any::<String>(), 1..4),
        mask in any::<u64>(),
        shape in 0usize..6,
        usage in proptest::option::of((0u64..10_000, 0u64..10_000)),
        empty in any::<bool>(),
    ) {
        let t: Vec<String> = texts.iter().map(|s| escaped(s, mask)).collect();
        let t1 = t.get(1).cloned().unwrap_or_default();
        let choices = match shape {
            0 => format!(r#"[{{"index":0,"delta":{{"content":"{}"}},"logprobs":null,"finish_reason":null}}]"#, t[0]),
            1 => format!(r#"[{{"index":0,"message":{{"role":"assistant","content":"{}"}}}},{{"index":1,"text":"{t1}"}}]"#, t[0]),
            2 => format!(r#"[{{"delta":{{"tool_calls":[{{"id":"x","function":{{"name":"n","arguments":"{}"}}}},{{"function":{{"arguments":"{t1}"}}}}]}}}}]"#, t[0]),
            3 => format!(r#"[{{"text":"{}","logprobs":{{"tokens":["a"],"text_offset":[1]}}}}]"#, t[0]),
            4 => "[]".to_owned(),
            _ => format!(r#"[{{"delta":{{}},"finish_reason":"stop"}}],"delta":"{}""#, t[0]),
        };
        let choices = if empty && shape != 5 { "[]".to_owned() } else { choices };
        let usage = match usage {
            Some((p, c)) => format!(r#"{{"prompt_tokens":{p},"completion_tokens":{c},"total_tokens":{}}}"#, p + c),
            None => "null".to_owned(),
        };
        let doc = format!(r#"{{"id":"chatcmpl-{}","object":"chat.completion.chunk","choices":{choices},"usage":{usage}}}"#, t1);
        let (mut a, mut b) = (Tally::new(1 << 20), Tally::new(1 << 20));
        let seen: Seen = a.observe(doc.as_bytes());
        let parsed = b.observe_doc(doc.as_bytes());
        prop_assert_eq!((seen.usage, seen.usage_only), (parsed.usage, parsed.usage_only));
        // The null usage strip mode removes: the top-level one, exactly.
        let null = doc.ends_with(r#","usage":null}"#).then(|| doc.len() - r#","usage":null}"#.len());
        prop_assert_eq!(seen.null_usage, null);
        prop_assert_eq!(a.text, b.text);
        prop_assert_eq!(a.usage, b.usage);
    }
}

/// One event of a stream: a head (the members before `choices`; some alike, some not, some
/// broken) and a body.
fn event(head: usize, body: usize, text: &str) -> String {
    let head = [
        r#"{"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"m","#,
        r#"{"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"m", "#,
        r#"{"id":"chatcmpl-2","object":"chat.completion.chunk","created":1,"model":"m","#,
        r#"{"id":"chatcmpl-1","object":"chat.completion.chunk","created":12,"model":"m","#,
        r#"{"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"#,
        r#"{"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"m""#,
        r#" {"id":"x","#,
        r#"{"#,
        r#"{"type":"response.output_text.delta","item_id":"i","#,
    ][head];
    let body = [
        format!(r#""choices":[{{"index":0,"delta":{{"content":"{text}"}},"finish_reason":null}}],"usage":null}}"#),
        format!(r#""choices":[],"usage":{{"prompt_tokens":3,"completion_tokens":{}}}}}"#, text.len()),
        format!(r#""delta":"{text}"}}"#),
        format!(r#""usage":null,"choices":[{{"text":"{text}"}}]}}"#),
        r#""model":"m"}"#.to_owned(),
        format!(r#""choices":[{{"delta":{{"content":"{text}"}}}}]"#),
        "}".to_owned(),
        format!(r#""choices":[{{"text":"{text}"}},{{"text":"x"}}]}}"#),
        format!(r#""choices":[{{"index":0,"delta":{{"content":"{text}"}},"finish_reason":null}}],"usage":null}} "#),
        format!(r#""choices":[{{"delta":{{"content":"{text}"}}}}],"usage":{{"prompt_tokens":3,"completion_tokens":{}}}}}"#, text.len()),
        format!(r#""choices":[{{"delta":{{"content":"{text}"}}}}],"usage":{{"prompt_tokens":{},"prompt_tokens":1}}}}"#, text.len()),
        format!(r#""choices":[{{"delta":{{"content":"{text}"}}}}],"usage":{{ "prompt_tokens":{} }}}}"#, text.len()),
        format!(r#""usage":{{"completion_tokens":{}}},"choices":[{{"text":"{text}"}}]}}"#, text.len()),
        format!(r#""choices":[{{"text":"{text}"}}],"usage":{{"completion_tokens":{}}},"x":[1]}}"#, text.len()),
        format!(r#""choices":[{{"text":"{text}"}}],"usage":{{"completion_tokens":{}}},"usage":null}}"#, text.len()),
        format!(r#""choices":[{{"text":"{text}"}}],"usage":{{"completion_tokens":{}}},"y":"a"}}"#, text.len()),
        format!(r#""choices":[{{"text":"{text}"}}],"usage":{{"completion_tokens":{}}},"y":"a"]"#, text.len()),
    ][body]
        .clone();
    head.to_owned() + &body
}

proptest! {
    // Cheap cases, and a fault that needs two kin events in a row to show: many of them.
    #![proptest_config(ProptestConfig::with_cases(8192))]
    /// A stream's events skimmed one after another, each with what the ones before had in
    /// common, see what each skimmed alone sees.
    #[test]
    fn walking_on_from_what_a_stream_had_in_common_sees_what_a_whole_walk_sees(
        base in (0usize..9, 0usize..17),
        events in proptest::collection::vec(
            (proptest::option::weighted(0.3, (0usize..9, 0usize..17)), "[a-z \\\\\"]{0,6}"),
            1..16,
        ),
    ) {
        // Most events in the stream's own shape, some in any other.
        let mut memo = Memo::default();
        for (other, text) in events {
            let (head, body) = other.unwrap_or(base);
            let text = serde_json::to_string(&text).unwrap();
            let doc = event(head, body, &text[1..text.len() - 1]);
            let (mut alone, mut after) = (Vec::new(), Vec::new());
            let a = skim(doc.as_bytes(), &mut |raw, e| alone.push((raw.to_vec(), e)));
            let b = skim_after(doc.as_bytes(), &mut memo, &mut |raw, e| after.push((raw.to_vec(), e)));
            prop_assert_eq!(a, b, "{}", doc);
            prop_assert_eq!(alone, after, "{}", doc);
        }
    }
}

#[test]
fn a_known_prefix_and_shape_are_used_and_new_ones_replace_them() {
    let mut memo = Memo::default();
    let mut texts = Vec::new();
    let one = event(0, 0, "a");
    assert!(skim_after(one.as_bytes(), &mut memo, &mut |_, _| ()).is_some());
    let kept = memo.0.as_ref().unwrap();
    let head = event(0, 4, "");
    assert_eq!(
        kept.prefix,
        head.as_bytes()[..head.len() - r#""model":"m"}"#.len()]
    );
    assert_eq!(kept.shape.len(), one.len() - 1);
    // Another text in the same shape: the text is what lies between.
    let two = event(0, 0, "bc d");
    let s = skim_after(two.as_bytes(), &mut memo, &mut |raw, e| {
        texts.push((raw.to_vec(), e))
    });
    assert_eq!(
        (s, texts),
        (
            skim(two.as_bytes(), &mut |_, _| ()),
            vec![(b"bc d".to_vec(), false)]
        )
    );
    // A text with a quote or an escape in the same shape is walked, and found all the same.
    let quoted = event(0, 0, r#"x\"y"#);
    let mut texts = Vec::new();
    assert!(skim_after(quoted.as_bytes(), &mut memo, &mut |raw, e| texts
        .push((raw.to_vec(), e)))
    .is_some());
    assert_eq!(texts, vec![(br#"x\"y"#.to_vec(), true)]);
    // Broken where the known prefix would have been checked: found all the same.
    let mut broken = event(0, 0, "b").into_bytes();
    broken[5] = b' ';
    assert_eq!(skim_after(&broken, &mut memo, &mut |_, _| ()), None);
    let other = event(2, 1, "cd");
    let s = skim_after(other.as_bytes(), &mut memo, &mut |_, _| ()).unwrap();
    assert_eq!(s.usage.unwrap().completion_tokens, Some(2));
    assert!(memo.0.unwrap().prefix.starts_with(br#"{"id":"chatcmpl-2""#));
}
