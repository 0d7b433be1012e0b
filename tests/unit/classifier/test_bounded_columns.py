"""Bounded columns (issue #16): the attributes that make a series are a closed set per metric
(``conventions.SERIES_ATTRIBUTES``, as semconv/registry.yaml lists them), so points carrying thousands of
invented attributes are taken as the series they are, and make no column: the decoder's schema, the
frames and the classifier's arrays stay the size of the honest series. Before, each distinct extra
attribute became a column (up to --max-series, 1,024) and ``FeatureExtractor.prev`` grew to rows x
2,048 columns x 8 bytes: two requests of 20k devices took the fleet to 3.4 GB."""

from __future__ import annotations

import tracemalloc
from pathlib import Path

import numpy as np
import yaml
from google.protobuf.json_format import ParseDict
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest

from otel_dra import conventions as cv
from otel_dra import policy
from otel_dra.classifier import Classifier
from otel_dra.decode import OtlpProtoDecoder
from otel_dra.decode.attributes import DESCRIPTIVE
from otel_dra.frame import Schema

S = 10**9
T0 = 1_795_000_000 * S
NODES, GPUS = 20, 100  # 2,000 devices
ATTACK = 5_000  # distinct invented attributes over the attack's requests
#: What decoding and ingesting the attack may allocate at its peak (tracemalloc). Measured: 8 MiB; before,
#: 48 MiB for these 2,000 devices (1,024 columns, 4,000 points refused past --max-series; it grows with
#: devices x --max-series: 3.4 GB for the issue's 20k devices).
PEAK_BYTES = 24 << 20
REGISTRY = Path(__file__).resolve().parents[3] / "semconv" / "registry.yaml"


def kv(attrs: dict[str, str]) -> list[dict]:
    return [{"key": k, "value": {"stringValue": v}} for k, v in attrs.items()]


def request(t: int, extra: int | None, ecc: dict[tuple[int, int], int]) -> bytes:
    """Every node's power and uncorrected-ECC counter at ``t``; ``extra``: each point carries an invented
    attribute, a different one per point (``extra`` the first number)."""
    resources = []
    for n in range(NODES):
        power, errors = [], []
        for g in range(GPUS):
            attrs = {"hw.id": f"gpu-{g}", "hw.type": "gpu"}
            if extra is not None:
                attrs[f"attack.{(extra + n * GPUS + g) % ATTACK}"] = "x"
            power.append({"attributes": kv(attrs), "timeUnixNano": str(t), "asDouble": 300.0})
            e = {**attrs, cv.ERROR_TYPE_ATTR: "uncorrected"}
            errors.append({"attributes": kv(e), "timeUnixNano": str(t), "asDouble": float(ecc.get((n, g), 0))})
        metrics = [
            {"name": "hw.power", "unit": "W", "gauge": {"dataPoints": power}},
            {
                "name": "hw.errors",
                "unit": "{error}",
                "sum": {"aggregationTemporality": 2, "isMonotonic": True, "dataPoints": errors},
            },
        ]
        resources.append(
            {"resource": {"attributes": kv({"k8s.node.name": f"node-{n}"})}, "scopeMetrics": [{"metrics": metrics}]}
        )
    return ParseDict({"resourceMetrics": resources}, ExportMetricsServiceRequest()).SerializeToString()


def test_the_5k_column_attack_stays_bounded_and_devices_keep_their_verdicts() -> None:
    schema = Schema()
    decoder = OtlpProtoDecoder(schema)
    classifier = Classifier(policy.load(), schema, interval_s=10.0)

    def take(body: bytes, t: int) -> None:
        result = decoder.decode(body)
        assert result.rejected == 0 and result.accepted == 2 * NODES * GPUS  # ignored attributes reject nothing
        classifier.ingest_many(result.frames, t)
        classifier.evaluate(t)

    take(request(T0, None, {}), T0)
    attack = [request(T0 + k * 10 * S, k * ATTACK // 2, {}) for k in (1, 2)]  # 5,000 attributes in all
    tracemalloc.start()
    try:
        for k, body in enumerate(attack, 1):
            take(body, T0 + k * 10 * S)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert len(schema) == 2, f"{len(schema)} columns: invented attributes made series kinds"
    assert peak < PEAK_BYTES, f"{peak / 2**20:.1f} MiB at the peak"
    prev = classifier.extractor.prev
    assert prev.shape[1] <= 8 and prev.nbytes <= classifier.registry.capacity * 8 * 8
    # The devices keep their verdicts: a fault after the attack is seen, the rest stay Healthy.
    for k in range(3, 6):
        take(request(T0 + k * 10 * S, 7 * k, {(3, 7): 1} if k >= 4 else {}), T0 + k * 10 * S)
    verdicts = {(v.node, v.hw_id): v for v in classifier.current()}
    assert len(verdicts) == NODES * GPUS
    assert verdicts[("node-3", "gpu-7")].health == "Unhealthy" and "memory_ecc" in verdicts[("node-3", "gpu-7")].reasons
    assert sum(v.health == "Healthy" for v in verdicts.values()) == NODES * GPUS - 1
    assert not np.isnan(prev[classifier.registry.row("node-3", "gpu-7"), 0])  # its counter's baseline is kept


def test_series_attributes_are_the_registrys() -> None:
    """``conventions.SERIES_ATTRIBUTES`` is the one list the decoders read; the registry says the same per
    metric (its attributes, less the device's identity, its descriptive ones and the agent's verdict)."""
    groups = yaml.safe_load(REGISTRY.read_text())["groups"]
    not_series = {cv.HW_ID, cv.HW_TYPE, cv.HW_PARENT, *DESCRIPTIVE, cv.DRA_DEVICE_HEALTH_STATE}
    for g in groups:
        if g["type"] == "metric" and g["metric_name"] in cv.SAMPLED_METRICS:
            registered = {a["ref"] for a in g["attributes"]} - not_series
            assert cv.SERIES_ATTRIBUTES.get(g["metric_name"], frozenset()) == registered, g["metric_name"]
    assert set(cv.SERIES_ATTRIBUTES) <= cv.SAMPLED_METRICS


def test_ignored_attributes_are_counted_by_both_decoders_and_the_receiver(caplog) -> None:
    """The issue's "ignored (counted)": every point taken with an invented attribute is counted once, by the
    protobuf decoder's plain path and its templates alike, by the JSON decoder, and in the receiver's
    ``otel_dra.receiver.attributes.ignored`` (told once in the log); honest points count nothing."""
    from google.protobuf.json_format import MessageToJson

    from otel_dra.decode import OtlpJsonDecoder
    from otel_dra.receivers.factory import new_receiver as OtlpReceiver

    honest, attack = request(T0, None, {}), request(T0 + 10 * S, 0, {})
    attack_again = request(T0 + 20 * S, 0, {})  # the same structure: read from the template
    points = 2 * NODES * GPUS
    for fast in (True, False):
        decoder = OtlpProtoDecoder(Schema(), fast=fast)
        assert [decoder.decode(b).stray for b in (honest, attack, attack_again)] == [0, points, points]
        assert (decoder.sections_fast > 0) == fast
    json_decoder = OtlpJsonDecoder(Schema())
    as_json = [MessageToJson(ExportMetricsServiceRequest.FromString(b)) for b in (honest, attack, attack_again)]
    assert [json_decoder.decode(line).stray for line in as_json] == [0, points, points]
    receiver = OtlpReceiver(Schema(), lambda frames: None, grpc_endpoint=None, http_endpoint="127.0.0.1:0")
    caplog.set_level("INFO")
    receiver.export_protobuf(honest, "http")
    assert receiver.stats()["attributes_ignored"] == {"points": 0}
    receiver.export_protobuf(attack, "http")
    receiver.export_json(as_json[2].encode())
    assert receiver.stats()["attributes_ignored"] == {"points": 2 * points}
    told = [r.getMessage() for r in caplog.records if cv.OTEL_DRA_RECEIVER_ATTRIBUTES_IGNORED.name in r.getMessage()]
    assert len(told) == 1 and f"{points} points carried attributes" in told[0], told
