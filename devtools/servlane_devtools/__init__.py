"""Developer tooling that is not part of the product: the tiny random-weight model the tests and the
standalone example serve. Installed from the source tree only (`devtools/`), never in an image."""
