"""Hybrid logical clock."""
