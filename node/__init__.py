"""The verifier node: daemon, database, HTTP API, dashboard, config, and the `pot` CLI."""
