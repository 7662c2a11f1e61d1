"""An upload's multipart/form-data body parsed as it arrives (python-multipart's streaming parser, which
Starlette's own form parser drives too, fed here from the request's stream): the file's bytes collect in a
buffer the caller empties chunk by chunk into the database, so neither the whole file nor a spool of it in
/tmp ever exists. Fields other than the file are small (FIELD_BYTES); more parts than a form of the Batch API
has are refused."""

from __future__ import annotations

import logging

from python_multipart.exceptions import FormParserError
from python_multipart.multipart import MultipartParser, parse_options_header

from servlane_core.protocol.errors import OpenAIError

FILE_FIELD = "file"
FIELD_BYTES = 1024  # the most of a plain field's value (purpose is a short word)
MAX_PARTS = 8
FILENAME_CHARS = 512  # the width of batch_files.filename (PostgreSQL refuses longer: a 400 here, not a 503)

# The parser logs a WARNING for each malformed header it meets, before raising: a line per bad upload that any
# caller could write into the gateway's log at will. The caller gets a 400 that says it; the log keeps errors.
logging.getLogger("python_multipart").setLevel(logging.ERROR)


def bad_form(message: str) -> OpenAIError:
    return OpenAIError(400, message, param=FILE_FIELD, code="invalid_multipart")


class UploadForm:
    """Feed it the body's pieces (`feed`); take the file's bytes as they collect (`take`); `end` when the body
    ended. OpenAIError 400 for a body that is not such a form."""

    def __init__(self, content_type: str) -> None:
        kind, options = parse_options_header(content_type)
        boundary = options.get(b"boundary")
        if kind != b"multipart/form-data" or not boundary:
            raise bad_form("The upload must be multipart/form-data with a boundary.")
        self.fields: dict[str, str] = {}
        self.filename: str | None = None  # set once the file's part has begun
        self.file_ended = False
        self.file_bytes = bytearray()  # received and not taken yet
        self._parts = 0
        self._name = ""
        self._in_file = False
        self._value = bytearray()
        self._headers: dict[bytes, bytes] = {}
        self._header_name = self._header_value = b""
        self._parser = MultipartParser(
            boundary,
            {
                "on_part_begin": self._part_begins,
                "on_header_field": self._header_field,
                "on_header_value": self._header_value_piece,
                "on_header_end": self._header_ends,
                "on_headers_finished": self._headers_end,
                "on_part_data": self._data,
                "on_part_end": self._part_ends,
            },
        )

    def feed(self, data: bytes) -> None:
        try:
            self._parser.write(data)
        except FormParserError:
            raise bad_form("The upload is not valid multipart/form-data.") from None

    def take(self, at_least: int) -> list[bytes]:
        """The file's bytes received so far, in pieces of exactly `at_least`; the rest stays for later."""
        pieces = []
        while len(self.file_bytes) >= at_least:
            pieces.append(bytes(self.file_bytes[:at_least]))
            del self.file_bytes[:at_least]
        return pieces

    def end(self) -> bytes:
        """Checks the body ended as a form does; the file's last bytes."""
        try:
            self._parser.finalize()
        except FormParserError:
            raise bad_form("The upload is not valid multipart/form-data.") from None
        if self.filename is None or not self.file_ended:
            raise OpenAIError(400, "Missing the file to upload (multipart field 'file').", param=FILE_FIELD)
        rest = bytes(self.file_bytes)
        self.file_bytes.clear()
        return rest

    # -- the parser's callbacks ----------------------------------------------------------------------

    def _part_begins(self) -> None:
        self._parts += 1
        if self._parts > MAX_PARTS:
            raise bad_form(f"The upload has more than {MAX_PARTS} parts.")
        self._headers, self._value, self._in_file = {}, bytearray(), False

    def _header_field(self, data: bytes, start: int, end: int) -> None:
        self._header_name += data[start:end]

    def _header_value_piece(self, data: bytes, start: int, end: int) -> None:
        self._header_value += data[start:end]

    def _header_ends(self) -> None:
        self._headers[self._header_name.lower()] = self._header_value
        self._header_name = self._header_value = b""

    def _headers_end(self) -> None:
        _, options = parse_options_header(self._headers.get(b"content-disposition", b""))
        if b"name" not in options:
            raise bad_form('Each part needs a Content-Disposition with a "name".')
        self._name = options[b"name"].decode("utf-8", "replace")
        if self._name == FILE_FIELD:
            if self.filename is not None:
                raise bad_form("The upload holds more than one file.")
            self.filename = options.get(b"filename", b"").decode("utf-8", "replace") or "upload.jsonl"
            if len(self.filename) > FILENAME_CHARS:
                raise bad_form(f"The file's name is longer than {FILENAME_CHARS} characters.")
            self._in_file = True

    def _data(self, data: bytes, start: int, end: int) -> None:
        if self._in_file:
            self.file_bytes += data[start:end]
            return
        if len(self._value) + end - start > FIELD_BYTES:
            raise bad_form(f"The form field '{self._name}' is longer than {FIELD_BYTES} bytes.")
        self._value += data[start:end]

    def _part_ends(self) -> None:
        if self._in_file:
            self.file_ended = True
        else:
            self.fields[self._name] = self._value.decode("utf-8", "replace")
