"""Tests that need a real accelerator; each skips with a reason where none is present."""
