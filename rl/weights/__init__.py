"""Weights from the learner to the engines: publishing versions and the sync into vLLM
(:mod:`.sync`), ``rollout=sync``'s push into its one engine (:mod:`.replica_sync`), the one reload sequence
(:mod:`.load`), folders to other nodes through Ray's object store (:mod:`.staging`), and the untied model
an external engine starts from (:mod:`.export`)."""

import lazy_loader

__getattr__, __dir__, __all__ = lazy_loader.attach(
    __name__,
    submod_attrs={
        "export": ["export_model"],
        "load": ["Served", "WeightControl", "load_weights"],
        "replica_sync": ["PushTarget", "ReplicaWeightSync"],
        "staging": ["FolderFiles", "ObjectStoreStager", "prune", "read_folder", "write_folder"],
        "sync": ["NcclWeightSync", "WeightPublisher", "WeightSync", "check_engine_untied", "export_engine_model",
                 "list_versions", "prune_versions", "save_checkpoint", "version_dir"],
    },
)
