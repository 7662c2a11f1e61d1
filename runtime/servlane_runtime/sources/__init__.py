"""Fetching a model's files from a remote store into the runtime's cache dir (s3:// so far).

`cache` keeps one copy per source that every runtime sharing the cache dir uses: fetched under an exclusive
lock, loaded only once its completion marker is written. `s3` fills it from any S3-compatible store.
"""
