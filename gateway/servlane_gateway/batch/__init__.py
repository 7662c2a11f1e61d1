"""The OpenAI Batch API on the gateway: files and batches kept in a database, worked off by every replica.

`rules` is the pure part (lines, results, states), `files` the database and its files, `store` the batches
and their requests on it, `migrations` its schema (Alembic, run at start), `routes` the HTTP endpoints,
`sender` one request through the gateway's own pipeline, `worker` the loop that claims and sends requests,
`service` the wiring into the app.
"""
