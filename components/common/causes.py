"""An error and the errors it was raised from: the one walk of the chain every error classifier uses."""

from __future__ import annotations

from collections.abc import Iterator


def causes(error: BaseException | None) -> Iterator[BaseException]:
    """`error`, then its `__cause__` (raise ... from), else its `__context__` (raised while handling), and so on;
    each once, so a chain that loops back ends."""
    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        yield error
        error = error.__cause__ or error.__context__
