"""The agent pushes OTLP to a real collector (rotel), over gRPC and HTTP/protobuf."""

import pytest

from otel_dra import conventions as cv
from tests.conftest import wait_for

pytestmark = pytest.mark.e2e
DEVICES = {f"gpu-{i}" for i in range(8)}
DATA_TYPES = {cv.COUNTER: "Sum", cv.UPDOWNCOUNTER: "Sum", cv.GAUGE: "Gauge"}


def device_of(attrs: dict) -> str:
    return attrs.get("hw.parent") or attrs["hw.id"]


@pytest.mark.parametrize("protocol", ["grpc", "http/protobuf"])
@pytest.mark.parametrize("configured_by", ["env", "flag"])
def test_otlp_push_arrives_with_names_units_and_attributes(start_agent, start_collector, protocol, configured_by):
    collector = start_collector()
    endpoint = collector.grpc_endpoint if protocol == "grpc" else collector.http_endpoint
    env = {"OTEL_RESOURCE_ATTRIBUTES": "deployment.environment.name=test,k8s.cluster.name=c1"}
    if configured_by == "env":
        env |= {
            "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://{endpoint}",
            "OTEL_EXPORTER_OTLP_PROTOCOL": protocol,
            "OTEL_METRIC_EXPORT_INTERVAL": "1000",
        }
        args = ["--interval", "1"]
    else:
        args = ["--interval", "1", "--otlp-endpoint", endpoint, "--otlp-protocol", protocol]
    start_agent(*args, "--node-name", "node-7", "--fault", "gpu-5:memory_ecc@0", env=env)

    def all_metrics_arrived() -> bool:
        names = {p.metric for p in collector.points()}
        return names >= cv.PER_DEVICE_METRICS | set(cv.PUSH_METRICS)

    wait_for(all_metrics_arrived, 30, "every metric at the collector (the push's own too)")
    points = collector.points()
    for p in points:
        spec = {**cv.METRICS, **cv.PUSH_METRICS}[p.metric]
        assert p.unit == spec.unit, p.metric
        assert p.data_type == DATA_TYPES[spec.instrument], p.metric
        if p.data_type == "Sum":
            assert p.monotonic == (spec.instrument == cv.COUNTER), p.metric
        assert p.resource["k8s.node.name"] == "node-7"
        assert p.resource["service.name"] == "otel-dra"
        assert p.resource["deployment.environment.name"] == "test"
    for metric in cv.PER_DEVICE_METRICS:
        assert {device_of(p.attrs) for p in points if p.metric == metric} == DEVICES, metric
    temps = [p for p in points if p.metric == "hw.temperature"]
    assert all(
        p.attrs["hw.type"] == "temperature" and p.attrs["hw.id"].startswith(p.attrs["hw.parent"] + "/") for p in temps
    )
    errors = [p for p in points if p.metric == "hw.errors"]
    assert {p.attrs["dra.device.name"] for p in errors} == DEVICES
    assert {p.attrs["dra.pool.name"] for p in errors} == {"node-7"}
    uncorrected = {p.attrs["hw.id"]: p.value for p in errors if p.attrs["error.type"] == "uncorrected"}
    assert uncorrected["gpu-5"] >= 1
    assert all(v == 0 for dev, v in uncorrected.items() if dev != "gpu-5")


def test_a_password_in_the_otlp_endpoint_never_reaches_the_log(start_agent, tmp_path):
    """Issue #16: the agent logs where it pushes, and the exporter logs each failed attempt with its
    URL; neither line may carry the endpoint's userinfo. Over gRPC, which has no userinfo, such an
    endpoint is refused in one line that does not repeat it either."""
    import subprocess
    import sys
    import time

    from tests.conftest import REPO, free_port

    dead = f"http://pusher:hunter2@127.0.0.1:{free_port()}"
    agent = start_agent("--interval", "1", "--otlp-endpoint", dead + "/v1/metrics", "--otlp-protocol", "http/protobuf")
    wait_for(lambda: "pushing OTLP" in agent.logs(), 20, "the push to be logged")
    time.sleep(3)  # a failed attempt or two, retried and logged by the exporter
    logs = agent.logs()
    assert "127.0.0.1" in logs and "hunter2" not in logs and "pusher" not in logs
    argv = [sys.executable, "-m", "otel_dra", "run", "--source", "simulated", "--otlp-endpoint", dead]
    argv += ["--prometheus-port", "0"]
    refused = subprocess.run(argv, capture_output=True, text=True, cwd=REPO, timeout=60)
    assert refused.returncode == 2 and "gRPC cannot use" in refused.stderr
    assert "hunter2" not in refused.stderr and "pusher" not in refused.stderr
