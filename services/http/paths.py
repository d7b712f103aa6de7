"""Path parameters as single segments of the path as the client sent it.

Ids may hold "/" (a user ``team/alice``, a session ``chat/1``, a key ``/memories/notes.md``): a
client sends it as ``%2F``, and it must stay inside its segment. Starlette matches the path once
percent-decoded, where ``DELETE /v1/users/a%2Fconversations%2Fx`` would be the conversation
route's (user ``a``, session ``x``) and an id with "/" would match no route at all. So these
routes match the raw path instead: each ``{name}`` is one segment (``[^/]+``), decoded only once
the route is chosen.
"""

from __future__ import annotations

from urllib.parse import unquote

from starlette.routing import Match, Route
from starlette.types import Scope


class SegmentRoute(Route):
    """A ``Route`` matched against ``scope["raw_path"]``: ``%2F`` in a segment is part of its
    value, never a separator. A segment that is not UTF-8 once decoded matches nothing (404)."""

    def matches(self, scope: Scope) -> tuple[Match, Scope]:
        if scope["type"] != "http":
            return super().matches(scope)
        sent = path_as_sent(scope)
        if sent is None:
            return Match.NONE, {}
        match, child = super().matches({**scope, "path": sent})
        if match is Match.NONE:
            return match, child
        params = dict(child["path_params"])
        try:
            for name in self.param_convertors:
                params[name] = unquote(params[name], errors="strict")
        except UnicodeDecodeError:
            return Match.NONE, {}
        return match, {**child, "path_params": params}


def path_as_sent(scope: Scope) -> str | None:
    """The request's path still percent-encoded, below the same root path (a mount's ``/v1``) as
    the decoded one. None when the server gave no ``raw_path`` (ASGI leaves it optional; uvicorn
    gives it) or the root path is not its leading segments: then no segment route answers,
    rather than one chosen by the decoded path."""
    raw = scope.get("raw_path")
    if raw is None:
        return None
    path = raw.partition(b"?")[0].decode("latin-1")
    root: str = scope.get("root_path", "")
    prefix = "/".join(path.split("/")[: root.count("/") + 1])
    if unquote(prefix) != root:
        return None
    return root + path[len(prefix) :]
