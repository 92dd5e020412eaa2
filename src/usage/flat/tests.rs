use proptest::prelude::*;

use super::*;

/// What serde reads at the start of `b`, and where it stops.
fn serde(b: &[u8]) -> Result<Read, ()> {
    let mut values = serde_json::Deserializer::from_slice(b).into_iter::<Usage>();
    match values.next() {
        Some(Ok(u)) => Ok((u, values.byte_offset())),
        _ => Err(()),
    }
}

#[test]
fn reads_the_shapes_providers_send() {
    for doc in [
        r#"{"prompt_tokens":300,"completion_tokens":5,"total_tokens":305}"#,
        r#"{"prompt_tokens":19,"completion_tokens":10,"total_tokens":29,"prompt_tokens_details":{"cached_tokens":0,"audio_tokens":0},"completion_tokens_details":{"reasoning_tokens":0,"audio_tokens":0,"accepted_prediction_tokens":0,"rejected_prediction_tokens":0}}"#,
        r#"{"input_tokens":7,"input_tokens_details":{"cached_tokens":3},"output_tokens":9,"output_tokens_details":{"reasoning_tokens":0},"total_tokens":16}"#,
        r#"{"prompt_tokens":4,"total_tokens":4}"#,
        r#"{"prompt_tokens":null,"completion_tokens":0,"prompt_tokens_details":null}"#,
        r#"{}"#,
        r#"{"completion_tokens":9999999999999999999}"#,
    ] {
        let with_tail = format!("{doc},\"choices\":[]}}");
        let fast = read(with_tail.as_bytes()).expect(doc);
        assert_eq!(fast, serde(with_tail.as_bytes()), "{doc}");
        assert_eq!(fast.unwrap().1, doc.len());
    }
    let (u, _) =
        read(br#"{"input_tokens":7,"input_tokens_details":{"cached_tokens":3},"output_tokens":9}"#)
            .unwrap()
            .unwrap();
    assert_eq!(
        (u.prompt_tokens, u.completion_tokens, u.cached_tokens()),
        (Some(7), Some(9), 3)
    );
}

#[test]
fn refuses_what_serde_refuses_and_leaves_the_unsure_to_it() {
    for dup in [
        r#"{"prompt_tokens":1,"prompt_tokens":2}"#,
        r#"{"prompt_tokens":1,"input_tokens":2}"#,
        r#"{"output_tokens":1,"completion_tokens":null}"#,
        r#"{"prompt_tokens_details":null,"input_tokens_details":{}}"#,
        r#"{"prompt_tokens_details":{"cached_tokens":1,"cached_tokens":1}}"#,
    ] {
        assert_eq!(read(dup.as_bytes()), Some(Err(())), "{dup}");
        assert_eq!(serde(dup.as_bytes()), Err(()), "{dup}");
    }
    for unsure in [
        r#"{ "prompt_tokens":1}"#,
        r#"{"prompt_tokens" :1}"#,
        r#"{"prompt_tokens":01}"#,
        r#"{"prompt_tokens":-1}"#,
        r#"{"prompt_tokens":1.0}"#,
        r#"{"prompt_tokens":1e3}"#,
        r#"{"prompt_tokens":18446744073709551615}"#,
        r#"{"prompt_tokens":"1"}"#,
        r#"{"prompt_\u0074okens":1}"#,
        r#"{"x":[1]}"#,
        r#"{"x":{"y":{}}}"#,
        r#"{"x":true}"#,
        r#"{"prompt_tokens_details":{"cached_tokens":{}}}"#,
        r#"{"prompt_tokens":1"#,
        r#"{"prompt_tokens":nul}"#,
        "{\"\u{e9}\":1}",
    ] {
        assert_eq!(read(unsure.as_bytes()), None, "{unsure}");
    }
}

/// A member of a usage-like object, from the keys and values providers use and the ones that
/// trip a reader up.
fn member() -> impl Strategy<Value = String> {
    let key = prop::sample::select(vec![
        "prompt_tokens",
        "input_tokens",
        "completion_tokens",
        "output_tokens",
        "total_tokens",
        "prompt_tokens_details",
        "input_tokens_details",
        "completion_tokens_details",
        "cached_tokens",
        "x",
        "prompt_tokens ",
        "\\u0070rompt_tokens",
    ]);
    let leaf = prop_oneof![
        any::<u64>().prop_map(|n| n.to_string()),
        (0u64..1000).prop_map(|n| n.to_string()),
        prop::sample::select(vec![
            "null",
            "0",
            "01",
            "-1",
            "1.5",
            "2e3",
            "\"7\"",
            "true",
            "[]",
            "[1]",
            "nul",
            "18446744073709551616",
            " 3",
        ])
        .prop_map(str::to_owned),
    ];
    let inner = (
        prop::sample::select(vec!["cached_tokens", "audio_tokens", "x"]),
        leaf.clone(),
    )
        .prop_map(|(k, v)| format!("\"{k}\":{v}"));
    let object = prop::collection::vec(inner, 0..4).prop_map(|m| format!("{{{}}}", m.join(",")));
    let value = prop_oneof![3 => leaf, 1 => object.clone(), 1 => object.prop_map(|o| format!("{{\"d\":{o}}}"))];
    (key, value).prop_map(|(k, v)| format!("\"{k}\":{v}"))
}

proptest! {
    /// Whatever it reads, serde reads the same from the same bytes; whatever it refuses,
    /// serde refuses.
    #[test]
    fn reads_what_serde_reads(
        members in prop::collection::vec(member(), 0..6),
        sep in prop::sample::select(vec![",", ",", ",", " ,", ""]),
        tail in prop::sample::select(vec!["", "}", ",\"choices\":[]}", " x"]),
    ) {
        let doc = format!("{{{}}}{tail}", members.join(sep));
        if let Some(fast) = read(doc.as_bytes()) {
            prop_assert_eq!(fast, serde(doc.as_bytes()), "{}", doc);
        }
    }
}
