"""The data-parallel learner: one rank's share of the batch and the summed gradients
(:mod:`.data_parallel`), rank 0 leading the others (:mod:`.ranks`) with typed messages (:mod:`.messages`),
and starting the ranks (:mod:`.launch`)."""

import lazy_loader

__getattr__, __dir__, __all__ = lazy_loader.attach(
    __name__,
    submod_attrs={
        "data_parallel": ["DataParallel"],
        "launch": ["LearnerRanks", "RankPlan", "RankZero", "learner_ranks", "rank_threads", "serve_rank"],
        "messages": ["Accumulate", "Begin", "Finish", "PretrainCritic", "ShareState", "Stop", "Update"],
        "ranks": ["Channel"],
    },
)
