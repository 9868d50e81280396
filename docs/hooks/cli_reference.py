"""mkdocs hook: placeholder until the CLI reference generator lands."""
