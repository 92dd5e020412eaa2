#!/usr/bin/env python3
"""Parses a Prometheus text scrape (a file, or stdin) with the official Python client's
exposition-format parser and checks every family: HELP and TYPE present, each once.

    python3 tests/prometheus/check_scrape.py scrape.txt

Prints one line per family (`name type samples`), then `N families, M failed`. Exit 0 when all
pass, 1 on a failure or a parse error, 2 when prometheus_client is not installed.
"""

import collections
import sys

try:
    from prometheus_client.parser import text_string_to_metric_families
except ImportError as e:
    print(f"missing parser: {e} (pip install prometheus-client)", file=sys.stderr)
    sys.exit(2)


def main():
    text = open(sys.argv[1]).read() if len(sys.argv) > 1 else sys.stdin.read()
    errors = []
    # The text itself: each family's HELP and TYPE line once (a repeated family would be two
    # families to a scraper).
    seen = collections.Counter()
    for line in text.splitlines():
        if line.startswith("# HELP ") or line.startswith("# TYPE "):
            seen[tuple(line.split(" ", 3)[1:3])] += 1
    for (kind, name), n in sorted(seen.items()):
        if n > 1:
            errors.append(f"{name}: {n} '# {kind}' lines")
    try:
        families = list(text_string_to_metric_families(text))
    except Exception as e:  # the parser raises ValueError (and others) on malformed text
        print(f"parse error: {e}", file=sys.stderr)
        sys.exit(1)
    for f in families:
        print(f"{f.name} {f.type} {len(f.samples)}")
        if not f.documentation:
            errors.append(f"{f.name}: no # HELP")
        if f.type == "unknown":
            errors.append(f"{f.name}: no # TYPE")
    for e in errors:
        print(e, file=sys.stderr)
    print(f"{len(families)} families, {len(errors)} failed")
    sys.exit(1 if errors or not families else 0)


if __name__ == "__main__":
    main()
