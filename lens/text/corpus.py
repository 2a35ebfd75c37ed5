"""A corpus: named documents in order and their fingerprint (read by ``lens.text.corpora``, cut by
``lens.text.windows``)."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from lens.text.files import Document


@dataclass(frozen=True)
class Corpus:
    name: str
    documents: tuple[Document, ...]
    source: str = ""
    digest: str = ""  # the fingerprint, when it was computed as the file was read

    @property
    def fingerprint(self) -> str:
        if self.digest:
            return self.digest
        h = hashlib.sha256()
        for d in self.documents:
            h.update(d.text.encode("utf-8"))
            h.update(b"\x00")
        return h.hexdigest()[:16]
