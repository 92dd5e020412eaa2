#!/usr/bin/env python3
"""Validates fairgate's Kubernetes manifests and the fairgate configs they carry.

    python3 tests/k8s/validate.py --fairgate target/debug/fairgate deploy/k8s

For every YAML document under the given folders:
- Kubernetes kinds: strict validation (unknown fields rejected) against the schemas bundled
  with `kubernetes-validate` (offline), for every Kubernetes version in KUBERNETES_VERSIONS;
- ServiceMonitor (a Prometheus Operator CRD): strict validation against servicemonitor.schema.json;
- a Kustomization: every resource it lists exists;
- every ConfigMap's `config.toml`: `fairgate check` exits 0;
- fairgate's Deployments and sidecars: probes on /readyz and /healthz, a non-root read-only root
  filesystem, resources set, and (standalone) a preStop pause plus shutdown_grace_ms that fit in
  terminationGracePeriodSeconds.

Exit 0 when all pass, 1 with every failure listed, 2 when a validator is not installed.
"""

import argparse
import json
import os
import pathlib
import subprocess
import sys
import tempfile

try:
    import jsonschema
    import kubernetes_validate
    import yaml
except ImportError as e:  # the Rust test turns this into a clear failure
    print(f"missing validator: {e} (pip install kubernetes-validate)", file=sys.stderr)
    sys.exit(2)

# The oldest version the manifests claim (the kubelet's preStop sleep action, native sidecars)
# and the newest the validator bundles.
KUBERNETES_VERSIONS = ["1.30.0", kubernetes_validate.latest_version()]
HERE = pathlib.Path(__file__).resolve().parent
# Variables the shipped configs name (`fairgate check` warns about unset ones; set them so a
# config that needs one more fails loudly instead).
CHECK_ENV = {
    "UPSTREAM_API_KEY": "sk-test",
    "FAIRGATE_ADMIN_TOKEN": "test-token",
    "FAIRGATE_REDIS_PASSWORD": "test-password",
}


def documents(path):
    with open(path) as f:
        for doc in yaml.safe_load_all(f):
            if doc is not None:
                yield doc


def name_of(doc):
    return f"{doc.get('kind')}/{doc.get('metadata', {}).get('name')}"


def containers_of(doc):
    spec = doc["spec"]["template"]["spec"]
    for c in spec.get("initContainers", []) + spec.get("containers", []):
        if "fairgate" in c.get("image", ""):
            yield spec, c


def toml_value(config, key):
    """The integer `key = N` of a config's text (the first one), or None."""
    for line in config.splitlines():
        parts = line.split("#", 1)[0].split("=", 1)
        if len(parts) == 2 and parts[0].strip() == key:
            return int(parts[1].strip())
    return None


def check_workload(where, doc, configs, errors):
    for spec, c in containers_of(doc):
        probes = {
            p: c.get(p, {}).get("httpGet", {}).get("path")
            for p in ("readinessProbe", "livenessProbe", "startupProbe")
        }
        if probes["readinessProbe"] != "/readyz":
            errors.append(f"{where}: {c['name']}: readinessProbe must GET /readyz")
        if probes["livenessProbe"] != "/healthz":
            errors.append(f"{where}: {c['name']}: livenessProbe must GET /healthz")
        sc = c.get("securityContext", {})
        pod_sc = spec.get("securityContext", {})
        if not sc.get("readOnlyRootFilesystem"):
            errors.append(f"{where}: {c['name']}: readOnlyRootFilesystem must be true")
        if not (sc.get("runAsNonRoot") or pod_sc.get("runAsNonRoot")):
            errors.append(f"{where}: {c['name']}: runAsNonRoot must be true")
        if sc.get("allowPrivilegeEscalation") is not False:
            errors.append(f"{where}: {c['name']}: allowPrivilegeEscalation must be false")
        res = c.get("resources", {})
        if not res.get("requests") or not res.get("limits", {}).get("memory"):
            errors.append(f"{where}: {c['name']}: resources need requests and a memory limit")
        grace = spec.get("terminationGracePeriodSeconds", 30)
        pause = c.get("lifecycle", {}).get("preStop", {}).get("sleep", {}).get("seconds", 0)
        drain = max((toml_value(t, "shutdown_grace_ms") or 30000 for t in configs), default=30000)
        if grace * 1000 < pause * 1000 + drain + 2000:
            errors.append(
                f"{where}: terminationGracePeriodSeconds {grace} s does not cover the preStop "
                f"pause ({pause} s) plus shutdown_grace_ms ({drain} ms) and 2 s of margin"
            )
        if c.get("restartPolicy") != "Always" and pause == 0:
            errors.append(
                f"{where}: {c['name']}: a preStop pause is needed so the endpoints drop the pod "
                f"before SIGTERM (a native sidecar, restartPolicy: Always, stops after the app)"
            )


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--fairgate", required=True, help="the fairgate binary")
    ap.add_argument("folders", nargs="+")
    args = ap.parse_args()
    errors, checked = [], 0
    monitor_schema = json.loads((HERE / "servicemonitor.schema.json").read_text())
    files = sorted(
        p for folder in args.folders for p in pathlib.Path(folder).rglob("*.y*ml")
    )
    if not files:
        errors.append(f"no manifest found under {args.folders}")
    for path in files:
        docs = list(documents(path))
        configs = [
            d["data"]["config.toml"]
            for d in docs
            if d.get("kind") == "ConfigMap" and "config.toml" in d.get("data", {})
        ]
        # A workload's config may live in a sibling file (standalone/configmap.yaml).
        siblings = [
            d["data"]["config.toml"]
            for p in path.parent.glob("*.y*ml")
            if p != path
            for d in documents(p)
            if d.get("kind") == "ConfigMap" and "config.toml" in d.get("data", {})
        ]
        for doc in docs:
            checked += 1
            where = f"{path}: {name_of(doc)}"
            kind = doc.get("kind")
            if kind == "Kustomization":
                for r in doc.get("resources", []):
                    if not (path.parent / r).exists():
                        errors.append(f"{where}: resource {r} does not exist")
                continue
            if kind == "ServiceMonitor":
                v = jsonschema.Draft7Validator(monitor_schema)
                errors.extend(f"{where}: {e.json_path}: {e.message}" for e in v.iter_errors(doc))
                continue
            for version in KUBERNETES_VERSIONS:
                try:
                    kubernetes_validate.validate(doc, version, strict=True)
                except kubernetes_validate.ValidationError as e:
                    loc = ".".join(str(p) for p in e.path)
                    errors.append(f"{where} (Kubernetes {version}): {loc}: {e.message}")
                except (kubernetes_validate.SchemaNotFoundError,
                        kubernetes_validate.InvalidSchemaError) as e:
                    errors.append(f"{where} (Kubernetes {version}): {e}")
            if kind in ("Deployment", "StatefulSet", "DaemonSet"):
                check_workload(where, doc, configs + siblings, errors)
        for i, config in enumerate(configs):
            with tempfile.NamedTemporaryFile("w", suffix=".toml", delete=False) as f:
                f.write(config)
            try:
                env = dict(os.environ, **CHECK_ENV)
                r = subprocess.run(
                    [args.fairgate, "check", "--config", f.name],
                    capture_output=True, text=True, env=env, timeout=60,
                )
            finally:
                os.unlink(f.name)
            checked += 1
            if r.returncode != 0:
                errors.append(f"{path}: ConfigMap config.toml #{i}: fairgate check: {r.stderr.strip()}")
    for e in errors:
        print(e, file=sys.stderr)
    print(f"{checked} checked, {len(errors)} failed")
    sys.exit(1 if errors else 0)


if __name__ == "__main__":
    main()
