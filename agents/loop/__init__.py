"""The agent loops: one episode against a token-in/token-out engine (:mod:`.token_loop`) or a chat
endpoint (:mod:`.text_loop`), a scripted policy instead of a model (:mod:`.scripted`), one episode of a
registered environment start to end (:mod:`.episodes`), calls into the environment's code
(:mod:`.env_calls`) and tool calls out of sampled text (:mod:`.tools`)."""
