"""Sinks: where the pipeline's results go (OpenTelemetry metrics, Prometheus, OTLP;
the kubelet and Kubernetes in later issues)."""
