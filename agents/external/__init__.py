"""External agents: an agent from another package (or a user's own) that speaks the OpenAI chat API, run
unchanged, one task per subprocess, against the capture proxy.

Modules: the records at the boundary (:mod:`.task`), the plug-ins of the ``sao.agents`` entry-point group
(:mod:`.registry`), one episode of an agent (:mod:`.runner`: its subprocess :mod:`.process` and
:mod:`.child`, the JSON between them :mod:`.wire`, its containers :mod:`.containers`, its verdict
:mod:`.verdicts`), and the seam with the capture proxy (:mod:`.sessions`).
"""

import lazy_loader

__getattr__, __dir__, __all__ = lazy_loader.attach(
    __name__,
    submod_attrs={
        "errors": ["AgentPluginError"],
        "registry": ["AgentPlugin", "find", "load", "plugins", "refused"],
        "runner": ["ExternalAgentRunner"],
        "sessions": ["CaptureSessionLike", "PassThroughSessions", "SessionOpener"],
        "task": ["BUILTIN_AGENTS", "ENTRY_POINT_GROUP", "AgentEndpoint", "AgentResult", "AgentTask", "SandboxRules"],
    },
)
