"""``engram``: the operator's and developer's command line. Every subcommand except ``serve``
talks to a running ``engram serve`` over the bus through ``EngramClient``.

``main`` runs one command line; ``parser`` builds the arguments of every subcommand; ``notes``
(a user's memory), ``operator`` (running a deployment) and ``agents`` (tools, MCP, tokens) hold
the subcommands, each turning its arguments into one call of the layers below; ``output`` and
``render`` print what they answer."""

from engram_ledger.services.cli.main import main

__all__ = ["main"]
