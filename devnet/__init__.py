"""Local networks for people and tests: `pot demo` (a whole network on one machine), `pot redteam`
(forgeries through the verifier's real path), and the process harness, TOML writer and block maker
that bench/ and tests/ share. The top room below `pot`: it may import every other room."""
