"""Fakes for tests, kept in the package: a scripted OpenAI-compatible completion server
(:mod:`.fake_server`)."""
