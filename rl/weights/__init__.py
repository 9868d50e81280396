"""Weights from the learner to the engines: publishing versions and the sync into vLLM
(:mod:`.sync`), ``rollout=sync``'s push into its one engine (:mod:`.replica_sync`), the one reload sequence
(:mod:`.load`), folders to other nodes through Ray's object store (:mod:`.staging`), and the untied model
an external engine starts from (:mod:`.export`)."""
