"""otel-dra: accelerator health for Kubernetes DRA, built on OpenTelemetry hw.* metrics.

The package is laid out as the pipeline it runs:
``sources`` (where samples come from) → ``store`` (the window of recent samples)
→ classifier (issue #3) → ``sinks`` (OpenTelemetry metrics, Prometheus, OTLP).
"""

__version__ = "0.1.0"
