"""The warm start from demonstrations (``algo=sft``): scripted demonstrators (:mod:`.demonstrators`), and the
rollout source that plays them through the agent loop on the training split (:mod:`.source`)."""

import lazy_loader

__getattr__, __dir__, __all__ = lazy_loader.attach(
    __name__,
    submod_attrs={
        "demonstrators": ["DEMONSTRATORS", "arithmetic_tool", "demonstrator"],
        "source": ["DemonstrationSource"],
    },
)
