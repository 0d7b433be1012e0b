"""Time that one request cannot poison (issue #16): a node's honest requests every 10 s, one copy of
its request stamped 590 s ahead, and a fault after it. Before, time order was kept per node and the
bound was 600 s: the copy made every honest point of the node "older than already read" for ten
minutes, the node still showed Healthy and the fault went unseen. Now the bound is 20 s (the copy is
refused), and with ``--max-future 600`` the copy holds back only its own series, and only until the
node's next points, a minute and more behind it, are taken as a clock that jumped back. Either way the
node is told in one warning and a counter, and the fault is seen."""

from __future__ import annotations

import logging
import re
import time

import pytest
from google.protobuf.json_format import MessageToJson, ParseDict
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest

from otel_dra import policy
from otel_dra.classifier import Classifier
from otel_dra.frame import Frame, Schema
from otel_dra.receivers.config import ReceiverConfig
from otel_dra.receivers.factory import new_receiver as OtlpReceiver

S = 10**9
NODE = "node-0002"
GPUS = ("gpu-0", "gpu-1", "gpu-2", "gpu-3")


def kv(attrs: dict[str, str]) -> list[dict]:
    return [{"key": k, "value": {"stringValue": v}} for k, v in attrs.items()]


def request(t: int, ecc: dict[str, int]) -> ExportMetricsServiceRequest:
    """The node's request at ``t``: power and the uncorrected-ECC counter of each GPU."""

    def point(gpu: str, value: float, **extra: str) -> dict:
        attrs = kv({"hw.id": gpu, "hw.type": "gpu", **extra})
        return {"attributes": attrs, "timeUnixNano": str(t), "asDouble": value}

    power = {"name": "hw.power", "unit": "W", "gauge": {"dataPoints": [point(g, 300.0) for g in GPUS]}}
    errors = {
        "name": "hw.errors",
        "unit": "{error}",
        "sum": {
            "aggregationTemporality": 2,
            "isMonotonic": True,
            "dataPoints": [point(g, float(ecc.get(g, 0)), **{"error.type": "uncorrected"}) for g in GPUS],
        },
    }
    doc = {
        "resourceMetrics": [
            {
                "resource": {"attributes": kv({"k8s.node.name": NODE, "service.name": "gpu-agent"})},
                "scopeMetrics": [{"scope": {"name": "gpu-exporter"}, "metrics": [power, errors]}],
            }
        ]
    }
    return ParseDict(doc, ExportMetricsServiceRequest())


def health(classifier: Classifier) -> dict[str, tuple[str, tuple[str, ...]]]:
    return {v.hw_id: (v.health, v.reasons) for v in classifier.current() if v.node == NODE}


def test_the_future_bound_is_two_sampling_intervals_by_default() -> None:
    assert ReceiverConfig.max_future_s == 20.0  # the fleet samples every 10 s (FleetConfig.sample_interval_s)


@pytest.mark.parametrize("encoding", ["protobuf", "json"])
@pytest.mark.parametrize("max_future_s", [ReceiverConfig.max_future_s, 600.0])
def test_a_request_stamped_ahead_does_not_blind_the_node(
    max_future_s: float, encoding: str, caplog: pytest.LogCaptureFixture
) -> None:
    schema = Schema()
    got: list[Frame] = []
    receiver = OtlpReceiver(
        schema, got.extend, grpc_endpoint=None, http_endpoint="127.0.0.1:0", max_future_s=max_future_s
    )
    classifier = Classifier(policy.load(), schema, interval_s=10.0)

    def send(message: ExportMetricsServiceRequest, heard: int) -> tuple[int, int]:
        del got[:]
        if encoding == "json":
            response = receiver.export_json(MessageToJson(message).encode())
        else:
            response = receiver.export_protobuf(message.SerializeToString(), "http")
        if got:
            classifier.ingest_many(list(got), heard)
        classifier.evaluate(heard)
        return len(got), response.partial_success.rejected_data_points

    now = time.time_ns()
    start = now - 300 * S  # honest requests every 10 s, the last one 10 s before the receiver's now
    ecc: dict[str, int] = {}
    caplog.set_level(logging.WARNING)
    for k in range(30):
        t = start + k * 10 * S
        if k == 20:
            ecc["gpu-3"] = 1  # the fault, after the request stamped ahead
        frames, rejected = send(request(t, ecc), t)
        assert rejected == 0 and frames == 1, f"honest request {k} (at -{(now - t) // S} s): {rejected} rejected"
        if k == 5:
            forged = request(t + 590 * S, ecc)  # the node's own request, replayed 590 s ahead
            frames, rejected = send(forged, t)
            if max_future_s < 590:
                assert (frames, rejected) == (0, 8), "past the bound: refused whole"
            else:
                assert (frames, rejected) == (1, 0), "inside --max-future 600: taken (it holds its series only)"
        if k == 15:
            assert {h for h, _ in health(classifier).values()} == {"Healthy"}
    verdicts = health(classifier)
    assert verdicts["gpu-3"] == ("Unhealthy", ("memory_ecc",)), verdicts
    assert {verdicts[g][0] for g in GPUS[:3]} == {"Healthy"}
    skew = receiver.stats()["clock_skew"]
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING and NODE in r.getMessage()]
    if max_future_s < 590:
        assert skew == {"ahead": 8, "behind": 0}
        # 590 s ahead of its own node's clock, 340 s ahead of the receiver's (that request was 250 s old).
        told = [w for w in warnings if re.search(r"clock 3[34]\d s ahead", w) and "check that node's clock" in w]
        assert told, warnings
    else:
        # The next honest request is 580 s behind what the copy left in each series: a clock that jumped back.
        assert skew == {"ahead": 0, "behind": 8}
        assert any("clock jumped back" in w and "580 s behind" in w for w in warnings), warnings
    assert len(warnings) == 1, warnings  # one line for the event, not one per point or per request
