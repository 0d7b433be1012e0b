"""Generated protobuf/gRPC stubs for the kubelet APIs this package speaks (do not edit the ``_pb2`` files).

- ``dra_health_v1alpha1`` / ``dra_health_v1``: the ``DRAResourceHealth`` stream (KEP-4680), packages
  ``v1alpha1`` and ``v1`` (identical messages);
- ``pluginregistration_v1``: the kubelet plugin-registration ``Registration`` service.

The ``.proto`` files beside them are the source; ``.venv/bin/python scripts/gen_protos.py`` regenerates
the stubs and ``tests/unit/sinks/test_kubelet_stream.py`` fails when they drift.
"""
