"""The data-parallel learner: one rank's share of the batch and the summed gradients
(:mod:`.data_parallel`), rank 0 leading the others (:mod:`.ranks`), and starting the ranks (:mod:`.launch`)."""
