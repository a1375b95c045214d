"""The one `pot` command: the top room, mounting each room's sub-app (see docs/architecture.md)."""
