"""Entry points: ``sao-train`` (:mod:`.train`, with the ``env`` config group of :mod:`.env_group`) and
``sao-sim`` (:mod:`.sim`)."""
