"""The agent as a user runs it, scraped by a real Prometheus server."""

import os
import re
import subprocess
import sys
import time

import pytest

from otel_dra import conventions as cv
from tests.conftest import free_port, http_get, wait_for

pytestmark = pytest.mark.e2e
DEVICES = [f"gpu-{i}" for i in range(8)]


def prom_name(spec: cv.MetricSpec) -> str:
    """The Prometheus name of a metric, as the OpenTelemetry exporter maps it."""
    from opentelemetry.exporter.prometheus._mapping import map_unit, sanitize_full_name

    name = sanitize_full_name(spec.name)
    unit = map_unit(spec.unit)
    if unit and not name.endswith(unit):
        name += "_" + unit
    return name + ("_total" if spec.instrument == cv.COUNTER else "")


def series_devices(exposition: str, name: str) -> set[str]:
    """Devices (hw_id, or hw_parent for sensors) that have at least one series of ``name``."""
    found = set()
    for line in exposition.splitlines():
        if line.startswith(name + "{"):
            labels = dict(re.findall(r'(\w+)="([^"]*)"', line))
            found.add(labels.get("hw_parent") or labels["hw_id"])
    return found


def test_prometheus_scrapes_every_device_and_sees_the_fault_on_one(start_agent, start_prometheus):
    agent = start_agent("--interval", "1", "--devices", "8", "--fault", "gpu-3:memory_ecc@4", "--node-name", "n1")
    prom = start_prometheus([f"127.0.0.1:{agent.port}"])

    def per_device(promql: str, label: str = "hw_id") -> set[str]:
        return {r["metric"][label] for r in prom.query(promql)}

    wait_for(lambda: per_device("hw_temperature_celsius", "hw_parent") == set(DEVICES), 30, "temperatures")
    for error_type in ("corrected", "uncorrected", "retired_page", "link", "reset", "power", "out_of_memory"):
        assert per_device(f'hw_errors_total{{error_type="{error_type}"}}') == set(DEVICES), error_type
    for state in ("ok", "degraded", "failed", "predicted_failure"):
        assert per_device(f'hw_status{{hw_state="{state}"}}') == set(DEVICES), state
    up = prom.query('up{job="otel-dra"}')
    assert up and up[0]["value"][1] == "1"
    # The injected uncorrected ECC error shows on gpu-3, and only there: as evidence, and as its verdict.
    wait_for(lambda: per_device('hw_errors_total{error_type="uncorrected"} > 0') == {"gpu-3"}, 30, "the fault")
    wait_for(lambda: per_device('hw_status{hw_state="failed"} == 1') == {"gpu-3"}, 30, "the verdict")
    assert per_device('hw_status{hw_state="ok"} == 1') == set(DEVICES) - {"gpu-3"}
    health = prom.query('dra_device_health{dra_device_health_state="Unhealthy"}')
    assert [(r["metric"]["hw_id"], r["metric"]["dra_device_health_reasons"]) for r in health] == [
        ("gpu-3", "memory_ecc")
    ]
    assert {r["metric"]["k8s_node_name"] for r in prom.query("hw_power_watts")} == {"n1"}


def test_exposition_passes_promtool(start_agent):
    from tests.conftest import ensure_binary

    promtool = ensure_binary("promtool", "prometheus")
    agent = start_agent("--interval", "1", "--fault", "gpu-1:driver_errors@0")
    wait_for(lambda: 'error_type="driver"' in agent.metrics(), 10, "the driver error series")
    result = subprocess.run([promtool, "check", "metrics"], input=agent.metrics().encode(), capture_output=True)
    assert result.returncode == 0 and not result.stdout.strip(), result.stdout.decode() + result.stderr.decode()


def test_defaults_serve_every_contract_signal_within_two_intervals(start_agent):
    """`otel-dra run --source simulated` with its other defaults (8 devices, 5 s interval): all signals, all
    devices, in < 2 intervals. (`--source auto` never runs the simulator: it is asked for.)"""
    port = free_port()
    agent = start_agent(env={"OTEL_EXPORTER_PROMETHEUS_PORT": str(port)}, wait=False)
    # The agent has started once it says so (Python's imports before that are not the agent's doing).
    wait_for(lambda: "starting: node=" in agent.logs(), 30, "the agent to start", every=0.05)
    assert "source=simulated" in agent.logs()
    t0 = time.monotonic()

    def complete() -> bool:
        status, body = http_get(agent.url + "/metrics", 1)
        text = body.decode()
        return status == 200 and all(
            series_devices(text, prom_name(cv.METRICS[m])) == set(DEVICES) for m in cv.PER_DEVICE_METRICS
        )

    wait_for(complete, 10, "every contract signal for 8 devices", every=0.1)
    assert time.monotonic() - t0 < 2 * 5.0


def test_sigterm_flushes_and_exits_quickly_even_with_an_unreachable_collector(start_agent):
    dead = f"http://127.0.0.1:{free_port()}"
    agent = start_agent("--interval", "1", "--otlp-endpoint", dead)
    time.sleep(2.5)  # a push or two has failed and is retrying
    code, took = agent.stop()
    assert code == 0, agent.logs()
    assert took < 5.0
    logs = agent.logs()
    assert "Traceback" not in logs
    assert "stopped after" in logs


def test_healthz_answers_and_unknown_paths_say_where_to_go(start_agent):
    agent = start_agent("--interval", "1")
    assert http_get(agent.url + "/healthz") == (200, b"ok\n")
    status, body = http_get(agent.url + "/nope")
    assert status == 404 and b"/metrics" in body


def test_v1_devices_and_status_show_verdicts_unhealthy_first(start_agent):
    import json as _json

    agent = start_agent("--interval", "1", "--fault", "gpu-6:memory_ecc@1", "--node-name", "n9")
    status = wait_for(
        lambda: [
            d for d in _json.loads(http_get(agent.url + "/v1/devices")[1])["devices"] if d["health"] == "Unhealthy"
        ],
        20,
        "the ECC verdict",
    )
    devices = _json.loads(http_get(agent.url + "/v1/devices")[1])["devices"]
    assert len(devices) == 8 and devices[0]["hw.id"] == "gpu-6" == status[0]["hw.id"]
    first = devices[0]
    assert (first["hw.state"], first["reasons"], first["remediation"]) == ("failed", ["memory_ecc"], "reset_device")
    assert first["since"].endswith("Z") and first["k8s.node.name"] == "n9" and first["dra.device.name"] == "gpu-6"
    assert all(d["health"] == "Healthy" and d["hw.state"] == "ok" for d in devices[1:])
    shown = subprocess.run(
        [sys.executable, "-m", "otel_dra", "status", agent.url],
        capture_output=True,
        text=True,
        timeout=30,
        env={**os.environ, "COLUMNS": "200"},
    )
    assert shown.returncode == 0, shown.stderr
    rows = [line for line in shown.stdout.splitlines() if "gpu-" in line]
    assert "gpu-6" in rows[0] and "Unhealthy" in rows[0] and "reset_device" in rows[0] and "memory_ecc" in rows[0]
    assert len(rows) >= 8


def test_health_attribute_all_stamps_every_series(start_agent):
    agent = start_agent("--interval", "1", "--health-attribute", "all", "--fault", "gpu-2:vendor_status@1")

    def stamped() -> bool:
        text = agent.metrics()
        power = [line for line in text.splitlines() if line.startswith("hw_power_watts{")]
        temps = [line for line in text.splitlines() if line.startswith("hw_temperature_celsius{")]
        return (
            len(power) == 8
            and all('dra_device_health_state="' in line for line in power + temps)
            and any('hw_id="gpu-2"' in line and 'dra_device_health_state="Unhealthy"' in line for line in power)
        )

    wait_for(stamped, 20, "the health attribute on every hw.* series")
