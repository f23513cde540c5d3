"""The fake flashinfer module (tests/backends/conftest.py's fixture) for the engine's tests too."""

from tests.backends.conftest import fake_fi  # noqa: F401
