"""Test support: stand-ins, twins and fixtures shared by the tests (no tests here)."""
