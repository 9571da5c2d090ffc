"""A faithful local implementation of the embeddings service (spec/service-api.md).

Real HTTP on loopback, accounts and a ledger in SQLite, a deterministic lexical embedder,
seeded fault injection. `python -m service.sandbox --help`; tests start it through
`service.sandbox.launcher.SandboxProcess`. No Beam here.
"""
