"""Kubernetes output: device health verdicts as DRA ``DeviceTaintRule`` objects (KEP-5055) and
ResourceSlice device attributes, rendered, validated and (for the rules) applied.

Facts first: a taint's default effect is ``None`` (informational); a scheduling response
(``NoSchedule``, ``NoExecute``) is the admin's choice in the policy's ``kubernetes`` section.

Modules: :mod:`~otel_dra.sinks.k8s.validation` (the API's name rules, no client needed),
:mod:`~otel_dra.sinks.k8s.render` (verdicts → objects, files), :mod:`~otel_dra.sinks.k8s.apply`
(idempotent create/update/delete through the ``kubernetes`` client), :mod:`~otel_dra.sinks.k8s.brake` (the
cluster writer's budget of new acting taints),
:mod:`~otel_dra.sinks.k8s.sink` (the agent's ``--k8s-output DIR``) and :mod:`~otel_dra.cli.k8s`
(``otel-dra k8s``). Nothing here imports the ``kubernetes`` client at import time: it is an
optional dependency (``pip install 'otel-dra[k8s]'``).
"""
