"""``--fault`` parsing: the exact contract vocabulary, and errors that teach the syntax."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from otel_dra.faults import Fault, FaultSpecError, parse_fault
from otel_dra.vocabulary import REASONS


def test_parses_device_reason_and_time():
    assert parse_fault("gpu-3:memory_ecc@30") == Fault("gpu-3", "memory_ecc", 30.0)
    assert parse_fault("gpu-0:thermal") == Fault("gpu-0", "thermal", 0.0)
    assert parse_fault("*:stale@1.5") == Fault("*", "stale", 1.5)


@pytest.mark.parametrize("reason", REASONS)
def test_every_contract_reason_is_accepted(reason):
    assert parse_fault(f"gpu-1:{reason}@2").reason == reason


@pytest.mark.parametrize("bad", ["gpu-3:ecc", "gpu-3", "gpu-3:thermal@-1", "gpu-3:thermal@soon", ":thermal", ""])
def test_bad_specs_list_the_valid_reasons(bad):
    with pytest.raises(FaultSpecError) as err:
        parse_fault(bad)
    message = str(err.value)
    assert "\n" not in message
    assert all(reason in message for reason in REASONS)


@given(st.text(max_size=30))
def test_anything_either_parses_to_a_contract_reason_or_fails_cleanly(text):
    try:
        fault = parse_fault(text)
    except FaultSpecError:
        return
    assert fault.reason in REASONS and fault.at >= 0
