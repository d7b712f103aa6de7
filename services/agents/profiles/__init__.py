"""One module per tool profile, each a table of its tools (spec and handler side by side);
``services/agents/tools.py`` names them and dispatches their calls.

What each profile is for, in a line a person reads (``engram mcp --help``, ``engram tools
--help``), is here rather than in the profiles' modules: the command line shows it without
importing a profile, its client or its schemas."""

from __future__ import annotations

DESCRIPTIONS: dict[str, str] = {
    "engram": "Engram's own tools: search, save, update, supersede, forget, list, history, context",
    "forget": "one tool, forget: find candidates by query, delete by id in two calls (ask, then confirm)",
    "runtime": "for agent runtimes: memory_search (the conversation too), memory_save, memory_update, memory_delete",
    "versioned": "versioned memories by category: add_to_memory (a known subject points to the update), update_memory",
    "memento": "store_memory answering with similar memories and what to do, supersede_memory, "
    "search_memories, list_recent_memories",
    "assistant": "a personal assistant's: extract_memory (several at once, duplicates caught), update_memory, "
    "remove_memory, list_memories",
}

# Names profiles had before they said what they are for: still accepted, never offered.
ALIASES: dict[str, str] = {"prd29": "versioned"}


def canonical(name: str) -> str:
    """The profile ``name`` stands for (itself, or the profile an old name now has)."""
    return ALIASES.get(name, name)
