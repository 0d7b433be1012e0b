"""Serving HTTP for the pipeline's edges: the OTLP/HTTP receiver and the ``/metrics`` endpoint share
one bounded server (:mod:`otel_dra.serve.http`), configured by :mod:`otel_dra.serve.config`."""
