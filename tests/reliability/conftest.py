"""Real failures on real processes: the stack, a private Redis, the settings as environment (tests/support/stack.py)."""

from tests.support.stack import private_redis, settings_env, stack

__all__ = ["private_redis", "settings_env", "stack"]
