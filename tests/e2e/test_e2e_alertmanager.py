"""Alerts that reach someone: a faulted GPU's OtelDraDeviceUnhealthy goes from the agent through a
real Prometheus (prometheus/rules.yaml) and a real Alertmanager (prometheus/alertmanager.yml) to
a webhook receiver in this test, and so does its resolution when the device recovers."""

from __future__ import annotations

import calendar
import json
import re
import subprocess
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.conftest import REPO, PrometheusServer, ensure_binary, free_port, http_get, wait_for

RULES = REPO / "prometheus" / "rules.yaml"
ALERTMANAGER_CONFIG = REPO / "prometheus" / "alertmanager.yml"
NODE = "node-am"


# -- the example configuration, without any server ----------------------------------------
def amtool() -> str:
    """amtool (Debian's prometheus-alertmanager, installed when missing), or a skip saying why not."""
    try:
        return ensure_binary("amtool", "prometheus-alertmanager")
    except pytest.fail.Exception as err:
        pytest.skip(f"cannot check prometheus/alertmanager.yml without amtool: {err}")


def test_example_alertmanager_config_passes_amtool_and_pages_for_critical_alerts():
    binary = amtool()
    check = subprocess.run([binary, "check-config", str(ALERTMANAGER_CONFIG)], capture_output=True, text=True)
    assert check.returncode == 0 and "SUCCESS" in check.stdout, check.stdout + check.stderr

    def receiver(*labels: str) -> str:
        argv = [binary, "config", "routes", "test", f"--config.file={ALERTMANAGER_CONFIG}", *labels]
        result = subprocess.run(argv, capture_output=True, text=True)
        assert result.returncode == 0, result.stdout + result.stderr
        return result.stdout.strip()

    assert receiver("alertname=OtelDraDeviceUnhealthy", "severity=critical", f"k8s_node_name={NODE}") == "otel-dra-page"
    assert receiver("alertname=OtelDraAgentDown", "severity=critical") == "otel-dra-page"
    assert receiver("alertname=OtelDraDeviceDegraded", "severity=warning") == "otel-dra-ticket"
    config = yaml.safe_load(ALERTMANAGER_CONFIG.read_text())
    assert config["route"]["group_by"] == ["k8s_node_name", "alertname"]
    hooks = [hook for r in config["receivers"] for hook in r.get("webhook_configs", [])]
    assert hooks and all(hook["send_resolved"] for hook in hooks)


# -- the real thing --------------------------------------------------------------------------
class Webhook:
    """Alertmanager's webhook receiver: records every POSTed notification as (path, JSON)."""

    def __init__(self) -> None:
        self.received: list[tuple[str, dict[str, Any]]] = []
        self.lock = threading.Lock()
        webhook = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                with webhook.lock:
                    webhook.received.append((self.path, json.loads(body)))
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def alerts(self, status: str, alertname: str = "OtelDraDeviceUnhealthy") -> list[tuple[str, dict, dict]]:
        """(path, notification, alert) for each alert of ``alertname`` in a ``status`` notification."""
        with self.lock:
            return [
                (path, note, alert)
                for path, note in self.received
                if note.get("status") == status
                for alert in note.get("alerts", [])
                if alert["labels"].get("alertname") == alertname and alert["status"] == status
            ]


class ScrapeTarget:
    """One address for Prometheus to scrape that forwards to the agent of the moment, so an agent can
    be replaced by another without a failed scrape: the target stays up, and an alert resolves
    because the verdict changed, not because the series went stale with their target."""

    def __init__(self, upstream: str) -> None:
        self.upstream = upstream
        target = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                accept = {"Accept": self.headers["Accept"]}
                request = urllib.request.Request(target.upstream + self.path, headers=accept)
                try:
                    with urllib.request.urlopen(request, timeout=5) as resp:
                        status, ctype, body = resp.status, resp.headers["Content-Type"], resp.read()
                except OSError:  # the agent of the moment is gone: a failed scrape, as without this
                    status, ctype, body = 502, "text/plain", b"agent unreachable\n"
                self.send_response(status)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.address = f"127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


@pytest.fixture
def servers() -> Iterator[list]:
    """Things to stop when the test ends: HTTP servers and processes."""
    running: list = []
    yield running
    for thing in reversed(running):
        if isinstance(thing, subprocess.Popen):
            thing.terminate()
            try:
                thing.wait(10)
            except subprocess.TimeoutExpired:
                thing.kill()
        else:
            thing.shutdown()
            thing.server_close()


def fast_rules(work: Path) -> Path:
    """rules.yaml with OtelDraDeviceUnhealthy's `for: 5m` made 2s, and nothing else changed: Prometheus
    cannot be told to evaluate a shipped rule faster, and a test cannot wait five minutes."""
    text = RULES.read_text()
    start = text.index("- alert: OtelDraDeviceUnhealthy")
    match = re.compile(r"^(\s+)for: 5m$", re.MULTILINE).search(text, start)
    assert match and text.find("- alert:", start + 1) > match.start(), "OtelDraDeviceUnhealthy's for: 5m moved"
    path = work / "rules.yaml"
    path.write_text(text[: match.start()] + f"{match[1]}for: 2s" + text[match.end() :])
    return path


def fast_alertmanager_config(work: Path, webhook: Webhook) -> Path:
    """prometheus/alertmanager.yml with its webhook URLs pointed at ``webhook`` (same paths) and its
    timings in seconds: the routes, grouping, inhibitions and receivers are the shipped ones."""
    config = yaml.safe_load(ALERTMANAGER_CONFIG.read_text())
    config["global"]["resolve_timeout"] = "10s"

    def shorten(route: dict) -> None:
        for key, value in (("group_wait", "1s"), ("group_interval", "1s"), ("repeat_interval", "1m")):
            if key in route:
                route[key] = value
        for child in route.get("routes", []):
            shorten(child)

    shorten(config["route"])
    for receiver in config["receivers"]:
        for hook in receiver.get("webhook_configs", []):
            hook["url"] = webhook.url + urllib.parse.urlsplit(hook["url"]).path
    path = work / "alertmanager.yml"
    path.write_text(yaml.safe_dump(config))
    return path


@pytest.mark.e2e
def test_a_device_fault_pages_the_webhook_and_its_recovery_resolves_it(start_agent, servers, tmp_path):
    alertmanager = ensure_binary("prometheus-alertmanager", "prometheus-alertmanager")
    prometheus = ensure_binary("prometheus", "prometheus")
    agent_args = ("--interval", "1", "--devices", "4", "--node-name", NODE)
    faulted = start_agent(*agent_args, "--fault", "gpu-3:memory_ecc@2")
    target = ScrapeTarget(faulted.url)
    webhook = Webhook()
    servers += [target.server, webhook.server]

    am_port = free_port()
    argv = [alertmanager, f"--config.file={fast_alertmanager_config(tmp_path, webhook)}"]
    argv += [f"--storage.path={tmp_path / 'am-data'}", f"--web.listen-address=127.0.0.1:{am_port}"]
    argv += ["--cluster.listen-address="]  # no gossip: one Alertmanager, no port of its own
    with (tmp_path / "alertmanager.log").open("wb") as log:
        servers.append(subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT))
    wait_for(lambda: http_get(f"http://127.0.0.1:{am_port}/-/ready", 1)[0] == 200, 30, "Alertmanager to be ready")

    prom_port = free_port()
    config = tmp_path / "prometheus.yml"
    config.write_text(
        "global: {scrape_interval: 1s, scrape_timeout: 1s, evaluation_interval: 1s}\n"
        f"rule_files: [{json.dumps(str(fast_rules(tmp_path)))}]\n"
        f"alerting: {{alertmanagers: [{{static_configs: [{{targets: ['127.0.0.1:{am_port}']}}]}}]}}\n"
        "scrape_configs:\n"
        f"  - job_name: otel-dra\n    static_configs: [{{targets: ['{target.address}']}}]\n"
    )
    argv = [prometheus, f"--config.file={config}", f"--storage.tsdb.path={tmp_path / 'prom-data'}"]
    argv += [f"--web.listen-address=127.0.0.1:{prom_port}", "--rules.alert.resend-delay=1s"]
    with (tmp_path / "prometheus.log").open("wb") as log:
        servers.append(subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT))
    prom = PrometheusServer(f"http://127.0.0.1:{prom_port}", servers[-1])
    wait_for(lambda: http_get(prom.url + "/-/ready", 1)[0] == 200, 60, "Prometheus to be ready")

    # The fault: gpu-3's uncorrected ECC error makes it Unhealthy; the critical route pages for it.
    firing = wait_for(lambda: webhook.alerts("firing"), 45, "OtelDraDeviceUnhealthy at the webhook")
    assert isinstance(firing, list)
    path, note, alert = firing[0]
    assert path == "/otel-dra/page", path  # severity critical: the paging receiver, not the ticket one
    assert note["groupLabels"] == {"alertname": "OtelDraDeviceUnhealthy", "k8s_node_name": NODE}
    assert [a["labels"]["hw_id"] for _, _, a in firing] == ["gpu-3"] * len(firing)  # only the faulted GPU
    labels, annotations = alert["labels"], alert["annotations"]
    assert labels["severity"] == "critical"
    assert (labels["k8s_node_name"], labels["hw_id"], labels["dra_device_name"]) == (NODE, "gpu-3", "gpu-3")
    assert labels["dra_device_health_reasons"] == "memory_ecc"
    assert labels["dra_device_health_remediation"] == "reset_device"
    assert annotations["summary"] == f"GPU gpu-3 on {NODE} is Unhealthy (memory_ecc)"
    assert annotations["runbook"].startswith("Remediation reset_device: drain the device, reset it (nvidia-smi")
    assert f"Device {NODE}/gpu-3" in annotations["description"]
    assert not webhook.alerts("resolved")

    # The device recovers (a reset GPU: an agent without the fault, its verdict Healthy) and takes over
    # the scrape target; the alert resolves and the webhook hears so. The new agent starts without the
    # first one's memory (--no-state): with it, the uncorrected ECC error would rightly stay held for an
    # hour (issue #16), as the operator who reset the GPU would clear it.
    healthy = start_agent(*agent_args, "--no-state")

    def gpu3_healthy() -> bool:
        return any(
            line.startswith("dra_device_health{")
            and 'hw_id="gpu-3"' in line
            and 'dra_device_health_state="Healthy"' in line
            and float(line.rsplit(" ", 1)[1]) == 1
            for line in healthy.metrics().splitlines()
        )

    wait_for(gpu3_healthy, 30, "the restarted agent's Healthy gpu-3")
    switched = time.time()
    target.upstream = healthy.url
    faulted.stop()
    resolved = wait_for(lambda: webhook.alerts("resolved"), 30, "the resolved notification at the webhook")
    assert isinstance(resolved, list)
    path, note, alert = resolved[0]
    assert path == "/otel-dra/page"
    assert {k: alert["labels"][k] for k in ("k8s_node_name", "hw_id", "dra_device_health_reasons")} == {
        "k8s_node_name": NODE,
        "hw_id": "gpu-3",
        "dra_device_health_reasons": "memory_ecc",
    }
    ends = alert["endsAt"]  # RFC 3339, e.g. 2025-01-01T12:00:00.123Z
    assert calendar.timegm(time.strptime(ends[:19], "%Y-%m-%dT%H:%M:%S")) >= int(switched) - 1, ends
    # The target never went down: the alert resolved because the verdict did, not because the series went stale.
    assert prom.query("min_over_time(up[5m])")[0]["value"][1] == "1"
    assert not prom.query('ALERTS{alertname="OtelDraDeviceUnhealthy"}')
