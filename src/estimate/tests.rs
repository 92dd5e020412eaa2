//! Token counts against OpenAI's counting, fallbacks, malformed bodies, and the cost formula.

use serde_json::{json, Value};

use super::*;
use crate::config::EstimateConfig;

fn chat(model: &str, messages: Value) -> u64 {
    let e = Estimator::with_defaults();
    e.count(
        Endpoint::Chat,
        model,
        &json!({ "model": model, "messages": messages }),
    )
    .unwrap()
    .tokens
}

#[test]
fn hello_is_eight_tokens_with_cl100k_and_o200k() {
    let m = json!([{"role": "user", "content": "hello"}]);
    assert_eq!(chat("gpt-3.5-turbo", m.clone()), 8);
    assert_eq!(chat("gpt-4o", m), 8);
}

/// The example of OpenAI's cookbook "How to count tokens with tiktoken".
fn cookbook() -> Value {
    json!([
        {"role": "system", "content": "You are a helpful, pattern-following assistant that translates corporate jargon into plain English."},
        {"role": "system", "name": "example_user", "content": "New synergies will help drive top-line growth."},
        {"role": "system", "name": "example_assistant", "content": "Things working well together will increase revenue."},
        {"role": "system", "name": "example_user", "content": "Let's circle back when we have more bandwidth to touch base on opportunities for increased leverage."},
        {"role": "system", "name": "example_assistant", "content": "Let's talk later when we're less busy about how to do better."},
        {"role": "user", "content": "This late pivot means we don't have time to boil the ocean for the client's project."}
    ])
}

#[test]
fn cookbook_example_matches_openai() {
    // The cookbook reports 129 prompt tokens for gpt-3.5-turbo-0613 and gpt-4 (cl100k_base).
    assert_eq!(chat("gpt-3.5-turbo-0613", cookbook()), 129);
    assert_eq!(chat("gpt-4", cookbook()), 129);
}

#[test]
fn content_parts_count_like_strings() {
    let parts = json!([{"role": "user", "content": [{"type": "text", "text": "hello"}]}]);
    assert_eq!(chat("gpt-4o", parts), 8);
    let image = json!([{"role": "user", "content": [
        {"type": "text", "text": "hello"},
        {"type": "image_url", "image_url": {"url": "data:,", "detail": "low"}}
    ]}]);
    assert_eq!(chat("gpt-4o", image), 8 + 85);
}

#[test]
fn unknown_models_fall_back_to_the_default_or_their_override() {
    let e = Estimator::with_defaults();
    assert_eq!(e.encoding("llama-3.1-70b"), Encoding::O200K);
    assert_eq!(e.encoding("claude-3-5-sonnet"), Encoding::O200K);
    assert_eq!(e.encoding("gpt-3.5-turbo"), Encoding::CL100K);
    let cfg: crate::config::Config = toml::from_str(
        "[[upstreams]]\nname = \"u\"\nbase_url = \"http://h/v1\"\n\
         [estimate]\ndefault_encoding = \"cl100k_base\"\n\
         [models.\"llama-3\"]\nweight = 2.0\nencoding = \"o200k_base\"\n",
    )
    .unwrap();
    let e = Estimator::new(&cfg.estimate, &cfg.models);
    assert_eq!(e.encoding("mistral-large"), Encoding::CL100K);
    assert_eq!(e.encoding("llama-3"), Encoding::O200K);
    assert_eq!(e.model_weight("llama-3").get(), 2.0);
    assert_eq!(
        chat(
            "llama-3.1-70b",
            json!([{"role": "user", "content": "hello"}])
        ),
        8
    );
}

#[test]
fn malformed_content_is_a_400() {
    let e = Estimator::with_defaults();
    let bad = [
        json!({"messages": [{"role": "user", "content": [{"type": "text"}]}]}),
        json!({"messages": [{"role": "user", "content": [{"type": "text", "text": 3}]}]}),
        json!({"messages": [{"role": "user", "content": ["hello"]}]}),
        json!({"messages": [{"role": "user", "content": [{"text": "no type"}]}]}),
        json!({"messages": [{"role": "user", "content": 42}]}),
        json!({"messages": {"role": "user"}}),
        json!({"messages": ["hi"]}),
        json!({"messages": [], "tools": "x"}),
    ];
    for body in bad {
        let err = e.count(Endpoint::Chat, "gpt-4o", &body).unwrap_err();
        assert_eq!(err.status(), StatusCode::BAD_REQUEST, "{body}");
        assert_eq!(crate::Error::from(err).status(), StatusCode::BAD_REQUEST);
    }
    let prompt = json!({"prompt": {"a": 1}});
    assert!(e
        .count(Endpoint::Completions, "gpt-3.5-turbo-instruct", &prompt)
        .is_err());
    assert!(e
        .count(Endpoint::Responses, "gpt-4o", &json!({"input": 5}))
        .is_err());
}

#[test]
fn other_endpoints_and_tools() {
    let e = Estimator::with_defaults();
    let n = |ep, v: Value| e.count(ep, "gpt-4o", &v).unwrap();
    assert_eq!(n(Endpoint::Embeddings, json!({"input": "hello"})).tokens, 1);
    assert_eq!(
        n(Endpoint::Embeddings, json!({"input": ["hello", "hello"]})).tokens,
        2
    );
    assert_eq!(
        n(Endpoint::Embeddings, json!({"input": [[1, 2, 3], [4]]})).tokens,
        4
    );
    assert_eq!(
        n(Endpoint::Embeddings, json!({"input": [1, 2, 3]})).tokens,
        3
    );
    assert_eq!(
        n(Endpoint::Completions, json!({"prompt": "hello"})).tokens,
        1
    );
    let r = n(
        Endpoint::Responses,
        json!({"instructions": "hello", "input": [{"role": "user", "content": [{"type": "input_text", "text": "hello"}]}]}),
    );
    assert_eq!(r.tokens, 1 + 8);
    assert_eq!(n(Endpoint::Responses, json!({"input": "hello"})).tokens, 1);
    let tools = json!({"messages": [{"role": "user", "content": "hello"}],
        "tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}]});
    let t = n(Endpoint::Chat, tools.clone());
    assert!(t.tokens > 8 + request::TOOL_OVERHEAD && t.tool_calls == 1);
    let mut none = tools;
    none["tool_choice"] = json!("none");
    assert_eq!(n(Endpoint::Chat, none).tool_calls, 0);
    let calls = json!({"messages": [{"role": "assistant", "content": null,
        "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{\"a\":1}"}}]}]});
    assert!(n(Endpoint::Chat, calls).tokens > 6);
}

#[test]
fn cost_uses_weights_history_and_caps() {
    let cfg = EstimateConfig::default();
    let e = Estimator::new(&cfg, &Default::default());
    let key = OutputKey::new(TenantId::new("a"), "m");
    let mut c = CostInputs {
        input_tokens: 100,
        output_key: Some(key.clone()),
        ..CostInputs::default()
    };
    // 100 + 512 × 1.5.
    assert_eq!(e.cost(&c), Tokens(868));
    c.max_output_tokens = Some(100);
    assert_eq!(e.cost(&c), Tokens(250));
    c.tool_calls = 2;
    assert_eq!(e.cost(&c), Tokens(4250));
    c.tool_calls = 0;
    c.max_output_tokens = None;
    for _ in 0..10 {
        e.record_output(&key, 40);
    }
    assert_eq!(e.cost(&c), Tokens(160));
    c.model_weight = Weight::new(2.0).unwrap();
    assert_eq!(e.cost(&c), Tokens(320));
    assert_eq!(e.actual_cost(100, 40, Weight::ONE), Tokens(160));
}

#[test]
fn repeated_messages_hit_the_cache() {
    let e = Estimator::with_defaults();
    let system = "You are a careful assistant. ".repeat(20);
    let body = json!({"messages": [{"role": "system", "content": system}, {"role": "user", "content": "hi"}]});
    let first = e.count(Endpoint::Chat, "gpt-4o", &body).unwrap();
    // The system text, both role names and "hi": every distinct string once.
    assert_eq!(e.cache().len(), 4);
    let again = e.count(Endpoint::Chat, "gpt-4o", &body).unwrap();
    assert_eq!(first, again);
    assert_eq!(e.cache().len(), 4, "the second count only hit the cache");
}

#[test]
fn hostile_bodies_are_extrapolated_not_counted_in_full() {
    let e = Estimator::with_defaults();
    let word = "x".repeat(4 << 20);
    let body = json!({"messages": [{"role": "user", "content": word}]});
    let n = e.count(Endpoint::Chat, "gpt-4o", &body).unwrap();
    assert!(n.extrapolated);
    assert!(n.tokens > (4 << 20) / 32, "{}", n.tokens);
    let small = json!({"messages": [{"role": "user", "content": "hello"}]});
    assert!(
        !e.count(Endpoint::Chat, "gpt-4o", &small)
            .unwrap()
            .extrapolated
    );
}

#[test]
fn choices_multiply_the_output_and_client_numbers_saturate() {
    let e = Estimator::with_defaults();
    let mut c = CostInputs {
        input_tokens: 100,
        max_output_tokens: Some(100),
        choices: 8,
        ..CostInputs::default()
    };
    // 100 + 8 × 100 × 1.5.
    assert_eq!(e.cost(&c), Tokens(1300));
    c.choices = 0; // taken as 1
    assert_eq!(e.cost(&c), Tokens(250));
    c.tool_calls = u64::MAX;
    c.choices = u64::MAX;
    c.max_output_tokens = Some(u64::MAX);
    assert_eq!(e.cost(&c), Tokens(u64::MAX));
    // Array prompts: each element is a prompt of its own.
    use super::request::prompts;
    assert_eq!(prompts(&json!({"prompt": ["a", "b", "c"]})), 3);
    assert_eq!(prompts(&json!({"prompt": [[1, 2], [3]]})), 2);
    assert_eq!(prompts(&json!({"prompt": [1, 2, 3]})), 1);
    assert_eq!(prompts(&json!({"prompt": "a"})), 1);
    assert_eq!(prompts(&json!({"prompt": []})), 1);
}
