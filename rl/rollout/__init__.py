"""Rollout orchestration: clock-agnostic schedulers for every rollout mode, and their simulator."""
