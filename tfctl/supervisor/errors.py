"""The one exception the supervisor's handlers raise on purpose."""


class AgentError(Exception):
    """A request that cannot be served: answered with its message, the conversation goes on."""
