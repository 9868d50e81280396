"""Hydra configuration files (YAML only)."""
