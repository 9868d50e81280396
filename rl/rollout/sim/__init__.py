"""A discrete-event simulator that drives the real schedulers on a simulated clock
(:mod:`.simulator`): its configuration and scenarios (:mod:`.config`), clock events (:mod:`.events`),
engines (:mod:`.fleet`, costs in :mod:`.engine_model`), turn placement (:mod:`.routing`), learner
(:mod:`.trainer`), what a run reports (:mod:`.metrics`), timelines (:mod:`.plots`) and the comparison
of the modes (:mod:`.compare`). Pure Python: no torch."""

import lazy_loader

__getattr__, __dir__, __all__ = lazy_loader.attach(
    __name__,
    submod_attrs={
        "compare": ["grid_json", "render", "resolve_modes", "run_grid"],
        "config": ["SCENARIOS", "SimConfig", "scenario"],
        "simulator": ["SIM_MODES", "Simulation", "simulate"],
    },
)
