from attnlab.kvcache.allocator import PageAllocator
from attnlab.kvcache.layout import PagedLayout, build_layout, pages_needed, slot_mapping
from attnlab.kvcache.pool import KVPool

__all__ = ["KVPool", "PageAllocator", "PagedLayout", "build_layout", "pages_needed", "slot_mapping"]
