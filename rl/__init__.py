"""The learner (SAO and its baselines). Arrives with part 3 of the roadmap; nothing here yet."""
