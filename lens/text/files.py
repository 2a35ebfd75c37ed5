"""User corpus files (``.txt``, ``.jsonl``) read in bounded memory, whatever their lines hold.

One pass over the file in blocks of :data:`BLOCK` bytes finds the documents, checks the text (UTF-8, no
NUL bytes, valid JSON) and hashes it into the corpus fingerprint. A document whose UTF-8 text is larger
than :data:`HOLD_BYTES` is not held: it stays in its file as a :class:`TextSpan`, read again in pieces
when it is tokenised (``lens.text.corpora.tokenize_document`` stops once it has the tokens it needs), so a
200 MB single-line text costs a few megabytes, not gigabytes. A ``.jsonl`` line longer than
:data:`LINE_LIMIT` is parsed as it streams (a top-level object: its ``text`` and ``title`` strings are
read piece by piece; its other values must be under :data:`SMALL_VALUE` bytes each).

The documents and fingerprint are exactly those of reading the whole file: a ``.txt`` splits where
``re.split(r"\\n\\s*\\n", text)`` splits (a run of whitespace holding two newlines) and strips each part;
a ``.jsonl`` splits lines where ``str.splitlines`` does.
"""

from __future__ import annotations

import codecs
import hashlib
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

from lens.errors import LensInputError

BLOCK = 1 << 20
HOLD_BYTES = 4 << 20  # a document larger than this stays in its file
LINE_LIMIT = 8 << 20  # a .jsonl line longer than this is parsed as it streams
SMALL_VALUE = 1 << 20  # other values (and keys, titles) of a streamed line
BINARY_PROBE = 65536  # NUL bytes here mean a binary file

# every character str.isspace() / re's \s accept, as UTF-8 (a match can never start inside a character)
_WS_CHARS = ("\t\n\x0b\x0c\r\x1c\x1d\x1e\x1f \x85\xa0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006"
             "\u2007\u2008\u2009\u200a\u2028\u2029\u202f\u205f\u3000")
_WS_ENC = tuple(c.encode() for c in _WS_CHARS)
_WS = b"(?:" + b"|".join(re.escape(e) for e in _WS_ENC) + b")"
_SEP = re.compile(rb"\n" + _WS + rb"*\n")  # a document break: re.split(r"\n\s*\n") on the text
_LEAD = re.compile(_WS + rb"*")
# str.splitlines() boundaries as UTF-8; a lone "\r" at a block's end waits for the next block
_EOL = re.compile(rb"\r\n|[\n\r\x0b\x0c\x1c\x1d\x1e]|\xc2\x85|\xe2\x80[\xa8\xa9]")
# the inside of a JSON string: whole characters and whole escapes, up to a quote, a backslash or the end
_STR_BODY = re.compile(rb'(?:[^\\"]++|\\(?:u[0-9a-fA-F]{4}|["\\/bfnrt]))*+')
_HIGH_SURROGATE_END = re.compile(rb"\\u[dD][89abAB][0-9a-fA-F]{2}\Z")


@dataclass(frozen=True)
class TextSpan:
    """A document too large to hold, left in its file: bytes ``[start, end)`` of ``path`` — its UTF-8
    text, or (``json``) the inside of the JSON string that holds it."""

    path: str
    start: int
    end: int
    json: bool = False

    @property
    def n_bytes(self) -> int:
        return self.end - self.start

    def pieces(self) -> Iterator[str]:
        """The text, a piece (about :data:`BLOCK` bytes) at a time."""
        with open(self.path, "rb") as fh:
            if self.json:
                out: list[str] = []
                stream = _Stream(fh, self.path, self.start, 0)
                while stream.offset < self.end:
                    stream.string_piece(out.append)
                    yield from out
                    out.clear()
                return
            fh.seek(self.start)
            dec = codecs.getincrementaldecoder("utf-8")()
            left = self.end - self.start
            while left > 0:
                block = fh.read(min(BLOCK, left))
                if not block:
                    raise LensInputError(f"corpus file {self.path} changed while it was read: reload it")
                left -= len(block)
                yield dec.decode(block, final=left <= 0)

    def read(self) -> str:
        return "".join(self.pieces())


@dataclass(frozen=True)
class Document:
    """One document; ``content`` is its text, or a :class:`TextSpan` for a document
    too large to hold (read from its file when ``text`` or :meth:`prefix` is asked for)."""

    doc_id: int
    content: str | TextSpan
    title: str = ""

    @property
    def text(self) -> str:
        return self.content if isinstance(self.content, str) else self.content.read()

    @property
    def size(self) -> int:
        """Characters held, or bytes in the file for a document left there (an upper bound of its characters)."""
        return len(self.content) if isinstance(self.content, str) else self.content.n_bytes

    def prefix(self, n_chars: int) -> tuple[str, bool]:
        """The first ``n_chars`` characters (all when shorter), and whether that is the whole text."""
        if isinstance(self.content, str):
            return self.content[:n_chars], len(self.content) <= n_chars
        got, n = [], 0
        pieces = self.content.pieces()
        for piece in pieces:
            got.append(piece)
            n += len(piece)
            if n > n_chars:
                return "".join(got)[:n_chars], False
            if n == n_chars:
                return "".join(got), next(pieces, None) is None
        return "".join(got), True


def _incomplete_tail(buf: bytes) -> int:
    """How many bytes at the end of ``buf`` are an unfinished UTF-8 character."""
    for k in range(1, min(4, len(buf)) + 1):
        b = buf[-k]
        if b < 0x80:
            return 0
        if b >= 0xC0:  # a lead byte: how long its character is
            need = 2 if b < 0xE0 else 3 if b < 0xF0 else 4
            return k if k < need else 0
    return 0


def _rstrip_ws(b: bytes) -> bytes:
    j = len(b)
    while j:
        for e in _WS_ENC:
            if b.endswith(e, 0, j):
                j -= len(e)
                break
        else:
            break
    return b[:j]


def _utf8_error(path: Path, offset: int) -> LensInputError:
    return LensInputError(f"corpus file {path} is not UTF-8 text (byte {offset} is invalid)")


class _Checked:
    """Blocks of a file as read: UTF-8 checked as they come, NUL bytes looked for at the start."""

    def __init__(self, path: Path):
        self.path = path
        self.dec = codecs.getincrementaldecoder("utf-8")()
        self.seen = 0
        self.nonblank = False

    def check(self, block: bytes, final: bool = False) -> None:
        if self.seen < BINARY_PROBE and b"\x00" in block[:BINARY_PROBE - self.seen]:
            raise LensInputError(f"corpus file {self.path} looks binary (NUL bytes): expected UTF-8 text")
        try:
            self.dec.decode(block, final=final)
        except UnicodeDecodeError as exc:
            raise _utf8_error(self.path, max(0, self.seen + exc.start - len(self.dec.getstate()[0]))) from None
        self.seen += len(block)
        self.nonblank = self.nonblank or bool(block.strip())


class _DocBuilder:
    """One document of a .txt as its pieces come: stripped, hashed, held while small."""

    def __init__(self, path: str, h, docs: list):
        self.path, self.h, self.docs = path, h, docs
        self._reset()

    def _reset(self) -> None:
        self.start = None
        self.end = 0
        self.size = 0
        self.held: list[bytes] | None = []

    def feed(self, seg: bytes, off: int, ends: bool) -> None:
        if self.start is None:
            k = _LEAD.match(seg).end()
            seg, off = seg[k:], off + k
        if ends:
            seg = _rstrip_ws(seg)
        if seg:
            if self.start is None:
                self.start = off
            self.end = off + len(seg)
            self.h.update(seg)
            self.size += len(seg)
            if self.held is not None:
                self.held.append(seg)
                if self.size > HOLD_BYTES:
                    self.held = None
        if ends:
            self.finish()

    def finish(self) -> None:

        if self.start is not None:
            self.h.update(b"\x00")
            body = (b"".join(self.held).decode("utf-8") if self.held is not None
                    else TextSpan(self.path, self.start, self.end))
            self.docs.append(Document(len(self.docs), body))
        self._reset()


def scan_txt(fh, path: Path) -> tuple[list, str, bool]:
    """Documents (separated by a blank line), fingerprint and whether any byte was not blank."""
    h = hashlib.sha256()
    docs: list = []
    doc = _DocBuilder(str(path), h, docs)
    checked = _Checked(path)
    carry, base = b"", 0
    while True:
        block = fh.read(BLOCK)
        eof = not block
        checked.check(block, final=eof)
        buf = carry + block
        if eof:
            cut = len(buf)
        else:  # keep back a trailing run of whitespace (it may hold a break) and an unfinished character
            cut = len(_rstrip_ws(buf[:len(buf) - _incomplete_tail(buf)]))
        part = buf[:cut]
        pos = 0
        for m in _SEP.finditer(part):
            doc.feed(part[pos:m.start()], base + pos, ends=True)
            pos = m.end()
        doc.feed(part[pos:], base + pos, ends=eof)
        carry, base = buf[cut:], base + cut
        if eof:
            return docs, h.hexdigest()[:16], checked.nonblank


# --------------------------------------------------------------------------- .jsonl
class _Stream:
    """A JSON value read from a file as it streams (for a .jsonl line too long to hold)."""

    def __init__(self, fh, path, offset: int, line: int):
        fh.seek(offset)
        self.fh, self.path, self.line = fh, path, line
        self.buf, self.pos, self.base = b"", 0, offset
        self.eof = False

    @property
    def offset(self) -> int:
        return self.base + self.pos

    def fill(self, n: int = 1) -> bool:
        """At least ``n`` unread bytes buffered (False at the end of the file)."""
        while len(self.buf) - self.pos < n and not self.eof:
            block = self.fh.read(BLOCK)
            self.eof = not block
            self.buf, self.base = self.buf[self.pos:] + block, self.base + self.pos
            self.pos = 0
        return len(self.buf) - self.pos >= n

    def peek(self) -> bytes:
        return self.buf[self.pos:self.pos + 1] if self.fill() else b""

    def bad(self, what: str) -> LensInputError:
        return LensInputError(f"{self.path}:{self.line} is not valid JSON ({what} at byte {self.offset}): "
                              "expected one object with a 'text' field per line")

    def skip_ws(self) -> None:
        while self.peek() in (b" ", b"\t"):
            self.pos += 1

    def expect(self, ch: bytes) -> None:
        self.skip_ws()
        if self.peek() != ch:
            raise self.bad(f"expected {ch.decode()!r}")
        self.pos += 1

    def string_piece(self, sink: Callable[[str], None]) -> bool:
        """Decode the next piece of a string whose opening quote is read; True once its closing quote is."""
        want = BLOCK
        while True:
            self.fill(want)
            m = _STR_BODY.match(self.buf, self.pos)
            end, closed = m.end(), False
            nxt = self.buf[end:end + 1]
            if nxt == b'"':
                closed = True
            elif nxt == b"\\" and (len(self.buf) - end >= 12 or self.eof):
                raise self.bad("an invalid escape")
            elif not nxt and self.eof:
                raise self.bad("an unterminated string")
            if not closed:  # a surrogate pair or a character cut by the buffer's end waits for the next piece
                hs = _HIGH_SURROGATE_END.search(self.buf, self.pos, end)
                end = hs.start() if hs else end - _incomplete_tail(self.buf[max(self.pos, end - 4):end])
            if closed or end > self.pos:
                break
            if self.eof:
                raise self.bad("an unterminated string")
            want = len(self.buf) - self.pos + BLOCK  # an escape cut by the buffer's end: read on
        try:
            raw = self.buf[self.pos:end].decode("utf-8")
        except UnicodeDecodeError as exc:
            raise _utf8_error(self.path, self.offset + exc.start) from None
        try:
            text = json.loads('"' + raw + '"')
        except json.JSONDecodeError as exc:
            raise self.bad(exc.msg.lower()) from None
        self.pos = end + closed
        if text:
            sink(text)
        return closed

    def string(self, sink: Callable[[str], None], limit: int | None = None) -> None:
        start = self.offset
        while not self.string_piece(sink):
            if limit is not None and self.offset - start > limit:
                raise LensInputError(f"{self.path}:{self.line} holds a string over {limit} bytes where only "
                                     "'text' may be that long")

    def small_value(self) -> object:
        """A number, literal, object or array under SMALL_VALUE bytes (checked by json)."""
        depth, parts = 0, []
        while True:
            if not self.fill():
                break
            ch = self.buf[self.pos:self.pos + 1]
            if ch == b'"':
                self.pos += 1
                got: list[str] = []
                self.string(got.append, SMALL_VALUE)
                parts.append(json.dumps("".join(got)))
                continue
            if ch in b"[{":
                depth += 1
            elif ch in b"]}":
                if depth == 0:
                    break
                depth -= 1
            elif depth == 0 and ch in b", \t\r\n":
                break
            parts.append(ch.decode("latin-1"))
            self.pos += 1
            if len(parts) > SMALL_VALUE:
                raise LensInputError(f"{self.path}:{self.line} is over {LINE_LIMIT} bytes and holds a value "
                                     f"over {SMALL_VALUE} bytes besides its 'text'")
            if depth == 0 and ch in b"]}":
                break
        try:
            return json.loads("".join(parts))
        except json.JSONDecodeError as exc:
            raise self.bad(exc.msg.lower()) from None
        except RecursionError:
            raise LensInputError(f"{self.path}:{self.line} is nested too deeply to read") from None


def _stream_line(fh, path: Path, offset: int, line: int, h, docs: list) -> int:
    """Parse the over-long line at ``offset``; add its document; return where the next line starts."""

    s = _Stream(fh, path, offset, line)
    s.skip_ws()
    s.expect(b"{")
    text_span, held, nonblank, hh, title = None, [], False, None, ""
    s.skip_ws()
    if s.peek() == b"}":
        s.pos += 1
    else:
        while True:
            s.expect(b'"')
            key: list[str] = []
            s.string(key.append, SMALL_VALUE)
            s.expect(b":")
            s.skip_ws()
            name = "".join(key)
            if s.peek() == b'"' and name == "text":
                s.pos += 1
                if text_span is not None:
                    raise LensInputError(f"{path}:{line} has two 'text' fields")
                hh, start, held, size = h.copy(), s.offset, [], 0

                def take(piece: str) -> None:
                    nonlocal nonblank, held, size
                    try:
                        data = piece.encode("utf-8")
                    except UnicodeEncodeError:
                        raise LensInputError(f"{path}:{line} has a lone surrogate escape in its text: expected "
                                             "text that is valid Unicode") from None
                    hh.update(data)
                    nonblank = nonblank or bool(piece.strip())
                    size += len(data)
                    if held is not None:
                        held.append(piece)
                        if size > HOLD_BYTES:
                            held = None

                s.string(take)
                text_span = TextSpan(str(path), start, s.offset - 1, json=True)
            elif s.peek() == b'"':
                s.pos += 1
                got: list[str] = []
                s.string(got.append, SMALL_VALUE)
                if name == "title":
                    title = "".join(got)
                elif name == "text":  # a later non-string 'text' would replace it
                    text_span = None
            else:
                value = s.small_value()
                if name == "title":
                    title = value
                elif name == "text":
                    text_span = None
            s.skip_ws()
            ch = s.peek()
            s.pos += 1
            if ch == b"}":
                break
            if ch != b",":
                s.pos -= 1
                raise s.bad("expected ',' or '}'")
    s.skip_ws()
    s.fill(2)
    m = _EOL.match(s.buf, s.pos)
    if m is None and s.fill():
        raise s.bad("extra data after the object")
    if text_span is None:
        raise LensInputError(f"{path}:{line} has no string 'text' field")
    if nonblank:
        hh.update(b"\x00")
        h.state = hh
        docs.append(Document(len(docs), "".join(held) if held is not None else text_span, str(title)))
    return s.base + (m.end() if m else s.pos)


class _Box:
    """The running corpus hash (a streamed line's text is hashed into a copy, adopted once it proves
    non-blank)."""

    def __init__(self):
        self.state = hashlib.sha256()

    def copy(self):
        return self.state.copy()

    def update(self, data: bytes) -> None:
        self.state.update(data)


def _line_doc(raw: bytes, start: int, n: int, path: Path, h: _Box, docs: list) -> None:

    try:
        line = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise _utf8_error(path, start + exc.start) from None
    if not line.strip():
        return
    try:
        row = json.loads(line)
    except json.JSONDecodeError:
        raise LensInputError(f"{path}:{n} is not valid JSON: expected one object with a 'text' field per line") from None
    except RecursionError:
        raise LensInputError(f"{path}:{n} is nested too deeply to read: expected one object with a 'text' "
                             "field per line") from None
    if not isinstance(row, dict) or not isinstance(row.get("text"), str):
        raise LensInputError(f"{path}:{n} has no string 'text' field")
    if row["text"].strip():
        try:
            data = row["text"].encode("utf-8")
        except UnicodeEncodeError:
            raise LensInputError(f"{path}:{n} has a lone surrogate escape in its text: expected text that is "
                                 "valid Unicode") from None
        h.update(data)
        h.update(b"\x00")
        docs.append(Document(len(docs), row["text"], str(row.get("title", ""))))


def scan_jsonl(fh, path: Path) -> tuple[list, str, bool]:
    """Documents (one JSON object with a 'text' field per line), fingerprint, whether any byte was not blank."""
    h, docs = _Box(), []
    checked = _Checked(path)
    buf, base, n, scanned = b"", 0, 0, 0
    while True:
        block = fh.read(BLOCK)
        eof = not block
        if block and checked.seen == base + len(buf):  # each byte checked once, on its first read
            checked.check(block)
        buf += block
        pos = 0
        for m in _EOL.finditer(buf, max(0, scanned - 3)):
            if m.group() == b"\r" and m.end() == len(buf) and not eof:
                break  # maybe the first half of "\r\n"
            n += 1
            _line_doc(buf[pos:m.start()], base + pos, n, path, h, docs)
            pos = m.end()
        buf, base = buf[pos:], base + pos
        scanned = len(buf)
        if eof:
            if buf:
                n += 1
                _line_doc(buf, base, n, path, h, docs)
            return docs, h.state.hexdigest()[:16], checked.nonblank
        if len(buf) > LINE_LIMIT:  # a line too long to hold: parse it as it streams, then go on after it
            n += 1
            nxt = _stream_line(fh, path, base, n, h, docs)
            _check_upto(fh, checked, nxt)
            fh.seek(nxt)
            buf, base, scanned = b"", nxt, 0


def _check_upto(fh, checked: _Checked, end: int) -> None:
    """UTF-8 / NUL checks of the bytes a streamed line covered that were not checked yet."""
    if checked.seen >= end:
        return
    fh.seek(checked.seen)
    while checked.seen < end:
        block = fh.read(min(BLOCK, end - checked.seen))
        if not block:
            break
        checked.check(block)
