"""The servers' logging: one format, and no line per request from the HTTP client libraries.

httpx (and huggingface_hub's httpx2) log every request's URL at INFO, and a request's URL may be a presigned
one (a Hugging Face download redirected to a signed CDN URL, an S3 object): its signature and credential would
reach the log of every model download.
"""

from __future__ import annotations

import logging

HTTP_CLIENT_LOGGERS = ("httpx", "httpx2", "httpcore", "httpcore2")
FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def quiet_http_clients() -> None:
    for name in HTTP_CLIENT_LOGGERS:
        logging.getLogger(name).setLevel(logging.WARNING)


def setup_logging(level: str) -> None:
    logging.basicConfig(level=level.upper(), format=FORMAT)
    quiet_http_clients()
