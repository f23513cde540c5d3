from attnlab.backends.base import AttentionBackend, AttnMeta, Capabilities, Mode
from attnlab.backends.registry import backend_names, get_backend_class, require_available

__all__ = ["AttentionBackend", "AttnMeta", "Capabilities", "Mode", "backend_names", "get_backend_class",
           "require_available"]
