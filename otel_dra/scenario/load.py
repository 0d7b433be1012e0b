"""What jobs do to GPUs: the load profiles and the job model, shared by ``otel-dra simulate`` and the
simulated source (``otel-dra run --source simulated --load ...``).

Why its own module: a classifier tried only on idle fleets calls healthy busy GPUs degraded (memory
held full, power at its cap) and a job's crash a device fault. Both simulators draw their load from
here, so the generator's labelled fleets and the agent's live node behave alike. Where each number
comes from is in docs/load-profiles.md; the short version is beside each constant.

Profiles (``PROFILES``): ``idle`` is no job model at all (each simulator keeps its own wander at light
to moderate load, unchanged); ``training``: one job holds a node's GPUs for hours; ``inference``:
model-server replicas hold 1, 2, 4 or 8 GPUs each; ``mixed``: nodes drawn 50/35/15 % training,
inference, idle.

The model has two parts, each in a module of its own (the names are re-exported here, so callers
read ``load.Lane``, ``load.LoadModel``):

- :class:`Lane` (:mod:`otel_dra.scenario.jobs`): the GPUs one workload holds together (a training
  node, an inference replica) and what runs on them, as a timeline of :class:`Run` (start, end, levels,
  checkpoint dips, crash or not), generated forward in time as far as asked (the generator asks for the
  whole recording up front, so its labels know every crash; the agent asks a little further at each read).
- :class:`LoadModel` (:mod:`otel_dra.scenario.load_model`): all lanes stepped together, vectorised over
  lanes and devices (a Python loop touches only the few lanes whose run, dip or burst changes at that
  step). :meth:`LoadModel.step` gives each device's utilization, memory, power demand and whether a
  process holds it; :func:`power_and_throttle` turns demand into power and the ``hw.throttle.time`` each
  reason accrues.
"""

from __future__ import annotations

from typing import Final

import numpy as np

from otel_dra.scenario.jobs import (
    APP_XIDS,
    BACKOFF_FIRST_S,
    BACKOFF_MAX_S,
    LOOP_LEN_S,
    LOOP_RUN_S,
    TRAINING_GAP_S,
    Forced,
    Job,
    Lane,
    Run,
    make_lanes,
)
from otel_dra.scenario.load_model import (
    LoadModel,
    LoadSample,
    Throttled,
    diurnal,
    full_load_temperature,
    normal_cdf,
    power_and_throttle,
    slot_offsets,
)

#: Load profiles, ``--load`` of both commands. ``idle`` is each simulator's behaviour before profiles existed.
PROFILES: Final = ("idle", "training", "inference", "mixed")
#: Profiles a node runs under the job model (``mixed`` assigns one of these, or idle, per node).
BUSY: Final = ("training", "inference")
#: ``mixed``: the share of nodes each profile gets.
MIXED_SHARES: Final = (("training", 0.50), ("inference", 0.35), ("idle", 0.15))
#: One line per profile, for ``--help``.
PROFILE_HELP: Final = {
    "idle": "GPUs wander at light to moderate load, memory 20-80%, well under the power cap (the default)",
    "training": "one job holds each node for hours: utilization 0.9-1.0, memory held at 93-99%, power at its "
    "cap much of the time (power_cap throttle time accrues), checkpoint dips every 30-60 min, idle gaps between "
    "jobs (PCIe back to Gen1), crashes that leave an XID and an OOM on every GPU of the job, some crash-looping",
    "inference": "model-server replicas hold 1, 2, 4 or 8 GPUs for hours with 90-95% of memory reserved; "
    "utilization follows diurnal, bursty traffic (0.1-0.9) and reaches the power cap only at peaks; fewer crashes",
    "mixed": "nodes drawn 50% training, 35% inference, 15% idle",
}


def profile_of_nodes(load: str, n: int, rng: np.random.Generator) -> list[str]:
    """Each node's profile: ``load`` for all, or for ``mixed`` a draw of :data:`MIXED_SHARES` (at least
    one training and one inference node when there are three or more)."""
    if load not in PROFILES:
        raise ValueError(f"load must be one of {', '.join(PROFILES)}, got {load!r}")
    if load != "mixed":
        return [load] * n
    names = [name for name, _ in MIXED_SHARES]
    shares = np.array([share for _, share in MIXED_SHARES])
    counts = np.floor(shares * n).astype(int)
    while counts.sum() < n:
        counts[int(np.argmax(shares * n - counts))] += 1
    if n >= 3:
        for i in (0, 1):  # training, inference
            if counts[i] == 0:
                counts[i] = 1
                counts[int(np.argmax(counts))] -= 1
    out = [name for name, k in zip(names, counts, strict=True) for _ in range(int(k))]
    rng.shuffle(out)
    return out


__all__ = [
    "APP_XIDS",
    "BACKOFF_FIRST_S",
    "BACKOFF_MAX_S",
    "BUSY",
    "LOOP_LEN_S",
    "LOOP_RUN_S",
    "MIXED_SHARES",
    "PROFILES",
    "PROFILE_HELP",
    "TRAINING_GAP_S",
    "Forced",
    "Job",
    "Lane",
    "LoadModel",
    "LoadSample",
    "Run",
    "Throttled",
    "diurnal",
    "full_load_temperature",
    "make_lanes",
    "normal_cdf",
    "power_and_throttle",
    "profile_of_nodes",
    "slot_offsets",
]
