"""Sandboxes where agent code runs (Docker, local). Arrives with part 2 of the roadmap; nothing here yet."""
