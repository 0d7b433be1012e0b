"""The fleet's own rendering of the verdict metrics says exactly what the SDK path says."""

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from otel_dra.classifier import Verdict
from otel_dra.sinks import provider
from otel_dra.sinks.verdict_text import VerdictText
from otel_dra.sinks.verdicts import VerdictMetrics
from otel_dra.state.board import VerdictBoard

ATTRS = {"hw.type": "gpu", "hw.vendor": "NVIDIA", "dra.pool.name": "node-1", "dra.driver.name": "gpu.example.com"}


def board_of(verdicts: list[Verdict]) -> VerdictBoard:
    board = VerdictBoard()
    board.update(verdicts, lambda node, dev: {**ATTRS, "dra.device.name": dev, "hw.name": 'quote " and \\ back'})
    return board


def samples(text: str) -> set[tuple[str, tuple[tuple[str, str], ...], float]]:
    out = set()
    for family in text_string_to_metric_families(text):
        if family.name not in ("hw_status", "dra_device_health"):
            continue
        for s in family.samples:
            labels = tuple(sorted((k, v) for k, v in s.labels.items() if not k.startswith("otel_scope")))
            out.add((s.name, labels, s.value))
    return out


def test_same_series_and_values_as_the_sdk_path():
    verdicts = [
        Verdict(1, "node-1", "gpu-0", "Healthy", "ok", (), "none", "fine"),
        Verdict(1, "node-1", "gpu-1", "Unhealthy", "failed", ("driver_errors", "memory_ecc"), "reset_device", "x"),
        Verdict(1, "node-1", "gpu-2", "Unknown", None, ("stale",), "none", "silent"),
        Verdict(1, "node-1", "gpu-3", "Healthy", "degraded", ("thermal",), "reduce_load", "hot"),
    ]
    board = board_of(verdicts)
    registry = CollectorRegistry()
    mp = provider.build_meter_provider("node-1", [provider.prometheus_reader(registry)], 10_000)
    VerdictMetrics(board, mp.get_meter("otel_dra"))
    sdk = generate_latest(registry).decode()
    mp.shutdown()
    ours = VerdictText().render(board.snapshot()).decode()
    assert samples(ours) == samples(sdk)
    assert len(samples(ours)) == 4 * 5 + 4


def states(text: str) -> dict[str, float]:
    return {dict(labels)["hw_state"]: value for name, labels, value in samples(text) if name == "hw_status"}


def test_cached_lines_follow_changes_and_forget_gone_devices():
    text = VerdictText()
    board = board_of([Verdict(1, "n", "gpu-0", "Healthy", "ok", (), "none", "")])
    assert states(text.render(board.snapshot()).decode())["ok"] == 1
    changed = Verdict(2, "n", "gpu-0", "Unhealthy", "failed", ("device_lost",), "reboot_node", "")
    board.update([changed], lambda node, dev: dict(ATTRS))
    rendered = text.render(board.snapshot()).decode()
    assert states(rendered) == {"ok": 0, "failed": 1, "degraded": 0, "predicted_failure": 0, "needs_cleaning": 0}
    assert 'dra_device_health_reasons="device_lost"' in rendered
    board.forget(lambda key: False)
    assert "gpu-0" not in text.render(board.snapshot()).decode()
