"""The agent loops: the episode skeleton they share (:mod:`.skeleton`), one episode against a
token-in/token-out engine (:mod:`.token_loop`) or a chat endpoint (:mod:`.text_loop`), a scripted
policy instead of a model (:mod:`.scripted`), one episode of a registered environment start to end
(:mod:`.episodes`), calls into the environment's code (:mod:`.env_calls`), why an episode ended
(:mod:`.exits`) and tool calls out of sampled text (:mod:`.tools`)."""

import lazy_loader

__getattr__, __dir__, __all__ = lazy_loader.attach(
    __name__,
    submod_attrs={
        "env_calls": ["INFRASTRUCTURE", "EnvCodeError", "failure_of", "finish_cut_env"],
        "episodes": ["EpisodeRunner", "Renderers", "opened", "unplayed"],
        "exits": ["EXIT_STATUSES", "LIMITS", "LOOP_LIMITS", "exit_status"],
        "scripted": ["run_graded_patch", "run_scripted_episode"],
        "seeds": ["episode_seed", "task_seed", "turn_seed"],
        "skeleton": ["LoopConfig", "Reply", "Sampled", "TurnSampler", "run_turns"],
        "text_loop": ["ChatSampler", "run_text_episode"],
        "token_loop": ["TokenSampler", "run_episode"],
        "tools": ["assistant_message", "check_native_tool_calls", "parse_tool_calls"],
    },
)
