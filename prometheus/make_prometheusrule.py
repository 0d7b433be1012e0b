"""Write prometheus/prometheusrule.yaml: the groups of prometheus/rules.yaml, comments and all, in a
Prometheus Operator ``PrometheusRule``. Run after editing rules.yaml (a test checks it is up to date):

    python prometheus/make_prometheusrule.py
"""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
RULES = HERE / "rules.yaml"
OUTPUT = HERE / "prometheusrule.yaml"

HEADER = """\
# Generated from prometheus/rules.yaml by prometheus/make_prometheusrule.py: edit rules.yaml and
# run it again. The same groups as a Prometheus Operator PrometheusRule: kubectl apply -f this file
# (the operator's CRDs must be installed). An operator selects rules by label: add the one your
# Prometheus's ruleSelector names (kube-prometheus-stack: `release: <its release name>`).
apiVersion: monitoring.coreos.com/v1
kind: PrometheusRule
metadata:
  name: otel-dra
  namespace: otel-dra
  labels:
    app.kubernetes.io/name: otel-dra
    app.kubernetes.io/component: alerting-rules
spec:
"""


def render(rules_text: str) -> str:
    """The PrometheusRule for a rules file: its lines from ``groups:`` on, indented under ``spec``."""
    lines = rules_text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("groups:"))
    body = "\n".join(("  " + line) if line.strip() else "" for line in lines[start:])
    return HEADER + body + "\n"


def main() -> int:
    OUTPUT.write_text(render(RULES.read_text()))
    print(f"wrote {OUTPUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
