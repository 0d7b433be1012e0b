"""bench/prometheus-rules.yaml: the default policy as Prometheus rules, the peer bench/bench_prometheus.py
measures otel-dra against. ``promtool check rules`` passes, and a ``promtool test rules`` case shows an
uncorrected-ECC increase firing its alert (and, there being no hold in PromQL, clearing a window later)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import yaml

from tests.conftest import REPO, ensure_binary

RULES = REPO / "bench" / "prometheus-rules.yaml"


def test_promtool_checks_the_bench_rules():
    promtool = ensure_binary("promtool", "prometheus")
    result = subprocess.run([promtool, "check", "rules", str(RULES)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_an_uncorrected_ecc_increase_fires_its_alert(tmp_path: Path):
    promtool = ensure_binary("promtool", "prometheus")
    groups = [g["name"] for g in yaml.safe_load(RULES.read_text())["groups"]]
    device = 'k8s_node_name="node-00001",hw_id="gpu-{}"'
    tests = {
        "rule_files": [str(RULES)],
        "evaluation_interval": "10s",
        # Recordings first: the alerts read what the signal and window groups record at the same time.
        "group_eval_order": groups,
        "tests": [
            {
                "interval": "10s",
                "input_series": [
                    # gpu-0's uncorrected ECC counter goes from 0 to 1 at 610 s; gpu-1 stays at 0.
                    {
                        "series": f'hw_errors_total{{{device.format(0)},error_type="uncorrected"}}',
                        "values": "0x60 1x60",
                    },
                    {"series": f'hw_errors_total{{{device.format(1)},error_type="uncorrected"}}', "values": "0x121"},
                    {
                        "series": f'hw_temperature_celsius{{{device.format(0)},hw_sensor_location="gpu"}}',
                        "values": "60x121",
                    },
                    {
                        "series": f'hw_temperature_celsius{{{device.format(1)},hw_sensor_location="gpu"}}',
                        "values": "60x121",
                    },
                ],
                "alert_rule_test": [
                    {"eval_time": "9m", "alertname": "GpuMemoryEccUncorrected", "exp_alerts": []},
                    {
                        "eval_time": "11m",
                        "alertname": "GpuMemoryEccUncorrected",
                        "exp_alerts": [
                            {
                                "exp_labels": {
                                    "k8s_node_name": "node-00001",
                                    "hw_id": "gpu-0",
                                    "reason": "memory_ecc",
                                    "hw_state": "failed",
                                    "severity": "critical",
                                },
                                "exp_annotations": {
                                    "summary": "GPU gpu-0 on node-00001: uncorrected ECC errors, "
                                    "or retired pages at the limit",
                                },
                            }
                        ],
                    },
                    # No hold in PromQL: once the 5-minute window has passed the error, the alert is gone
                    # (otel-dra holds memory_ecc for an hour, across restarts).
                    {"eval_time": "17m", "alertname": "GpuMemoryEccUncorrected", "exp_alerts": []},
                ],
                "promql_expr_test": [
                    {
                        "expr": "otel_dra_bench:samples:count5m",
                        "eval_time": "11m",
                        "exp_samples": [
                            {"labels": f"otel_dra_bench:samples:count5m{{{device.format(0)}}}", "value": 31},
                            {"labels": f"otel_dra_bench:samples:count5m{{{device.format(1)}}}", "value": 31},
                        ],
                    },
                ],
            }
        ],
    }
    path = tmp_path / "ecc_test.yaml"
    path.write_text(yaml.safe_dump(tests, sort_keys=False))
    result = subprocess.run([promtool, "test", "rules", str(path)], capture_output=True, text=True, cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
