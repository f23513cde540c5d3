"""Page allocator: a free list and per-request page tables. It asks before it mutates."""

from __future__ import annotations

from collections.abc import Hashable

from attnlab.errors import OutOfPages
from attnlab.kvcache.layout import pages_needed


class PageAllocator:
    """Owns page ids ``0 .. num_pages-1`` of one KV pool.

    Each request has a page table (list of page ids) and a length in tokens. ``allocate`` grows a
    request to a new length, ``truncate`` shrinks it (rollback) and returns emptied pages to the free
    list, ``free`` drops the request. A page is owned by at most one request at any time.
    """

    def __init__(self, num_pages: int, page_size: int):
        if num_pages < 1 or page_size < 1:
            raise ValueError(f"need num_pages >= 1 and page_size >= 1, got {num_pages}, {page_size}")
        self.num_pages = num_pages
        self.page_size = page_size
        # Pop from the end: low page ids are handed out first, which keeps tests readable.
        self._free: list[int] = list(range(num_pages - 1, -1, -1))
        self.page_tables: dict[Hashable, list[int]] = {}
        self.lengths: dict[Hashable, int] = {}
        self.max_pages_used = 0

    @property
    def num_free(self) -> int:
        return len(self._free)

    @property
    def num_used(self) -> int:
        return self.num_pages - len(self._free)

    def extra_pages(self, req: Hashable, new_len: int) -> int:
        """Pages ``req`` (new or not) would take from the free list to hold ``new_len`` tokens (0 if it holds them)."""
        have = len(self.page_tables.get(req, ()))
        return max(0, pages_needed(new_len, self.page_size) - have)

    def can_allocate(self, req: Hashable, new_len: int) -> bool:
        """True if ``req`` can grow to ``new_len`` tokens without running out of pages."""
        return self.extra_pages(req, new_len) <= len(self._free)

    def pages_of(self, req: Hashable) -> int:
        """Pages ``req`` holds (0 for an unknown request)."""
        return len(self.page_tables.get(req, ()))

    def allocate(self, req: Hashable, new_len: int) -> list[int]:
        """Grow ``req`` (created if new) to hold ``new_len`` tokens; return the pages added."""
        if new_len < self.lengths.get(req, 0):
            raise ValueError(f"allocate cannot shrink request {req!r}: use truncate")
        extra = self.extra_pages(req, new_len)
        if extra > len(self._free):
            raise OutOfPages(
                f"KV pool out of pages: request {req!r} needs {extra} more page(s) of {self.page_size} tokens, "
                f"{len(self._free)} of {self.num_pages} free; raise kv.num_pages or lower workload.batch_size"
            )
        added = [self._free.pop() for _ in range(extra)]
        self.page_tables.setdefault(req, []).extend(added)
        self.lengths[req] = new_len
        self.max_pages_used = max(self.max_pages_used, self.num_used)
        return added

    def truncate(self, req: Hashable, new_len: int) -> list[int]:
        """Shrink ``req`` to ``new_len`` tokens (rollback); return the pages given back."""
        cur = self.lengths[req]
        if not 0 <= new_len <= cur:
            raise ValueError(f"truncate({req!r}, {new_len}) outside 0..{cur}")
        table = self.page_tables[req]
        keep = pages_needed(new_len, self.page_size)
        dropped = table[keep:]
        del table[keep:]
        self._free.extend(reversed(dropped))
        self.lengths[req] = new_len
        return dropped

    def free(self, req: Hashable) -> None:
        """Release every page of ``req``; unknown requests are an error (double free)."""
        table = self.page_tables.pop(req)
        del self.lengths[req]
        self._free.extend(reversed(table))

    def slot(self, req: Hashable, pos: int) -> int:
        table = self.page_tables[req]
        return table[pos // self.page_size] * self.page_size + pos % self.page_size
