"""attnlab: measure which attention backend the draft and verify sides of speculative decoding should use."""

__version__ = "0.1.0"
