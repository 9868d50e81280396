"""A discrete-event simulator that drives the real schedulers on a simulated clock
(:mod:`.simulator`): its configuration and scenarios (:mod:`.config`), clock events (:mod:`.events`),
engines (:mod:`.fleet`, costs in :mod:`.engine_model`), turn placement (:mod:`.routing`), learner
(:mod:`.trainer`), what a run reports (:mod:`.metrics`), timelines (:mod:`.plots`) and the comparison
of the modes (:mod:`.compare`). Pure Python: no torch."""
