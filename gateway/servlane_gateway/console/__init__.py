"""The Servlane console: a read-only web page, served by the gateway, over its routes, objects and requests.

recent: what this replica saw (slow or failed requests, per-model rates); view: the page's JSON, decided
purely from the route table, the objects, that record and the caller's key; router: the thin HTTP part.
"""
