use super::*;

fn env<'a>(vars: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<String> + 'a {
    move |k| {
        vars.iter()
            .find(|(n, _)| *n == k)
            .map(|(_, v)| (*v).to_owned())
    }
}

#[test]
fn the_environment_fills_what_the_config_leaves_unset() {
    let vars = [
        ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4318/"),
        ("OTEL_SERVICE_NAME", "gateway"),
        (
            "OTEL_RESOURCE_ATTRIBUTES",
            "deployment.environment=prod,team=ml%20infra",
        ),
        ("OTEL_EXPORTER_OTLP_TIMEOUT", "750"),
        ("OTEL_BSP_SCHEDULE_DELAY", "200"),
        ("OTEL_TRACES_SAMPLER", "parentbased_traceidratio"),
        ("OTEL_TRACES_SAMPLER_ARG", "0.25"),
    ];
    let s = Settings::resolve(&OtelConfig::default(), &env(&vars)).unwrap();
    assert_eq!(s.url, "http://collector:4318/v1/traces");
    assert_eq!(s.service_name, "gateway");
    assert_eq!(s.resource[1], ("team".to_owned(), "ml infra".to_owned()));
    assert_eq!(
        (s.timeout_ms, s.export_interval_ms, s.max_queued),
        (750, 200, 2048)
    );
    assert_eq!(
        s.sampler,
        Sampler {
            parent_based: true,
            ratio: 0.25
        }
    );
    // The config wins where both are set.
    let cfg = OtelConfig {
        endpoint: Some("http://mine:4318".into()),
        service_name: Some("fg".into()),
        timeout_ms: Some(100),
        sample_ratio: Some(1.0),
        ..OtelConfig::default()
    };
    let s = Settings::resolve(&cfg, &env(&vars)).unwrap();
    assert_eq!(
        (s.url.as_str(), s.service_name.as_str()),
        ("http://mine:4318/v1/traces", "fg")
    );
    assert_eq!((s.timeout_ms, s.export_interval_ms), (100, 200));
    assert_eq!(s.sampler.ratio, 1.0);
    // The traces endpoint is used as is; service.name may come from the resource attributes.
    let vars = [
        (
            "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
            "https://c/otlp/traces",
        ),
        ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://ignored:4318"),
        ("OTEL_RESOURCE_ATTRIBUTES", "service.name=from-resource"),
    ];
    let s = Settings::resolve(&OtelConfig::default(), &env(&vars)).unwrap();
    assert_eq!(
        (s.url.as_str(), s.service_name.as_str()),
        ("https://c/otlp/traces", "from-resource")
    );
    assert!(s.resource.is_empty());
}

#[test]
fn off_without_an_endpoint_or_when_disabled_and_bad_values_are_ignored() {
    assert!(Settings::resolve(&OtelConfig::default(), &env(&[])).is_none());
    let vars = [
        ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4318"),
        ("OTEL_SDK_DISABLED", "true"),
    ];
    assert!(Settings::resolve(&OtelConfig::default(), &env(&vars)).is_none());
    let vars = [("OTEL_EXPORTER_OTLP_ENDPOINT", "collector:4318")];
    assert!(
        Settings::resolve(&OtelConfig::default(), &env(&vars)).is_none(),
        "not a URL"
    );
    let vars = [
        ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4318"),
        ("OTEL_BSP_MAX_QUEUE_SIZE", "lots"),
        ("OTEL_TRACES_SAMPLER", "always_off"),
    ];
    let s = Settings::resolve(&OtelConfig::default(), &env(&vars)).unwrap();
    assert_eq!(s.max_queued, 2048);
    assert_eq!(
        s.sampler,
        Sampler {
            parent_based: false,
            ratio: 0.0
        }
    );
}

#[test]
fn the_ratio_sampler_keeps_about_its_share_and_parents_decide_for_their_traces() {
    let half = Sampler {
        parent_based: true,
        ratio: 0.5,
    };
    let kept = (0..4000)
        .filter(|_| half.sample(&Trace::from_header(None)))
        .count();
    assert!((1700..2300).contains(&kept), "{kept} of 4000");
    let none = Sampler {
        parent_based: true,
        ratio: 0.0,
    };
    let sampled =
        http::HeaderValue::from_static("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01");
    assert!(
        none.sample(&Trace::from_header(Some(&sampled))),
        "the parent's flag wins"
    );
    assert!(!none.sample(&Trace::from_header(None)));
    let unsampled =
        http::HeaderValue::from_static("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00");
    let all = Sampler {
        parent_based: true,
        ratio: 1.0,
    };
    assert!(!all.sample(&Trace::from_header(Some(&unsampled))));
    let root = Sampler {
        parent_based: false,
        ratio: 1.0,
    };
    assert!(
        root.sample(&Trace::from_header(Some(&unsampled))),
        "not parent-based"
    );
}
