"""User-facing errors: each carries a one-line message; the CLI prints it and exits 2."""


class AttnlabError(Exception):
    """Base class for errors that are the user's input, not a bug: printed as one line, exit code 2."""


class ConfigError(AttnlabError):
    """A configuration value is unknown, out of range or unsupported by the chosen backend."""


class BackendUnavailable(AttnlabError):
    """A backend's optional package or hardware is missing; the message says how to get it."""


class OutOfPages(AttnlabError):
    """The KV pool has no free page for the requested allocation."""


class ModelLoadError(AttnlabError):
    """A model source could not be resolved or loaded."""


class PromptTooLong(AttnlabError):
    """A prompt plus its generation budget does not fit in the model's context or the KV pool."""
