"""The RL math, as small pure functions tested against hand-derived numbers: advantages and
baselines (:mod:`.advantages`), policy and value losses (:mod:`.losses`)."""
