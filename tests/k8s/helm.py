#!/usr/bin/env python3
"""Lints and renders fairgate's Helm chart, then validates what it renders.

    python3 tests/k8s/helm.py --fairgate target/debug/fairgate deploy/helm/fairgate

- `helm lint --strict` (Helm's own Go SDK, through the `helm-python-sdk` package: no helm
  binary) for the oldest Kubernetes version the chart claims: no warning, no error;
- the chart rendered offline with its defaults and with the other shapes its values allow
  (a Secret it makes, a managed Redis, a ServiceMonitor, a fixed replica count), each written to
  a folder and checked by validate.py as the plain manifests are (strict Kubernetes schemas,
  probes, drain, non-root, `fairgate check` on the rendered config);
- the rendered objects agree: the config's Redis URL names the Redis Service the chart made,
  the pods read the Secret the chart made, the Service selects the Deployment's pods.

Exit 0 when all pass, 1 with every failure listed, 2 when a tool is not installed.
"""

import argparse
import pathlib
import subprocess
import sys
import tempfile

try:
    import helm_python as helm
    import yaml
except ImportError as e:  # the Rust test turns this into a clear failure
    print(f"missing tool: {e} (pip install helm-python-sdk kubernetes-validate)", file=sys.stderr)
    sys.exit(2)

HERE = pathlib.Path(__file__).resolve().parent
KUBE_VERSION = "v1.30.0"

SHAPES = {
    "defaults": {},
    "managed-redis": {
        "secret": {
            "create": True,
            "upstreamApiKey": "sk-test",
            "adminToken": "admin",
            "redisPassword": "pw",
        },
        "redis": {"enabled": False, "url": "rediss://redis.example.internal:6380"},
        "serviceMonitor": {"enabled": True},
        "autoscaling": {"enabled": False},
        "replicaCount": 2,
        "env": [{"name": "OTEL_EXPORTER_OTLP_ENDPOINT", "value": "http://otel:4318"}],
    },
}


def docs_of(manifests):
    for path, text in sorted(manifests.items()):
        if not path.endswith(".yaml"):
            continue
        for doc in yaml.safe_load_all(text):
            if doc:
                yield path, doc


def agree(shape, docs, errors):
    by_kind = {}
    for _, d in docs:
        by_kind.setdefault(d["kind"], []).append(d)
    deploy = by_kind["Deployment"][0]
    pod = deploy["spec"]["template"]
    config = by_kind["ConfigMap"][0]["data"]["config.toml"]
    services = {s["metadata"]["name"]: s for s in by_kind.get("Service", [])}
    redis_line = next((l for l in config.splitlines() if l.strip().startswith("redis_url")), "")
    if by_kind.get("StatefulSet"):
        want = f'redis://{by_kind["StatefulSet"][0]["metadata"]["name"]}:6379'
        if want not in redis_line or want.split("//")[1].split(":")[0] not in services:
            errors.append(f"{shape}: the config's {redis_line!r} is not the chart's Redis ({want})")
    elif "rediss://redis.example.internal:6380" not in redis_line:
        errors.append(f"{shape}: the config's {redis_line!r} is not redis.url")
    secrets = {
        e["valueFrom"]["secretKeyRef"]["name"]
        for c in pod["spec"]["containers"]
        for e in c.get("env", [])
        if "secretKeyRef" in e.get("valueFrom", {})
    }
    made = {s["metadata"]["name"] for s in by_kind.get("Secret", [])}
    if made and secrets != made:
        errors.append(f"{shape}: the pods read {secrets}, the chart made {made}")
    proxy = [s for s in services.values() if s["spec"]["selector"].get("app.kubernetes.io/component") == "proxy"]
    labels = pod["metadata"]["labels"]
    for s in proxy:
        if any(labels.get(k) != v for k, v in s["spec"]["selector"].items()):
            errors.append(f"{shape}: Service {s['metadata']['name']} does not select the pods")
    if not proxy:
        errors.append(f"{shape}: no Service for the proxy")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--fairgate", required=True, help="the fairgate binary")
    ap.add_argument("chart")
    args = ap.parse_args()
    errors = []
    report = helm.lint(args.chart, strict=True, kube_version=KUBE_VERSION)
    errors += [f"helm lint: {e}" for e in report.get("errors", [])]
    errors += [
        f"helm lint: {m['path']}: {m['error']}"
        for m in report.get("messages", [])
        if m.get("severity", 0) >= 2
    ]
    with tempfile.TemporaryDirectory() as out:
        folders = []
        with helm.Chart.load(args.chart) as chart:
            for shape, values in SHAPES.items():
                try:
                    manifests = chart.render(values, name="prod", namespace="llm", is_install=True)
                except helm.HelmError as e:
                    errors.append(f"{shape}: render: {e}")
                    continue
                folder = pathlib.Path(out) / shape
                folder.mkdir()
                for path, text in manifests.items():
                    if path.endswith(".yaml") and text.strip():
                        (folder / pathlib.Path(path).name).write_text(text)
                agree(shape, list(docs_of(manifests)), errors)
                folders.append(str(folder))
        r = subprocess.run(
            [sys.executable, str(HERE / "validate.py"), "--fairgate", args.fairgate, *folders],
            capture_output=True, text=True, timeout=300,
        )
        if r.returncode == 2:
            print(r.stderr, file=sys.stderr)
            sys.exit(2)
        if r.returncode != 0:
            errors.append(f"validate.py:\n{r.stderr}{r.stdout}")
        summary = r.stdout.strip().splitlines()[-1] if r.stdout.strip() else ""
    for e in errors:
        print(e, file=sys.stderr)
    print(f"{len(SHAPES)} shapes rendered; validate.py: {summary}; {len(errors)} failed")
    sys.exit(1 if errors else 0)


if __name__ == "__main__":
    main()
