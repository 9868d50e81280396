"""Fakes for tests, kept in the package: a scripted OpenAI-compatible completion server
(:mod:`.fake_server`), scripted agent plug-ins (:mod:`.fake_agents`, run by name in a subprocess) and a
stand-in for the ``docker`` command line (:mod:`.fake_docker`)."""

import lazy_loader

__getattr__, __dir__, __all__ = lazy_loader.attach(
    __name__,
    submod_attrs={
        "fake_server": ["FakeServer", "Reply"],
    },
)
