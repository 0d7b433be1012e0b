"""The policy's schema: every key a policy file may set, its type and its range.

The sections other packages own (:mod:`otel_dra.policy.sections`) keep their place among the keys;
their rules come from the sections a load is given.
"""

from __future__ import annotations

from collections.abc import Mapping

from otel_dra.policy.sections import OWNED_SECTIONS, Section, as_read
from otel_dra.policy.validators import (
    COUNT,
    FRACTION,
    POSITIVE,
    Validator,
    boolean,
    duration,
    list_of,
    map_of,
    number,
    one_of,
    positive_duration,
    string,
    struct,
)
from otel_dra.vocabulary import COMBINE_MODES, REASONS, REMEDIATIONS

#: Event-count thresholds, judged on each device's log of its last EVENT_LOG_DEPTH events.
EVENT_LOG_DEPTH = 8
EVENT_THRESHOLDS = (
    ("memory_pressure", "out_of_memory"),
    ("driver_errors", "application_repeats"),
    ("device_reset", "resets"),
)
#: Reasons judged on event logs (each has an ``events_window``), in EVENT_THRESHOLDS' order.
EVENT_REASONS: tuple[str, ...] = tuple(reason for reason, _ in EVENT_THRESHOLDS)

#: Buckets the long horizon keeps per device at most (memory: about 50 bytes a bucket).
HORIZON_MAX_BUCKETS = 1440

#: Driver error code classes, and the ladder step a fatal class starts at.
DRIVER_CLASSES: tuple[str, ...] = ("ignore", "application", "reset_device", "reboot_node", "mechanical")
#: Reasons whose evidence, on most devices of a node at once, is the node's (power, cooling, the host).
NODE_SCOPE_REASONS: tuple[str, ...] = ("thermal", "cooling", "power_delivery", "power_throttling")
#: Reasons whose evidence on most devices behind one PCIe switch or on one fabric may be that thing's (scope link).
LINK_SCOPE_REASONS: tuple[str, ...] = ("link", "driver_errors", "device_lost", "device_reset")

#: hw.state values a rule may set (Unknown is not a state).
RULE_STATES: tuple[str, ...] = ("degraded", "predicted_failure", "failed")

LADDER = list_of(one_of(REMEDIATIONS), min_len=1)
STATE = one_of(RULE_STATES)
CODES = list_of(string)

RULES = struct(
    {
        "thermal": struct(
            {
                "state": STATE,
                "min_fraction": FRACTION,
                "critical_state": STATE,
                "throttle_share": FRACTION,
                "slowdown_share": FRACTION,
                "duty": FRACTION,
                "fallback_limits": struct({"high.degraded": number(), "high.critical": number()}),
                "peers": struct(
                    {
                        "enabled": boolean,
                        "state": STATE,
                        "margin": POSITIVE,
                        "unknown_slot_margin": POSITIVE,
                        "mad_k": POSITIVE,
                        "hold_ratio": FRACTION,
                        "sustain": duration,
                        "min_utilization": FRACTION,
                        "slope": number(0.0, 200.0),
                        "min_node_devices": number(2, None, integer=True),
                        "min_slot_nodes": number(2, None, integer=True),
                        "change_margin": POSITIVE,
                        "change_floor": number(0.0, None),
                        "history": duration,
                        "baseline_tau": positive_duration,
                    }
                ),
                "remediation": LADDER,
            }
        ),
        "cooling": struct(
            {
                "state": STATE,
                "min_rpm": POSITIVE,
                "min_ratio": FRACTION,
                "warm": number(),
                "min_fraction": FRACTION,
                "duty": FRACTION,
                "remediation": LADDER,
            }
        ),
        "memory_ecc": struct(
            {
                "uncorrected": COUNT,
                "retired_pages_failed": COUNT,
                "retired_pages_predicted": COUNT,
                "corrected_per_minute": POSITIVE,
                "corrected_mad_k": POSITIVE,
                "corrected_storm_ratio": number(1.0),
                "corrected_cohort_ratio": number(1.0),
                "corrected_floor_per_minute": POSITIVE,
                "remediation": LADDER,
            }
        ),
        "power_delivery": struct(
            {
                "state": STATE,
                "errors": COUNT,
                "voltage_fraction": FRACTION,
                "brake_share": FRACTION,
                "duty": FRACTION,
                "remediation": LADDER,
            }
        ),
        "power_throttling": struct(
            {
                "state": STATE,
                "throttle_share": FRACTION,
                "pinned_ratio": FRACTION,
                "duty": FRACTION,
                "min_peers": number(2, None, integer=True),
                "peer_quantile": FRACTION,
                "peer_margin": FRACTION,
                "busy_utilization": FRACTION,
                "load_coupling": FRACTION,
                "limit_ratio": FRACTION,
                "capped_share": FRACTION,
                "remediation": LADDER,
            }
        ),
        "memory_pressure": struct(
            {
                "state": STATE,
                "full_is_evidence": boolean,
                "utilization": FRACTION,
                "min_fraction": FRACTION,
                "duty": FRACTION,
                "out_of_memory": COUNT,
                "events_window": duration,
                "remediation": LADDER,
            }
        ),
        "link": struct(
            {
                "state": STATE,
                "replays_per_lane_per_minute": map_of(number(1, 16, integer=True), POSITIVE),
                "default_generation": number(1, 16, integer=True),
                "default_width": number(1, 64, integer=True),
                "mad_k": POSITIVE,
                "storm_ratio": number(1.0),
                "cohort_ratio": number(1.0),
                "floor_per_minute": POSITIVE,
                "duty": FRACTION,
                "downgrade_fraction": FRACTION,
                "generation_min_utilization": FRACTION,
                "remediation": LADDER,
            }
        ),
        "driver_errors": struct(
            {
                "code_tables": map_of(string, struct(dict.fromkeys(DRIVER_CLASSES, CODES))),
                "application_repeats": COUNT,
                "events_window": duration,
                "remediation": LADDER,
            }
        ),
        "firmware": struct({"state": STATE, "deny": CODES, "minimum": map_of(string, string), "remediation": LADDER}),
        "device_reset": struct({"state": STATE, "resets": COUNT, "events_window": duration, "remediation": LADDER}),
        "device_lost": struct({"remediation": LADDER}),
        "vendor_status": struct({"remediation": LADDER}),
    }
)

#: How a reason that is on clears (the policy's ``clears``): ``hold``, once its evidence has been gone for its hold
#: time; ``repair``, a failure, only once the repair its remediation names was seen on the device and it stayed clean.
CLEAR_MODES: tuple[str, ...] = ("hold", "repair")

#: Reasons a policy has rules (and hold times) for: every contract reason but ``stale``.
RULES_KEYS: tuple[str, ...] = tuple(r for r in REASONS if r != "stale")


def schema_for(sections: Mapping[str, Section]) -> Validator:
    """The whole policy's schema, each owned section validated by the given owner (else kept as read)."""
    owned = {name: sections[name].schema if name in sections else as_read for name in OWNED_SECTIONS}
    return struct(
        {
            "version": number(1, 1, integer=True),
            "window": duration,
            "min_samples": COUNT,
            "stale_timeout": duration,
            "stale_intervals": number(2.0, 100.0),
            "device_ttl": duration,
            "horizon": struct(
                {"bucket": duration, "duty_span": duration, "rate_span": duration, "duty_hold_ratio": FRACTION}
            ),
            "cohorts": struct(
                {
                    "by": list_of(string),
                    "slot_by": list_of(string),
                    "load_bins": list_of(FRACTION, min_len=1),
                    "min_devices": COUNT,
                    "significance": POSITIVE,
                    "span_significance": POSITIVE,
                    "healthy_ratio": number(1.0),
                }
            ),
            "unhealthy_states": list_of(one_of(RULE_STATES), min_len=1),
            "hold": map_of(one_of(("default", *RULES_KEYS)), duration),
            "clears": map_of(one_of(("default", *RULES_KEYS)), one_of(CLEAR_MODES)),
            "clean_after_repair": duration,
            "escalation": struct({"window": duration, "after": COUNT}),
            "rules": RULES,
            "overrides": list_of(struct({"match": struct({"hw.vendor": string, "hw.model": string}), "rules": RULES})),
            "kubernetes": owned["kubernetes"],
            "shared_devices": struct({"combine": one_of(COMBINE_MODES)}),
            "scopes": struct(
                {
                    "workload": struct({"min_devices": number(2, None, integer=True), "together": duration}),
                    "node": struct(
                        {
                            "reasons": list_of(one_of(NODE_SCOPE_REASONS)),
                            "min_devices": number(2, None, integer=True),
                            "share": FRACTION,
                            "remediation": one_of(REMEDIATIONS),
                        }
                    ),
                    "link": struct(
                        {
                            "reasons": list_of(one_of(LINK_SCOPE_REASONS)),
                            "min_devices": number(2, None, integer=True),
                            "share": FRACTION,
                            "remediation": list_of(one_of(REMEDIATIONS), min_len=1),
                        }
                    ),
                    "firmware": struct(
                        {
                            "horizon": positive_duration,
                            "bucket": positive_duration,
                            "min_events": COUNT,
                            "min_devices": COUNT,
                            "significance": number(0.0, 1.0),
                            "min_ratio": number(1.0),
                            "min_device_days": POSITIVE,
                            "every": duration,
                        }
                    ),
                }
            ),
        }
    )
